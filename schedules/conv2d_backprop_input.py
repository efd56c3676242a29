"""x86 schedule of ``conv2d_backprop_input`` (dx).

The compute already splits a strided dx by output phase (one ``dx_acc*`` block per phase, taps
that hit only), so every block here is a plain direct convolution ``[N, C1x, Hq, Wq, 16]`` in
the NCHWc style: the 16-wide C0 axis is the vector lane (one AVX-512 fp32 register, two AVX2,
four SSE); a tile of ``C1x`` blocks x ``Wq`` positions stays in registers for the whole
reduction (``cache_write`` into a local buffer that LLVM promotes once the tile is unrolled);
dy is broadcast from the padded copy made once; the rows ``(N, C1x tiles, Hq)`` run across
cores. Grouped layers load dy as regathered vectors instead, one C1x block per tile, with the
KW taps unrolled beside the positions so a dy vector feeds every tap that reads it. Layers with
few input channels (``dx_acc_w*``) vectorise W positions instead and broadcast the weight.
Tile sizes come from the target's register file; no target is named here. With one stride
phase the anchor ``dx`` (and any epilogue fused into it) is computed in the register tile's
write-back (:func:`schedules.fusion.write_from_tile`): no round trip through ``dx_acc``.
"""

from __future__ import annotations

import schedules
from dsl.ops import tag
from schedules import fusion
from schedules import toolbox as tb
from schedules.fallback import schedule_fallbacks
from schedules.intrinsics import dot_intrinsic

RULE = "x86 dx register tile"


def dx_positions_tile(sch, block, target) -> None:
    """Register tile of ``dx_acc_w`` ``[N, Cin, Hq, Wq]`` (few input channels): every input
    channel x a few vectors of W positions; dy rows load as (unaligned) vectors, the weight
    is broadcast per (channel, tap, output channel)."""
    b, ci, qh, qw, *red = sch.get_loops(block)
    lanes = target.lanes("float32")
    regs = tb.vector_registers(target)
    cin, nqw = tb.extent(sch, ci), tb.extent(sch, qw)
    ci_t = max(c for c in range(1, min(cin, 4) + 1) if cin % c == 0)
    # accumulators + the dy vectors of the tile + one broadcast weight per channel
    n_vec = max(v for v in range(1, regs) if v == 1 or ci_t * v + v + ci_t <= regs)
    vw = lanes * tb.tile_factor(-(-nqw // lanes), n_vec) if nqw > lanes else nqw
    qw_o, qw_i = sch.split(qw, [None, vw])
    ci_o, ci_i = sch.split(ci, [None, ci_t])
    sch.reorder(b, qh, ci_o, qw_o, *red, ci_i, qw_i)
    sch.parallel(sch.fuse(b, qh, ci_o))
    wb = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(wb, qw_o, preserve_unit_loops=True)
    sch.unroll(ci_i)
    if vw > lanes:
        qw_v, qw_l = sch.split(qw_i, [None, lanes])
        sch.unroll(qw_v)
        sch.vectorize(qw_l)
    else:
        sch.vectorize(qw_i)
    sch.decompose_reduction(block, red[0])
    last = sch.get_loops(wb)[-1]
    if tb.extent(sch, last) > lanes:
        last = sch.split(last, [None, lanes])[-1]
    sch.vectorize(last)


def dx_acc_tiles(sch, block, target):
    """Register tile of one dx phase: C1x blocks x Wq positions x the lane axis."""
    loops = sch.get_loops(block)
    c1x, wq = tb.extent(sch, loops[1]), tb.extent(sch, loops[3])
    n_vec, _ = tb.c0_vectors(target)
    regs = tb.vector_registers(target)

    def fits(c, t):
        if per_lane:
            # accumulators + every dy vector of the tile's row of taps + a weight per tap
            taps = tb.extent(sch, red[1])
            return (c * t + (t + taps - 1) + taps) * n_vec <= regs
        # accumulators + the weight rows of the tile + two broadcast dy (LLVM broadcasts
        # one position at a time, the next one's load overlapping)
        accs = c * t * n_vec
        return accs <= tb.accumulator_registers(target) and accs + c * n_vec + 2 <= regs

    spatial, red = tb.split_loops(sch, block)
    per_lane = len(red) == 3  # grouped: [jh, jw, co], dy loaded as vectors
    if per_lane:
        # dy and weight vectors both belong to one C1x block: a wider block tile reuses
        # nothing, so the tile is all positions, and with the KW taps unrolled next to it
        # each dy vector loaded serves every tap that reads it
        cx1_t = 1
    else:
        cx1_t = 2 if c1x % 2 == 0 and fits(2, 4) else 1
    limit = max(t for t in range(1, regs) if t == 1 or fits(cx1_t, t))
    if per_lane:
        tw = tb.tile_factor(wq, limit)
    else:
        tw = tb.chain_tile(wq, limit, cx1_t * n_vec, target.fma_chains())
    return tb.register_tile(sch, block, target, spatial, red, {1: cx1_t, 3: tw},
                            par=[0, 1, 2], serial=[3], red_inner=(red[1],) if per_lane else (),
                            dot_intrin=dot_intrinsic(sch, block, target))


def weight_sums(sch, block) -> None:
    """``dx_wsum*`` ``[C1x, 16]`` (int8 weight sums): the 16 lanes in one vector, the taps and
    Cout summed below the channel block (unscheduled, they ran as scalar loops on one
    core)."""
    if tb.spatial_count(sch, block) != 2:  # [Cin] (positions): small, left as it is
        return
    cx1, cx0, *red = sch.get_loops(block)
    sch.reorder(cx1, *red, cx0)
    sch.vectorize(cx0)
    sch.decompose_reduction(block, red[0])


@schedules.register(tag.CONV2D_BACKPROP_INPUT, "x86")
def schedule_dx_x86(sch, workload) -> None:
    target = workload.target
    accs = workload.find_all(sch, tag.DX_ACC)
    stages = [tag.DX_DY_CAST, tag.DX_DY_PAD, tag.DX_WEIGHT, tag.CONV2D_BACKPROP_INPUT]
    for acc in accs:
        name = sch.get(acc).name_hint
        # [N, Cin, Hq, Wq] (few input channels) or [N, C1x, Hq, Wq, C0]
        if tb.spatial_count(sch, acc) == 4:
            dx_positions_tile(sch, acc, target)
            workload.note(name, RULE, "few input channels: W positions in vector lanes")
            continue
        wb, _ = dx_acc_tiles(sch, acc, target)
        workload.note(name, RULE, "C1x blocks x Wq positions x C0 lanes in registers")
        # one phase: dx (and a fused epilogue) is written straight from the register tile
        if len(accs) == 1 and fusion.write_from_tile(
                sch, workload, wb, workload.find(sch, tag.CONV2D_BACKPROP_INPUT), RULE):
            stages.remove(tag.CONV2D_BACKPROP_INPUT)
    schedule_fallbacks(sch, workload, tag.CONV2D_BACKPROP_INPUT, RULE)
    for block in workload.find_all(sch, tag.DX_WSUM):
        weight_sums(sch, block)
        workload.note(sch.get(block).name_hint, RULE, "weight sums, the lanes in a vector")
    for stage in stages:
        block = workload.find(sch, stage)
        if block is not None:
            tb.elementwise_c0(sch, block, target)
            workload.note(sch.get(block).name_hint, RULE, "elementwise 5HD stage")
