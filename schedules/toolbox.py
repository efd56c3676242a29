"""The schedule toolbox: the loop, factor and stage helpers every rule in :mod:`schedules` uses.

One home for what the rules share (as TVM dlight keeps ``base/utils.py`` and
``common_schedules.py``): rules compose these and keep only their own tiling logic.

Loops and blocks
    :func:`extent`, :func:`extents`, :func:`spatial_count`, :func:`split_loops`,
    :func:`root_blocks`, :func:`written_dtype`.

Factors (how far to split a loop). Each has one documented policy; a rule picks by name:

==========================  ===================================================================
:func:`divisors`            every divisor of ``n``, ascending
:func:`largest_divisor`     the largest divisor of ``n`` that is at most ``cap`` (no tail)
:func:`tile_factor`         a tile <= ``limit``: the largest divisor when it is at least half
                            the limit, else the limit itself (a guarded ragged tail is cheaper
                            than a tile half the size)
:func:`chain_tile`          a register tile of positions <= ``limit`` with enough independent
                            accumulators to hide the FMA latency: an exact divisor that has
                            them, else two balanced tiles, else ``limit`` with a ragged tail
:func:`row_tile`            rows of a register tile: the largest divisor up to the budget,
                            else the budget with a ragged last tile when the divisor leaves
                            over a quarter of the accumulators idle (:func:`split_last_tile`)
:func:`register_factor`     vector lanes in whole registers: the largest multiple of ``lanes``
                            up to ``max_vectors`` registers that divides the extent, else the
                            largest divisor up to one register
:func:`exact_vector_factor` never a predicated tail (TVM's vectoriser scalarises it): the whole
                            loop up to four registers, else a divisor in ``[lanes/2, lanes]``,
                            else in ``(lanes, 4*lanes]``, else 1 (leave it to LLVM)
:func:`fill_vector_factor`  the whole loop up to two registers, else the divisor up to two
                            registers that wastes the fewest lanes (then the largest)
:func:`whole_vector_lanes`  a whole, half or quarter register (at least 4 lanes) dividing the
                            extent, else 0
==========================  ===================================================================

Loop transforms
    :func:`parallel` (fuse, then run across cores), :func:`parallel_outer` (the outer spatial
    loops of a block), :func:`vectorize_inner` (an all-spatial block's innermost loop),
    :func:`vectorize_split` (split a loop by a factor and vectorise the lanes),
    :func:`vectorize_innermost` (split by whole registers or vectorise whole),
    :func:`split_last_tile` (a ragged last register tile in a loop nest of its own;
    :func:`leaf_blocks` and :func:`from_zero` find its blocks and the loops it may fuse).

Register tiles
    :func:`register_tile`: the 5HD reduction tile dx and dw share (accumulators of a tile of
    spatial positions x the C0 lanes kept in registers across the whole reduction, or across
    one chunk of it); :func:`balance` and :func:`task_share` say how well tasks share out,
    :func:`sharing_choice` picks the first blocking whose tasks do.

Elementwise stages (each rule's data-parallel stages: packs, pads, casts, outputs)
    :func:`elementwise` (channel-last: whole registers, every outer loop fused) and
    :func:`elementwise_c0` (5HD / FracZ: the 16-wide C0 axis in registers, parallel only when
    the stage is large enough to pay for waking the pool).

Register counts
    :func:`vector_registers`, :func:`accumulator_registers`, :func:`c0_vectors`.

Nothing here reads a target's name: only its numbers (lanes, vector bits, cores).
"""

from __future__ import annotations

import math

from dsl.ops.group import C0
from schedules.intrinsics import llvm_import

# Below this many elements a copy stage runs on one core: waking the pool costs more than it
# saves, and on a shared machine every fork-join waits for the slowest core.
PARALLEL_MIN_ELEMS = 1 << 15


# ---------------------------------------------------------------------------- loops, blocks
def extent(sch, loop) -> int:
    """The constant extent of ``loop``."""
    return int(sch.get(loop).extent)


def extents(sch, loops) -> int:
    """The product of the extents of ``loops`` (the iterations of their fused loop)."""
    return math.prod(extent(sch, lp) for lp in loops)


def spatial_count(sch, block) -> int:
    """Number of spatial block iterators (TE puts them first, so the leading loops)."""
    return sum(1 for iv in sch.get(block).iter_vars if int(iv.iter_type) == 0)


def split_loops(sch, block) -> tuple[list, list]:
    """(spatial loops, reduction loops) of a block whose loops are still in TE order."""
    loops = sch.get_loops(block)
    n_sp = spatial_count(sch, block)
    return list(loops[:n_sp]), list(loops[n_sp:])


def root_blocks(sch) -> list:
    """The blocks directly under the kernel's root block, in program order."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def written_dtype(sch, block) -> str:
    """dtype of the buffer a block writes (lanes per register depend on it)."""
    try:
        return str(sch.get(block).writes[0].source.dtype)
    except (AttributeError, IndexError):
        return "float32"


# ---------------------------------------------------------------------------- factors
def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def largest_divisor(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is at most ``cap`` (>= 1): a split with no tail."""
    for f in range(max(1, min(n, cap)), 0, -1):
        if n % f == 0:
            return f
    return 1


def tile_factor(extent: int, limit: int) -> int:
    """A tile size <= ``limit`` for ``extent``: its largest divisor when that is at least half
    of the limit (no ragged tail), else ``limit`` (the split then guards the tail)."""
    limit = max(1, min(limit, extent))
    div = largest_divisor(extent, limit)
    return div if 2 * div >= limit else limit


def chain_tile(extent: int, limit: int, accs_per_position: int, chains: int) -> int:
    """Positions per register tile (<= ``limit``) for a loop of ``extent`` positions, each
    holding ``accs_per_position`` accumulators: the whole loop when it fits; else its largest
    divisor when that is at least half the limit and keeps ``chains`` (FMA latency x pipes)
    accumulators in flight; else two balanced tiles when the loop is under two limits; else
    ``limit`` with a ragged tail. A tile below ``chains`` stalls every FMA on the previous
    one, which costs more than the guarded tail (dx of an 8x256x14x14 layer on a Zen 3: 2
    positions, 4 accumulators, 77 GFLOP/s; 6 positions and a tail of 2, 116)."""
    limit = max(1, min(limit, extent))
    if extent <= limit:
        return extent
    div = largest_divisor(extent, limit)
    if 2 * div >= limit and div * accs_per_position >= chains:
        return div
    if extent < 2 * limit:
        return -(-extent // 2)
    return limit


# the least share of the cores' time the tasks of a parallel loop may keep busy: 27 taps of a
# 3-D dw on 2 cores, 14 + 13, idle one core 1/28 of the time; on 16 cores, 2 rounds of 16
# for 27 tasks, 5/32 (the blocks then shrink until the tasks share out better)
BALANCE_MIN = 0.97


def balance(tasks: int, cores: int) -> float:
    """The share of ``cores`` x the longest core's time that ``tasks`` equal tasks fill."""
    return tasks / (cores * -(-tasks // cores))


def lead_loops(sizes: list[int], cores: int, least: int = 2) -> int:
    """How many of a nest's lead loops (their ``sizes``, outermost first) to run across
    ``cores``: the fewest (at least ``least``) whose blocks share out evenly (:func:`balance`
    at least :data:`BALANCE_MIN`), else those that share out best. The loops left below
    share what the blocks above them read (a tap loop below the reduction chunks reads the
    chunk from L1 / L2 again; above them, from memory)."""
    counts = range(min(least, len(sizes)), len(sizes) + 1)
    return sharing_choice(counts, lambda n: math.prod(sizes[:n]), cores, balance)[0]


def task_share(tasks: int, cores: int) -> float:
    """How well ``tasks`` equal tasks keep ``cores`` busy: :func:`balance`, scaled down
    below two tasks per core (a core with one task has no slack for a slow one)."""
    return balance(tasks, cores) * min(1.0, tasks / (2 * cores))


def sharing_choice(candidates, tasks, cores: int, measure=task_share) -> tuple:
    """``(candidate, share)``: the first of ``candidates`` (in order of preference) whose
    ``tasks(candidate)`` tasks keep ``cores`` busy (``measure``, :func:`task_share` or
    :func:`balance`, at least :data:`BALANCE_MIN`), else the one whose tasks share out best
    (the earlier on a tie)."""
    best = None
    for cand in candidates:
        share = measure(tasks(cand), cores)
        if share >= BALANCE_MIN:
            return cand, share
        if best is None or share > best[1] + 1e-9:
            best = (cand, share)
    return best


def row_tile(extent: int, budget: int) -> int:
    """Rows of a register tile of ``budget`` accumulator rows over a loop of ``extent``: its
    largest divisor up to the budget, or the budget itself (a ragged last tile, see
    :func:`split_last_tile`) when the divisor would leave over a quarter of the accumulators
    idle and the loop holds two full tiles. Too few accumulators stall every FMA on the
    previous one (dx of a conv1d of 1024 positions on a Zen 3: 4 rows, 136 GFLOP/s; 6 rows
    and a last tile of 4, 154)."""
    exact = largest_divisor(extent, budget)
    if 4 * exact < 3 * budget and extent >= 2 * budget:
        return budget
    return exact


def split_last_tile(sch, tiles) -> tuple:
    """Give the ragged last register tile of a split its own loop nest, so that no guard is
    left in the full tiles' loops: TVM proves the split's guard true there, and constant in
    the last tile once its rows are unrolled.

    ``tiles`` is the loop over register tiles; what it holds is copied for each part. In a
    reduction nest, vectorise and split the init off first (``decompose_reduction`` above
    ``tiles``): TVM cannot vectorise a part of a partitioned reduction block, and the parts
    of a plain update block keep the loops' annotations. Returns the blocks ``(main,
    last)``: the full tiles' (None when there are none) and the last tile's, each under a
    copy of the nest. The last tile's copy of ``tiles`` starts above 0: only
    :func:`from_zero` of its loops may be split or fused."""
    count = extent(sch, tiles)
    if count == 1:
        return None, leaf_blocks(sch, tiles)[0]
    main, last = sch.loop_partition(tiles, [count - 1, None])
    return leaf_blocks(sch, main)[0], leaf_blocks(sch, last)[0]


def leaf_blocks(sch, parent) -> list:
    """The blocks under ``parent`` (a loop or block) that compute something: the opaque
    blocks ``loop_partition`` wraps its parts in are looked through."""
    out = []
    for b in sch.get_child_blocks(parent):
        inner = leaf_blocks(sch, b)
        if inner:
            out += inner
        elif len(sch.get(b).writes):
            out.append(b)
    return out


def from_zero(sch, loops) -> list:
    """The loops of ``loops`` that start at 0 (a ``loop_partition`` part does not)."""
    return [lp for lp in loops if int(sch.get(lp).min) == 0]


def register_factor(extent: int, lanes: int, max_vectors: int = 2) -> int:
    """Vector lanes in whole registers: the largest ``lanes * v`` (``v <= max_vectors``) that
    divides ``extent``, else its largest divisor up to one register."""
    for f in (lanes * v for v in range(max_vectors, 0, -1)):
        if extent % f == 0:
            return f
    return largest_divisor(extent, lanes)


def whole_vector_lanes(extent: int, lanes: int) -> int:
    """The widest whole, half or quarter register of ``lanes`` (at least 4 lanes) that
    divides ``extent``; 0 when none does."""
    return next((w for w in (lanes, lanes // 2, lanes // 4) if w >= 4 and extent % w == 0), 0)


def exact_vector_factor(extent: int, lanes: int) -> int:
    """Lanes for a loop of ``extent`` with no predicated tail (1: leave it to LLVM).

    A split whose factor does not divide the extent leaves a predicate that TVM's vectoriser
    scalarises (measured 5-7x slower), so only exact factors are used: the whole loop up to
    four registers (LLVM splits odd widths into legal vectors), else a divisor in
    ``[lanes/2, lanes]``, else one in ``(lanes, 4*lanes]``.
    """
    if extent <= 4 * lanes:
        return extent
    for lo, hi in ((max(1, lanes // 2), lanes), (lanes + 1, 4 * lanes)):
        for v in range(hi, lo - 1, -1):
            if extent % v == 0:
                return v
    return 1


def fill_vector_factor(extent: int, lanes: int) -> int:
    """Elements per vectorised step: the whole axis when it fits two vectors, else the
    divisor of ``extent`` (no tail, no predicate) that wastes the fewest lanes."""
    if extent <= 2 * lanes:
        return extent
    cands = [d for d in divisors(extent) if d <= 2 * lanes]
    return max(cands, key=lambda d: (d / (-(-d // lanes) * lanes), d))


# ---------------------------------------------------------------------------- registers
def vector_registers(target) -> int:
    """Architectural vector registers: AVX-512 has 32, SSE / AVX2 have 16."""
    return 32 if target.vector_bits >= 512 else 16


def accumulator_registers(target) -> int:
    """Registers a register tile may hold as accumulators (the rest stream operands)."""
    return vector_registers(target) * 3 // 4


def c0_vectors(target, dtype: str = "float32") -> tuple[int, int]:
    """(registers per 16-wide C0 row, lanes per register) for ``dtype``."""
    lanes = min(C0, target.lanes(dtype))
    return max(1, C0 // lanes), lanes


# ---------------------------------------------------------------------------- loop transforms
def parallel(sch, loops, cores: int):
    """Fuse ``loops`` (outermost first) and run the result across cores when there is more
    than one core and more than one iteration; returns the fused loop."""
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if cores > 1 and extent(sch, fused) > 1:
        sch.parallel(fused)
    return fused


def parallel_outer(sch, block, max_fuse: int = 2, min_extent: int = 2) -> None:
    """Fuse up to ``max_fuse`` outer spatial loops and run them across cores."""
    loops = sch.get_loops(block)
    n_sp = min(spatial_count(sch, block), max_fuse, len(loops))
    if n_sp == 0:
        return
    fused = sch.fuse(*loops[:n_sp]) if n_sp > 1 else loops[0]
    if extent(sch, fused) >= min_extent:
        sch.parallel(fused)


def vectorize_inner(sch, block, max_lanes: int = 64) -> None:
    """Vectorise the innermost loop of an all-spatial block when it is short enough."""
    loops = sch.get_loops(block)
    if not loops or spatial_count(sch, block) != len(sch.get(block).iter_vars):
        return
    ext = sch.get(loops[-1]).extent
    if hasattr(ext, "value") and 1 < int(ext.value) <= max_lanes and len(loops) > 1:
        sch.vectorize(loops[-1])


# How many times over the copies of a stage computed inside each task of its reader may cover
# the whole stage (the rows of the taps' halo each task computes again) for a rule to move the
# stage into the tasks (:func:`task_repeat`)
TASK_REPEAT_LIMIT = 1.25


def task_repeat(sch, stage, reader, prepare=None) -> float | None:
    """How many times over the parts of ``stage`` that the tasks of ``reader`` (its first,
    parallel loop) would compute, were ``stage`` computed there, cover the whole of it:
    measured on a copy of ``sch``, after ``prepare(copy, reader's block in the copy)`` (the
    reader's own tiling, when not yet applied). None where the part varies from task to
    task (a ragged chunk of rows)."""
    import tvm

    trial = sch.copy()
    trial_reader = trial.get_sblock(sch.get(reader).name_hint)
    if prepare is not None:
        prepare(trial, trial_reader)
    trial_stage = trial.get_sblock(sch.get(stage).name_hint)
    task = trial.get_loops(trial_reader)[0]
    trial.compute_at(trial_stage, task, preserve_unit_loops=True)
    sizes = [trial.get(lp).extent for lp in trial.get_loops(trial_stage)[1:]]
    if not all(isinstance(e, tvm.tirx.IntImm) for e in sizes):
        return None
    whole = math.prod(int(d) for d in sch.get(stage).writes[0].source.shape)
    return math.prod(int(e) for e in sizes) * extent(trial, task) / whole


def sole_reader(sch, stage):
    """The one block that reads ``stage``, or None (none, or several)."""
    readers = sch.get_consumers(stage)
    return readers[0] if len(readers) == 1 else None


def in_task_repeat(sch, stage, reader, prepare=None) -> float | None:
    """:func:`task_repeat` where ``stage`` may move into the tasks of ``reader``: ``reader``
    is its only reader and the tasks' parts repeat the whole at most
    :data:`TASK_REPEAT_LIMIT` times; else None."""
    only = sole_reader(sch, stage)
    if only is None or sch.get(only).name_hint != sch.get(reader).name_hint:
        return None
    repeat = task_repeat(sch, stage, reader, prepare)
    return repeat if repeat is not None and repeat <= TASK_REPEAT_LIMIT else None


# Reduction steps per iteration of an innermost reduction loop (unrolled), where that loop has
# at least UNROLL_MIN_STEPS of them: a register tile's FMAs of one step sat beside the loop's
# increment, compare and branch (and a 28-step loop of DeconvGradFilter exited every 336
# cycles). A short loop (a grouped dx's 12 steps) would be all but unrolled away: 0.97x.
STEP_UNROLL = 4
UNROLL_MIN_STEPS = 16


def unroll_steps(sch, loop) -> bool:
    """Split the innermost reduction ``loop`` by :data:`STEP_UNROLL` and unroll the inner
    part, where that divides it and it has at least :data:`UNROLL_MIN_STEPS` steps. Returns
    whether it did."""
    steps = extent(sch, loop)
    if STEP_UNROLL < 2 or steps < UNROLL_MIN_STEPS or steps % STEP_UNROLL:
        return False
    sch.unroll(sch.split(loop, [None, STEP_UNROLL])[1])
    return True


def vectorize_split(sch, loop, factor: int):
    """Split ``loop`` by ``factor`` (when ``1 < factor < extent``) and vectorise the inner
    part (the whole loop when not split; nothing when only 1 long); returns
    ``(outer or None, inner)``."""
    outer = None
    if 1 < factor < extent(sch, loop):
        outer, loop = sch.split(loop, [None, factor])
    if extent(sch, loop) > 1:
        sch.vectorize(loop)
    return outer, loop


def vectorize_innermost(sch, block, lanes: int, split_above: int) -> None:
    """Vectorise a block's innermost loop of extent ``n``: split by ``lanes`` when ``n`` is a
    multiple of them above ``split_above``, else whole when ``1 < n <= 4*lanes``."""
    loop = sch.get_loops(block)[-1]
    n = extent(sch, loop)
    if n > split_above and n % lanes == 0:
        sch.vectorize(sch.split(loop, [None, lanes])[-1])
    elif 1 < n <= 4 * lanes:
        sch.vectorize(loop)


# ---------------------------------------------------------------------------- register tiles
def register_tile(sch, block, target, spatial: list, red: list, tiles: dict[int, int],
                  par: list[int], serial: list[int], red_inner: tuple = (),
                  dot_intrin: str | None = None, chunk: int = 0):
    """Tile a reduction block whose last spatial loop is the 16-wide lane axis.

    ``tiles`` maps spatial loop index -> inner tile size; the inner tiles and the lane axis go
    below every reduction loop in ``red``, so their accumulators stay in registers across the
    whole reduction. The outer parts of the spatial loops ``par`` are fused and run across
    cores, those of ``serial`` stay serial (in that order) between them and the reduction.
    Reduction loops also in ``red_inner`` go (unrolled) just above the tile, so loads that two
    unrolled (tap, position) pairs share become one load. ``dot_intrin``
    (:func:`schedules.intrinsics.dot_intrinsic`): the last reduction loop goes under the
    lanes and the two become one dot-product instruction.
    """
    outer = dict(enumerate(spatial[:-1]))
    inner = []
    for idx, size in tiles.items():
        if size > 1 and extent(sch, spatial[idx]) > 1:
            outer[idx], i = sch.split(spatial[idx], [None, size])
            inner.append(i)
    n_vec, lanes = c0_vectors(target)
    lane_o, lane_i = sch.split(spatial[-1], [n_vec, lanes])
    order_par = [outer[i] for i in par]
    order_ser = [outer[i] for i in serial]
    red_outer = [lp for lp in red if not any(lp is r for r in red_inner)]
    dot = [red_outer.pop()] if dot_intrin else []
    red_chunk, red_outer = red_outer[:chunk], red_outer[chunk:]
    sch.reorder(*order_par, *red_chunk, *order_ser, *red_outer, *red_inner, *inner, lane_o,
                lane_i, *dot)
    # parallel before decompose_reduction: the split init block would break compact dataflow
    fused = sch.fuse(*order_par) if len(order_par) > 1 else order_par[0]
    sch.parallel(fused)
    anchor = order_ser[-1] if order_ser and not red_chunk else fused
    wb = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(wb, anchor, preserve_unit_loops=True)
    for lp in [*red_inner, *inner]:
        sch.unroll(lp)
    sch.unroll(lane_o)
    if not dot:
        sch.vectorize(lane_i)
    init = sch.decompose_reduction(block, (red_chunk or red_outer or red)[0])
    if dot:
        tensorize_dot(sch, block, lane_i, init, fused, dot_intrin)
    last = sch.get_loops(wb)[-1]
    if extent(sch, last) > lanes and extent(sch, last) % lanes == 0:
        last = sch.split(last, [None, lanes])[-1]
    sch.vectorize(last)
    return wb, anchor


def tensorize_dot(sch, block, lane_i, init, outer_loop, intrin: str) -> None:
    """The lanes and the reduction loop under them become one ``intrin`` step; the init block
    is vectorised; an instruction that is an LLVM function is linked in at ``outer_loop``."""
    step = sch.blockize(lane_i)
    # the step keeps the tile block's annotations (its exact twin's link)
    for key, value in sch.get(block).annotations.items():
        sch.annotate(step, key, value)
    sch.tensorize(step, intrin)
    sch.vectorize(sch.get_loops(init)[-1])
    code = llvm_import(intrin)
    if code is not None:
        sch.annotate(outer_loop, "pragma_import_llvm", code)


# ---------------------------------------------------------------------------- elementwise
def elementwise(sch, block, target) -> None:
    """A channel-last data-parallel stage: the innermost axis split by whole registers
    (:func:`register_factor`) and vectorised, every outer loop fused and parallel."""
    loops = sch.get_loops(block)
    lanes = target.lanes("float32")
    outer = list(loops[:-1])
    split, inner = vectorize_split(sch, loops[-1], register_factor(extent(sch, loops[-1]),
                                                                   lanes))
    if split is not None:
        outer.append(split)
    if outer:
        parallel(sch, outer, target.cores)


# The buffer of a register tile computed in each task of a parallel loop: TVM serves a
# "global" buffer under 1 KiB from the stack, where LLVM keeps the tile in registers, and every
# "local" one from TVMBackendAllocWorkspace, an allocation and a free per task. Same-process
# A/B, 1 / 2 Zen 4 cores: a user's 8x512x14x14 depthwise window 1.57 / 1.81x, 8x1024x7x7
# 1.32 / 1.67x; the NC* depthwise dx 1.01-1.06 / 1.15-1.28x, its dw 0.98-1.06x. The long
# tasks of the contraction and reduction rules measured neutral and keep "local".
TASK_TILE_SCOPE = "global"
TRANSPOSE_TILE = 8  # an 8 x 8 block: 8 source lines serve 8 vectors (see transpose_tile)
PAD_PARTS = 8  # vector-wide parts of a padded transpose's interior, at most (_padded_transpose)


def _read_inner_loop(sch, block, loops) -> int | None:
    """Index in ``loops`` of the loop whose iterator alone makes the innermost index of the
    block's single read (``x[.., i]`` or a padded ``x[.., i - 1]``), else None."""
    import tvm_ffi
    from tvm.ir.prim.expr import Var

    blk = sch.get(block)
    if len(blk.reads) != 1 or len(blk.iter_vars) != len(loops) or not blk.reads[0].region:
        return None
    found: list = []
    tvm_ffi.structural_walk(blk.reads[0].region[-1].min, (Var, found.append), order="post")
    hits = [i for i, iv in enumerate(blk.iter_vars) if any(v.same_as(iv.var) for v in found)]
    return hits[0] if len(hits) == 1 else None


def _fusable_rows(sch, block, loops, u: int) -> bool:
    """The write axis is too short for a whole block and the axis outside it makes one run
    with it on both sides (``[.., h, w]`` written, ``[.., h, w, c]`` read, neither padded),
    so the two fuse into one write axis: an NHWC -> NCHW copy of 28-wide rows then takes
    8-lane blocks instead of 4 (a depthwise 8x192x28x28 stride-2 dx, whose output transpose
    is half its time, 1.16 -> 0.94 ms on one Zen 4 core)."""
    n_h, n_w = extent(sch, loops[-2]), extent(sch, loops[-1])
    if len(loops) < 3 or u >= len(loops) - 2 or _tile(n_h * n_w) <= _tile(n_w):
        return False
    blk = sch.get(block)
    h, w = (iv.var for iv in blk.iter_vars[-2:])
    read, write = blk.reads[0], blk.writes[0]

    def plain(region, dims) -> bool:
        return all(r.min.same_as(v) and int(r.extent) == 1
                   for r, v in zip([region.region[d] for d in dims], (h, w)))

    rd = len(read.region)
    return (len(blk.iter_vars) == len(loops) and plain(write, (-2, -1)) and rd >= 3
            and plain(read, (rd - 3, rd - 2)) and int(write.source.shape[-1]) == n_w
            and int(read.source.shape[rd - 2]) == n_w)


def _tile(n: int) -> int:
    """The transpose block along an axis of ``n``: the largest power of two up to
    ``TRANSPOSE_TILE`` dividing ``n`` (0 below 4: not worth a block)."""
    t = TRANSPOSE_TILE
    while t >= 4 and n % t:
        t //= 2
    return t if t >= 4 else 0


def transpose_tile(sch, block, target, depth: int = 0) -> bool:
    """A copy whose read is contiguous along another axis than its write (a layout
    transpose such as NCL -> NLC): blocks of up to ``TRANSPOSE_TILE`` squared, the write's
    axis vectorised and the read's unrolled, so a block's vectors gather from the same 8
    source lines while they are in L1, not from one line per element across the whole stride
    (an 8 MB NCL -> NLC copy: 8.1 ms -> 1.2 ms on one Zen 3 core; a padded one 8.8 ms -> 1.4
    ms). Each block's gathers are turned into row loads and register shuffles when the
    kernel is lowered (:mod:`dsl.runtime.transpose_pass`): a copy bound by its memory
    traffic gains little (a tensorized one ran 0.98-1.08x as fast on one Emerald Rapids
    core), a pack read from L2 inside a compute-bound kernel gains most. ``depth``: the
    block sits under that many loops of a parallel task (its own loops below them run on
    the task's core). Returns False (nothing changed) when the block is not such a copy or
    its write axis does not divide into blocks."""
    loops = sch.get_loops(block)[depth:]
    cores = 1 if depth else target.cores
    if len(loops) < 2 or spatial_count(sch, block) != len(loops):
        return False
    u = _read_inner_loop(sch, block, loops)
    if u is None or u == len(loops) - 1:
        return False
    if _fusable_rows(sch, block, loops, u):
        sch.fuse(loops[-2], loops[-1])
        loops = sch.get_loops(block)[depth:]
    # the unrolled read axis may leave a guarded tail (a padded pack's 1026 rows); the
    # vectorised write axis may not (a predicated vector is scalarised)
    nu = extent(sch, loops[u])
    tu = _tile(nu) or (TRANSPOSE_TILE if nu >= TRANSPOSE_TILE else 0)
    tv = _tile(extent(sch, loops[-1]))
    if tu and not tv:
        return _padded_transpose(sch, block, loops, u, tu, target, cores)
    if not tu or not tv:
        return False
    outer = [lp for i, lp in enumerate(loops[:-1]) if i != u]
    sch.reorder(*outer, loops[u], loops[-1])
    parallel(sch, [*outer, *transpose_blocks(sch, loops[u], loops[-1], tu, tv)], cores)
    return True


def _padded_transpose(sch, block, loops: list, u: int, tu: int, target, cores: int) -> bool:
    """:func:`transpose_tile` of a padded copy (``P = if_then_else(lo <= i < hi, .., 0)``)
    whose write axis divides into blocks only inside its padding (a few-channel dx's dy, W
    rows of 1 + 112 + 2): that loop partitioned at the pad's bounds, its interior (where the
    bounds test is gone and each vector is built from scalar loads) in parts of whole
    vectors (at most :data:`PAD_PARTS`; each part a loop of its own, as s_tir splits no loop
    that starts above 0), each vectorised below the read's loop (a 5HD source block's lines
    serve its 16 channels from L1), the borders plain. Vectorised with the test, every
    vector was a masked gather: the 7x7 stem dx's pad of dy was a quarter of its time, and
    this made the dx 1.09-1.15x / 1.13-1.24x faster on one / two Zen 4 cores (same-process
    A/B, two runs); the interior as one 112-lane vector ran as fast but took 1.7 s more to
    compile. The read's loop is unrolled in blocks of ``tu`` rows where they divide it, so
    the vectors of a block (each under the pad's row test) become row loads and register
    shuffles when lowered, not ``lanes`` scalar loads and inserts each (the stem dx 1.01 /
    1.02x on one / two Zen 4 cores, same-process A/B; the copy is bound by its memory
    traffic)."""
    from schedules.zero_taps import pad_bounds

    blk = sch.get(block)
    store = blk.body
    write_var = blk.iter_vars[-1].var
    axes = [i for i, idx in enumerate(getattr(store, "indices", [])) if idx.same_as(write_var)]
    n = extent(sch, loops[-1])
    lo, hi = pad_bounds(blk).get(axes[0], (None, None)) if axes else (None, None)
    lo, hi = max(0, lo or 0), min(n, n if hi is None else hi)
    tv = _tile(hi - lo) if hi > lo else 0
    if not tv or (lo, hi) == (0, n):
        return False
    outer = [lp for i, lp in enumerate(loops[:-1]) if i != u]
    sch.reorder(*outer, loops[-1], loops[u])
    lanes, inner = target.lanes("float32"), hi - lo
    width = next((w for w in range(lanes, inner + 1, lanes)
                  if inner % w == 0 and inner // w <= PAD_PARTS), inner)
    sizes = [s for s in (lo, *[width] * (inner // width), n - hi) if s]
    parts = sch.loop_partition(loops[-1], [*sizes[:-1], None])
    first = 1 if lo else 0
    for part in parts[first:first + inner // width]:
        middle = leaf_blocks(sch, part)[0]
        write, read = sch.get_loops(middle)[-2:]
        sch.reorder(read, write)
        if extent(sch, read) % tu == 0:  # runs of tu rows: transposed in registers
            sch.unroll(sch.split(read, [None, tu])[-1])
        sch.vectorize(write)  # s_tir splits no loop that starts above 0
    parallel(sch, outer, cores)
    return True


def transpose_blocks(sch, read_loop, write_loop, tu: int, tv: int) -> list:
    """Split two adjacent loops of a transposing copy (``read_loop`` outer, along the read's
    contiguous axis; ``write_loop`` inner, along the write's) into ``tu x tv`` blocks, the
    read's part unrolled and the write's vectorised (:func:`transpose_tile`). Returns the
    two block loops, outermost first."""
    uo, ui = sch.split(read_loop, [None, tu])
    vo, vi = sch.split(write_loop, [None, tv])
    sch.reorder(uo, vo, ui, vi)
    sch.unroll(ui)
    sch.vectorize(vi)
    return [uo, vo]


def transpose_tiles(n_read: int, n_write: int, ragged_read: bool = False) -> tuple[int, int]:
    """The block of :func:`transpose_blocks` for loops of ``n_read`` and ``n_write``: a power
    of two up to :data:`TRANSPOSE_TILE` dividing each (1 along the read, the whole loop along
    the write, where none of at least 4 does). ``ragged_read``: the read's unrolled loop may
    end in a guarded partial block (a padded pack's 258 rows), so it takes blocks of
    :data:`TRANSPOSE_TILE` where no power of two of at least 4 divides it."""
    read = _tile(n_read) or (TRANSPOSE_TILE if ragged_read and n_read >= TRANSPOSE_TILE else 1)
    return read, _tile(n_write) or n_write


def elementwise_c0(sch, block, target, outer: int = 3, run: int = 0) -> None:
    """A 5HD / FracZ data-parallel stage: the 16-wide C0 axis split into registers and
    vectorised (else a short innermost loop vectorised whole), up to ``outer`` outer loops
    parallel when the stage has at least :data:`PARALLEL_MIN_ELEMS` elements.

    ``run``: the C0 lanes come in runs of this many equal values (a grouped dx's regathered
    dy, :data:`dsl.ops.tag.LANE_RUN`), so each run is one scalar load broadcast into its lanes,
    the runs unrolled; or of this many lanes of one source block (:data:`dsl.ops.tag.
    SOURCE_RUN`), each run one contiguous vector load. Vectorised whole, every lane has its
    own index and LLVM built each vector from scalar loads and inserts: the regather was most
    of resnext_grouped_g32's dx (4 channels a group), which ran 1.46-1.57x faster this way
    on one Emerald Rapids core; dy re-blocked into AMX tile rows was 60% of an int8 1x1 dx
    (resnet50_1x1: 1.7-1.8x faster)."""
    loops = sch.get_loops(block)
    elems = extents(sch, loops)
    if run:
        runs, lanes = sch.split(loops[-1], [None, run])
        sch.unroll(runs)
        sch.vectorize(lanes)
    elif len(loops) >= 2 and extent(sch, loops[-1]) == C0:
        _, lanes = c0_vectors(target)
        sch.vectorize(sch.split(loops[-1], [None, lanes])[-1])
    else:
        vectorize_inner(sch, block)
    if elems >= PARALLEL_MIN_ELEMS and target.cores > 1:
        parallel_outer(sch, block, max_fuse=outer)
