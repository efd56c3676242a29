"""Reductions: rows across cores, the reduction vectorised, its consumers fused at the row.

* A *row group* (softmax, layer-norm, RMS-norm): reductions over the innermost axes whose
  outputs an injective output stage reads per row. The output's row loops run across cores
  and every reduction is computed at the row (``compute_at``), so a row is read from cache
  by the second pass, not from memory. When the data exceeds the L2, a later pass
  prefetches the next row (:mod:`schedules.patterns.prefetch`), so memory traffic overlaps
  the arithmetic instead of taking turns with it.
* A reduction over the innermost (contiguous) axis is vectorised by ``rfactor``: the axis
  splits into ``[ko, ki]`` with ``ki`` a few vectors wide, ``ki`` becomes a spatial axis of a
  partial-result stage that is vectorised (independent vector accumulators), and a short
  horizontal reduction over ``ki`` follows.
* A reduction over outer axes keeps the contiguous spatial axis innermost: where its input
  is read a row at a time (``[reduction.., spatial..]``, a bias gradient) the output row is
  the accumulator and the input streams through it a few rows a pass; otherwise a tile of it
  is accumulated in registers (``cache_write`` to a local tile) across the whole reduction
  and vectorised, the other spatial axes run across cores.
"""

from __future__ import annotations

from schedules.patterns import prefetch
from schedules.patterns.common import (
    Detail,
    extent,
    producers_inside,
    product,
    split_by_phase,
    vector_width,
    vectorize_tail,
)

# under PARALLEL_MIN_ELEMS (output x reduction elements), a reduction runs on one core
from schedules.toolbox import BALANCE_MIN, PARALLEL_MIN_ELEMS, whole_vector_lanes

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
    run = _contiguous_run(sch, blk)
    if run > 1:
        whole = product(extent(sch, lp) for lp in loops[-run:])
        if _rfactor_width(target, dtype, whole) > width:
            # one loop over the run: a 56-column row alone is no whole number of vectors,
            # an image of 56 x 56 is
            sch.fuse(*loops[-run:])
            loops, width = sch.get_loops(blk), _rfactor_width(target, dtype, whole)
    if not width:
        return None
    _, ki = sch.split(loops[-1], [None, width])
    return sch.rfactor(ki, len(sch.get(blk).body.indices))


def _contiguous_run(sch, blk) -> int:
    """How many of the innermost reduction loops of unscheduled block ``blk`` every load
    that a reduction iterator indexes reads as its trailing dimensions, bare and in order,
    each but the first whole: one contiguous run of memory (a channel's ``H x W`` in NCHW),
    fusable into one loop."""
    from schedules.patterns.analysis import block_facts, indexed_by, reads_trailing

    f = block_facts(sch, blk)
    loops = sch.get_loops(blk)
    if len(loops) != len(f.spatial) + len(f.reduce) or not f.reads:
        return 1
    # a load no reduction iterator indexes (``mu[c]`` in ``dy * (x - mu[c])``) is the same
    # scalar along the whole run
    varying = [acc for acc in f.reads if indexed_by(acc, f.reduce)]
    run = 1
    while run < len(f.reduce) and all(reads_trailing(acc, f.reduce[-run - 1:], f.extents)
                                      for acc in varying):
        run += 1
    return run


def fold_partials(sch, name: str, target):
    """After :func:`rfactor_inner`: the sum of block ``name``'s partial sums (a few vectors'
    worth per row) itself split by ``rfactor`` into one vector of partials, added vector by
    vector, before the last lanes are summed one by one: a chain of ``lanes`` scalar adds per
    row instead of ``UNROLL_VECTORS * lanes`` (64 dependent adds, about 200 cycles a row,
    beside the 16 cycles of a 1024-wide row's own FMAs). Returns the new block (None where
    the partials are one vector already)."""
    blk = sch.get_sblock(name)
    loops = sch.get_loops(blk)
    lanes = target.lanes(str(sch.get(blk).body.buffer.dtype))
    n = extent(sch, loops[-1])
    if n <= lanes or n % lanes:
        return None
    _, li = sch.split(loops[-1], [None, lanes])
    return sch.rfactor(li, len(sch.get(blk).body.indices))


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


def schedule_row_group(sch, out_name: str, red_names: list, facts: dict, target) -> str:
    """A normalisation: reductions computed per row, inside the output's parallel row loop.
    Returns the prefetch note for ``dsl.explain`` ("" when none was added)."""
    blk = sch.get_sblock(out_name)
    loops = sch.get_loops(blk)
    n_lead = _row_prefix(sch, loops, [facts[r] for r in red_names])
    if n_lead == 0:
        raise ValueError("the reductions do not share leading row axes with the output")
    dtype = facts[out_name].out_dtype
    # rfactor first: TVM's rfactor wants the reduction alone under its loops (the root)
    rfs = {r: rfactor_inner(sch, r, target) if facts[r].reduce else None for r in red_names}
    folds = {r: fold_partials(sch, r, target) if rfs[r] is not None else None
             for r in red_names}
    row = sch.fuse(*loops[:n_lead]) if n_lead > 1 else loops[0]
    vectorize_tail(sch, list(sch.get_loops(blk)[1:]), target, dtype)
    elems = product(facts[out_name].extents[v] for v in facts[out_name].spatial)
    if target.cores > 1 and extent(sch, row) >= 2 and elems >= 1 << 14:
        sch.parallel(row)
    for r in reversed(red_names):
        for stage in (sch.get_sblock(r), folds[r], rfs[r]):  # consumers first
            if stage is not None:
                sch.compute_at(stage, row, preserve_unit_loops=True)
    for r in red_names:
        if rfs[r] is not None:
            finish_rfactor(sch, rfs[r])
            if folds[r] is not None:
                finish_rfactor(sch, folds[r])
        elif not facts[r].reduce:  # a materialised row stage (softmax's exp)
            inner = sch.get_loops(sch.get_sblock(r))
            vectorize_tail(sch, [lp for lp in inner[1:] if extent(sch, lp) > 1][-1:], target,
                           facts[r].out_dtype)
    passes = {r: rfs[r] if rfs[r] is not None else sch.get_sblock(r) for r in red_names}
    passes[out_name] = sch.get_sblock(out_name)
    fo = facts[out_name]
    if extent(sch, row) != product(fo.extents[v] for v in fo.spatial[:n_lead]):
        return ""  # rows only partly fused (a kernel of 2**31 rows): no row-ahead addresses
    rowwise = _rowwise_inputs(list(passes), facts, n_lead)
    return _prefetch_rows(sch, row, rowwise, passes, target)


def _rowwise_inputs(names: list, facts: dict, n_lead: int) -> set[str]:
    """Buffers every stage of ``names`` reads row by row: their leading ``n_lead`` indices
    are the stage's leading iterators (the rows), in order."""
    ok, bad = set(), set()
    for name in names:
        f = facts[name]
        for acc in f.reads:
            lead = [str(ix) for ix in acc.indices[:n_lead]]
            (ok if len(acc.indices) > n_lead and lead == f.spatial[:n_lead] else bad).add(
                acc.buffer)
    return ok - bad


def _prefetch_rows(sch, row, rowwise: set, passes: dict, target) -> str:
    """Overlap the row group's memory traffic with its arithmetic (:mod:`.prefetch`): in the
    first pass after the one that streams the row in, prefetch the next row of every input
    and the output's current row. Only when the data exceeds the cores' L2 (else it is
    cached already) and a row fits in half an L2 (else the prefetched row is evicted first).
    Returns the note for ``dsl.explain``."""
    rows = extent(sch, row)
    params = [p for func in sch.mod.functions.values() for p in func.params]
    bufs = {}
    for blk in passes.values():
        for region in sch.get(blk).reads:
            buf = region.source
            if buf.name in rowwise and any(buf.same_as(p) for p in params):
                bufs[buf.name] = buf
    out_name = list(passes)[-1]
    out = sch.get(passes[out_name]).writes[0].source
    streamed = {**bufs, out.name: out}
    row_elems = {n: product(b.shape) // rows for n, b in streamed.items()}
    row_bytes = sum(row_elems[n] * b.dtype.bits // 8 for n, b in streamed.items())
    l2 = target.l2_kib * 1024
    if not bufs or row_bytes * rows <= target.cores * l2 or row_bytes > l2 // 2:
        return ""
    host = next(((name, lps) for name, blk in list(passes.items())[1:]
                 if (lps := prefetch.host_loops(sch, blk, row))), None)
    if host is None:
        return ""
    reads = [(b, row_elems[n]) for n, b in bufs.items()]
    writes = [] if host[0] == out_name else [(out, row_elems[out.name])]
    prefetch.prefetch_next_rows(sch, host[1], row, reads, writes)
    what = " and the output's row for writing" if writes else ""
    return (f"the next row of {sorted(bufs)}{what} prefetched during "
            f"{host[0]}'s pass (memory overlaps the arithmetic)")


def schedule_inner_reduction(sch, name: str, facts: dict, target) -> str:
    """A reduction over the innermost axis on its own: rows across cores, rfactor inside.
    Where the rows are too few tasks for the cores (a batch-norm weight gradient's 64
    channels on 48 cores), the outer reduction axes split into partial sums first
    (:func:`_partial_sums`), each part's rows tasks, the parts added after
    (:func:`_sum_partials`)."""
    f = facts[name]
    # the axes outside the contiguous run that rfactor_inner vectorises: a split inside it
    # would leave the run's loads no whole number of vectors
    outside = len(f.reduce) - _contiguous_run(sch, sch.get_sblock(name))
    note = in_partial_sums(sch, name, f, product(f.extents[v] for v in f.spatial), target,
                           lambda part, g: _inner_nest(sch, part, g, target), "rows",
                           axes=min(2, outside)) if f.spatial else None
    return note if note is not None else _inner_nest(sch, name, f, target)


def _inner_nest(sch, name: str, f, target) -> str:
    """:func:`schedule_inner_reduction`'s loop nest for block ``name`` (facts ``f``, its
    loops in the facts' order)."""
    rows = product(f.extents[v] for v in f.spatial)
    rf = rfactor_inner(sch, name, target)
    fold = fold_partials(sch, name, target) if rf is not None else None
    loops = sch.get_loops(sch.get_sblock(name))
    n_sp = len(f.spatial)
    if n_sp == 0:
        return rfactor_detail(rf is not None)
    row = sch.fuse(*loops[:n_sp]) if n_sp > 1 else loops[0]
    total = rows * product(f.extents[v] for v in f.reduce)
    if target.cores > 1 and rows >= 2 and total >= PARALLEL_MIN_ELEMS:
        sch.parallel(row)
    for stage in (fold, rf):  # consumers first
        if stage is not None:
            sch.compute_at(stage, row, preserve_unit_loops=True)
    for stage in (rf, fold):
        if stage is not None:
            finish_rfactor(sch, stage)
    return rfactor_detail(rf is not None)


def rfactor_detail(vectorised: bool) -> str:
    return ("the innermost reduction loop rfactor-vectorised" if vectorised else
            "the innermost reduction loop serial (too short, or not a multiple of a vector)")


def schedule_outer_reduction(sch, name: str, facts: dict, target) -> str | None:
    """A reduction over outer axes: a vector tile of the contiguous output axis accumulated
    in registers across the whole reduction, the other output axes across cores. Where
    those tiles are fewer tasks than the cores (a bias gradient's 64 channels are 2 tiles,
    for 16 cores), the outer reduction axes split into partial sums first
    (:func:`_partial_sums`), each part a task, added after (:func:`_sum_partials`)."""
    f = facts[name]
    if not f.spatial:
        raise ValueError("no spatial axis to vectorise")
    pieces = _stream_pieces(f, target)
    if pieces:
        return _schedule_streamed(sch, name, f, pieces, target)
    tile, _ = _outer_tile(target, f)
    tasks = product(f.extents[v] for v in f.spatial[:-1]) * -(-f.extents[f.spatial[-1]] // tile)
    def nest(part: str, g) -> str:
        _outer_tile_nest(sch, sch.get_sblock(part), g, target)
        return f"{tile}-lane tiles of {f.spatial[-1]} in registers across the reduction"

    note = in_partial_sums(sch, name, f, tasks, target, nest, "tiles")
    if note is None:
        _outer_tile_nest(sch, sch.get_sblock(name), f, target)
    return note


# Rows of the input a streamed outer reduction adds per pass over its output row: the
# output's vectors stay in registers across them (a quarter of the read-modify-writes of
# one row a pass), and four streams are few enough for the prefetchers.
STREAM_ROWS = 4
# The shortest run of each input row a core streams (where the row is shared out among
# cores by columns); shorter, the rows split into partial sums instead.
STREAM_RUN_BYTES = 1024


def _stream_pieces(f, target) -> int:
    """Pieces the output row of outer reduction ``f`` splits into across cores where its
    input streams a row at a time (:func:`_schedule_streamed`), else 0: its largest input
    read ``[reduction.., spatial..]``, every index a bare iterator, the spatial ones the
    output's in order (a bias gradient ``sum_n dy[n, c]``, a transposed matrix-vector
    product ``sum_r a[r, i] * x[r]``); the output row whole vectors, a core's piece of it
    small enough for L1, where it is added to a row at a time."""
    from tvm.runtime import DataType

    from schedules.patterns.analysis import largest_read

    big = largest_read(f)
    if big is None or not big.pure() or not f.reduce:
        return 0
    dims = [next(iter(vs)) for vs in big.index_vars if f.extents[next(iter(vs))] > 1]
    # a unit axis is no stride (a row vector times a matrix: ``c[0, j]``)
    n_lead = stream_lead(f)
    sp = [v for v in f.spatial[n_lead:] if f.extents[v] > 1]
    lead = [v for v in f.spatial[:n_lead] if f.extents[v] > 1]
    n_sp = len(sp)
    if not sp or dims[len(dims) - n_sp:] != sp or dims[:len(lead)] != lead or \
            set(dims[len(lead):len(dims) - n_sp]) != {v for v in f.reduce
                                                      if f.extents[v] > 1} or \
            [next(iter(vs)) for vs in f.write_vars if len(vs) == 1] != f.spatial:
        return 0
    row = product(f.extents[v] for v in f.spatial[n_lead:])
    lanes = target.lanes(f.out_dtype)
    nbytes = DataType(f.out_dtype).bits // 8
    if row % lanes:
        return 0
    fits = [p for p in range(1, min(target.cores, row // lanes) + 1)
            if row // lanes % p == 0 and row // p * nbytes >= min(STREAM_RUN_BYTES, row * nbytes)]
    pieces = max(fits)
    return pieces if row // pieces * nbytes <= target.l1d_kib * 1024 // 2 else 0


def stream_lead(f) -> int:
    """Leading output axes of an outer reduction whose largest read indexes them ahead of
    its reduction (``x[b, r, j]`` summed over ``r`` into ``y[b, j]``, a mean over a
    sequence): each of their steps is a reduction of its own, streamed alike."""
    from schedules.patterns.analysis import largest_read

    big = largest_read(f)
    first = next((k for k, vs in enumerate(big.index_vars) if vs & set(f.reduce)), 0)
    lead = [next(iter(vs)) for vs in big.index_vars[:first] if len(vs) == 1]
    n = 0
    while n < min(len(lead), len(f.spatial) - 1) and lead[n] == f.spatial[n]:
        n += 1
    return n


def _schedule_streamed(sch, name: str, f, pieces: int, target) -> Detail:
    """An outer reduction that reads its input a row at a time (:func:`_stream_pieces`): the
    output row (``pieces`` of it across cores) is the accumulator, :data:`STREAM_ROWS` input
    rows added to it a pass, so the input streams through in its memory order. A tile of the
    output in registers across the whole reduction (:func:`_outer_tile_nest`) read a short
    run of every row in turn, a row's length apart: a transposed matrix-vector product of
    4096 x 4096 (64 MB) ran at 11 GB/s on one Zen 4 core, streamed at 27 (PyTorch 26); a
    bias gradient of 4096 x 1024, in cache, 2.3x faster. Where the pieces leave cores idle,
    the reduction first splits into partial sums (:func:`in_partial_sums`), each part
    streamed."""
    n_lead = stream_lead(f)

    def nest(part: str, g) -> str:
        _stream_nest(sch, sch.get_sblock(part), g, pieces, target, parts=True, n_lead=n_lead)
        return _stream_note(g, pieces)

    note = None
    tasks = pieces * product(f.extents[v] for v in f.spatial[:n_lead])
    if tasks < target.cores:
        note = in_partial_sums(sch, name, f, tasks, target, nest, "row pieces")
    if note is None:
        _stream_nest(sch, sch.get_sblock(name), f, pieces, target, n_lead=n_lead)
        note = Detail(_stream_note(f, pieces))
    return note


def _stream_note(f, pieces: int) -> str:
    return (f"the input streamed {STREAM_ROWS} rows a pass into the output row"
            + (f" ({pieces} pieces of it across cores)" if pieces > 1 else ""))


def _stream_nest(sch, blk, f, pieces: int, target, parts: bool = False,
                 n_lead: int = 0) -> None:
    """:func:`_schedule_streamed`'s loops ``[parts, lead.., piece, rows // STREAM_ROWS,
    vectors, row in pass, lanes]`` for block ``blk`` (facts ``f``; ``parts``: its first
    spatial iterator is :func:`in_partial_sums`' parts; ``n_lead``: the output axes ahead
    of the reduction, :func:`stream_lead`)."""
    loops = sch.get_loops(blk)
    n_sp = len(f.spatial)
    at = int(parts) + n_lead
    lead, sp, red = loops[:at], loops[at:n_sp], loops[n_sp:]
    lanes = target.lanes(f.out_dtype)
    row = sch.fuse(*sp) if len(sp) > 1 else sp[0]
    steps = sch.fuse(*red) if len(red) > 1 else red[0]
    k = next(k for k in (STREAM_ROWS, 2, 1) if extent(sch, steps) % k == 0)
    ro, ri = sch.split(steps, [None, k])
    jp, jo, ji = sch.split(row, [pieces, None, lanes])
    sch.reorder(*lead, jp, ro, jo, ri, ji)
    _rows_across_cores(sch, [*lead, jp], f, target)
    sch.unroll(ri)
    sch.vectorize(ji)
    init = sch.decompose_reduction(blk, ro)
    sch.vectorize(sch.get_loops(init)[-1])


def _outer_tile(target, f) -> tuple[int, int]:
    """``(lanes of the register tile, lanes of a vector)`` along the output's contiguous
    axis: two vectors where the axis holds four, else one."""
    n = f.extents[f.spatial[-1]]
    v = vector_width(target, f.out_dtype, n)
    return (min(n, v * 2) if n >= 4 * v else v), v


def _outer_tile_nest(sch, blk, f, target) -> None:
    """:func:`schedule_outer_reduction`'s loop nest for block ``blk`` (facts ``f``, its loops
    in the facts' order)."""
    loops = sch.get_loops(blk)
    n_sp = len(f.spatial)
    sp, red = loops[:n_sp], loops[n_sp:]
    tile, v = _outer_tile(target, f)
    jo, ji = sch.split(sp[-1], [None, tile])
    sch.reorder(*sp[:-1], jo, *red, ji)
    outer = [*sp[:-1], jo]
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    total = product(f.extents.values())
    if target.cores > 1 and extent(sch, fused) >= 2 and total >= PARALLEL_MIN_ELEMS:
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


# Taps a tap-sums block may hold (7 x 7): each tap's partial sums stay in registers.
MAX_TAPS = 49


def tap_axes(f) -> list[str]:
    """The output axes of window reduction ``f`` that its reads add to a reduction iterator
    (a weight gradient's taps ``ry, rx``: ``x[.., i + ry, j + rx]``)."""
    red = set(f.reduce)
    return [v for v in f.spatial
            if any(v in vs and vs & red for acc in f.reads for vs in acc.index_vars)]


def tap_lanes_axis(f) -> str | None:
    """The iterator :func:`schedule_tap_sums` puts in vector lanes: the output's innermost
    axis where it is no tap (the channels of an NHWC weight gradient), else the innermost
    reduction iterator (NCHW: the columns)."""
    if not f.spatial or not f.reduce:
        return None
    return f.spatial[-1] if f.spatial[-1] not in tap_axes(f) else f.reduce[-1]


def schedule_tap_sums(sch, name: str, facts: dict, target):
    """A window reduction into the window's taps (a depthwise weight gradient, ``dw[c, ry,
    rx] = sum dy[n, c, i, j] * x[n, c, i + ry, j + rx]``): every tap's vector of partial
    sums in registers across the whole reduction, one load of ``dy`` serving all the taps,
    the other output axes across cores. In NCHW the lanes run along ``j`` (``rfactor``;
    the lanes summed once at the end) and the padded input is computed per channel; in
    NHWC along the channels, blocks of them across cores and the padded input computed per
    image of the block. Left to the window rule, each tap (or row of taps) was a pass of
    its own over the data."""
    f = facts[name]
    along = tap_lanes_axis(f)
    if along in f.reduce:
        return _tap_sums_rfactor(sch, name, f, target)
    return _tap_sums_channels(sch, name, f, along, target)


def _tap_sums_rfactor(sch, name: str, f, target) -> Detail:
    """NCHW: lanes along the innermost reduction iterator, by ``rfactor``."""
    from schedules.patterns.analysis import stride_in
    from schedules.patterns.injective import schedule_injective

    j = f.reduce[-1]
    # a strided gradient's operand re-laid by phase, so its lanes read whole vectors
    strided = [(acc, stride_in(acc.indices[-1], j)) for acc in f.reads
               if acc.indices and (stride_in(acc.indices[-1], j) or 1) > 1]
    f, copies = split_by_phase(sch, name, strided)
    n, lanes = f.extents[f.reduce[-1]], target.lanes(f.out_dtype)
    width = whole_vector_lanes(n, lanes)
    if not width:
        raise ValueError(f"{f.reduce[-1]} is no whole number of vectors")
    taps = tap_axes(f)
    # the batch only: each part then pads its own images, where rows would pad halos twice
    split = _partial_sums(sch, name, f, product(f.extents[v] for v in f.spatial
                                                if v not in taps), target, axes=1)
    if split is not None:
        f = split[0]
    blk = sch.get_sblock(name) if split is None else split[1]
    by = dict(zip([*f.spatial, *f.reduce], sch.get_loops(blk)))
    _, ji = sch.split(by[f.reduce[-1]], [None, width])
    rf = sch.rfactor(ji, len(sch.get(blk).body.indices))
    rf_loops = dict(zip([*f.spatial, *f.reduce, "lanes"], sch.get_loops(rf)))
    rows = [rf_loops[v] for v in f.spatial if v not in taps]
    red = sch.get_loops(rf)[len(f.spatial):-1]
    sch.reorder(*rows, *red, *(rf_loops[v] for v in taps), rf_loops["lanes"])
    row = _rows_across_cores(sch, rows, f, target)
    wb = sch.cache_write(rf, 0, "local")
    sch.reverse_compute_at(wb, row, preserve_unit_loops=True)
    sch.reverse_compute_at(blk, row, preserve_unit_loops=True)
    for v in taps:
        sch.unroll(rf_loops[v])
    sch.vectorize(rf_loops["lanes"])
    sch.decompose_reduction(rf, red[0])
    inside = [m for r in f.reads for m in producers_inside(sch, rf, r.buffer, row, target)]
    for copy in copies:
        if copy not in inside:
            schedule_injective(sch, copy, target)
    if split is not None:
        _sum_partials(sch, name, target)
    return Detail(f"{width}-lane partial sums of each tap {taps} in registers across the "
                  f"reduction, rfactor along {f.reduce[-1]}"
                  + (_partials_note(*split[2:], "rows") if split is not None else "")
                  + (f", the strided {', '.join(copies)} re-laid by phase" if copies else "")
                  + (f", {', '.join(inside)} computed per row" if inside else ""),
                  also=[m for m in inside if m not in copies])


def _tap_sums_channels(sch, name: str, f, along: str, target) -> Detail:
    """NHWC: lanes along the output's innermost axis ``along`` (the channels)."""
    from schedules.patterns.contraction import vector_registers

    blk = sch.get_sblock(name)
    lanes = target.lanes(f.out_dtype)
    n = f.extents[along]
    if n % lanes:
        raise ValueError(f"{along} is no whole number of vectors")
    taps = tap_axes(f)
    n_taps = product(f.extents[v] for v in taps)
    # accumulators: taps x vectors within the register file (four left for the loads),
    # blocks enough for the cores
    nv = max(1, min(n // lanes, (vector_registers(target) - 4) // n_taps))
    while nv > 1 and (n % (nv * lanes) or n // (nv * lanes) < target.cores):
        nv -= 1
    tasks = n // (nv * lanes) * product(f.extents[v] for v in f.spatial
                                        if v not in taps and v != along)
    split = _partial_sums(sch, name, f, tasks, target)
    if split is not None:
        f, blk = split[:2]
    by = dict(zip([*f.spatial, *f.reduce], sch.get_loops(blk)))
    co, cv, cl = sch.split(by[along], [None, nv, lanes])
    rows = [by[v] for v in f.spatial if v not in taps and v != along]
    red = [by[v] for v in f.reduce]
    sch.reorder(*rows, co, *red, *(by[v] for v in taps), cv, cl)
    row = _rows_across_cores(sch, [*rows, co], f, target)
    wb = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(wb, row, preserve_unit_loops=True)
    for v in taps:
        sch.unroll(by[v])
    sch.unroll(cv)
    sch.vectorize(cl)
    sch.decompose_reduction(blk, red[0])
    sch.vectorize(sch.get_loops(wb)[-1])
    inside = [m for r in f.reads
              for m in producers_inside(sch, blk, r.buffer, red[0], target)]
    if split is not None:
        _sum_partials(sch, name, target)
    return Detail(f"{nv} x {lanes}-lane vectors of {along} for each of the {n_taps} taps "
                  f"{taps} in registers across the reduction, blocks of {along} across cores"
                  + (_partials_note(*split[2:], "blocks") if split is not None else "")
                  + (f", {', '.join(inside)} computed per {f.reduce[0]}" if inside else ""),
                  also=inside)


def in_partial_sums(sch, name: str, f, tasks: int, target, nest, what: str,
                    axes: int = 2) -> Detail | None:
    """Block ``name`` (facts ``f``) in partial sums where its ``tasks`` leave cores idle
    (:func:`_partial_sums`): ``nest(partial-sum block's name, its facts)`` schedules the
    parts and returns their note (a string, or a :class:`Detail` with the stages it
    computed inside), then the parts are added (:func:`_sum_partials`). ``what``: the tasks
    it had, for the note. Returns the note, or None (nothing changed: the caller schedules
    ``name`` whole)."""
    split = _partial_sums(sch, name, f, tasks, target, axes)
    if split is None:
        return None
    g, rf, parts, axis = split
    note = nest(sch.get(rf).name_hint, g)
    _sum_partials(sch, name, target)
    return Detail(str(note) + _partials_note(parts, axis, what),
                  also=tuple(getattr(note, "also", ())))


def _partial_sums(sch, name: str, f, tasks: int, target, axes: int = 2):
    """Where ``tasks`` blocks of output do not share out over the cores (an NHWC depthwise
    weight gradient's 64 channels are 4 blocks, for 16 cores; an NCHW one's 64 channel rows
    leave a third of 48 cores idle), one of the first ``axes`` reduction axes (the batch,
    else the rows) split into partial sums by ``rfactor``, each part a task of its own:
    the split :func:`partial_sum_time` finds fastest (the earlier axis and the fewer parts
    on a tie), where it beats none. Not for a reduction too small to run across cores at
    all. Returns ``(facts of the partial-sum block, that block, parts, the axis split)``
    with its loops in the facts' order, or None (nothing changed)."""
    from schedules.patterns.analysis import block_facts

    work, out = product(f.extents.values()), product(f.extents[v] for v in f.spatial)
    if target.cores < 2 or work < PARALLEL_MIN_ELEMS:
        return None
    time = lambda parts: partial_sum_time(work, out, tasks, parts, target.cores)  # noqa: E731
    found = [(k, p) for k, axis in enumerate(f.reduce[:axes])
             for p in range(2, f.extents[axis] + 1) if f.extents[axis] % p == 0]
    if not found:
        return None
    k, parts = min(found, key=lambda kp: time(kp[1]))
    if time(parts) >= time(1) * BALANCE_MIN:
        return None
    axis = f.reduce[k]
    blk = sch.get_sblock(name)
    loops = sch.get_loops(blk)
    po, _ = sch.split(loops[len(f.spatial) + k], [parts, None])
    rf = sch.rfactor(po, 0)
    g = block_facts(sch, rf)
    # the rf block's loops are [spatial.., reduction before the axis.., parts, rest of the
    # axis, reduction after it..]: the parts first, as the facts list them (spatial, then
    # reduction iterators)
    lps = sch.get_loops(rf)
    n_sp = len(f.spatial)
    sch.reorder(lps[n_sp + k], *lps[:n_sp], *lps[n_sp:n_sp + k], *lps[n_sp + k + 1:])
    return g, rf, parts, axis


def partial_sum_time(work: int, out: int, tasks: int, parts: int, cores: int) -> float:
    """A reduction's time in element steps, its ``work`` elements in ``tasks x parts`` equal
    tasks run in rounds over ``cores``, then the ``parts`` partials of each of its ``out``
    output elements added on one core (:func:`_sum_partials`). More parts fill the last
    round better and cost a longer sum: the 32 tiles of a layer-norm gamma gradient (8192 x
    1024) on 48 cores in 64 parts keep 0.58 of them busy (by the scaling model; the sum of
    64 x 1024 partials serial), in the 4 this estimate picks 0.85."""
    n = tasks * parts
    return -(-n // cores) * work / n + (parts * out if parts > 1 else 0)


def _partials_note(parts: int, axis: str, what: str) -> str:
    """The rule's note on :func:`_partial_sums`' split (``what``: the tasks it had)."""
    return f", {parts} partial sums over {axis} ({what} too few for the cores), added after"


def _sum_partials(sch, name: str, target) -> None:
    """The sum of :func:`_partial_sums`' parts: vectors along the innermost axis, the
    parts added in registers."""
    blk = sch.get_sblock(name)
    *spatial, parts = sch.get_loops(blk)
    lanes = target.lanes(str(sch.get(blk).body.buffer.dtype))
    inner = spatial[-1]
    if extent(sch, inner) % lanes == 0 and extent(sch, inner) > lanes:
        io, il = sch.split(inner, [None, lanes])
        sch.reorder(io, parts, il)
        sch.vectorize(il)
        sch.decompose_reduction(blk, parts)


def _rows_across_cores(sch, rows: list, f, target):
    """``rows`` fused into one loop, run across cores where the block is large enough."""
    row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    elems = product(f.extents[v] for v in [*f.spatial, *f.reduce])
    if target.cores > 1 and extent(sch, row) >= 2 and elems >= PARALLEL_MIN_ELEMS:
        sch.parallel(row)
    return row
