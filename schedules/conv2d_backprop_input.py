"""x86 schedule of ``conv2d_backprop_input`` (dx), and the register-tiling helpers dw shares.

The compute already splits a strided dx by output phase (one ``dx_acc*`` block per phase, taps
that hit only), so every block here is a plain direct convolution ``[N, C1x, Hq, Wq, 16]`` in
the NCHWc style: the 16-wide C0 axis is the vector lane (one AVX-512 fp32 register, two AVX2,
four SSE); a tile of ``C1x`` blocks x ``Wq`` positions stays in registers for the whole
reduction (``cache_write`` into a local buffer that LLVM promotes once the tile is unrolled);
dy is broadcast from the padded copy made once; the rows ``(N, C1x tiles, Hq)`` run across
cores. Grouped layers load dy as regathered vectors instead, one C1x block per tile, with the
KW taps unrolled beside the positions so a dy vector feeds every tap that reads it. Layers with
few input channels (``dx_acc_w*``) vectorise W positions instead and broadcast the weight.
Tile sizes come from the target's register file; no target is named here.
"""

from __future__ import annotations

import schedules
from schedules.generic import parallel_outer, vectorize_inner

TAG = "conv2d_backprop_input"
C0 = 16


def vector_registers(target) -> int:
    """Architectural vector registers: AVX-512 has 32, SSE / AVX2 have 16."""
    return 32 if target.vector_bits >= 512 else 16


def c0_vectors(target, dtype: str = "float32") -> tuple[int, int]:
    """(registers per 16-wide C0 row, lanes per register) for ``dtype``."""
    lanes = min(C0, target.lanes(dtype))
    return max(1, C0 // lanes), lanes


def best_factor(extent: int, limit: int) -> int:
    """A tile size <= ``limit`` for ``extent``: its largest divisor when that is at least half
    of the limit (no ragged tail), else ``limit`` (the split then guards the tail)."""
    limit = max(1, min(limit, extent))
    div = max(d for d in range(1, limit + 1) if extent % d == 0)
    return div if 2 * div >= limit else limit


def extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def block_named(sch, name: str):
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint == name:
            return block
    return None


def blocks_with_prefix(sch, prefix: str) -> list:
    return [b for b in sch.get_child_blocks(sch.get_sblock("root"))
            if sch.get(b).name_hint.startswith(prefix)]


# Below this many elements a copy stage runs on one core: waking the pool costs more than it
# saves, and on a shared machine every fork-join waits for the slowest core.
PARALLEL_MIN_ELEMS = 1 << 15


def elementwise(sch, block, target, outer: int = 3) -> None:
    """Parallel outer loops and a vectorised 16-wide lane axis for a data-parallel stage."""
    loops = sch.get_loops(block)
    elems = 1
    for lp in loops:
        elems *= extent(sch, lp)
    if len(loops) >= 2 and extent(sch, loops[-1]) == C0:
        _, lanes = c0_vectors(target)
        inner = sch.split(loops[-1], [None, lanes])
        sch.vectorize(inner[-1])
    else:
        vectorize_inner(sch, block)
    if elems >= PARALLEL_MIN_ELEMS and target.cores > 1:
        parallel_outer(sch, block, max_fuse=outer)


def split_loops(sch, block) -> tuple[list, list]:
    """(spatial loops, reduction loops) of a block whose loops are still in TE order."""
    loops = sch.get_loops(block)
    n_sp = sum(1 for iv in sch.get(block).iter_vars if int(iv.iter_type) == 0)
    return loops[:n_sp], loops[n_sp:]


def register_tile(sch, block, target, spatial: list, red: list, tiles: dict[int, int],
                  par: list[int], serial: list[int], red_inner: tuple = ()):
    """Tile a reduction block whose last spatial loop is the 16-wide lane axis.

    ``tiles`` maps spatial loop index -> inner tile size; the inner tiles and the lane axis go
    below every reduction loop in ``red``, so their accumulators stay in registers across the
    whole reduction. The outer parts of the spatial loops ``par`` are fused and run across
    cores, those of ``serial`` stay serial (in that order) between them and the reduction.
    Reduction loops also in ``red_inner`` go (unrolled) just above the tile, so loads that two
    unrolled (tap, position) pairs share become one load.
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
    sch.reorder(*order_par, *order_ser, *red_outer, *red_inner, *inner, lane_o, lane_i)
    # parallel before decompose_reduction: the split init block would break compact dataflow
    fused = sch.fuse(*order_par) if len(order_par) > 1 else order_par[0]
    sch.parallel(fused)
    anchor = order_ser[-1] if order_ser else fused
    wb = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(wb, anchor, preserve_unit_loops=True)
    for lp in [*red_inner, *inner]:
        sch.unroll(lp)
    sch.unroll(lane_o)
    sch.vectorize(lane_i)
    sch.decompose_reduction(block, red_outer[0] if red_outer else red[0])
    last = sch.get_loops(wb)[-1]
    if extent(sch, last) > lanes and extent(sch, last) % lanes == 0:
        last = sch.split(last, [None, lanes])[-1]
    sch.vectorize(last)
    return wb, anchor


def dx_positions_tile(sch, block, target) -> None:
    """Register tile of ``dx_acc_w`` ``[N, Cin, Hq, Wq]`` (few input channels): every input
    channel x a few vectors of W positions; dy rows load as (unaligned) vectors, the weight
    is broadcast per (channel, tap, output channel)."""
    b, ci, qh, qw, *red = sch.get_loops(block)
    lanes = target.lanes("float32")
    regs = vector_registers(target)
    cin, nqw = extent(sch, ci), extent(sch, qw)
    ci_t = max(c for c in range(1, min(cin, 4) + 1) if cin % c == 0)
    # accumulators + the dy vectors of the tile + one broadcast weight per channel
    n_vec = max(v for v in range(1, regs) if v == 1 or ci_t * v + v + ci_t <= regs)
    vw = lanes * best_factor(-(-nqw // lanes), n_vec) if nqw > lanes else nqw
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
    if extent(sch, last) > lanes:
        last = sch.split(last, [None, lanes])[-1]
    sch.vectorize(last)


def dx_acc_tiles(sch, block, target):
    """Register tile of one dx phase: C1x blocks x Wq positions x the lane axis."""
    loops = sch.get_loops(block)
    c1x, wq = extent(sch, loops[1]), extent(sch, loops[3])
    n_vec, _ = c0_vectors(target)
    regs = vector_registers(target)

    def fits(c, t):
        if per_lane:
            # accumulators + every dy vector of the tile's row of taps + a weight per tap
            taps = extent(sch, red[1])
            return (c * t + (t + taps - 1) + taps) * n_vec <= regs
        # accumulators + one broadcast dy per position + the weight rows of the tile
        return c * t * n_vec + t + c * n_vec <= regs

    spatial, red = split_loops(sch, block)
    per_lane = len(red) == 3  # grouped: [jh, jw, co], dy loaded as vectors
    if per_lane:
        # dy and weight vectors both belong to one C1x block: a wider block tile reuses
        # nothing, so the tile is all positions, and with the KW taps unrolled next to it
        # each dy vector loaded serves every tap that reads it
        cx1_t = 1
    else:
        cx1_t = 2 if c1x % 2 == 0 and fits(2, 4) else 1
    tw = best_factor(wq, max(t for t in range(1, regs) if t == 1 or fits(cx1_t, t)))
    return register_tile(sch, block, target, spatial, red, {1: cx1_t, 3: tw}, par=[0, 1, 2],
                         serial=[3], red_inner=(red[1],) if per_lane else ())


@schedules.register(TAG, "x86")
def schedule_dx_x86(sch, workload) -> None:
    target = workload.target
    for acc in blocks_with_prefix(sch, "dx_acc"):
        if sch.get(acc).name_hint.startswith("dx_acc_w"):
            dx_positions_tile(sch, acc, target)
        else:
            dx_acc_tiles(sch, acc, target)
    for name in ("dx_dy_cast", "dx_dy_pad", "dx_weight", "dx"):
        block = block_named(sch, name)
        if block is not None:
            elementwise(sch, block, target)
