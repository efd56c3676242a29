"""x86 schedule of ``convolution_backward`` (see :mod:`dsl.ops.convolution_backward`).

The three reductions keep channels innermost, so every one is the same register-tiled
outer-product loop nest:

* the vector axis (channels: Cin for dx, Cy for the transposed dx, Cin/g or Cy for dw) is split
  by one or two vector registers (``target.lanes("float32")``) and vectorised;
* a second axis (the last spatial axis for dx, Cy or the last kernel axis for dw) is split by
  as many rows as leave the accumulators in registers (``regs // vectors``) and unrolled, so
  each reduction step loads one vector per row block and broadcasts one scalar per row. For
  dx of 1-D and 2-D layers whose row axis has no divisor that fills 3/4 of the rows, full
  tiles and a ragged last tile, each in a loop nest of its own (``loop_partition``), so no
  guard is left in the full tiles' loops -- unless whole tiles still cover the FMA latency
  1.5 times over and let grad_input be written from cache (:func:`_tile_rows`);
* the tile's accumulators live in a ``local`` cache (promoted to registers by LLVM), written
  back once per tile; the reduction runs in chunks whose vector operand (the V panel: steps x
  lanes) fits half of the target's L1d (:func:`panel_steps`), reused from L1 by a block of
  row tiles; of the loops outside the tile, the outermost with at least two
  iterations per core runs in parallel. They are not fused: TVM 0.27's ``fuse`` mis-simplifies
  the stride-phase indices ``(t - t % s) // s`` of ``ConvAxis.dx_taps`` when ``t`` becomes a
  div/mod of the fused loop (a 3-D strided dx came out wrong), so no index of a tile loop is
  rewritten that way. dw runs its taps inside each reduction chunk (every tap reads the
  chunk of dy and x from cache); across cores go the tile blocks and as many tap axes as
  share out evenly.

Grouped layers: where the compute expanded a pack (``y_rep`` / ``x_rep``, few channels per
group) the lanes read it contiguously (grad_weight then puts Y channels in lanes); elsewhere a
grouped vector of channels is split by a divisor of the channels per group, so it never
straddles two groups (one broadcast scalar per vector instead of a gather). An expanded pack
writes each source scalar as one broadcast per group.

Exact depthwise (the ``nc_*`` stages): dx takes a register tile of whole vectors
along the innermost spatial axis (and rows of the next axis, until the tile has enough
independent accumulators), every tap across the tile, and writes grad_input (cast) straight
from it; dw keeps the innermost output positions in vector lanes (``rfactor``; a short row's
lanes come from the compute, ``nc_dw_lanes``) and the partial sums of as many taps as the
accumulator registers hold across the whole reduction of a channel (the other taps walk it
again: all 3x3 taps of a 16-lane row spilled built for AVX2). Each task (an
``(n, c)`` plane for dx, a channel for dw) pads its own part of the operand first, so the
padded copy is made in cache instead of as a separate pass over memory (dx of a 8x64x56x56
3x3 layer: 2.5 -> 1.5-1.8 ms on the 2-core Zen 3). A strided layer's row reads dy, the taps
and x out of lane order; its task loops are marked for :mod:`dsl.runtime.lane_shuffle_pass`,
which makes those gathers window loads and shuffles (8x144x56x56 3x3 stride 2 on one Zen 4
core, against the channel-last stages: dx 5.2 -> 1.3 ms, dw 5.0 -> 2.1 ms).

Packs and the layout-restoring outputs are elementwise: channel (or spatial) innermost split by
the vector width and vectorised, outer loops fused and parallel. Where a dx task's block of
rows and channels is one loop nest (no ragged tile, fused tasks), grad_input is written from
it under the task loop, a blocked transpose of the task's accumulator tile still in cache,
instead of a pass of its own over a full-size accumulator buffer. Such a dx whose tasks'
rows of ``y_pack`` overlap little (a 1-D dx: each task a block of rows and every channel)
packs them inside each task too (:func:`pack_in_task`), so dy goes through memory once, not
three times (read, pack written, pack read back). A dense dx whose taps move the dy row by
one (stride == dilation) walks each reduction chunk of taps x channels as one loop: ``w_adj``
stores the taps in the order dx visits them, so both operands are contiguous across it. Only
target numbers (lanes, vector bits, cores, cache sizes) are read, never the target's name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsl.ops import tag
from dsl.ops.convolution_backward import NC_LANES, NC_ROW
from dsl.runtime.lane_shuffle_pass import KEY
from schedules import register
from schedules.fallback import schedule_fallbacks, twin_block
from schedules.patterns.injective import padded_rows
from schedules.patterns.reduction import finish_rfactor, rfactor_detail, rfactor_inner
from schedules.toolbox import (
    TASK_TILE_SCOPE,
    accumulator_registers,
    divisors,
    elementwise,
    extent,
    extents,
    from_zero,
    in_task_repeat,
    largest_divisor,
    lead_loops,
    parallel,
    register_factor,
    row_tile,
    sharing_choice,
    spatial_count,
    split_last_tile,
    transpose_blocks,
    transpose_tile,
    transpose_tiles,
    unroll_steps,
    vectorize_split,
    whole_vector_lanes,
)

RULE = "x86 channel-last register tile"


def reduction_rows(sch, block, target) -> str:
    """grad_bias: channels across cores; each channel's run of output positions, contiguous
    in an NC* layout (the trailing reduction loops, fused), summed in a few vector
    accumulators by ``rfactor``, then one horizontal sum per channel. Returns the note."""
    name = sch.get(block).name_hint
    loops = sch.get_loops(block)
    n_sp = spatial_count(sch, block)
    spatial = loops[n_sp + 1:]  # after the channel(s) and the batch
    if len(spatial) > 1:
        sch.fuse(*spatial)
    rf = rfactor_inner(sch, name, target)
    if n_sp == 0:
        return rfactor_detail(rf is not None)
    row = parallel(sch, sch.get_loops(sch.get_sblock(name))[:n_sp], target.cores)
    if rf is not None:
        sch.compute_at(rf, row, preserve_unit_loops=True)
        finish_rfactor(sch, rf)
    return f"db: channels across cores, {rfactor_detail(rf is not None)}"


K_CHUNK = 256  # reduction steps per chunk at most (the S block's rows, see plan_tile)
# The share of L1d one chunk's V panel (kc steps x vf lanes) may take: the rest holds the S rows
# the row tiles broadcast from and the accumulators each tile loads and stores once per chunk.
PANEL_L1_SHARE = 0.5
# The share for a flat chunk (taps x channels as one loop, :attr:`Tile.flat`): its taps move the
# S row by one position, so its S rows are one row's worth whatever its taps, and the panel may
# take more of L1d.
FLAT_PANEL_L1_SHARE = 0.75


@dataclass(frozen=True)
class Tile:
    """Register tile ``rf x vf`` and cache blocks of one reduction (see the module docstring):
    ``mb`` row tiles x ``nb`` vector tiles share one chunk of ``kc`` steps of the innermost
    reduction axis times ``kc2`` of the next one (``kc2 > 1`` only when ``kc`` is that whole
    innermost axis); ``tail``: the rows of the last register tile when ``rf`` does not divide
    the row axis (0 when it does)."""

    vf: int
    rf: int
    mb: int
    nb: int
    kc: int
    tail: int = 0
    kc2: int = 1
    flat: bool = False  # the chunk's kc2 and kc steps as one loop (:func:`tile_acc`)

    def describe(self) -> str:
        return (f"{self.rf} x {self.vf} register tile, {self.mb} x {self.nb} tiles per "
                f"{self.kc * self.kc2}-step reduction chunk"
                + (" in one loop" if self.flat and self.kc2 > 1 else "")
                + (f", the last tile of {self.tail} rows in a loop nest of its own"
                   if self.tail else ""))


def plan_tile(sch, block, vec: int, row: int, target, fuse_ok: bool, group: int = 0,
              ragged: bool = False, flat: bool = False) -> Tile:
    """Tile sizes from the target's registers, caches and cores. ``group``: when not 0, the
    vector axis is channels in groups of ``group`` whose other operand is one channel per
    group (a broadcast), so the lanes take a divisor of ``group``, never two groups.
    ``ragged``: the row tile may leave a ragged last tile (:func:`row_tile`). ``flat``: both
    operands are contiguous across the last two reduction axes (:attr:`Tile.flat`)."""
    loops = sch.get_loops(block)
    n_sp = spatial_count(sch, block)
    ext = [extent(sch, lp) for lp in loops]
    lanes = target.lanes("float32")
    vf = register_factor(group or ext[vec], lanes)
    vectors = -(-vf // lanes)
    budget = max(1, accumulator_registers(target) // vectors)
    rf = _tile_rows(ext[row], budget, vectors, target, ragged, fuse_ok)
    tiles = ext[row] // rf  # full ones: a ragged last tile is a loop nest of its own
    kc, kc2 = chunk_steps(ext[n_sp:], panel_steps(target, vf),
                          panel_steps(target, vf, share=FLAT_PANEL_L1_SHARE) if flat else 0)
    l2 = target.l2_kib << 10
    # the S block (kc x mb*rf) and the accumulators (mb*rf x nb*vf) each take <= 1/8 of L2
    mb = largest_divisor(tiles, max(1, l2 // 8 // (4 * rf * kc * kc2)))
    nb = largest_divisor(ext[vec] // vf, max(1, l2 // 8 // (4 * mb * rf * vf)))
    others = math.prod(e for i, e in enumerate(ext[:n_sp]) if i not in (vec, row))
    # smaller blocks until every core has two tasks, in shares equal enough; else the blocks
    # whose tasks share out best (ties: the larger blocks)
    def blocks(mb, nb):
        yield mb, nb
        while mb > 1 or nb > 1:
            if mb > 1:
                mb = largest_divisor(tiles, mb - 1)
            else:
                nb = largest_divisor(ext[vec] // vf, nb - 1)
            yield mb, nb

    def tasks(b):
        n = tiles // b[0] * (ext[vec] // (vf * b[1]))
        return n * others if fuse_ok else max(n, others)

    (mb, nb), _ = sharing_choice(blocks(mb, nb), tasks, target.cores)
    return Tile(vf, rf, mb, nb, kc, ext[row] % rf, kc2, flat)


# Whole row tiles where they hold this many times the accumulators the FMA pipes need in
# flight (units x latency): then a ragged last tile is not worth its cost (see _tile_rows).
LATENCY_COVER = 1.5


def _tile_rows(rows: int, budget: int, vectors: int, target, ragged: bool,
               fuse_ok: bool) -> int:
    """Rows of the register tile over a row axis of ``rows``. Where a ragged last tile is
    allowed (``ragged``), :func:`row_tile` decides, unless grad_input could be written from
    each task's tile while it is in cache (``fuse_ok``: a task's block is then one loop nest,
    see :func:`_restore_in_cache`) and the largest divisor of ``rows`` still keeps the FMA
    pipes fed (:data:`LATENCY_COVER`): the ragged tile's nest costs that write its own pass
    over grad_input (one EMR core, same-process A/B: conv1d dx of 1024 positions 8 x 32
    whole tiles 1.035x faster than 12 x 32 and a last tile of 4, the transposed dx of 28
    positions 7 x 32 1.12x faster than 12 + 12 + 4; on a Zen 3 the conv1d's 4 rows of two
    vectors, 8 accumulators where its pipes need 8, lost to 6 rows and a last tile of 4,
    which this keeps)."""
    whole = largest_divisor(rows, budget)
    if not ragged:
        return whole
    need = LATENCY_COVER * target.fma_units * target.fma_latency
    if fuse_ok and whole * vectors >= need:
        return whole
    return row_tile(rows, budget)


def panel_steps(target, vf: int, elem_bytes: int = 4, share: float = PANEL_L1_SHARE) -> int:
    """Reduction steps per chunk: the most whose V panel (``vf`` lanes of ``elem_bytes`` each
    per step) fits :data:`PANEL_L1_SHARE` of the target's L1d, at most :data:`K_CHUNK`. The
    panel is reused by every row tile of a block, so it must stay in L1 while they stream the
    S rows through it: a 32 KB panel (256 steps x 32 lanes) filled 2/3 of an Emerald Rapids
    L1d and all of a Zen 4's (conv1d dx, 256 channels, 128 steps: 1.035x / 1.023x on one /
    two EMR cores, same-process A/B, 61 rounds of alternate calls). ``share``: of L1d, for a
    flat chunk :data:`FLAT_PANEL_L1_SHARE`."""
    budget = int(target.l1d_kib * 1024 * share)
    return max(1, min(K_CHUNK, budget // (vf * elem_bytes)))


def chunk_steps(reduce: list[int], limit: int = K_CHUNK, limit2: int = 0) -> tuple[int, int]:
    """``(kc, kc2)``: the steps of the innermost reduction axis and of the next one in one
    chunk of at most ``limit`` (:func:`panel_steps`), or ``limit2`` where it is not 0 (a
    flat chunk's own budget). A short innermost axis (a 28-wide row of a 3-D dw) takes rows
    of the next axis too: the register tile is loaded and stored once per chunk, once per 28
    steps otherwise (a 3-D dx of 64 channels on a Zen 4, 3 taps of 64 in one flat chunk
    where the half of L1d allowed 64 steps: 1.023x / 1.026x on one / two cores, same-process
    A/B, 41 rounds of alternate calls)."""
    if not reduce:
        return 1, 1
    kc = largest_divisor(reduce[-1], limit)
    if kc < reduce[-1] or len(reduce) < 2:
        return kc, 1
    return kc, largest_divisor(reduce[-2], max(1, (limit2 or limit) // kc))


def tile_acc(sch, block, vec: int, row: int, target, fuse_ok: bool = True,
             tile: Tile | None = None, taps_inside: bool = False) -> Tile:
    """Register-tile and cache-block the reduction ``block``: spatial loop ``vec``
    vectorised, spatial loop ``row`` unrolled into independent accumulators, the innermost
    reduction loop chunked (see the module docstring). ``fuse_ok``: the outer loops may be
    fused into one parallel loop (not across dx's stride-phase indices). A ragged last row
    tile gets loop nests of its own (:func:`schedules.toolbox.split_last_tile`).
    ``taps_inside`` (dw, whose other spatial loops are its taps): see :func:`_taps_inside`."""
    t = tile or plan_tile(sch, block, vec, row, target, fuse_ok)
    loops = sch.get_loops(block)
    n_sp = spatial_count(sch, block)
    sp, red = list(loops[:n_sp]), list(loops[n_sp:])
    vo, vm, vi = sch.split(sp[vec], [None, t.nb, t.vf])
    chunk = list(sch.split(red[-1], [None, t.kc])) if red else []
    if t.kc2 > 1:  # the chunk's steps of the next axis, just outside the innermost's
        outer2, inner2 = sch.split(red[-2], [None, t.kc2])
        red = [*red[:-2], outer2, red[-1]]
        chunk = [chunk[0], inner2, chunk[1]]
    others = [lp for i, lp in enumerate(sp) if i not in (vec, row)]
    reduce = [*red[:-1], *chunk[:1]]
    if not t.tail:
        ro, rm, ri = sch.split(sp[row], [None, t.mb, t.rf])
        lead = [ro, vo, *others] if taps_inside else [*others, ro, vo]
        n_par = _taps_inside(sch, lead, target.cores) if taps_inside else len(lead)
        sch.reorder(*lead[:n_par], *reduce, *lead[n_par:], vm, rm, *chunk[1:], ri, vi)
        _chunk_loop(sch, chunk, t)
        _tile_nest(sch, block, n_par, t, target, fuse_ok)
        return t
    # the tiles loop outermost, split in two nests; the full tiles then in blocks of mb
    rt, ri = sch.split(sp[row], [None, t.rf])
    sch.reorder(rt, *others, vo, *reduce, vm, *chunk[1:], ri, vi)
    _chunk_loop(sch, chunk, t)
    main, last = split_last_tile(sch, rt)
    if main is not None:
        _, rm = sch.split(sch.get_loops(main)[0], [None, t.mb])
        loops = sch.get_loops(main)  # ro, rm, others, vo, reduce, vm, ...: rm after vm
        sch.reorder(*loops[2:len(others) + len(reduce) + 4], rm)
        _tile_nest(sch, main, len(others) + 2, t, target, fuse_ok)
    _tile_nest(sch, last, len(others) + 2, t, target, fuse_ok)
    return t


def _taps_inside(sch, lead: list, cores: int) -> int:
    """dw's taps below the reduction chunks: each chunk of dy and x (a few hundred output
    positions) is read from L1 / L2 by every tap in turn, where with the taps outermost
    every tap streamed all of dy and x from memory again (3-D dw, 27 taps, 64 channels:
    1.08x on one core, 1.26x on two; same-process A/B, Emerald Rapids). The accumulators of
    a block's taps stay in its ``local`` write-back buffer between chunks. Above the chunks
    and across cores: the ``lead`` loops ``(row blocks, vector blocks, taps...)`` that
    :func:`schedules.toolbox.lead_loops` picks. Returns how many."""
    return lead_loops([extent(sch, lp) for lp in lead], cores)


def _chunk_loop(sch, chunk: list, t: Tile) -> None:
    """The chunk's innermost loop: the flat one (:func:`_flatten_chunk`), or its steps a few
    per iteration (:func:`_unroll_steps`)."""
    _flatten_chunk(sch, chunk, t)
    _unroll_steps(sch, chunk, t)


def _flatten_chunk(sch, chunk: list, t: Tile) -> None:
    """A :attr:`Tile.flat` chunk's two reduction loops fused into one of ``kc2 * kc`` steps:
    its operands' addresses grow by one stride per step (``(r // kc) * kc + r % kc``
    simplifies to ``r``), with no loop exit and restart every ``kc`` steps (3-D dx, 64
    channels: 463 -> 471 GFLOP/s, same-process A/B on 2 Zen 5 cores)."""
    if t.flat and t.kc2 > 1:
        sch.fuse(*chunk[1:])


def _unroll_steps(sch, chunk: list, t: Tile) -> None:
    """The innermost loop of a chunk (``kc`` steps; not a :attr:`Tile.flat` fused one) a few
    steps per iteration (:func:`schedules.toolbox.unroll_steps`; conv1d dx 1.04-1.05x /
    1.02x on one / two Emerald Rapids cores, transposed dx 1.02-1.04x / 1.02x, conv1d dw
    1.04x / 1.05x, transposed dw 1.03x / 1.00x, conv3d dw, 28 steps, 1.03x / 1.02x;
    same-process A/B, 41 rounds of alternate calls)."""
    if (t.flat and t.kc2 > 1) or len(chunk) < 2:
        return
    unroll_steps(sch, chunk[-1])


def _tile_nest(sch, block, n_outer: int, t: Tile, target, fuse_ok: bool) -> None:
    """Finish one loop nest of :func:`tile_acc`: its ``n_outer`` outer loops across cores,
    the accumulators in a ``local`` tile written back there, the rows unrolled, the lanes
    vectorised and the init split off above the reduction."""
    outer = from_zero(sch, sch.get_loops(block)[:n_outer])
    if fuse_ok:
        home = parallel(sch, outer, target.cores)
    else:
        ext = [extent(sch, lp) for lp in outer]
        pick = next((i for i, e in enumerate(ext) if e >= 2 * target.cores),
                    max(range(len(ext)), key=ext.__getitem__))
        if ext[pick] > 1 and target.cores > 1:
            sch.parallel(outer[pick])
        home = outer[-1]
    wb = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(wb, home)
    loops = sch.get_loops(block)
    if t.rf > 1:
        sch.unroll(loops[-2])
    if t.vf > 1:
        sch.vectorize(loops[-1])
    if spatial_count(sch, block) < len(sch.get(block).iter_vars):
        depth = next(i for i, lp in enumerate(loops) if sch.get(lp).same_as(sch.get(home)))
        sch.decompose_reduction(block, loops[depth + 1])
    last = sch.get_loops(wb)[-1]
    n = extent(sch, last)
    lanes = target.lanes("float32")
    vectorize_split(sch, last, register_factor(n, lanes) if n > 4 * lanes else n)


def batch_chunks(sch, block, target):
    """Split dw's batch reduction into chunks whose operands fit half of L2 and rfactor it:
    returns the partial-sum block ``[chunks, *k, Cy, Cx_g]`` (tiled like dw, the chunk as
    its outermost spatial loop), the original block then sums the chunks. Every register
    tile of a chunk re-reads that chunk from L2, not the whole batch from memory (a dw
    with few channels has few outputs and many tiles per reduction step)."""
    loops = sch.get_loops(block)
    n_sp = spatial_count(sch, block)
    n = extent(sch, loops[n_sp])  # the batch: the first reduction axis of dw_acc
    per_image = sum(math.prod(int(d) for d in r.source.shape[1:]) * r.source.dtype.bits // 8
                    for r in sch.get(block).reads if r.source.name != sch.get(block).name_hint)
    per_chunk = largest_divisor(n, max(1, (target.l2_kib << 10) // 2 // max(1, per_image)))
    if per_chunk == n:
        return block
    chunk, _ = sch.split(loops[n_sp], [n // per_chunk, per_chunk])
    rf = sch.rfactor(chunk, 0)
    rf_loops = sch.get_loops(rf)
    sch.reorder(rf_loops[n_sp], *rf_loops[:n_sp])  # the chunk outermost
    return rf


def rep_pack(sch, block, group: int, target) -> None:
    """An expanded pack ``[N, *rows, C', C]`` whose last axis holds each source channel
    ``group`` times in a row: the last loop split into (groups, ``group``), the inner part
    vectorised (one scalar load and a broadcast per ``group`` lanes, instead of a per-lane
    gather), the group loop unrolled when short, the rest fused and parallel."""
    loops = sch.get_loops(block)
    n_groups = extent(sch, loops[-1]) // group
    go, gi = sch.split(loops[-1], [n_groups, group])
    if group > 1:
        sch.vectorize(gi)
    outer = list(loops[:-1])
    if n_groups <= 16:
        sch.unroll(go)
    else:
        outer.append(go)
    # fuse only the leading loops the cores need: the inner ones keep plain indices (no
    # div/mod of a fused loop per 16 floats written)
    count = 1
    while count < len(outer) and extents(sch, outer[:count]) < 4 * target.cores:
        count += 1
    parallel(sch, outer[:count], target.cores)


def pack_dw_operands(sch, block, tile: Tile) -> list[str]:
    """Lay the dw operands out as GotoBLAS panels: ``y_pack`` as ``[Cy // rf, .., rf]`` and
    ``x_pack`` as ``[Cx // vf, .., vf]``, so one reduction step of a register tile reads
    ``rf`` adjacent scalars and one ``vf``-wide row, and a chunk streams contiguous memory.
    Only a pack that dw and its exact twin alone read (dx reads ``y_pack`` row-wise).
    Returns the packs re-laid."""
    return _to_panels(sch, block, {"cb_y_pack": tile.rf, "cb_x_pack": tile.vf})


def pack_weight_panels(sch, block, tile: Tile) -> list[str]:
    """dx's weight operand (``w_adj``, or ``w_fwd`` of the transposed dx; ``[*k, Cy, Cx]``,
    read as ``vf``-wide rows of Cx, one row per reduction step) laid out as panels
    ``[Cx // vf, *k, Cy, vf]``: a vector tile's steps then read one contiguous panel instead
    of rows ``Cx`` floats apart, which at 256 channels (1 KB) fell into 8 of L1d's 64 sets,
    so the panel (kc rows) never stayed in L1 across the row tiles that reuse it (same-process
    A/B on 2 Emerald Rapids cores: conv1d, 256 channels, 1.02-1.03x; 3-D dx 1.03x; transposed
    dx 1.035x). Only where the tile's ``vf`` is narrower than Cx."""
    return _to_panels(sch, block, {
        r.source.name: tile.vf for r in sch.get(block).reads
        if r.source.name in ("cb_w_adj", "cb_w_fwd") and tile.vf < int(r.source.shape[-1])})


def _to_panels(sch, block, widths: dict) -> list[str]:
    """Re-lay each pack ``block`` reads that ``widths`` names (pack -> panel width, 1: leave
    it) as panels (:func:`_panels`), where the pack is ``block``'s own
    (:func:`_own_pack`). Returns the packs re-laid."""
    from tvm.tirx import IndexMap

    done = []
    for i, r in enumerate(sch.get(block).reads):
        name = r.source.name
        width = widths.get(name, 1)
        if width == 1 or not _own_pack(sch, block, name):
            continue
        sch.transform_layout(block, ("read", i), IndexMap.from_func(
            _panels(width), ndim=len(r.source.shape), index_dtype="int32"))
        done.append(name)
    return done


def _own_pack(sch, block, name: str) -> bool:
    """Whether stage ``name`` feeds ``block`` and is read by nothing else but its exact twin,
    so its layout may be changed for ``block``: the twin reads it at the same indices
    rewritten with it, and its speed does not matter (it runs only for a NaN / inf input)."""
    producer = next((b for b in sch.get_producers(block) if sch.get(b).name_hint == name),
                    None)
    if producer is None:
        return False
    twin = twin_block(sch, block)
    ours = {sch.get(b).name_hint for b in (block, twin) if b is not None}
    return all(sch.get(c).name_hint in ours for c in sch.get_consumers(producer))


# dw first: TVM's rfactor (dw's batch chunks, db's rows) fails on a function that already
# holds the opaque blocks of a loop_partition (a dx with a ragged last tile)
ACCS = {tag.CB_DW_ACC: "dw", tag.CB_DX_ACC: "dx", tag.CB_FWD_ACC: "dx of the transposed conv"}


def schedule_convolution_backward(sch, workload) -> None:
    """The rule for every output tag of the operator (the kernel may hold any subset)."""
    tgt = workload.target
    done = _schedule_nc_depthwise(sch, workload)
    for stage in (tag.CB_Y_PACK, tag.CB_X_PACK, tag.CB_W_ADJ, tag.CB_W_FWD):
        _elementwise(sch, workload, stage, "channel-last pack")
    cxg, cyg = _group_channels(_params(workload))
    for stage, group in ((tag.CB_Y_REP, cxg), (tag.CB_X_REP, cyg)):
        block = workload.find(sch, stage)
        if block is not None:
            rep_pack(sch, block, group, tgt)
            workload.note(sch.get(block).name_hint, RULE, f"expanded pack: one source scalar "
                          f"broadcast into the {group} lanes of its group")
    block = workload.find(sch, tag.CB_DB_ACC)
    if block is not None:
        name = sch.get(block).name_hint
        workload.note(name, RULE, reduction_rows(sch, block, tgt))
    for stage, what in ACCS.items():
        block = workload.find(sch, stage)
        if block is not None and _schedule_acc(sch, workload, block, stage, what, (cxg, cyg)):
            done = done | {tag.CB_GRAD_INPUT}
    for stage in (tag.CB_GRAD_INPUT, tag.CB_GRAD_WEIGHT, tag.CB_GRAD_BIAS):
        if stage not in done:
            _elementwise(sch, workload, stage, "layout-restoring output")
    schedule_fallbacks(sch, workload, tag.CONVOLUTION_BACKWARD, RULE)


def _schedule_acc(sch, workload, block, stage: str, what: str, group_channels) -> bool:
    """Register-tile one reduction (dx, the transposed dx or dw; module docstring). Returns
    whether grad_input was scheduled with it (:func:`_restore_in_cache`)."""
    tgt = workload.target
    cxg, cyg = group_channels
    n_sp = spatial_count(sch, block)
    vec, row = n_sp - 1, n_sp - 2  # [N, *spatial, C] or [*k, Cy, Cx/g]
    rep = {r.source.name for r in sch.get(block).reads} & {"cb_y_rep", "cb_x_rep"}
    ext = [extent(sch, lp) for lp in sch.get_loops(block)]
    if stage == tag.CB_DW_ACC and (rep or ext[n_sp - 1] * 2 < tgt.lanes("float32")):
        # Y channels in lanes; unrolled rows on the last tap axis or Cx/g, the longer
        vec = n_sp - 2
        row = n_sp - 1 if rep and ext[n_sp - 1] > ext[n_sp - 3] else n_sp - 3
    # without an expanded pack, a grouped vector of channels stays inside one group
    group = 0 if rep or (cxg, cyg) == (1, 1) else {
        tag.CB_DX_ACC: cxg, tag.CB_FWD_ACC: cyg}.get(stage, cyg if vec == n_sp - 2 else 0)
    chunks = ""
    if stage == tag.CB_DW_ACC and vec == n_sp - 2:
        rf = batch_chunks(sch, block, tgt)
        if rf != block:  # the chunk axis leads the partial sums' spatial axes
            count = extent(sch, sch.get_loops(rf)[0])
            chunks = f"; the batch in {count} L2-sized chunks, partial sums added after (rfactor)"
            workload.note(sch.get(block).name_hint, RULE, f"dw: the sum of {count} chunks' "
                          "partial sums (serial: a few values per weight)")
            block, vec, row, n_sp = rf, vec + 1, row + 1, n_sp + 1
    name = sch.get(block).name_hint
    # dx's stride-phase indices must not pass through a fused loop (module docstring)
    fuse_ok = stage != tag.CB_DX_ACC or max(_params(workload).get("stride", [1])) == 1
    # a ragged last row tile for dx of 1-D and 2-D layers only: dw's panels need whole
    # tiles, and a 3-D dx measured slower with 6 rows and a last tile of 4 than with 4 rows
    # (64 channels on a Zen 3: 150 against 169 GFLOP/s; with 64-bit indices, which fold the
    # index arithmetic of every broadcast into its address, still 164 against 170)
    ragged = stage != tag.CB_DW_ACC and n_sp <= 4
    flat = stage == tag.CB_DX_ACC and not rep and _flat_taps(_params(workload))
    tile = plan_tile(sch, block, vec, row, tgt, fuse_ok, group, ragged, flat)
    in_task = None
    if stage == tag.CB_DX_ACC and fuse_ok and not tile.tail and not rep:
        in_task = _in_task_tile(sch, workload, block, vec, row, tile)
        tile = in_task or tile
    if stage == tag.CB_DW_ACC:
        packed = pack_dw_operands(sch, block, tile) if vec == n_sp - 1 else []
    else:
        packed = pack_weight_panels(sch, block, tile)
    taps_inside = stage == tag.CB_DW_ACC and vec == n_sp - 1 and n_sp > 2
    tile_acc(sch, block, vec, row, tgt, fuse_ok, tile, taps_inside)
    workload.note(name, RULE, f"{what}: vector axis {vec}, unrolled rows on axis {row}, "
                  + tile.describe() + (f"; {' and '.join(packed)} as panels" if packed else "")
                  + ("; the taps inside each chunk" if taps_inside else "")
                  + (f"; reads the expanded {' and '.join(sorted(rep))} (lanes in one "
                     "contiguous run across groups)" if rep else "") + chunks)
    if in_task:
        pack_in_task(sch, workload, block)
    if stage != tag.CB_DW_ACC and fuse_ok and not tile.tail:
        return _restore_in_cache(sch, workload, name)
    return False


def _in_task_tile(sch, workload, block, vec: int, row: int, tile: Tile) -> Tile | None:
    """The tile for a dx that packs its own rows of ``y_pack`` in each task
    (:func:`pack_in_task`), or None where it should not: ``block`` must be the pack's one
    reader, and the tasks' packs together may cover the whole pack at most
    :data:`schedules.toolbox.TASK_REPEAT_LIMIT` times (:func:`schedules.toolbox.task_repeat`;
    a 2-D or 3-D dx whose tasks are single rows of the outer axes would pack every row once
    per tap of those axes). Each task takes every channel (no
    two tasks pack the same rows but for the taps' halo) and as many row tiles as keep its
    accumulators within 1/8 of L2, fewer until the tasks share out over the cores."""
    pack = workload.find(sch, tag.CB_Y_PACK)
    if pack is None:
        return None
    tgt = workload.target
    ext = [extent(sch, lp) for lp in sch.get_loops(block)]
    n_sp = spatial_count(sch, block)
    tiles = ext[row] // tile.rf
    per_tile = 4 * tile.rf * ext[vec]  # one row tile's accumulators across every channel
    others = math.prod(e for i, e in enumerate(ext[:n_sp]) if i not in (vec, row))

    most = (tgt.l2_kib << 10) // 8 // per_tile
    rows = [d for d in sorted(divisors(tiles), reverse=True) if d <= max(1, most)]
    mb, _ = sharing_choice(rows, lambda m: tiles // m * others, tgt.cores)
    whole = Tile(tile.vf, tile.rf, mb, ext[vec] // tile.vf, tile.kc, 0, tile.kc2, tile.flat)
    repeat = in_task_repeat(sch, pack, block, lambda trial, acc: tile_acc(
        trial, acc, vec, row, tgt, True, whole))
    return whole if repeat is not None else None


def pack_in_task(sch, workload, block) -> None:
    """dx's ``y_pack`` computed inside each task of ``block`` (its fused parallel loop, see
    :func:`_in_task_tile`): the rows that task reads, transposed from Y into cache just
    before its register tiles read them, instead of a pass of its own that writes the whole
    pack to memory for the tasks to read back (conv1d dx, 256 channels: 1.030x on one and
    on two Emerald Rapids cores, same-process A/B, 61 rounds of alternate calls; with the
    channel blocks as tasks of their own, each packing the same rows, 0.984x / 0.994x)."""
    pack = workload.find(sch, tag.CB_Y_PACK)
    sch.compute_at(pack, sch.get_loops(block)[0], preserve_unit_loops=True)
    loops = sch.get_loops(pack)[1:]
    tu, tv = transpose_tiles(extent(sch, loops[-2]), extent(sch, loops[-1]), ragged_read=True)
    transpose_blocks(sch, loops[-2], loops[-1], tu, tv)
    workload.note(sch.get(pack).name_hint, RULE, f"computed in each task of the dx tile (its "
                  f"rows, in cache), {tu} x {tv} transpose blocks")


def _restore_in_cache(sch, workload, acc: str) -> bool:
    """grad_input written from each task's block of ``acc`` right after the task computed it,
    while the block is in cache, as a blocked transpose of the block's channels and its row
    axis (the last spatial one), instead of a transposing pass over all of ``acc`` after it
    (3-D dx, 64 channels: 497 -> 506 GFLOP/s, same-process A/B, 2 Zen 5 cores). It reads the
    task's accumulator tile (the ``local`` cache) itself: the tile's write-back, a copy into a
    full-size ``acc`` buffer that only this transpose read, is inlined away, so the kernel
    neither writes that buffer (8 MB for the conv1d bench layer) nor allocates it (conv1d dx
    1.016x / 1.034x on one / two Emerald Rapids cores, conv3d dx 1.003x / 1.013x, transposed
    dx 1.008x / 0.998x; same-process A/B, 41 rounds of alternate calls). The exact twin's
    values reach grad_input through the same tile (:func:`dsl.runtime.run_if.
    take_exact_twins` wires its copy in before every read of the tile). Only where
    grad_input reads ``acc`` alone and every task's block is one loop nest (no ragged tile).
    Returns whether grad_input was scheduled."""
    out = workload.find(sch, tag.CB_GRAD_INPUT)
    if out is None or [r.source.name for r in sch.get(out).reads] != [acc]:
        return False
    home = sch.get_loops(sch.get_sblock(f"{acc}_local"))[0]  # the write-back's task loop
    sch.reverse_compute_at(out, home)
    sch.compute_inline(sch.get_sblock(f"{acc}_local"))  # read the task's tile itself
    inner = sch.get_loops(out)[1:]
    if len(inner) == 2:  # (channels, rows): the task's block
        tu, tv = transpose_tiles(*(extent(sch, lp) for lp in inner))
        transpose_blocks(sch, *inner, tu, tv)
        how = f"{tu} x {tv} blocks"
    else:
        how = "its innermost loop vectorised"
        vectorize_split(sch, inner[-1], extent(sch, inner[-1]))
    workload.note(sch.get(out).name_hint, RULE, f"layout-restoring output, each task's block "
                  f"of {acc} transposed in cache right after the task ({how}), read from its "
                  "accumulator tile (no full-size copy)")
    return True


def _flat_taps(params: dict) -> bool:
    """dx of an ungrouped layer whose last axis has stride == dilation: each tap the dx
    loop visits moves the dy row by one and w_adj's (reversed) tap by one, so the last tap
    axis and the channels form one contiguous run in both operands (``ConvAxis.dx_taps``:
    the row moves by ``dilation / gcd`` and the tap by ``stride / gcd``)."""
    stride, dilation = params.get("stride", [0]), params.get("dilation", [1])
    return params.get("groups", 1) == 1 and stride[-1] == dilation[-1]


def _panels(width: int):
    """Index map ``[.., c] -> [c // width, .., c % width]``."""
    return lambda *ix: [ix[-1] // width, *ix[:-1], ix[-1] % width]


def _params(workload) -> dict:
    """The operator's parameters (the anchor's ``dsl_params`` JSON attribute)."""
    import json

    return json.loads(workload.attrs.get("dsl_params", "{}"))


def _group_channels(params: dict) -> tuple[int, int]:
    """``(Cx/g, Cy/g)`` of the underlying plain convolution; ``(0, 0)`` when ungrouped."""
    groups = params.get("groups", 1)
    if groups == 1 or "weight" not in params:
        return 0, 0
    y = params["input" if params["transposed"] else "grad_output"]
    return params["weight"][1], y[1] // groups


def _elementwise(sch, workload, stage: str, why: str) -> None:
    block = workload.find(sch, stage)
    if block is not None:
        if transpose_tile(sch, block, workload.target):
            why += " (an 8 x 8 tiled transpose)"
        else:
            elementwise(sch, block, workload.target)
        workload.note(sch.get(block).name_hint, RULE, why)


for _tag in (tag.CB_GRAD_INPUT, tag.CB_GRAD_WEIGHT, tag.CB_GRAD_BIAS):
    register(_tag, "x86")(schedule_convolution_backward)


# --- exact depthwise, in NC* (dsl.ops.convolution_backward._build_nc_depthwise) -------------

def _schedule_nc_depthwise(sch, workload) -> set:
    """The NC* stages (exact depthwise); each pad is computed inside its consumer's
    parallel task (one plane or one channel), so the padded copy stays in cache. Returns the
    output tags already written."""
    done = set()
    block = workload.find(sch, tag.CB_NC_DX_ACC)
    if block is not None:
        workload.note(sch.get(block).name_hint, RULE, _nc_dx(sch, workload, block))
        done.add(tag.CB_GRAD_INPUT)  # written from the register tile
    block = workload.find(sch, tag.CB_NC_DW_LANES)
    if block is not None:
        workload.note(sch.get(block).name_hint, RULE, _nc_dw_lanes(sch, workload, block))
        acc = workload.find(sch, tag.CB_NC_DW_ACC)
        workload.note(sch.get(acc).name_hint, RULE, "the row's real lanes summed, per weight")
    else:
        block = workload.find(sch, tag.CB_NC_DW_ACC)
        if block is not None:
            workload.note(sch.get(block).name_hint, RULE, _nc_dw(sch, workload, block))
    return done


# An NC* dx tile: up to this many output rows (neighbouring rows read the same dy rows
# through different taps, and a strided row's shuffled dy and taps serve them all), then
# vectors of the row up to this many accumulators. Rows first against vectors first (7
# vectors of a row, 2 rows), 1 Zen 4 thread, ms: 8x192x28x28 stride 2 0.54 -> 0.42, 8x144x56x56
# stride 2 1.07 -> 0.75, 8x64x56x56 0.56 -> 0.48; built for AVX2 (whose 7 vectors spilled)
# 1.04 -> 0.41, 2.45 -> 0.79, 1.24 -> 0.51.
NC_DX_ROWS = 4
NC_DX_VECTORS = 8


def _nc_dx(sch, workload, block) -> str:
    """``[n, c, *i]`` over taps ``j``: the last axis split into whole vectors, the taps
    inside, accumulators in a ``local`` tile written back (cast) as grad_input."""
    tgt = workload.target
    loops = sch.get_loops(block)
    n_sp = spatial_count(sch, block)
    spatial, taps = loops[:n_sp], loops[n_sp:]
    n_row, lanes = extent(sch, spatial[-1]), tgt.lanes("float32")
    # rows of whole registers where they divide it (an 11-wide row: one odd vector)
    vf = whole_vector_lanes(n_row, lanes) or register_factor(n_row, lanes)
    wo, wi = sch.split(spatial[-1], [None, vf])
    # independent accumulators: a tap's FMA chain is as long as the taps, so several vectors
    # take each tap in turn
    chains = accumulator_registers(tgt) * 2 // 3
    nr = largest_divisor(extent(sch, spatial[-2]), NC_DX_ROWS) if n_sp > 3 else 1
    nv = largest_divisor(extent(sch, wo), max(1, min(chains, NC_DX_VECTORS) // nr)
                         if n_sp > 3 else chains)
    wo, wv = sch.split(wo, [None, nv])
    rows = [*spatial[:-1], wo]
    if n_sp > 3:
        ro, ri = sch.split(spatial[-2], [None, nr])
        rows = [*spatial[:-2], ro, wo]
    inner = [ri, wv, wi] if nr > 1 else [wv, wi]
    sch.reorder(*rows, *taps, *inner)
    out = workload.find(sch, tag.CB_GRAD_INPUT)
    wb = sch.cache_write(block, 0, TASK_TILE_SCOPE)
    sch.reverse_compute_at(wb, rows[-1], preserve_unit_loops=True)
    if out is not None:
        sch.reverse_compute_inline(out)
    sch.vectorize(wi)
    for loop in inner[:-1]:
        sch.unroll(loop)
    sch.vectorize(sch.get_loops(wb)[-1])
    plane = parallel(sch, rows[:2], tgt.cores)  # one (n, c) plane per task
    _pad_at(sch, workload, tag.CB_NC_Y_PAD, plane)
    w_taps = workload.find(sch, tag.CB_NC_W_PAD)
    workload.note(sch.get(w_taps).name_hint, RULE, "the channel's taps, in each task")
    sch.compute_at(w_taps, plane, preserve_unit_loops=True)
    # a strided row's lanes read dy and the taps out of order: window loads and shuffles
    sch.annotate(plane, KEY, 1)
    init = sch.decompose_reduction(block, taps[0])
    sch.vectorize(sch.get_loops(init)[-1])
    return (f"NC* depthwise dx: {nr} x {nv} x {vf} outputs per register tile, each tap "
            "across the tile, cast from registers")


def _nc_dw(sch, workload, block) -> str:
    """``[c, *k]`` over ``(n, *o)``, dy's rows whole 4-float vectors: the innermost output
    positions in vector lanes (``rfactor``; a whole, half or quarter register), then the tile
    of :func:`_nc_dw_tile`, then one horizontal sum per weight."""
    loops = sch.get_loops(block)
    n_sp = spatial_count(sch, block)
    c, taps, red = loops[0], loops[1:n_sp], loops[n_sp:]
    n_o = extent(sch, red[-1])
    width = whole_vector_lanes(n_o, workload.target.lanes("float32"))  # the gate: n_o % 4 == 0
    kernel = [extent(sch, t) for t in taps]
    outer = _nc_dw_outer_taps(kernel, width, workload.target)
    oo, oi = sch.split(red[-1], [None, width])
    sch.reorder(c, *taps[:outer], *red[:-1], oo, *taps[outer:], oi)
    rf = sch.rfactor(oi, n_sp)  # partial sums [c, *k, lane]
    return _nc_dw_tile(sch, workload, rf, kernel, outer, f"{width} output positions in lanes "
                       "(rfactor)")


def _nc_dw_lanes(sch, workload, block) -> str:
    """``nc_dw_lanes [c, *k, lane]`` over ``(n, *o')``: the row padded to whole lanes by
    the compute, so the lane axis is the vector; then the tile of :func:`_nc_dw_tile`."""
    loops = sch.get_loops(block)
    n_sp = spatial_count(sch, block)
    c, taps, lane, red = loops[0], loops[1:n_sp - 1], loops[n_sp - 1], loops[n_sp:]
    kernel = [extent(sch, t) for t in taps]
    width = extent(sch, lane)
    outer = _nc_dw_outer_taps(kernel, width, workload.target)
    sch.reorder(c, *taps[:outer], *red, *taps[outer:], lane)
    return _nc_dw_tile(sch, workload, block, kernel, outer, f"the row padded to {width} lanes")


def _nc_dw_tile(sch, workload, block, kernel: list[int], outer: int, lanes: str) -> str:
    """Partial sums ``[c, *k, lane]`` whose loops are ``c, k[:outer], reduction, k[outer:],
    lane``: channels across cores (each task pads its channel's x and dy rows in cache), the
    inner taps' partial sums in a register tile across the whole reduction, the outer taps
    walking it again (the channel's operands stay in cache)."""
    tgt = workload.target
    wb = sch.cache_write(block, 0, TASK_TILE_SCOPE)
    loops = sch.get_loops(block)
    task, tile = loops[0], loops[outer]
    sch.reverse_compute_at(wb, tile, preserve_unit_loops=True)
    sch.vectorize(loops[-1])
    inner = len(kernel) - outer
    for tap in loops[-1 - inner:-1]:  # these taps' accumulators in registers
        sch.unroll(tap)
    parallel(sch, [task], tgt.cores)
    for stage in (tag.CB_NC_X_PAD, tag.CB_NC_DY_ROWS):  # one channel per task
        _pad_at(sch, workload, stage, task)
    sch.annotate(task, KEY, 1)  # a strided row's lanes read x every s-th element
    init = sch.decompose_reduction(block, loops[outer + 1])
    sch.vectorize(sch.get_loops(init)[-1])
    return (f"NC* depthwise dw: channels across cores, {lanes}, "
            f"{math.prod(kernel[outer:])} taps' partial sums in registers")


def _nc_dw_outer_taps(kernel: list[int], width: int, target) -> int:
    """How many leading tap axes of ``kernel`` walk the reduction outside the register
    tile: the fewest that leave the others' accumulators (``width`` lanes each) in the
    target's registers. All 3x3 taps of a 16-lane row spilled built for AVX2 (18 of 16)."""
    budget = accumulator_registers(target)
    per_tap = -(-width // target.lanes("float32"))
    for outer in range(len(kernel)):
        if math.prod(kernel[outer:]) * per_tap <= budget:
            return outer
    return len(kernel) - 1


def _pad_at(sch, workload, stage: str, loop) -> None:
    """Compute an NC* pad inside its consumer's task ``loop`` (the padded rows of that plane
    or channel only, kept in cache). A row with borders is partitioned at them and its
    interior copied in whole vectors (:func:`padded_rows`): vectorised with the bounds test,
    LLVM copied it one element at a time, a third of an 8x64x56x56 depthwise dx's time on
    one Zen 4 core. A row without borders is copied in whole vectors of its pitch."""
    block = workload.find(sch, stage)
    if block is None:
        return
    name = sch.get(block).name_hint
    sch.compute_at(block, loop, preserve_unit_loops=True)
    interior = sch.get(block).annotations.get(tag.ROW_INTERIOR)
    bounds = None if interior is None else tuple(int(v) for v in interior)
    if padded_rows(sch, block, workload.target, min_interior=NC_LANES, bounds=bounds):
        how = "its rows' interior in whole vectors, the borders apart"
    else:
        sch.vectorize(sch.split(sch.get_loops(block)[-1], [None, NC_ROW])[-1])
        how = "rows in whole vectors"
    workload.note(name, RULE, f"NC* pad, computed in each task of its consumer, {how}")
