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

from dsl.ops import tag
from schedules import register
from schedules.toolbox import exact_vector_factor, extent, parallel, vectorize_split

UNROLL_TAPS = 16  # unroll the candidate loops when there are at most this many candidates
RULE = "x86 pooling rows"


def _vectorize_last(sch, loop, lanes: int):
    """Vectorise ``loop`` by :func:`~schedules.toolbox.exact_vector_factor` (nothing when
    that is 1); returns (outer or None, inner)."""
    v = exact_vector_factor(extent(sch, loop), lanes)
    return vectorize_split(sch, loop, v) if v > 1 else (None, loop)


@register(tag.AVG_POOL2D_BACKWARD, "x86")
def schedule_avg_pool2d_backward(sch, workload) -> None:
    tgt = workload.target
    lanes = tgt.lanes("float32")  # the arithmetic is float32 whatever the tensors' dtype
    row_axes = 2 if workload.attrs.get("layout") == "NC1HWC0" else 1  # (W, C0) or (W,)

    scale = workload.find(sch, tag.POOL_SCALE)
    out = workload.find(sch, tag.AVG_POOL2D_BACKWARD)
    red = workload.find(sch, tag.POOL_ACC)
    separate = red is not None  # False for float32: the output is the reduction
    red = red if separate else out
    for block, why in ((scale, "scaled dy: parallel rows, vector lanes"),
                       (out, "parallel output rows, reduction computed per row"),
                       (red if separate else None, "candidate windows per output row")):
        if block is not None:
            workload.note(sch.get(block).name_hint, RULE, why)

    # Scaled dy: rows in parallel, lanes along the contiguous axis.
    loops = sch.get_loops(scale)
    parallel(sch, loops[:-row_axes], tgt.cores)
    _vectorize_last(sch, sch.get_loops(scale)[-1], lanes)

    # Output: one parallel loop over rows; the reduction is computed per row under it.
    n_sp = len(sch.get(out).iter_vars) - (0 if separate else 2)
    loops = sch.get_loops(out)
    row_loop = parallel(sch, loops[:n_sp - row_axes], tgt.cores)
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
    taps = extent(sch, jh) * extent(sch, jw)
    sch.decompose_reduction(red, jh)  # the init copies the vectorised lanes loop
    if taps <= UNROLL_TAPS:
        sch.unroll(jw)
        sch.unroll(jh)
