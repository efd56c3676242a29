"""x86 schedule of ``convolution_backward`` (see :mod:`dsl.ops.convolution_backward`).

The three reductions keep channels innermost, so every one is the same register-tiled
outer-product loop nest:

* the vector axis (channels: Cin for dx, Cy for the transposed dx, Cin/g or Cy for dw) is split
  by one or two vector registers (``target.lanes("float32")``) and vectorised;
* a second axis (the last spatial axis for dx, Cy or the last kernel axis for dw) is split by
  as many rows as leave the accumulators in registers (``regs // vectors``) and unrolled, so
  each reduction step loads one vector per row block and broadcasts one scalar per row;
* the tile's accumulators live in a ``local`` cache (promoted to registers by LLVM), written
  back once per tile; of the loops outside the tile, the outermost with at least two
  iterations per core runs in parallel. They are not fused: TVM 0.27's ``fuse`` mis-simplifies
  the stride-phase indices ``(t - t % s) // s`` of ``ConvAxis.dx_taps`` when ``t`` becomes a
  div/mod of the fused loop (a 3-D strided dx came out wrong), so no index of a tile loop is
  rewritten that way.

Packs and the layout-restoring outputs are elementwise: channel (or spatial) innermost split by
the vector width and vectorised, outer loops fused and parallel. Only target numbers (lanes,
vector bits, cores) are read, never the target's name.
"""

from __future__ import annotations

from dsl.ops import tag
from schedules import register
from schedules.toolbox import (
    accumulator_registers,
    elementwise,
    extent,
    largest_divisor,
    parallel,
    register_factor,
    spatial_count,
    vectorize_split,
)

RULE = "x86 channel-last register tile"


def reduction_rows(sch, block, target) -> None:
    """A reduction with scalar rows (grad_bias): parallel over its spatial loops."""
    loops = sch.get_loops(block)
    n_sp = spatial_count(sch, block)
    if n_sp:
        parallel(sch, loops[:n_sp], target.cores)


def tile_acc(sch, block, vec: int, row: int, target) -> None:
    """Register-tile the reduction ``block``: spatial loop ``vec`` vectorised, spatial
    loop ``row`` unrolled into independent accumulators (see the module docstring)."""
    loops = sch.get_loops(block)
    n_sp = spatial_count(sch, block)
    sp, red = list(loops[:n_sp]), list(loops[n_sp:])
    lanes = target.lanes("float32")
    regs = accumulator_registers(target)
    vf = register_factor(extent(sch, sp[vec]), lanes)
    n_vec = max(1, -(-vf // lanes))
    rf = largest_divisor(extent(sch, sp[row]), max(1, regs // n_vec))
    vo, vi = sch.split(sp[vec], [None, vf])
    ro, ri = sch.split(sp[row], [None, rf])
    outer = [lp for i, lp in enumerate(sp) if i not in (vec, row)] + [ro, vo]
    sch.reorder(*outer, *red, ri, vi)
    # one loop runs in parallel, unfused (see the module docstring)
    ext = [extent(sch, lp) for lp in outer]
    pick = next((i for i, e in enumerate(ext) if e >= 2 * target.cores),
                max(range(len(ext)), key=ext.__getitem__))
    if ext[pick] > 1 and target.cores > 1:
        sch.parallel(outer[pick])
    wb = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(wb, outer[-1])
    if rf > 1:
        sch.unroll(ri)
    if vf > 1:
        sch.vectorize(vi)
    if red:
        init = sch.decompose_reduction(block, red[0])
        init_loops = sch.get_loops(init)
        if rf > 1 and vf > 1 and len(init_loops) >= 2:
            sch.unroll(init_loops[-2])
    last = sch.get_loops(wb)[-1]
    n = extent(sch, last)
    vectorize_split(sch, last, register_factor(n, lanes) if n > 4 * lanes else n)


ACCS = {tag.CB_DX_ACC: "dx", tag.CB_FWD_ACC: "dx of the transposed conv", tag.CB_DW_ACC: "dw"}


def schedule_convolution_backward(sch, workload) -> None:
    """The rule for every output tag of the operator (the kernel may hold any subset)."""
    tgt = workload.target
    lanes = tgt.lanes("float32")
    for stage in (tag.CB_Y_PACK, tag.CB_X_PACK, tag.CB_W_ADJ, tag.CB_W_FWD):
        _elementwise(sch, workload, stage, "channel-last pack")
    for stage, what in ACCS.items():
        block = workload.find(sch, stage)
        if block is None:
            continue
        n_sp = spatial_count(sch, block)
        vec, row = n_sp - 1, n_sp - 2  # [N, *spatial, C] or [*k, Cy, Cx/g]
        if stage == tag.CB_DW_ACC and extent(sch, sch.get_loops(block)[n_sp - 1]) * 2 < lanes:
            vec, row = n_sp - 2, n_sp - 3  # depthwise-like: Y channels in lanes, taps as rows
        name = sch.get(block).name_hint
        tile_acc(sch, block, vec, row, tgt)
        workload.note(name, RULE, f"{what}: vector axis {vec}, unrolled rows on axis {row}")
    block = workload.find(sch, tag.CB_DB_ACC)
    if block is not None:
        workload.note(sch.get(block).name_hint, RULE, "db: parallel rows")
        reduction_rows(sch, block, tgt)
    for stage in (tag.CB_GRAD_INPUT, tag.CB_GRAD_WEIGHT, tag.CB_GRAD_BIAS):
        _elementwise(sch, workload, stage, "layout-restoring output")


def _elementwise(sch, workload, stage: str, why: str) -> None:
    block = workload.find(sch, stage)
    if block is not None:
        workload.note(sch.get(block).name_hint, RULE, why)
        elementwise(sch, block, workload.target)


for _tag in (tag.CB_GRAD_INPUT, tag.CB_GRAD_WEIGHT, tag.CB_GRAD_BIAS):
    register(_tag, "x86")(schedule_convolution_backward)
