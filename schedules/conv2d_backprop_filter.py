"""x86 schedule of ``conv2d_backprop_filter`` (dw).

dw is a GEMM per tap whose reduction is ``N*Ho*Wo``: ``acc[C1, KH, KW, C, 16]``, the last axis
the vector lane. A register tile of accumulators stays live across the reduction. Dense layers
tile ``C1 x C`` (one operand loaded as vectors, the other broadcast); grouped and depthwise
layers, whose C is tiny and whose both operands are vectors, tile ``C x KW (x KH)`` so each
loaded vector is reused across taps. Tile sizes come from the target's register file.

A dense layer whose tasks (C1 tile x a span of Cout, :func:`plan_chunks`) keep the cores busy
runs in reduction chunks of output rows whose x rows fit half of L1d: each task runs all its
tiles and taps over one chunk before the next, its accumulators for every tap in L1. Otherwise,
when the reduction's data does not fit the L2 cache, or the spatial axes are too few to keep
every core busy (grouped, depthwise, stem layers), the ``N*Ho`` rows are split into parts by
``rfactor``: each task runs all taps over one part, in chunks of rows that fit half of L1d
(:func:`part_rows`), writes a partial sum, and a small vectorised reduction adds the parts.

On a target with AMX a bfloat16 pair reduction runs as ``tdpbf16ps`` tile products instead
(:func:`amx_tiles`, :mod:`schedules.amx`): Cout as tile rows, 16 Cin lanes as columns, Wo
pairs as each product's depth.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import schedules
from dsl.ops import tag
from schedules import amx
from schedules.fallback import schedule_fallbacks
from schedules.intrinsics import dot_intrinsic
from schedules.toolbox import (
    BALANCE_MIN,
    C0,
    PARALLEL_MIN_ELEMS,
    balance,
    c0_vectors,
    divisors,
    elementwise_c0,
    extent,
    extents,
    in_task_repeat,
    largest_divisor,
    parallel_outer,
    register_tile,
    sharing_choice,
    sole_reader,
    split_loops,
    tile_factor,
    vector_registers,
    vectorize_split,
)

RULE = "x86 dw register tile"


def _buffer_bytes(region) -> int:
    buf = region.source
    bits = {"float16": 16, "bfloat16": 16, "float32": 32}.get(str(buf.dtype), 32)
    return math.prod(int(d) for d in buf.shape) * bits // 8


def dw_tiles(sch, block, target, grouped: bool) -> dict[int, int]:
    """Inner tile per spatial loop index of ``acc[C1, KH, KW, C, 16]``."""
    c1, kh, kw, co = (extent(sch, lp) for lp in sch.get_loops(block)[:4])
    n_vec, _ = c0_vectors(target)
    regs = vector_registers(target)
    if not grouped:
        def fits(c, t):
            # accumulators + the vector rows of the tile + one broadcast per channel
            return c * t * n_vec + c * n_vec + t <= regs

        best = (0, 1, 1)
        for c1_t in (1, 2, 4):
            if c1 % c1_t or not fits(c1_t, 1):
                continue
            co_t = tile_factor(co, max(t for t in range(1, regs) if fits(c1_t, t)))
            # most accumulators wins; ties go to the smaller C1 tile (fewer vector loads)
            best = max(best, (c1_t * co_t, -c1_t, co_t))
        return {0: -best[1], 3: best[2]}

    def fits_g(h, w, c):
        # accumulators + one x vector per tap + one dy vector per channel
        return (h * w * c + h * w + c) * n_vec <= regs

    co_t = tile_factor(co, max(t for t in range(1, co + 1) if t == 1 or fits_g(1, 1, t)))
    kw_t = max(t for t in range(1, kw + 1) if t == 1 or fits_g(1, t, co_t))
    kh_t = max(t for t in range(1, kh + 1) if t == 1 or fits_g(t, kw_t, co_t))
    return {1: kh_t, 2: kw_t, 3: co_t}


def parallel_parts(tasks: int, cores: int) -> int:
    """rfactor parts that, times ``tasks``, share out evenly over ``cores``: the fewest from
    one task per core up whose :func:`schedules.toolbox.balance` reaches
    :data:`BALANCE_MIN`, else the best balanced up to four tasks per core (the fewest on a
    tie). Every part beyond that writes and reads one more partial sum and re-reads its rows'
    halo: the RGB stem dw (one task) on the lent 16-core Xeon, same-process, ran 1.43-1.45x
    faster in 16 parts than in 64 (28: 1.20-1.27x, 112: 0.76x); on 8 threads 8 parts beat
    32 by 1.22x."""
    most = max(1, math.ceil(4 * cores / tasks))
    least = min(most, math.ceil(cores / tasks))
    return sharing_choice(range(least, most + 1), lambda p: p * tasks, cores, balance)[0]


def reduction_chunks(sch, block, target, tiles: dict[int, int]) -> int:
    """How many chunks of the ``N*Ho`` rows to rfactor (1: none)."""
    loops = sch.get_loops(block)
    c1, kh, kw, co = (extent(sch, lp) for lp in loops[:4])
    rows = extent(sch, loops[5]) * extent(sch, loops[6])
    data = sum(_buffer_bytes(r) for r in sch.get(block).reads)
    acc = _buffer_bytes(sch.get(block).writes[0])
    need_cache = math.ceil(data / (target.l2_kib * 1024 / 2))
    # tasks left when the taps become serial inside each chunk
    tasks = math.ceil(c1 / tiles.get(0, 1)) * math.ceil(co / tiles.get(3, 1))
    need_par = parallel_parts(tasks, target.cores)
    # partial sums cost a write and a read of acc per chunk: keep that small next to the data
    cap = max(1, data // (4 * acc))
    chunks = min(max(need_cache, need_par), cap)
    if tasks < 2 * target.cores:
        chunks = max(chunks, need_par)
    return max(1, min(chunks, rows))


# The share of L1d a task's accumulator block may take (every tap x its Cout span, loaded and
# stored by each register tile once per reduction chunk), and the share one chunk's x rows
# may take (read by every tile and tap of the task while the chunk lasts).
ACC_L1_SHARE = 0.5
X_L1_SHARE = 0.5


@dataclass(frozen=True)
class Chunks:
    """A dense dw run chunk by chunk: each task (C1 tile x ``span`` Cout) keeps its
    accumulators for every tap in L1 and runs all its register tiles and taps over ``rows``
    output rows (a chunk of the reduction, its x rows in L1) before the next chunk, instead
    of each tile and tap streaming the whole reduction from L2 (resnet50 3x3 dw 1.08-1.14x,
    batch-8 14x14 256 channels 1.10-1.13x, same-process A/B on one Emerald Rapids core)."""

    span: int
    rows: int

    def describe(self) -> str:
        return f"tasks of {self.span} Cout, {self.rows}-row reduction chunks in L1"


def _vertical_steps(params: dict) -> tuple[int, int]:
    """(stride, dilation) along H from the operator's parameters (1, 1 where absent: the row
    counts below then leave out the taps' halo, a smaller chunk, never a wrong result)."""
    return params.get("strides", [1])[0], params.get("dilations", [1, 1, 1])[2]


def _dilated_w(params: dict) -> bool:
    """Whether the taps are dilated along W (the operator's parameters; no where absent)."""
    return params.get("dilations", [1, 1, 1, 1])[3] > 1


def plan_chunks(sch, block, target, tiles: dict[int, int], params: dict) -> Chunks | None:
    """:class:`Chunks` for a dense 5HD dw accumulator ``[C1, KH, KW, CO, 16]`` over
    ``(n, ho, wo)``, or None (then :func:`reduction_chunks` splits it): the widest Cout span
    (a multiple of the register tile dividing CO) whose accumulator block fits
    :data:`ACC_L1_SHARE` of L1d and whose tasks keep the cores busy
    (:func:`schedules.toolbox.task_share`); the most output rows (a divisor of Ho) whose x
    rows fit :data:`X_L1_SHARE`, at least one."""
    loops = sch.get_loops(block)
    c1, kh, kw, co = (extent(sch, lp) for lp in loops[:4])
    ho = extent(sch, loops[6])
    c1_t, co_t = tiles.get(0, 1), tiles.get(3, 1)
    if co % co_t:
        return None
    l1 = target.l1d_kib * 1024
    per_tile = c1_t * kh * kw * co_t * C0 * 4  # one register tile's accumulators, every tap
    spans = [co_t * d for d in divisors(co // co_t) if d * per_tile <= l1 * ACC_L1_SHARE]
    spans = spans or [co_t]
    span, share = sharing_choice(reversed(spans), lambda s: c1 // c1_t * (co // s),
                                 target.cores)
    if share < BALANCE_MIN:
        return None
    # x and dy are both [N, C1, rows, columns, 16]; x has the padded (larger) plane
    x = max((r.source for r in sch.get(block).reads if len(r.source.shape) == 5
             and r.source.name != sch.get(block).name_hint),
            key=lambda b: int(b.shape[2]) * int(b.shape[3]))
    stride, dil = _vertical_steps(params)
    row_bytes = c1_t * int(x.shape[3]) * C0 * x.dtype.bits // 8

    def x_rows(r):
        return (r - 1) * stride + (kh - 1) * dil + 1

    fit = [d for d in divisors(ho) if x_rows(d) * row_bytes <= l1 * X_L1_SHARE]
    return Chunks(span, max(fit, default=1))


def part_rows(sch, rf, target, params: dict) -> int:
    """Output rows per reduction chunk of an rfactor part ``rf`` (rows of ``N*Ho`` x Wo): the
    most (a divisor of the part's rows) whose rows of every operand, all their channels,
    fit :data:`X_L1_SHARE` of L1d, at least one; 0 when one chunk is the whole part. Every
    tap then runs over a chunk still in L1 instead of streaming the whole part from L2 (the
    RGB stem's 49 taps, Cout in the lanes: 1.11x on one Emerald Rapids core, a chunk of one
    output row; 1.04x at two rows, 0.96x at seven)."""
    _, kh, *_, n_rows, _ = (extent(sch, lp) for lp in sch.get_loops(rf))  # C1, KH, .., Wo
    stride, dil = _vertical_steps(params)
    per_row = []  # (bytes of one row of the operand, True when it has the taps' halo)
    for r in sch.get(rf).reads:
        buf = r.source
        if buf.name == sch.get(rf).name_hint or len(buf.shape) < 4:
            continue
        row = math.prod(int(d) for d in buf.shape) // int(buf.shape[0]) // int(buf.shape[2])
        per_row.append((row * buf.dtype.bits // 8, int(buf.shape[2]) > n_rows))
    budget = target.l1d_kib * 1024 * X_L1_SHARE

    def chunk_bytes(h):
        x_rows = (h - 1) * stride + (kh - 1) * dil + 1
        return sum(b * (x_rows if halo else h) for b, halo in per_row)

    fit = max((d for d in divisors(n_rows) if chunk_bytes(d) <= budget), default=1)
    return 0 if fit == n_rows else fit


# Output columns per step of a chunked dw's innermost loop (unrolled): the loop body was one
# column's 16 FMAs beside its 10 loads and 3 loop instructions; two columns per step halve
# that overhead and give the core two columns' loads to run ahead on. Same-process A/B, one
# and two Emerald Rapids cores, 41 rounds of alternate calls: resnet50 3x3 1.01-1.04x, its
# stride-2 layer 1.04-1.07x, the 1x1 layers 1.01-1.03x, batch-8 14x14 1.02-1.04x, a 32x32
# layer 1.01-1.04x. Not along a dilated W: the 32x32 dilation-2 layer ran 0.91-0.97x, a 56x56
# one 1.00x (measured, not explained).
POSITION_UNROLL = 2


def schedule_in_chunks(sch, block, target, tiles: dict[int, int], ch: Chunks,
                       unroll: int = 1) -> None:
    """Tile ``block`` as :class:`Chunks` ``ch`` says: tasks (C1 tile, Cout span) across cores;
    per chunk of (image, ``ch.rows`` output rows) every Cout tile and tap of the task, each
    tile's accumulators loaded and stored once per chunk
    (:func:`schedules.toolbox.register_tile`'s ``chunk``); the output columns ``unroll`` at
    a time (:data:`POSITION_UNROLL`) where that divides them."""
    cx1, kh, kw, co, cx0 = sch.get_loops(block)[:5]
    n, ho, wo = sch.get_loops(block)[5:8]
    co_task, co_rest = sch.split(co, [None, ch.span])
    ho_o, ho_i = sch.split(ho, [None, ch.rows])
    red, unrolled = [n, ho_o, ho_i, wo], ()
    if unroll > 1 and extent(sch, wo) % unroll == 0:
        wo_o, wo_i = sch.split(wo, [None, unroll])
        red, unrolled = [n, ho_o, ho_i, wo_o, wo_i], (wo_i,)
    register_tile(sch, block, target, [cx1, kh, kw, co_task, co_rest, cx0],
                  red, {0: tiles.get(0, 1), 4: tiles[3]}, par=[0, 3],
                  serial=[4, 1, 2], chunk=2, red_inner=unrolled)


def exact_chunks(rows: int, chunks: int) -> int:
    """The divisor of ``rows`` nearest ``chunks`` (the smaller on a tie)."""
    return min(divisors(rows), key=lambda d: (abs(d - chunks), d))


def schedule_acc(sch, block, target, grouped: bool, params: dict) -> str:
    """Register-tile one dw accumulator: in :class:`Chunks` where :func:`plan_chunks` finds
    them, else the whole reduction under each tile, split across cores by ``rfactor`` when
    :func:`reduction_chunks` says so, each part in chunks of :func:`part_rows` rows. Returns
    what it did, for the note.
    A bfloat16 pair reduction (``dw_acc`` over ``(n, ho, wo2, wo_dot)``) runs its last axis
    in the target's dot-product instruction where it has one (:func:`dot_intrinsic`)."""
    tiles = dw_tiles(sch, block, target, grouped)
    dot = dot_intrinsic(sch, block, target)
    plain = not grouped and dot is None and len(sch.get_loops(block)) == 8
    ch = plan_chunks(sch, block, target, tiles, params) if plain else None
    if ch is not None:
        unroll = 1 if _dilated_w(params) else POSITION_UNROLL
        schedule_in_chunks(sch, block, target, tiles, ch, unroll)
        return ch.describe()
    chunks = reduction_chunks(sch, block, target, tiles)
    if dot is not None and chunks > 1:
        # a chunk split that is not exact leaves a predicate blockize cannot take
        loops = sch.get_loops(block)
        chunks = exact_chunks(extent(sch, loops[5]) * extent(sch, loops[6]), chunks)
    if chunks <= 1:
        spatial, red = split_loops(sch, block)
        register_tile(sch, block, target, spatial, red, tiles, par=[0, 1, 2, 3], serial=[],
                      dot_intrin=dot)
        return ""
    spatial, (rn, rh, *_) = split_loops(sch, block)
    rows = sch.fuse(rn, rh)
    r_o, r_i = sch.split(rows, [chunks, None])
    rf = sch.rfactor(r_o, factor_axis=0)
    # rf block: spatial (chunk, C1, KH, KW, C, lane), reduction (rows of the chunk, Wo)
    cx1, kh, kw, co, lane, chunk, *rf_red = sch.get_loops(rf)
    rf_tiles = {i + 1: t for i, t in tiles.items()}
    hs = part_rows(sch, rf, target, params) if dot is None and len(rf_red) == 2 else 0
    if hs:  # each task's taps over chunks of hs rows, not each tap over the whole part
        rf_red = [*sch.split(rf_red[0], [None, hs]), rf_red[1]]
    register_tile(sch, rf, target, [chunk, cx1, kh, kw, co, lane], rf_red, rf_tiles,
                  par=[0, 1, 4], serial=[2, 3], dot_intrin=dot_intrinsic(sch, rf, target),
                  chunk=1 if hs else 0)
    # the chunk sum: lane axis vectorised below the chunk loop
    c1, kh, kw, co, lane, r = sch.get_loops(block)
    sch.reorder(r, lane)
    _, lanes = c0_vectors(target)
    lane_i = sch.split(lane, [None, lanes])[-1]
    sch.vectorize(lane_i)
    # what the sum reads (every chunk's partials), not what it writes: 64 chunks of a 1x1
    # layer's 64 x 256 weights left serial were a third of its time on 64 cores (static model,
    # dsl/runtime/scaling.py)
    if extents(sch, (c1, kh, kw, co, r)) * C0 >= PARALLEL_MIN_ELEMS:
        sch.parallel(sch.fuse(c1, kh, kw))
    sch.decompose_reduction(block, r)
    return f"N*Ho rows in {chunks} rfactor chunks" + (f" of {hs}-row chunks" if hs else "")


def amx_tiles(sch, workload, block, target) -> str | None:
    """AMX tiles for a bfloat16 pair reduction ``dw_acc [C1x, KH, KW, CO, 16]`` over ``(n, ho,
    wo2, pair)`` where the target has them (:mod:`schedules.amx`): Cout as tile rows (A: dy
    pairs, a row per channel), C1x blocks as the tiles' 16 lanes (B: x pairs, a row per Wo
    pair), Wo pairs as the tile product's ``K`` in rows of up to 16, every position under the
    tile; the (C1x tiles, KH, KW) tasks across cores. None (nothing done) where the
    instruction does not apply, else the note."""
    ins = amx.instruction(sch, block, target)
    spatial, red = split_loops(sch, block)
    if ins is None or len(spatial) != 5 or len(red) != 4:
        return None
    cx1, kh, kw, co, cx0 = spatial
    k = largest_divisor(extent(sch, red[2]), amx.K_GROUPS)
    sch.split(red[2], [None, k])
    _dy_rows_by_k(sch, workload, block, k)
    one_tap = extent(sch, kh) * extent(sch, kw) == 1
    t = amx.tile_reduction(sch, block, co, cx0, cx1, [cx1, kh, kw], target.cores)
    note = (f"AMX {ins.llvm.rsplit('.', 1)[-1]}: {t.mt}x{t.nt} accumulator tiles of "
            f"{t.rows} Cout x 16 lanes, Wo pairs {k} per tile row, every position under them")
    if one_tap:
        _x_pairs_per_task(sch, workload, block)
        note += "; each task pairs its own x channels"
    return note


def _x_pairs_per_task(sch, workload, block) -> None:
    """``dw_x_pair`` computed in each task (a block of x channels; a 1x1 layer has no tap to
    share them) just before its tiles read it, from L2, instead of all of x paired first
    (as large as x: out of L2 by the time the tiles come to it)."""
    loops = sch.get_loops(block)
    tiles = next(i for i, lp in enumerate(loops) if amx.ANNOTATION in sch.get(lp).annotations)
    pair = workload.find(sch, tag.DW_X_PAIR)
    sch.compute_at(pair, loops[tiles - 1], preserve_unit_loops=True)


def _dy_rows_by_k(sch, workload, block, k: int) -> None:
    """``dy_pair [N, CO, Ho, Wo/2, 2]`` laid out ``[N, Ho, Wo/2/k, CO, k, 2]``: an A tile (a
    row of ``k`` Wo pairs per Cout) is then one contiguous block, not 16 rows a channel's
    whole ``Ho x Wo`` apart (each row a cache line or two of its own, in L2)."""
    pairs = sch.get(workload.find(sch, tag.DW_DY_PAIR)).writes[0].source
    idx = next(i for i, r in enumerate(sch.get(block).reads) if r.source.same_as(pairs))
    sch.transform_layout(block, ("read", idx),
                         lambda n, co, ho, w2, j: (n, ho, w2 // k, co, w2 % k, j))


def _x_pad_rows_outer(sch, block) -> None:
    """The planar ``x_pad [N, Cin, Hp, Wp]`` (Cout in the lanes: few input channels) written
    row by row, every channel of a row before the next: its source is 5HD, where one cache
    line holds a pixel's channels, so each line is fetched once for all of them instead of
    once per channel plane (the RGB stem: 3 passes over a 3.2 MB x; its dw 1.07x on one
    EMR core, same-process A/B)."""
    loops = sch.get_loops(block)
    if len(loops) == 4:  # b, ci, hp, wp (5HD pads have the C0 axis too)
        sch.reorder(loops[2], loops[1])


@schedules.register(tag.CONV2D_BACKPROP_FILTER, "x86")
def schedule_dw_x86(sch, workload) -> None:
    target = workload.target
    grouped = tag.DW_DY_GROUP in workload.stages
    params = json.loads(workload.attrs.get("dsl_params", "{}"))
    in_place = grouped and _dy_group_is_dy(params)
    if in_place:
        block = workload.find(sch, tag.DW_DY_GROUP)
        workload.note(sch.get(block).name_hint, RULE, "inlined: the depthwise regather is dy "
                      "itself, read in place")
        sch.compute_inline(block)
    for acc in workload.find_all(sch, tag.DW_ACC):
        name = sch.get(acc).name_hint  # before decompose_reduction renames it
        tiles = amx_tiles(sch, workload, acc, target)
        if tiles is not None:
            workload.note(name, RULE, tiles)
            continue
        done = schedule_acc(sch, acc, target, grouped, params)
        workload.note(name, RULE, ("C x KW x KH" if grouped else "C1 x C") + " tile of C0 lanes"
                      + (f", {done}" if done else ""))
    padded_in_task = grouped and _x_pad_in_task(sch, workload)
    for stage in (tag.DW_X_PAD, tag.DW_DY_GROUP, tag.DW_DY_CAST, tag.CONV2D_BACKPROP_FILTER):
        if (in_place and stage == tag.DW_DY_GROUP) or (padded_in_task and stage == tag.DW_X_PAD):
            continue
        block = workload.find(sch, stage)
        if block is not None:
            if stage == tag.DW_X_PAD:
                _x_pad_rows_outer(sch, block)
            elementwise_c0(sch, block, target)
            workload.note(sch.get(block).name_hint, RULE, "elementwise 5HD stage")
    block = workload.find(sch, tag.DW_X_PAIR)
    if block is not None:
        interleave_stage(sch, block, target)
        workload.note(sch.get(block).name_hint, RULE,
                      "interleave: each x column's 16 lanes read as a vector, the pair unrolled")
    block = workload.find(sch, tag.DW_DY_PAIR)
    if block is not None:
        transpose_stage(sch, block, target)
        workload.note(sch.get(block).name_hint, RULE,
                      "transpose: dy's 16 channel lanes read as a vector, stored per channel row")
    schedule_fallbacks(sch, workload, tag.CONV2D_BACKPROP_FILTER, RULE)


def _x_pad_in_task(sch, workload) -> bool:
    """A grouped dw's ``x_pad`` computed inside each task of the one block that reads it (its
    parallel loop): the task's rows of x, padded into cache just before its taps read them,
    instead of a pass of its own that writes all of x_pad to memory for the tasks to read
    back (one / two Emerald Rapids cores, same-process A/B, 41 rounds: mobilenet_dw_s1 dw
    1.37-1.39x / 1.46-1.49x, mobilenet_dw_s2 1.73-1.75x / 1.55-1.74x, resnext_grouped_g32
    1.067x / 1.048x; the RGB stem's planar pad, Cout in the lanes, ran 0.97x, so dense
    layers keep the pass). Only where the tasks' rows together repeat at most
    :data:`schedules.toolbox.TASK_REPEAT_LIMIT` times the whole pad
    (:func:`schedules.toolbox.task_repeat`: tasks that are taps would each pad every row).
    Returns whether it moved the pad."""
    import tvm

    pad = workload.find(sch, tag.DW_X_PAD)
    reader = sole_reader(sch, pad) if pad is not None else None
    if reader is None:
        return False
    task = sch.get_loops(reader)[0]
    if sch.get(task).kind != tvm.tirx.ForKind.PARALLEL or in_task_repeat(
            sch, pad, reader) is None:
        return False
    sch.compute_at(pad, task, preserve_unit_loops=True)
    _, lanes = c0_vectors(workload.target)
    vectorize_split(sch, sch.get_loops(pad)[-1], lanes)
    workload.note(sch.get(pad).name_hint, RULE, "x padded in each task (its rows, in cache)")
    return True


def _dy_group_is_dy(params: dict) -> bool:
    """Whether ``dy_group`` (dy regathered per x lane, :func:`dsl.ops.conv2d_backprop_filter.
    dy_stage`) reads dy at its own index: one input and one output channel per group (a
    depthwise layer of multiplier 1) and whole C0 blocks of them. Then the copy is inlined
    and the reduction reads dy's vectors in place (mobilenet_dw_s1 dw 1.54x on one Emerald
    Rapids core, mobilenet_dw_s2 1.20x; same-process A/B, 41 rounds of alternate calls),
    where a layer of several channels per group must keep it (resnext_grouped_g32, 4 per
    group: 0.30x inlined, each lane a gather)."""
    sizes, groups = params.get("filter_sizes"), params.get("groups", 1)
    if not sizes or groups == 1:
        return False
    cout, cin_g = sizes[0], sizes[1]
    return cin_g == 1 and cout == groups and groups % C0 == 0


def transpose_stage(sch, block, target) -> None:
    """``dy_pair [N, CO, Ho, Wo/2, 2]`` from dy's ``[N, C1, Ho, Wo, 16]``: a transpose of each
    row's ``Wo x 16`` block. Vectorised along the positions (the output's contiguous axis)
    it loads every element on its own from a stride of 16 (a chain of inserts); vectorised
    along the 16 channels (the input's contiguous axis) it loads one vector per position and
    stores its lanes to the 16 channel rows."""
    n, co, ho, w2, pair = sch.get_loops(block)
    c1, c0 = sch.split(co, [None, C0])
    sch.reorder(n, c1, ho, w2, pair, c0)
    sch.vectorize(c0)
    _parallel_rows(sch, block, target)


def interleave_stage(sch, block, target) -> None:
    """``x_pair [N, C1x, Hr, Wr, 16, 2]``: lane ``c`` of column ``q`` holds a pair of x's
    columns ``stride`` apart. Vectorised across (lanes, pair) the columns alternate element by
    element, which LLVM loads one at a time (inserts); with the pair unrolled outside the
    lanes each column is one vector load, stored to every other element."""
    q, c0, pair = sch.get_loops(block)[-3:]
    sch.reorder(q, pair, c0)
    sch.unroll(pair)
    sch.vectorize(c0)
    _parallel_rows(sch, block, target)


def _parallel_rows(sch, block, target) -> None:
    """A pair stage's rows (its first three loops: image, channel block, row) across cores,
    when it is large enough to pay for them and not already inside a parallel task."""
    import tvm

    loops = sch.get_loops(block)
    if any(sch.get(lp).kind == tvm.tirx.ForKind.PARALLEL for lp in loops):
        return
    if extents(sch, loops) >= PARALLEL_MIN_ELEMS and target.cores > 1:
        parallel_outer(sch, block, max_fuse=3)
