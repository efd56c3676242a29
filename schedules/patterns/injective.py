"""Injective stages: elementwise chains inlined, broadcasts, padding and layout stages.

Every non-output stage whose iterators are all spatial is inlined into its consumers (one
pass over memory instead of one per stage), except a stage read by a contraction: there it
would be recomputed once per register tile, so it is materialised once instead, and a stage
calling a math function (``exp``) that a reduction and another stage both read (softmax),
which the row rule computes once per row. What
remains (the outputs, and stages before a contraction) is vectorised along its innermost
(contiguous) axis, trailing axes fused until a vector fills, and the outer axes run
across cores.
"""

from __future__ import annotations

from schedules.patterns.common import extent, parallel_loops, product, vector_width, vectorize_tail


def inline_stages(sch, facts: dict, outputs: set, workload) -> list[str]:
    """Inline every injective non-output stage not feeding a contraction; return the names
    kept (materialised)."""
    from schedules.patterns.analysis import consumers_of

    kept = []
    for name, f in facts.items():
        if not f.injective or name in outputs:
            continue
        users = consumers_of(facts, name)
        # a plain copy costs a reader nothing to read through (a zero padding's stage,
        # schedules.rewrite.drop_proven_guards); any other stage would be recomputed per tile
        if not f.copy and any(facts[u].kind == "contraction" or getattr(
                facts[u], "extra_where", "") == "window" for u in users):
            kept.append(name)
            continue
        if f.costly and len(users) > 1 and any(facts[u].reduce for u in users):
            # softmax's exp: read by the sum and by the divide; computed once per row instead
            kept.append(name)
            continue
        try:
            sch.compute_inline(sch.get_sblock(name))
        except Exception:  # noqa: BLE001 - TVM refuses (e.g. a reduction reads it twice)
            kept.append(name)
            continue
        workload.note(name, "patterns.inline",
                      f"{f.kind} stage ({f.why}) inlined into {', '.join(users) or 'its user'}")
    return kept


def schedule_injective(sch, name: str, target) -> None:
    """Vectorise the contiguous axis, run the outer axes across cores."""
    blk = sch.get_sblock(name)
    loops = sch.get_loops(blk)
    dtype = str(sch.get(blk).body.buffer.dtype)
    elems = product(extent(sch, lp) for lp in loops)
    if padded_rows(sch, blk, target):
        parallel_loops(sch, list(loops[:-1]), target, elems)
        return
    lanes = target.lanes(dtype)
    # trailing loops fused until one vector (two when long) fits
    n_tail, inner = 0, 1
    while n_tail < len(loops) and inner < 2 * lanes:
        n_tail += 1
        inner *= extent(sch, loops[-n_tail])
    if n_tail > 1 and extent(sch, loops[-1]) >= vector_width(target, dtype, 1 << 30):
        n_tail = 1
    if n_tail == 1 and _rows_fuse_into_vectors(sch, blk, loops, lanes):
        n_tail = 2
    outer = list(loops[:-n_tail]) if n_tail else list(loops)
    rest = vectorize_tail(sch, list(loops[len(loops) - n_tail:]), target, dtype)
    # the outer part of the vector axis joins the parallel loop when the rows are few
    par = outer + ([rest] if rest is not None and product(
        extent(sch, lp) for lp in outer) < 4 * target.cores else [])
    parallel_loops(sch, par, target, elems)


def _rows_fuse_into_vectors(sch, blk, loops, lanes: int) -> bool:
    """Whether the innermost loop is no whole number of vectors (rows of 56) while it and
    the loop outside it together are (an NCHW plane of 56 x 56), and every load the two
    iterate reads them as its two trailing dimensions, whole: the plane is then one
    contiguous run, vectorised with no guarded tail at the end of each row. (Rows of 56 in
    vectors of 16 ended each row in a masked vector; a batch-norm backward's dx, 8x64x56x56,
    ran 2x slower on two cores than on one so.)"""
    from schedules.patterns.analysis import block_facts, indexed_by, reads_trailing

    if len(loops) < 2:
        return False
    n_row, n_outer = extent(sch, loops[-1]), extent(sch, loops[-2])
    if n_row % lanes == 0 or (n_row * n_outer) % lanes:
        return False
    f = block_facts(sch, blk)
    pair = f.spatial[-2:]
    # the stage stores the pair as its own trailing dimensions (not a transposing layout)
    if len(f.spatial) != len(loops) or [sorted(vs) for vs in f.write_vars[-2:]] != \
            [[v] for v in pair]:
        return False
    return all(reads_trailing(acc, pair, f.extents) for acc in f.reads
               if indexed_by(acc, pair))


def _binds_last(sch, loop, block) -> bool:
    """The innermost loop ``loop`` runs the block's last iterator from 0: it spans that
    iterator's whole domain, or (under ``compute_at``, a consumer reading fewer columns than
    a row's pitch) is bound to it as it is."""
    import tvm

    if extent(sch, loop) == int(block.iter_vars[-1].dom.extent):
        return True
    realize = sch.get(loop).body
    return isinstance(realize, tvm.s_tir.SBlockRealize) and \
        realize.iter_values[-1].same_as(sch.get(loop).loop_var)


def padded_rows(sch, blk, target, min_interior: int = 0, bounds=None) -> bool:
    """A padding stage (``P[.., j] = if_then_else(lo <= j < hi and .., x[.., j - lo], 0)``)
    whose rows are no whole number of vectors (56 columns padded to 58): its innermost loop
    partitioned at the pad's bounds, the interior (where the test is gone) in parts of whole
    vectors, each vectorised whole (s_tir splits no loop that starts above 0), the borders
    plain. Vectorised as usual, every vector held the test and a tail guard and LLVM copied
    the rows one element at a time: 8x64x56x56 padded by 1, 0.44 ms on one Zen 4 core, twice
    the time of rows that are whole vectors. ``min_interior``: split off any interior of at
    least this many elements, also from rows that are whole vectors (by default only from
    rows that are not, and interiors of a vector or more). ``bounds``: the row's interior
    ``(lo, hi)`` where the compute knows it and its test does not show it (a stride-phase
    pad: ``x[q*s + r - pad]``, strided reads: its parts by :func:`_interior_parts`, greedy).
    Returns False (nothing changed) elsewhere."""
    from schedules.toolbox import leaf_blocks
    from schedules.zero_taps import pad_bounds

    block = sch.get(blk)
    loops = sch.get_loops(blk)
    if not loops or not block.iter_vars or not hasattr(block.body, "indices") or \
            not _binds_last(sch, loops[-1], block):
        return False
    n, lanes = extent(sch, loops[-1]), target.lanes(str(block.body.buffer.dtype))
    given = bounds is not None
    if not given:
        last = block.iter_vars[-1].var
        dims = [k for k, ix in enumerate(block.body.indices) if ix.same_as(last)]
        bounds = pad_bounds(block).get(dims[0], (None, None)) if dims else (None, None)
    lo, hi = bounds
    if (n % lanes == 0 and not min_interior) or (lo is None and hi is None):
        return False
    lo, hi = max(0, lo or 0), min(n, n if hi is None else hi)
    inner = hi - lo
    # too short to split off, or no border along the row
    if inner < (min_interior or lanes) or (lo, hi) == (0, n):
        return False
    widths, rest = _interior_parts(inner, lanes, greedy=given)
    sizes = [k for k in (lo, *widths, rest, n - hi) if k]
    parts = sch.loop_partition(loops[-1], [*sizes[:-1], None])
    first = 1 if lo else 0
    for part in parts[first:first + len(widths)]:
        sch.vectorize(sch.get_loops(leaf_blocks(sch, part)[0])[-1])
    return True


def _interior_parts(inner: int, lanes: int, greedy: bool) -> tuple[list[int], int]:
    """A row interior of ``inner`` elements as vector parts and a plain rest: equal parts of
    a whole, half or quarter vector that divide it, else one vector of all of it; ``greedy``
    (strided reads, where an odd vector's lanes gather from odd windows): whole vectors, then
    halves and quarters, the rest plain (27 = 16 + 8 + 3)."""
    from schedules.toolbox import PAD_PARTS

    if not greedy:
        width = next((w for w in (lanes, lanes // 2, lanes // 4)
                      if w and inner % w == 0 and inner // w <= PAD_PARTS), inner)
        return [width] * (inner // width), 0
    widths = []
    for w in (w for w in (lanes, lanes // 2, lanes // 4) if w >= 4):
        while inner - sum(widths) >= w and len(widths) < PAD_PARTS:
            widths.append(w)
    return widths, inner - sum(widths)
