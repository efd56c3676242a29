"""x86 schedule of ``conv2d_backprop_filter`` (dw).

dw is a GEMM per tap whose reduction is ``N*Ho*Wo``: ``acc[C1, KH, KW, C, 16]``, the last axis
the vector lane. A register tile of accumulators stays live across the reduction. Dense layers
tile ``C1 x C`` (one operand loaded as vectors, the other broadcast); grouped and depthwise
layers, whose C is tiny and whose both operands are vectors, tile ``C x KW (x KH)`` so each
loaded vector is reused across taps. Tile sizes come from the target's register file.

When the reduction's data does not fit the L2 cache, or the spatial axes are too few to keep
every core busy (grouped, depthwise, stem layers), the ``N*Ho`` rows are split into chunks by
``rfactor``: each task runs all taps over one chunk that stays in cache, writes a partial sum,
and a small vectorised reduction adds the chunks.
"""

from __future__ import annotations

import math

import schedules
from dsl.ops import tag
from schedules.fallback import schedule_fallbacks
from schedules.intrinsics import dot_intrinsic
from schedules.toolbox import (
    C0,
    PARALLEL_MIN_ELEMS,
    c0_vectors,
    divisors,
    elementwise_c0,
    extent,
    extents,
    parallel_outer,
    register_tile,
    split_loops,
    tile_factor,
    vector_registers,
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
    need_par = math.ceil(4 * target.cores / tasks)
    # partial sums cost a write and a read of acc per chunk: keep that small next to the data
    cap = max(1, data // (4 * acc))
    chunks = min(max(need_cache, need_par), cap)
    if tasks < 2 * target.cores:
        chunks = max(chunks, need_par)
    return max(1, min(chunks, rows))


def exact_chunks(rows: int, chunks: int) -> int:
    """The divisor of ``rows`` nearest ``chunks`` (the smaller on a tie)."""
    return min(divisors(rows), key=lambda d: (abs(d - chunks), d))


def schedule_acc(sch, block, target, grouped: bool) -> int:
    """Register-tile one dw accumulator; returns the number of rfactor chunks (1: none).
    A bfloat16 pair reduction (``dw_acc`` over ``(n, ho, wo2, wo_dot)``) runs its last axis
    in the target's dot-product instruction where it has one (:func:`dot_intrinsic`)."""
    tiles = dw_tiles(sch, block, target, grouped)
    chunks = reduction_chunks(sch, block, target, tiles)
    dot = dot_intrinsic(sch, block, target)
    if dot is not None and chunks > 1:
        # a chunk split that is not exact leaves a predicate blockize cannot take
        loops = sch.get_loops(block)
        chunks = exact_chunks(extent(sch, loops[5]) * extent(sch, loops[6]), chunks)
    if chunks <= 1:
        spatial, red = split_loops(sch, block)
        register_tile(sch, block, target, spatial, red, tiles, par=[0, 1, 2, 3], serial=[],
                      dot_intrin=dot)
        return 1
    spatial, (rn, rh, *_) = split_loops(sch, block)
    rows = sch.fuse(rn, rh)
    r_o, r_i = sch.split(rows, [chunks, None])
    rf = sch.rfactor(r_o, factor_axis=0)
    # rf block: spatial (chunk, C1, KH, KW, C, lane), reduction (rows of the chunk, Wo)
    cx1, kh, kw, co, lane, chunk, *rf_red = sch.get_loops(rf)
    rf_tiles = {i + 1: t for i, t in tiles.items()}
    register_tile(sch, rf, target, [chunk, cx1, kh, kw, co, lane], rf_red, rf_tiles,
                  par=[0, 1, 4], serial=[2, 3], dot_intrin=dot_intrinsic(sch, rf, target))
    # the chunk sum: lane axis vectorised below the chunk loop
    c1, kh, kw, co, lane, r = sch.get_loops(block)
    sch.reorder(r, lane)
    _, lanes = c0_vectors(target)
    lane_i = sch.split(lane, [None, lanes])[-1]
    sch.vectorize(lane_i)
    if extents(sch, (c1, kh, kw, co)) * C0 >= PARALLEL_MIN_ELEMS:
        sch.parallel(sch.fuse(c1, kh, kw))
    sch.decompose_reduction(block, r)
    return chunks


@schedules.register(tag.CONV2D_BACKPROP_FILTER, "x86")
def schedule_dw_x86(sch, workload) -> None:
    target = workload.target
    grouped = tag.DW_DY_GROUP in workload.stages
    for acc in workload.find_all(sch, tag.DW_ACC):
        name = sch.get(acc).name_hint  # before decompose_reduction renames it
        chunks = schedule_acc(sch, acc, target, grouped)
        workload.note(name, RULE,
                      ("C x KW x KH" if grouped else "C1 x C") + " tile of C0 lanes"
                      + (f", N*Ho rows in {chunks} rfactor chunks" if chunks > 1 else ""))
    for stage in (tag.DW_X_PAD, tag.DW_DY_GROUP, tag.DW_DY_CAST, tag.CONV2D_BACKPROP_FILTER):
        block = workload.find(sch, stage)
        if block is not None:
            elementwise_c0(sch, block, target)
            workload.note(sch.get(block).name_hint, RULE, "elementwise 5HD stage")
    for stage in (tag.DW_X_PAIR, tag.DW_DY_PAIR):
        block = workload.find(sch, stage)
        if block is not None:
            pair_stage(sch, block, target)
            workload.note(sch.get(block).name_hint, RULE, "pair stage: lanes x pair vectorised")
    schedule_fallbacks(sch, workload, tag.CONV2D_BACKPROP_FILTER, RULE)


def pair_stage(sch, block, target) -> None:
    """``x_pair [.., 16, 2]`` / ``dy_pair [.., 2]``: the innermost axes fused into one
    vector of up to 64 bytes, the outer loops across cores."""
    loops = sch.get_loops(block)
    inner = loops[-1]
    if extent(sch, loops[-2]) * extent(sch, inner) <= 32:
        inner = sch.fuse(loops[-2], inner)
    sch.vectorize(inner)
    if extents(sch, sch.get_loops(block)) >= PARALLEL_MIN_ELEMS and target.cores > 1:
        parallel_outer(sch, block, max_fuse=3)
