"""Window reductions: a depthwise conv2d, a window sum or max, written by a user.

A reduction whose largest input moves by one along the output's innermost axis ``j`` as
well as along its reduction iterators (``x[.., i + ry, j + rx]``) gets nothing from vectors
along the taps (a 3-tap row is not a vector) and nothing from a register tile across
channels (a depthwise channel reads only itself). It is vectorised along ``j`` instead, a
``ri x nv`` tile of output rows by vectors in registers for the whole window: the taps loop
around the vectors, unrolled when few, so the rows of one tile load each input row once per
tap column (LLVM merges the loads that ``i + ry`` makes equal), and the tile is written
once. A padding stage the window reads is computed inside each parallel task, for its rows
only, so it is read from cache, not from a pass over memory of its own. NHWC windows
(``x[.., i + ry, j + rx, c]``) take the same nest with the channels as the vector axis and
the output columns as the tile's rows; their padding is inlined instead (its guard tests a
pixel, the same for every lane) and their tile is narrower (:func:`_channels_last_tile`).
At stride 2 along the row, the padding stage is laid out and iterated as ``[W % 2, W //
2]`` so the window still reads whole vectors. A row that no whole, half or quarter register
divides (14, 7, 57) is one odd vector (LLVM splits it into legal ones), the tile counting
the registers it holds; no guarded tail, which TVM's vectoriser would scalarise. Where one
tile covers a whole plane (a 7x7 depthwise channel), it holds several planes while
registers are left, so their independent FMA chains overlap.
"""

from __future__ import annotations

from schedules.patterns.analysis import largest_read, stride_in
from schedules.patterns.common import (
    Detail,
    extent,
    phase_map,
    producers_inside,
    product,
    vectorize_registers,
)
from schedules.toolbox import TASK_TILE_SCOPE, largest_divisor, whole_vector_lanes

UNROLL_TAPS = 64  # taps unrolled around the tile at most (a 7x7 window is 49)
PLANES = 4  # whole small planes one register tile holds at most (_planes)
# accumulators of a tile of whole planes: all registers but 4 (AVX-512) or 2, which hold an
# input row and a weight (8x1024x7x7 on AVX-512, 4 planes of 7 rows against the 2 that fit 24,
# 3 not dividing 1024: 0.37 -> 0.29 ms; built for AVX2, 2 planes against 1 within 10: 0.41 ->
# 0.34 ms)
PLANE_ACCUMULATORS = {512: 28, 256: 14, 128: 14}
TILE_ROWS = 8  # output rows of one tile at most
# accumulators of one tile: the rest of the register file holds the loaded input vectors and
# the broadcast weight (32 registers with AVX-512, 16 below)
TILE_ACCUMULATORS = {512: 24, 256: 10, 128: 10}
# a channels-last tile (_channels_last_tile): its accumulator registers, its output columns
# at stride 1
CHANNELS_LAST_ACCUMULATORS = 8
CHANNELS_LAST_COLUMNS = 4


def _lanes(target, dtype: str, n: int) -> int:
    """The widest vector (full, half or quarter width, at least 4 lanes) dividing ``n``; else
    the largest divisor of ``n`` from 4 up to four registers, one odd vector that LLVM
    splits into legal ones (a row of 14: 14 lanes; of 57: 57). Such rows went to the
    generic reduction rule, the padding in a pass of its own: 8x96x57x57 3x3 on one Zen 4
    core 8.3 ms, 3.1 ms so."""
    lanes = target.lanes(dtype)
    whole = whole_vector_lanes(n, lanes)
    if whole:
        return whole
    odd = next((v for v in range(min(n, 4 * lanes), 3, -1) if n % v == 0), None)
    if odd is None:
        raise ValueError(f"no vector of 4 to {4 * lanes} lanes divides the row of {n}")
    return odd


def _row_var(f, big) -> str | None:
    """The output axis before ``j`` that ``big``'s next-to-innermost index moves with (the
    rows ``i`` of ``x[.., i + ry, j + rx]`` or ``x[.., 2 * i + ry, ..]``), if any."""
    if len(big.indices) < 2 or len(f.spatial) < 2:
        return None
    i = f.spatial[-2]
    return i if (stride_in(big.indices[-2], i) or 0) > 0 else None


def _registers(target, f, lanes: int) -> int:
    """Registers one vector of ``lanes`` holds: an odd vector as many as its legal pieces."""
    return -(-lanes // target.lanes(f.out_dtype))


def _tile(target, f, i: str | None, j: str, lanes: int) -> tuple[int, int]:
    """``(rows, vectors)`` of the register tile: as many rows as divide ``i`` (up to
    :data:`TILE_ROWS`), then as many vectors of the row as the accumulators left allow."""
    budget = TILE_ACCUMULATORS.get(target.vector_bits, 10) // _registers(target, f, lanes)
    rows_ext = f.extents[i] if i else 1
    rows = max(r for r in range(1, min(TILE_ROWS, rows_ext, max(1, budget)) + 1)
               if rows_ext % r == 0)
    nvj = f.extents[j] // lanes
    nv = max(v for v in range(1, nvj + 1) if nvj % v == 0 and rows * v <= budget)
    return rows, nv


def _channels_last(f, big) -> bool:
    """Whether the vector axis is a channel axis the taps do not move (``x[.., i + ry, j +
    rx, c]``): the tile's rows are then output columns, its vectors a pixel's channels."""
    return not any(stride_in(big.indices[-1], r) for r in f.reduce)


def _channels_last_tile(target, f, big, i: str | None, j: str,
                        lanes: int) -> tuple[int, int]:
    """``(rows, vectors)`` of a channels-last tile (its rows are output columns). At a
    stride along the columns the tile holds whole pixels, as many columns as
    :data:`CHANNELS_LAST_ACCUMULATORS` registers hold, where a pixel's channels fit them;
    at stride 1, :data:`CHANNELS_LAST_COLUMNS` columns where they divide the row, by the
    vectors that fit the same registers. Elsewhere (rows of 7 or 14, pixels of 256 channels
    and more at a stride) :func:`_tile`'s 7 or 8 columns by 2 vectors.

    A user's NHWC depthwise window, one Zen 4 core, padding inlined, against the 8 columns by
    2 vectors of before: 3x3 8x112x112x32 1.9 -> 1.35 ms (4 x 2), x64 6.1 -> 3.3 ms (4 x 2),
    8x56x56x128 3.3 -> 1.5 ms (4 x 2), 1x56x56x256 0.24 -> 0.17 ms (4 x 2), 5x5 8x56x56x96
    3.6 -> 1.4 ms (4 x 2); at stride 2 8x112x112x64 2.8 -> 1.1 ms (1 x 4: 4 x 2 took 1.4).
    Tiles of 16 accumulators or more (4 x 4, 2 x 8, 1 x 16) were 1.3-2.3x slower again, 8
    columns by 2 vectors over 256 channels and more no faster than 4 x 2 (8x28x28x256,
    0.39 ms against 0.36), and 7 columns by 2 vectors the fastest over rows of 14 and 7
    (8x14x14x512 0.23 ms; 4 x 2, which leaves a guarded tail, 0.26 ms, 2 x 2 0.28 ms)."""
    cols = f.extents[i] if i else 1
    regs = _registers(target, f, lanes)
    nvj = f.extents[j] // lanes
    stride = stride_in(big.indices[-2], i) if i else 1
    if stride and stride > 1:
        if nvj * regs > CHANNELS_LAST_ACCUMULATORS:
            return _tile(target, f, i, j, lanes)
        return largest_divisor(cols, CHANNELS_LAST_ACCUMULATORS // (nvj * regs)), nvj
    rows = CHANNELS_LAST_COLUMNS
    if cols % rows:
        return _tile(target, f, i, j, lanes)
    return rows, largest_divisor(nvj, CHANNELS_LAST_ACCUMULATORS // (rows * regs))


def _inline_padding(sch, blk, facts) -> list[str]:
    """Inline the padding stages ``blk`` alone reads: a channels-last window's guard tests
    the tap's pixel, the same for every lane of a vector, so the taps load the input
    directly, where a padded copy computed per task cost a store and a load of each input
    vector, three times over for a 3-row window (8x28x28x256 3x3, one Zen 4 core, 0.93 ->
    0.48 ms; 8x14x14x512 0.44 -> 0.19 ms). Returns the stages inlined."""
    inlined = []
    for prod in sch.get_producers(blk):
        name = sch.get(prod).name_hint
        pf = facts.get(name)
        if pf is None or pf.kind != "padding" or pf.costly or len(sch.get_consumers(prod)) > 1:
            continue
        sch.compute_inline(prod)
        inlined.append(name)
    return inlined


def _planes(target, f, i: str | None, j: str, tile: tuple[int, int], lanes: int,
            phased: int) -> tuple[int, str | None]:
    """``(planes, axis)``: how many planes (steps of the output axis before ``i``, a depthwise
    layer's channels) one register tile holds, when the ``rows x vectors`` tile covers a whole
    plane and registers are left: up to :data:`PLANES` dividing that axis within the tile's
    accumulator budget. A small plane's tile is a short chain of dependent FMAs between its
    padded rows' stores and its write-back, so one plane at a time left the core waiting on
    latency; independent planes fill it (a user's 3x3 depthwise window, one Zen 4 core:
    8x1024x7x7 0.48 -> 0.29 ms with 4 planes, 8x512x6x6 0.22 -> 0.08 ms with 4; 8x160x7x7
    1.29x faster). Not at a stride (``phased``): the stride-2 8x512x14x14 went 0.19 -> 0.21
    ms with 2. ``(1, None)`` elsewhere."""
    rows, nv = tile
    outer = [x for x in f.spatial if x not in (i, j)]
    if not i or phased or not outer or rows != f.extents[i] or nv * lanes != f.extents[j]:
        return 1, None
    axis = outer[-1]
    budget = PLANE_ACCUMULATORS.get(target.vector_bits, 10) // _registers(target, f, lanes)
    fits = [q for q in range(1, PLANES + 1) if f.extents[axis] % q == 0 and
            q * rows * nv <= budget]
    return max(fits, default=1), axis


def schedule_window(sch, name: str, facts: dict, target, epilogue: str | None = None) -> Detail:
    """Schedule window reduction ``name`` (see the module docstring), its elementwise
    consumer ``epilogue`` (bias, activation, cast) fused into the tile's write-back."""
    f = facts[name]
    big = largest_read(f)
    j = next(iter(f.write_vars[-1]))
    i = _row_var(f, big)
    lanes = _lanes(target, f.out_dtype, f.extents[j])
    last = _channels_last(f, big)
    rows, nv = (_channels_last_tile(target, f, big, i, j, lanes) if last
                else _tile(target, f, i, j, lanes))
    blk = sch.get_sblock(name)
    phased = _phase_split(sch, blk, big, stride_in(big.indices[-1], j))
    by = dict(zip([*f.spatial, *f.reduce], sch.get_loops(blk)))
    j_o, j_v, j_l = sch.split(by[j], [None, nv, lanes])
    i_o, i_r = sch.split(by[i], [None, rows]) if i else (None, None)
    planes, plane_axis = _planes(target, f, i, j, (rows, nv), lanes, phased)
    p_i = None
    if planes > 1:
        by[plane_axis], p_i = sch.split(by[plane_axis], [None, planes])
    outer = [by[x] for x in f.spatial if x not in (i, j)] + ([i_o] if i_o else [])
    red = [by[x] for x in f.reduce]
    tile = [lp for lp in (p_i, i_r, j_v, j_l) if lp is not None]
    sch.reorder(*outer, j_o, *red, *tile)
    task = sch.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else j_o)
    if target.cores > 1 and extent(sch, task) >= 2 and product(f.extents.values()) >= 1 << 15:
        sch.parallel(task)
    wb = sch.cache_write(blk, 0, TASK_TILE_SCOPE)
    if epilogue is not None:
        sch.reverse_compute_inline(sch.get_sblock(epilogue))
    sch.reverse_compute_at(wb, j_o, preserve_unit_loops=True)
    for lp in tile[:-1]:
        sch.unroll(lp)
    sch.vectorize(j_l)
    taps = product(f.extents[x] for x in f.reduce)
    if taps <= UNROLL_TAPS:
        for lp in red:
            sch.unroll(lp)
    inlined = _inline_padding(sch, blk, facts) if last else []
    inside = producers_inside(sch, blk, big.buffer, task, target)
    sch.decompose_reduction(blk, red[0])
    vectorize_registers(sch, sch.get_loops(wb)[-1], lanes)
    return Detail(f"vectors of {lanes} along {j}, a tile of {rows} rows x {nv} vectors in "
                  f"registers for the whole window"
                  + (f", {planes} planes of {plane_axis} a tile" if planes > 1 else "")
                  + (f", {big.buffer} split into {phased} phases along its rows" if phased
                     else "")
                  + (", its taps unrolled" if taps <= UNROLL_TAPS else "")
                  + (f"; {', '.join(inside)} computed per parallel task" if inside else "")
                  + (f"; {', '.join(inlined)} inlined (its guard on each tap's pixel)"
                     if inlined else ""),
                  also=(*inside, *inlined))


def _phase_split(sch, blk, big, stride: int) -> int:
    """Where the window steps the row by ``stride`` > 1 (``x[.., j * 2 + rx]``) and an
    injective stage writes ``x`` (its padding), lay that stage's rows out as ``[W % s,
    W // s]``: the window then reads ``[rx % s, j + rx // s]``, whole vectors, instead of
    every other lane. Returns the stride applied (0: none)."""
    from schedules.patterns.analysis import block_facts

    if stride <= 1 or big.shape[-1] % stride:
        return 0
    prods = [p for p in sch.get_producers(blk)
             if (pf := block_facts(sch, p)).out_buffer == big.buffer and pf.injective]
    if len(prods) != 1:
        return 0
    idx = next(k for k, r in enumerate(sch.get(blk).reads) if r.source.name == big.buffer)
    split = phase_map(len(big.shape), stride)
    sch.transform_layout(blk, ("read", idx), split)
    # the stage iterates in its new layout: it writes whole vectors and reads every s-th
    # element (loads LLVM groups and shuffles), not the other way round (a scatter)
    sch.transform_block_layout(prods[0], split)
    return stride
