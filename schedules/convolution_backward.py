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

from schedules import register
from schedules.generic import spatial_count

TAG = "convolution_backward"


def _divisor(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is at most ``cap`` (>= 1)."""
    for f in range(max(1, min(n, cap)), 0, -1):
        if n % f == 0:
            return f
    return 1


def _vec_factor(extent: int, lanes: int, max_vectors: int = 2) -> int:
    for f in (lanes * v for v in range(max_vectors, 0, -1)):
        if extent % f == 0:
            return f
    return _divisor(extent, lanes)


def _extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def _parallel(sch, loops, cores: int) -> object:
    """Fuse ``loops`` (outermost first) and run the result in parallel; returns the loop."""
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if _extent(sch, fused) > 1 and cores > 1:
        sch.parallel(fused)
    return fused


def _vectorize_last(sch, block, lanes: int) -> None:
    loops = sch.get_loops(block)
    if loops and _extent(sch, loops[-1]) > 1:
        ext = _extent(sch, loops[-1])
        if ext > 4 * lanes:
            _, loops[-1] = sch.split(loops[-1], [None, _vec_factor(ext, lanes)])
        if _extent(sch, loops[-1]) > 1:
            sch.vectorize(loops[-1])


def elementwise(sch, name: str, target) -> None:
    """Innermost axis vectorised (split by the vector width), outer axes fused and parallel."""
    block = sch.get_sblock(name)
    loops = sch.get_loops(block)
    lanes = target.lanes("float32")
    inner = loops[-1]
    ext = _extent(sch, inner)
    vf = _vec_factor(ext, lanes)
    outer = list(loops[:-1])
    if 1 < vf < ext:
        o, inner = sch.split(inner, [None, vf])
        outer.append(o)
    if outer:
        _parallel(sch, outer, target.cores)
    if _extent(sch, inner) > 1:
        sch.vectorize(inner)


def reduction_rows(sch, name: str, target) -> None:
    """A reduction with scalar rows (grad_bias): parallel over its spatial loops."""
    block = sch.get_sblock(name)
    loops = sch.get_loops(block)
    n_sp = spatial_count(sch, block)
    if n_sp:
        _parallel(sch, loops[:n_sp], target.cores)


def tile_acc(sch, name: str, vec: int, row: int, target) -> None:
    """Register-tile the reduction block ``name``: spatial loop ``vec`` vectorised, spatial
    loop ``row`` unrolled into independent accumulators (see the module docstring)."""
    block = sch.get_sblock(name)
    loops = sch.get_loops(block)
    n_sp = spatial_count(sch, block)
    sp, red = list(loops[:n_sp]), list(loops[n_sp:])
    lanes = target.lanes("float32")
    regs = 24 if target.vector_bits >= 512 else 12  # accumulators kept in registers
    vext = _extent(sch, sp[vec])
    vf = _vec_factor(vext, lanes)
    n_vec = max(1, -(-vf // lanes))
    rf = _divisor(_extent(sch, sp[row]), max(1, regs // n_vec))
    vo, vi = sch.split(sp[vec], [None, vf])
    ro, ri = sch.split(sp[row], [None, rf])
    outer = [lp for i, lp in enumerate(sp) if i not in (vec, row)] + [ro, vo]
    sch.reorder(*outer, *red, ri, vi)
    # one loop runs in parallel, unfused (see the module docstring)
    ext = [_extent(sch, lp) for lp in outer]
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
    _vectorize_last(sch, wb, lanes)


def schedule_convolution_backward(sch, workload) -> None:
    """The rule for every output tag of the operator (the kernel may hold any subset)."""
    tgt = workload.target
    blocks = workload.blocks
    lanes = tgt.lanes("float32")
    for stage in ("y_pack", "x_pack", "w_adj", "w_fwd"):
        if f"{TAG}.{stage}" in blocks:
            elementwise(sch, blocks[f"{TAG}.{stage}"], tgt)
    for stage in ("dx_acc", "fwd_acc"):  # [N, *spatial, C]
        if f"{TAG}.{stage}" in blocks:
            name = blocks[f"{TAG}.{stage}"]
            n_sp = spatial_count(sch, sch.get_sblock(name))
            tile_acc(sch, name, n_sp - 1, n_sp - 2, tgt)
    if f"{TAG}.dw_acc" in blocks:  # [*k, Cy, Cx/g]
        name = blocks[f"{TAG}.dw_acc"]
        block = sch.get_sblock(name)
        n_sp = spatial_count(sch, block)
        loops = sch.get_loops(block)
        cxg = _extent(sch, loops[n_sp - 1])
        if cxg * 2 >= lanes:
            tile_acc(sch, name, n_sp - 1, n_sp - 2, tgt)
        else:  # depthwise-like: channels of Y across lanes, kernel taps as rows
            tile_acc(sch, name, n_sp - 2, n_sp - 3, tgt)
    if f"{TAG}.db_acc" in blocks:
        reduction_rows(sch, blocks[f"{TAG}.db_acc"], tgt)
    for stage in ("grad_input", "grad_weight", "grad_bias"):
        if f"{TAG}.{stage}" in blocks:
            elementwise(sch, blocks[f"{TAG}.{stage}"], tgt)


for _tag in ("grad_input", "grad_weight", "grad_bias"):
    register(f"{TAG}.{_tag}", "x86")(schedule_convolution_backward)
