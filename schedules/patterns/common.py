"""Small helpers the pattern rules share (loop extents, trial application, vector widths)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

# Below this many elements a stage runs on one core: waking the pool costs more than it saves.
PARALLEL_MIN_ELEMS = 1 << 16


@dataclass(frozen=True)
class Detail:
    """What a rule's ``apply`` may return instead of a string: the note, and the further
    stages it scheduled itself (computed inside its loops), which no later rule may take."""

    text: str
    also: tuple = ()

    def __str__(self) -> str:
        return self.text


def extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def product(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def block(sch, name: str):
    return sch.get_sblock(name)


def attempt(sch, fn, *args) -> tuple[bool, object]:
    """Apply ``fn(sch, *args)`` only if it succeeds on a copy first.

    Schedule primitives check before they mutate, but a rule is several primitives: trying
    the whole rule on a copy keeps ``sch`` untouched when any step is refused, so the next
    rule (finally the generic one) starts from a clean schedule. Returns ``(applied, what
    fn returned)``.
    """
    trial = sch.copy()
    try:
        fn(trial, *args)
    except Exception:  # noqa: BLE001 - any refusal means "this rule does not apply"
        return False, None
    return True, fn(sch, *args)


def vector_width(target, dtype: str, inner: int) -> int:
    """Elements per vectorised iteration: two registers when the axis is long enough (LLVM
    then keeps two independent operations in flight), else one, else the whole axis."""
    lanes = target.lanes(dtype)
    if inner >= 4 * lanes:
        return 2 * lanes
    if inner >= lanes:
        return lanes
    return inner


def vectorize_tail(sch, loops: list, target, dtype: str):
    """Fuse ``loops`` (the innermost, contiguous ones) and vectorise a lane-wide split.

    Returns the outer part of the fused loop (None when the whole nest was vectorised)."""
    if not loops:
        return None
    inner = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    n = extent(sch, inner)
    v = vector_width(target, dtype, n)
    lanes = target.lanes(dtype)
    if v > lanes and n % v and n % lanes == 0:
        v = lanes  # whole vectors, no guarded tail (a row of 112: 7 vectors, not 3.5 pairs)
    if v <= 1:
        return inner
    if v >= n:
        sch.vectorize(inner)
        return None
    outer, vec = sch.split(inner, [None, v])
    sch.vectorize(vec)
    return outer


def parallel_loops(sch, loops: list, target, elems: int):
    """Fuse ``loops`` and run them across cores when the stage is large enough."""
    loops = [lp for lp in loops if lp is not None]
    if not loops or target.cores < 2 or elems < PARALLEL_MIN_ELEMS:
        return None
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if extent(sch, fused) >= 2:
        sch.parallel(fused)
    return fused


SHORT_INTERIOR = 4  # a short padded row's interior vectorised from this many elements


def producers_inside(sch, blk, buffer: str, loop, target) -> list[str]:
    """Compute the injective stage that writes ``buffer`` for block ``blk`` (its padding)
    inside each iteration of ``loop``, for the part that iteration reads, instead of in a
    pass of its own: one wake-up of the thread pool per call instead of two (about 6% of a
    0.5 ms conv2d with parked workers), and rows written just before they are read stay in
    L1. Its innermost loop is vectorised (a padded row in parts: :func:`.injective.
    padded_rows`), a row shorter than one vector too: its interior of at least
    :data:`SHORT_INTERIOR` elements in vectors, one odd vector where no whole, half or
    quarter register divides it (it was copied element by element: a user's
    3x3 depthwise window over 8x1024x7x7, one Zen 4 core, 0.55 -> 0.46 ms; 8x512x6x6 0.25 ->
    0.21 ms). A row of exactly one vector keeps its guarded whole vector: 8x512x6x6 padded to
    8 built for AVX2 took 0.135 ms so and 0.148 ms with its interior alone (8x512x14x14 padded
    to 16 on AVX-512 went the other way, 0.45 -> 0.43 ms; left as it was). Returns the stages
    moved."""
    from schedules.patterns.analysis import block_facts
    from schedules.patterns.injective import padded_rows

    moved = []
    for prod in sch.get_producers(blk):
        f = block_facts(sch, prod)
        if f.out_buffer != buffer or not f.injective or len(sch.get_consumers(prod)) > 1:
            continue
        _iterate_phases(sch, prod)
        sch.compute_at(prod, loop, preserve_unit_loops=True)
        lanes = target.lanes(f.out_dtype)
        inner = sch.get_loops(prod)[-1]
        short = extent(sch, inner) < lanes
        phased = _phase_interior(sch, prod)
        if phased is not None:
            from dsl.runtime.lane_shuffle_pass import KEY

            sch.annotate(loop, KEY, 1)  # the rows' lanes read every s-th element
        if not padded_rows(sch, prod, target, min_interior=SHORT_INTERIOR if short else 0,
                           bounds=phased) and not short:
            sch.vectorize(sch.split(inner, [None, lanes])[-1])
        moved.append(f.name)
    return moved


def _iterate_phases(sch, blk) -> None:
    """A stage :func:`split_by_phase` laid out ``[.., W % s, W // s]`` iterates that layout, so
    it writes whole rows of each phase (its reads stepping by ``s``, which the lane-shuffle
    pass loads whole) where it had written every ``s``-th element of a row, one at a time (a
    user's ResNet stem forward, its padding computed per row: 1.074 / 1.039x on one / two Zen 4
    cores). Only for a stage computed per task: one scheduled as a pass of its own fuses the
    phase and row axes into one vectorised loop whose indices divide and take the remainder
    by the row (a strided 32-group conv2d: 2.8x slower so)."""
    from tvm.s_tir.schedule import ScheduleError
    from tvm.tirx import FloorDiv, FloorMod, IntImm

    block = sch.get(blk)
    idx = list(getattr(block.body, "indices", []))
    if len(idx) < 2 or not block.iter_vars:
        return
    mod, div = idx[-2:]
    last = block.iter_vars[-1]
    if not (isinstance(mod, FloorMod) and isinstance(div, FloorDiv) and mod.a.same_as(last.var)
            and div.a.same_as(last.var) and isinstance(mod.b, IntImm)
            and isinstance(div.b, IntImm) and mod.b.value == div.b.value >= 2
            and int(last.dom.extent) % mod.b.value == 0):
        return
    with contextlib.suppress(ScheduleError):
        sch.transform_block_layout(blk, phase_map(len(block.iter_vars), mod.b.value))


def _phase_interior(sch, blk):
    """``(lo, hi)``: the positions of the innermost axis where a stride-phase padding stage
    (iterating ``[.., r, q]``, reading ``x[.., q * s + r - pad]`` under a test on that
    index, :func:`split_by_phase`) reads the input at every phase ``r``, as
    :func:`.injective.padded_rows` takes them; None for any other stage."""
    from schedules.loop_tests import conjunction, conjuncts, held_on_grid
    from schedules.patterns.analysis import stride_in

    block = sch.get(blk)
    value = getattr(block.body, "value", None)
    if value is None or not hasattr(value, "op") or not value.op.name.endswith(
            "if_then_else") or len(block.iter_vars) < 2:
        return None
    r, q = (iv.var for iv in block.iter_vars[-2:])
    load = value.args[1]
    if not hasattr(load, "indices") or not load.indices or \
            (stride_in(load.indices[-1], q.name) or 0) < 2 or not _uses(load.indices[-1], r):
        return None  # not a stride-phase read (a plain pad knows its own bounds)
    terms = [t for t in conjuncts(value.args[0]) if _uses(t, q)]
    if not terms or any(_uses(t, v.var) for t in terms for v in block.iter_vars[:-2]):
        return None
    dom = [(iv.var, int(iv.dom.min), int(iv.dom.extent)) for iv in block.iter_vars[-2:]]
    held = held_on_grid(conjunction(terms), dom)
    if held is None:
        return None
    inside = held.all(axis=0).nonzero()[0]
    if not len(inside) or not held.all(axis=0)[inside[0]:inside[-1] + 1].all():
        return None
    return dom[1][1] + int(inside[0]), dom[1][1] + int(inside[-1]) + 1


def _uses(expr, var) -> bool:
    from schedules.loop_tests import used_vars

    found: list = []
    used_vars(expr, found)
    return any(v.same_as(var) for v in found)


def phase_map(ndim: int, stride: int):
    """The layout ``[.., W] -> [.., W % s, W // s]`` that lets a window stepping its row by
    ``s`` read whole vectors (``x[.., v * s + r]`` becomes ``[.., r % s, v + r // s]``)."""
    from tvm.tirx import IndexMap

    return IndexMap.from_func(lambda *ix: [*ix[:-1], ix[-1] % stride, ix[-1] // stride],
                              ndim=ndim, index_dtype="int32")


def split_by_phase(sch, name: str, reads: list) -> tuple[object, list[str]]:
    """Re-lay each ``(access, s)`` of ``reads`` (a read of block ``name`` stepping its last
    axis by a stride ``s``: ``x[.., v * s + r]``) as ``[.., W % s, W // s]`` (:func:`phase_map`;
    a stage in place, a kernel input through a copy), so it reads ``[.., r % s, v + r //
    s]``: whole vectors along ``v``. Returns ``(facts of the block, copy blocks made)``."""
    from schedules.patterns.analysis import block_facts, root_blocks

    before = {sch.get(b).name_hint for b in root_blocks(sch)}
    for acc, s in reads:
        blk = sch.get_sblock(name)
        idx = next(i for i, r in enumerate(sch.get(blk).reads) if r.source.name == acc.buffer)
        if acc.buffer not in {block_facts(sch, b).out_buffer for b in sch.get_producers(blk)}:
            sch.cache_read(blk, idx, "global")  # a kernel input: split a copy of it
            blk = sch.get_sblock(name)
        sch.transform_layout(blk, ("read", idx), phase_map(len(acc.shape), s),
                             pad_value=0.0 if acc.shape[-1] % s else None)
    made = [sch.get(b).name_hint for b in root_blocks(sch)]
    return block_facts(sch, sch.get_sblock(name)), [m for m in made if m not in before]


def vectorize_registers(sch, loop, lanes: int) -> None:
    """Vectorise ``loop`` in whole registers of ``lanes``: split and its outer part unrolled
    where it holds several, else vectorised whole."""
    if extent(sch, loop) > lanes and extent(sch, loop) % lanes == 0:
        whole, loop = sch.split(loop, [None, lanes])
        sch.unroll(whole)
    sch.vectorize(loop)
