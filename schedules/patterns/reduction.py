"""Reductions: rows across cores, the reduction vectorised, its consumers fused at the row.

* A *row group* (softmax, layer-norm, RMS-norm): reductions over the innermost axes whose
  outputs an injective output stage reads per row. The output's row loops run across cores
  and every reduction is computed at the row (``compute_at``), so a row is read from cache
  by the second pass, not from memory.
* A reduction over the innermost (contiguous) axis is vectorised by ``rfactor``: the axis
  splits into ``[ko, ki]`` with ``ki`` a few vectors wide, ``ki`` becomes a spatial axis of a
  partial-result stage that is vectorised (independent vector accumulators), and a short
  horizontal reduction over ``ki`` follows.
* A reduction over outer axes keeps the contiguous spatial axis innermost: a tile of it is
  accumulated in registers (``cache_write`` to a local tile) across the whole reduction and
  vectorised, the other spatial axes run across cores.
"""

from __future__ import annotations

from schedules.patterns.common import extent, product, vector_width, vectorize_tail

UNROLL_VECTORS = 4  # independent accumulators: hides the add latency (3-4 cycles)


def _rfactor_width(target, dtype: str, n: int) -> int:
    """Partial sums per row: a few vectors, dividing the axis (TVM's ``rfactor`` drops the
    guard of a ragged split, so a width that leaves a tail is never used)."""
    lanes = target.lanes(dtype)
    for width in (UNROLL_VECTORS * lanes, 2 * lanes, lanes):
        if n >= 2 * width and n % width == 0:
            return width
    return 0


def rfactor_inner(sch, name: str, target, row_loop=None):
    """Vectorise the innermost reduction loop of block ``name`` through ``rfactor``.

    Returns the partial-result block (None when the axis is too short to pay)."""
    blk = sch.get_sblock(name)
    loops = sch.get_loops(blk)
    dtype = str(sch.get(blk).body.buffer.dtype)
    n = extent(sch, loops[-1])
    width = _rfactor_width(target, dtype, n)
    if not width:
        return None
    _, ki = sch.split(loops[-1], [None, width])
    return sch.rfactor(ki, len(sch.get(blk).body.indices))


def finish_rfactor(sch, rf) -> None:
    """After ``compute_at``: the partial-sum axis innermost and vectorised, then the init
    split off. ``compute_at`` regenerates one loop per block iterator, in iterator order."""
    ivs = sch.get(rf).iter_vars
    loops = sch.get_loops(rf)[-len(ivs):]
    ki = loops[0]  # rfactor's new spatial iterator comes first
    ko = next(lp for lp, iv in zip(loops, ivs) if int(iv.iter_type) != 0)
    sch.reorder(ko, ki)
    sch.vectorize(ki)
    sch.decompose_reduction(rf, ko)


def _row_prefix(sch, out_loops, red_facts) -> int:
    """Leading loops of the output stage that are the reductions' rows."""
    n_lead = len(out_loops)
    for f in red_facts:
        ext = [f.extents[v] for v in f.spatial]
        k = 0
        while k < min(len(ext), len(out_loops)) and ext[k] == extent(sch, out_loops[k]):
            k += 1
        if any(e != 1 for e in ext[k:]):
            return 0
        n_lead = min(n_lead, k)
    return n_lead


def schedule_row_group(sch, out_name: str, red_names: list, facts: dict, target) -> None:
    """A normalisation: reductions computed per row, inside the output's parallel row loop."""
    blk = sch.get_sblock(out_name)
    loops = sch.get_loops(blk)
    n_lead = _row_prefix(sch, loops, [facts[r] for r in red_names])
    if n_lead == 0:
        raise ValueError("the reductions do not share leading row axes with the output")
    dtype = facts[out_name].out_dtype
    # rfactor first: TVM's rfactor wants the reduction alone under its loops (the root)
    rfs = {r: rfactor_inner(sch, r, target) if facts[r].reduce else None for r in red_names}
    row = sch.fuse(*loops[:n_lead]) if n_lead > 1 else loops[0]
    vectorize_tail(sch, list(sch.get_loops(blk)[1:]), target, dtype)
    elems = product(facts[out_name].extents[v] for v in facts[out_name].spatial)
    if target.cores > 1 and extent(sch, row) >= 2 and elems >= 1 << 14:
        sch.parallel(row)
    for r in reversed(red_names):
        sch.compute_at(sch.get_sblock(r), row, preserve_unit_loops=True)
        if rfs[r] is not None:
            sch.compute_at(rfs[r], row, preserve_unit_loops=True)
    for r in red_names:
        if rfs[r] is not None:
            finish_rfactor(sch, rfs[r])
        elif not facts[r].reduce:  # a materialised row stage (softmax's exp)
            inner = sch.get_loops(sch.get_sblock(r))
            vectorize_tail(sch, [lp for lp in inner[1:] if extent(sch, lp) > 1][-1:], target,
                           facts[r].out_dtype)


def schedule_inner_reduction(sch, name: str, facts: dict, target) -> None:
    """A reduction over the innermost axis on its own: rows across cores, rfactor inside."""
    f = facts[name]
    rows = product(f.extents[v] for v in f.spatial)
    rf = rfactor_inner(sch, name, target)
    loops = sch.get_loops(sch.get_sblock(name))
    n_sp = len(f.spatial)
    if n_sp == 0:
        return rfactor_detail(rf is not None)
    row = sch.fuse(*loops[:n_sp]) if n_sp > 1 else loops[0]
    total = rows * product(f.extents[v] for v in f.reduce)
    if target.cores > 1 and rows >= 2 and total >= 1 << 15:
        sch.parallel(row)
    if rf is not None:
        sch.compute_at(rf, row, preserve_unit_loops=True)
        finish_rfactor(sch, rf)
    return rfactor_detail(rf is not None)


def rfactor_detail(vectorised: bool) -> str:
    return ("the innermost reduction loop rfactor-vectorised" if vectorised else
            "the innermost reduction loop serial (too short, or not a multiple of a vector)")


def schedule_outer_reduction(sch, name: str, facts: dict, target) -> None:
    """A reduction over outer axes: a vector tile of the contiguous output axis accumulated
    in registers across the whole reduction, the other output axes across cores."""
    f = facts[name]
    blk = sch.get_sblock(name)
    loops = sch.get_loops(blk)
    n_sp = len(f.spatial)
    sp, red = loops[:n_sp], loops[n_sp:]
    if n_sp == 0:
        raise ValueError("no spatial axis to vectorise")
    n = extent(sch, sp[-1])
    v = vector_width(target, f.out_dtype, n)
    tile = min(n, v * 2) if n >= 4 * v else v
    jo, ji = sch.split(sp[-1], [None, tile])
    sch.reorder(*sp[:-1], jo, *red, ji)
    outer = [*sp[:-1], jo]
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    total = product(f.extents.values())
    if target.cores > 1 and extent(sch, fused) >= 2 and total >= 1 << 15:
        sch.parallel(fused)
    wb = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(wb, fused, preserve_unit_loops=True)
    if tile > v and tile % v == 0:
        jv, jl = sch.split(ji, [None, v])
        sch.unroll(jv)
        sch.vectorize(jl)
    else:
        sch.vectorize(ji)
    sch.decompose_reduction(blk, red[0])
    sch.vectorize(sch.get_loops(wb)[-1])
