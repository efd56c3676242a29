"""x86 schedule of ``avg_pool2d_backward`` (NCHW, CHW and NC1HWC0 alike).

The contiguous innermost axis (W for NCHW/CHW, C0 for 5HD) is the vector axis; everything
above the output row (N, C, H / N, C1, H) is fused and spread over the cores. The float32
gather-sum is computed one output row at a time under that fused loop, with the candidate
windows (jh, jw) moved outside the vector lanes so each lane accumulates in a register (for
NCHW with a W stride the lanes are the columns of one stride phase, see the compute); the
output stage then reads that L1-resident row. The scaled dy stage is a plain elementwise stage:
parallel rows, vector lanes.
"""

from __future__ import annotations

from schedules import register

TAG = "avg_pool2d_backward"
UNROLL_TAPS = 16  # unroll the candidate loops when there are at most this many candidates


def vector_factor(extent: int, lanes: int) -> int:
    """Lanes for a loop of ``extent`` (1: leave it to LLVM's loop vectoriser).

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


def _vectorize_last(sch, loop, lanes: int):
    """Split ``loop`` into (outer, lanes) and vectorise the lanes; returns (outer, inner)."""
    extent = int(sch.get(loop).extent)
    v = vector_factor(extent, lanes)
    if v == extent or v == 1:
        if v > 1:
            sch.vectorize(loop)
        return None, loop
    outer, inner = sch.split(loop, [None, v])
    sch.vectorize(inner)
    return outer, inner


def _parallel(sch, loops, cores: int):
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if cores > 1 and int(sch.get(fused).extent) > 1:
        sch.parallel(fused)
    return fused


@register(TAG, "x86")
def schedule_avg_pool2d_backward(sch, workload) -> None:
    tgt, blocks = workload.target, workload.blocks
    lanes = tgt.lanes("float32")  # the arithmetic is float32 whatever the tensors' dtype
    row_axes = 2 if workload.attrs.get("layout") == "NC1HWC0" else 1  # (W, C0) or (W,)

    scale = sch.get_sblock(blocks[f"{TAG}.scale"])
    out = sch.get_sblock(blocks[TAG])
    separate = f"{TAG}.acc" in blocks  # False for float32: the output is the reduction
    red = sch.get_sblock(blocks[f"{TAG}.acc"]) if separate else out

    # Scaled dy: rows in parallel, lanes along the contiguous axis.
    loops = sch.get_loops(scale)
    _parallel(sch, loops[:-row_axes], tgt.cores)
    _vectorize_last(sch, sch.get_loops(scale)[-1], lanes)

    # Output: one parallel loop over rows; the reduction is computed per row under it.
    n_sp = len(sch.get(out).iter_vars) - (0 if separate else 2)
    loops = sch.get_loops(out)
    row_loop = _parallel(sch, loops[:n_sp - row_axes], tgt.cores)
    if separate:
        _vectorize_last(sch, sch.get_loops(out)[-1], lanes)
        sch.compute_at(red, row_loop, preserve_unit_loops=True)

    # Reduction row: (..., vec_outer, [phase], jh, jw, vec_lanes) so each lane accumulates in
    # place; with W phases (NCHW, sW > 1) the lanes are the columns of one phase.
    phased = int(workload.attrs.get("w_phases", 1)) > 1
    loops = sch.get_loops(red)
    jh, jw = loops[-2], loops[-1]
    vec = loops[-4] if phased else loops[-3]
    _, inner = _vectorize_last(sch, vec, lanes)
    sch.reorder(*([loops[-3]] if phased else []), jh, jw, inner)
    taps = int(sch.get(jh).extent) * int(sch.get(jw).extent)
    sch.decompose_reduction(red, jh)  # the init copies the vectorised lanes loop
    if taps <= UNROLL_TAPS:
        sch.unroll(jw)
        sch.unroll(jh)
