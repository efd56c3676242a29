"""x86 schedule of ``conv2d_backprop_input`` (dx).

The compute already splits a strided dx by output phase (one ``dx_acc*`` block per phase, taps
that hit only), so every block here is a plain direct convolution ``[N, C1x, Hq, Wq, 16]`` in
the NCHWc style: the 16-wide C0 axis is the vector lane (one AVX-512 fp32 register, two AVX2,
four SSE); a tile of ``C1x`` blocks x ``Wq`` positions stays in registers for the whole
reduction (``cache_write`` into a local buffer that LLVM promotes once the tile is unrolled);
dy is broadcast from the padded copy made once; the rows ``(N, C1x tiles, Hq)`` run across
cores. Grouped layers load dy as regathered vectors instead, one C1x block per tile, with the
KW taps unrolled beside the positions so a dy vector feeds every tap that reads it. Layers with
few input channels (``dx_acc_w*``) vectorise W positions instead and broadcast the weight.
Tile sizes come from the target's register file; no target is named here. With one stride
phase the anchor ``dx`` (and any epilogue fused into it) is computed in the register tile's
write-back (:func:`schedules.fusion.write_from_tile`): no round trip through ``dx_acc``.

Where a tile's weight panel (its C1x blocks x every tap x Cout) overflows half of L1d, the
reduction runs in Cout chunks whose panel fits (:func:`chunk_blocks`): a task takes
:func:`task_rows` rows of an image and runs all their tiles over one chunk before the next,
the tiles' partial sums in the task's ``local`` block between chunks, and the weight stage
is laid out as one contiguous panel per chunk (:func:`weight_panels`). The sizes come from
the target's L1d, L2 and cores. Where such tasks can take every C1x block of their rows and
still share out over the cores, they do, and each pads its own rows of dy in cache
(:func:`pad_in_task`) instead of reading them from a padded copy of the whole of dy.

On a target with AMX a bfloat16 or int8 dot-product phase runs as tile products instead
(:func:`amx_tiles`, :mod:`schedules.amx`): Wq positions are a tile's rows, 16 dx lanes its
columns, every reduction step one ``tdpbf16ps`` / ``tdpbusd`` per accumulator tile.
"""

from __future__ import annotations

import json

import schedules
from dsl.ops import tag
from dsl.ops.group import C0
from schedules import amx, fusion
from schedules import toolbox as tb
from schedules.fallback import schedule_fallbacks
from schedules.intrinsics import dot_intrinsic

RULE = "x86 dx register tile"


def dx_positions_tile(sch, block, target, in_task: bool = False) -> None:
    """Register tile of ``dx_acc_w`` ``[N, Cin, Hq, Wq]`` (few input channels): every input
    channel x a few vectors of W positions; dy rows load as (unaligned) vectors, the weight
    is broadcast per (channel, tap, output channel). ``in_task``: the block sits under the
    task loop of :func:`positions_in_tasks`, which runs across the cores instead."""
    b, ci, qh, qw, *red = sch.get_loops(block)[1 if in_task else 0:]
    lanes = target.lanes("float32")
    regs = tb.vector_registers(target)
    cin, nqw = tb.extent(sch, ci), tb.extent(sch, qw)
    ci_t = max(c for c in range(1, min(cin, 4) + 1) if cin % c == 0)
    # accumulators + the dy vectors of the tile + one broadcast weight per channel
    n_vec = max(v for v in range(1, regs) if v == 1 or ci_t * v + v + ci_t <= regs)
    vw = lanes * tb.tile_factor(-(-nqw // lanes), n_vec) if nqw > lanes else nqw
    qw_o, qw_i = sch.split(qw, [None, vw])
    ci_o, ci_i = sch.split(ci, [None, ci_t])
    sch.reorder(b, qh, ci_o, qw_o, *red, ci_i, qw_i)
    home = qw_o
    if not in_task:
        # the tiles of a row are tasks too where the rows are too few to share out
        lead = [b, qh, ci_o, qw_o][:tb.lead_loops(
            [tb.extent(sch, lp) for lp in (b, qh, ci_o, qw_o)], target.cores, least=3)]
        fused = sch.fuse(*lead)
        sch.parallel(fused)
        home = qw_o if len(lead) == 3 else fused
    wb = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(wb, home, preserve_unit_loops=True)
    sch.unroll(ci_i)
    if vw > lanes:
        qw_v, qw_l = sch.split(qw_i, [None, lanes])
        sch.unroll(qw_v)
        sch.vectorize(qw_l)
    else:
        sch.vectorize(qw_i)
    sch.decompose_reduction(block, red[0])
    last = sch.get_loops(wb)[-1]
    if tb.extent(sch, last) > lanes:
        last = sch.split(last, [None, lanes])[-1]
    sch.vectorize(last)


# The share of L2 one task's rows of padded dy may take (positions_in_tasks): the rest holds
# the task's phase rows of dx, dx's rows and the weights.
TASK_PAD_L2_SHARE = 0.5
# How many times over the tasks' rows of padded dy may cover the whole pad (each task pads
# its phases' halo rows again) for positions_in_tasks to pad in the tasks.
TASK_PAD_REPEAT_LIMIT = 1.5


def positions_in_tasks(sch, workload, accs) -> bool:
    """Few input channels (``dx_acc_w*``, W positions in lanes): each task takes a block of
    dx rows, pads the rows of dy that its phases read (``dx_dy_pad``, in L2), computes
    every phase's rows there (:func:`dx_positions_tile`) and interleaves them into dx, so
    neither the padded dy nor the phases go through memory as whole passes. The RGB stem's
    pad of dy (3.4 MB) was a pass of its own, written to L3 and read back by each of the
    four phases, the phases' new dy rows missing L2. The block is the most rows of the
    phases (a divisor of Hq) whose padded dy fits :data:`TASK_PAD_L2_SHARE` of L2 and whose
    tasks share out over the cores; False (nothing done) where dx has a reader (an
    epilogue), the phases' rows or columns do not tile dx evenly, or the tasks would pad
    more than :data:`TASK_PAD_REPEAT_LIMIT` times the pad."""
    target = workload.target
    pad = workload.find(sch, tag.DX_DY_PAD)
    out = workload.find(sch, tag.CONV2D_BACKPROP_INPUT)
    if pad is None or out is None or sch.get_consumers(out) or not accs:
        return False
    if {sch.get(b).name_hint for b in sch.get_consumers(pad)} != {
            sch.get(a).name_hint for a in accs}:
        return False
    sh = json.loads(workload.attrs.get("dsl_params", "{}")).get("strides", [1])[0]
    n, c1, h = (tb.extent(sch, lp) for lp in sch.get_loops(out)[:3])
    hq = {tb.extent(sch, sch.get_loops(a)[2]) for a in accs}
    if len(hq) != 1 or h != sh * min(hq):
        return False
    hq = hq.pop()
    halo = _task_pad_rows(sch, accs, pad, out, sh, 1)
    if halo is None:
        return False
    halo -= 1
    buf = sch.get(pad).writes[0].source
    _, cout, _, wp = (int(d) for d in buf.shape)
    fit = int(target.l2_kib * 1024 * TASK_PAD_L2_SHARE) // (cout * wp * buf.dtype.bits // 8) \
        - halo
    rows, share = tb.sharing_choice(
        [r for r in sorted(tb.divisors(hq), reverse=True) if r <= fit] or [1],
        lambda r: n * c1 * (hq // r), target.cores)
    if share < tb.BALANCE_MIN or (rows + halo) / rows > TASK_PAD_REPEAT_LIMIT or \
            _task_pad_rows(sch, accs, pad, out, sh, rows) is None:
        return False
    task = _tasks_of_rows(sch, accs, pad, out, sh, rows)
    if target.cores > 1 and n * c1 * (hq // rows) > 1:
        sch.parallel(task)
    for acc in accs:
        dx_positions_tile(sch, acc, target, in_task=True)
    pad_name = sch.get(pad).name_hint  # the partitioned copy below makes new blocks
    padded = tb.transpose_tile(sch, pad, target, depth=1)
    if not padded:
        tb.vectorize_inner(sch, pad)
    lanes = tb.c0_vectors(target)[1]
    sch.vectorize(sch.split(sch.get_loops(out)[-1], [None, lanes])[-1])
    workload.note(pad_name, RULE, f"dy padded in each task of {rows} phase rows "
                  f"(in L2; {(rows + halo) / rows:.2f}x the pad)"
                  + (", C0 lanes into W rows" if padded else ""))
    workload.note(sch.get(out).name_hint, RULE, "each task's phase rows interleaved into dx")
    return True


def _tasks_of_rows(sch, accs, pad, out, sh: int, rows: int):
    """Split dx's rows into tasks of ``sh * rows`` and compute every phase block ``accs``
    and then ``pad`` inside each (:func:`positions_in_tasks`); returns the task loop, or None
    where a phase would not compute whole rows there (its channels or columns cut)."""
    b, c1, i, *_ = sch.get_loops(out)
    whole = [[tb.extent(sch, lp) for lp in sch.get_loops(a)[:4]] for a in accs]
    io, _ = sch.split(i, [None, sh * rows])
    task = sch.fuse(b, c1, io)
    for acc in accs:
        sch.compute_at(acc, task, preserve_unit_loops=True)
    sch.compute_at(pad, task, preserve_unit_loops=True)
    for acc, ext in zip(accs, whole):
        got = [tb.extent(sch, lp) for lp in sch.get_loops(acc)[1:5]]
        if got != [1, ext[1], rows, ext[3]]:  # one image, every channel and column
            return None
    return task


def _task_pad_rows(sch, accs, pad, out, sh: int, rows: int) -> int | None:
    """The rows of padded dy one task of ``rows`` phase rows pads (on a copy of ``sch``),
    or None where the phases would not compute whole rows there."""
    trial = sch.copy()
    names = [sch.get(b).name_hint for b in (*accs, pad, out)]
    *t_accs, t_pad, t_out = (trial.get_sblock(name) for name in names)
    if _tasks_of_rows(trial, t_accs, t_pad, t_out, sh, rows) is None:
        return None
    return tb.extent(trial, trial.get_loops(t_pad)[3])


# The share of L1d one reduction chunk's weight panel may take: the rest holds the dy rows its
# tiles broadcast from and the accumulator tile each of them loads and stores once per chunk.
CHUNK_L1_SHARE = 0.5
# The share of L2 the accumulator block of one task may take (its tiles' partial sums between
# two chunks).
BLOCK_L2_SHARE = 0.125


def tile_shape(sch, block, target) -> tuple[int, int]:
    """``(cx1_t, tw)``: C1x blocks x Wq positions of one phase's register tile."""
    loops = sch.get_loops(block)
    c1x, wq = tb.extent(sch, loops[1]), tb.extent(sch, loops[3])
    n_vec, _ = tb.c0_vectors(target)
    regs = tb.vector_registers(target)
    spatial, red = tb.split_loops(sch, block)
    per_lane = len(red) == 3  # grouped: [jh, jw, co], dy loaded as vectors

    def fits(c, t):
        if per_lane:
            # accumulators + every dy vector of the tile's row of taps + a weight per tap
            taps = tb.extent(sch, red[1])
            return (c * t + (t + taps - 1) + taps) * n_vec <= regs
        # accumulators + the weight rows of the tile + two broadcast dy (LLVM broadcasts
        # one position at a time, the next one's load overlapping)
        accs = c * t * n_vec
        return accs <= tb.accumulator_registers(target) and accs + c * n_vec + 2 <= regs

    if per_lane:
        # dy and weight vectors both belong to one C1x block: a wider block tile reuses
        # nothing, so the tile is all positions, and with the KW taps unrolled next to it
        # each dy vector loaded serves every tap that reads it
        cx1_t = 1
    else:
        cx1_t = 2 if c1x % 2 == 0 and fits(2, 4) else 1
    limit = max(t for t in range(1, regs) if t == 1 or fits(cx1_t, t))
    if per_lane:
        tw = tb.tile_factor(wq, limit)
    else:
        tw = tb.chain_tile(wq, limit, cx1_t * n_vec, target.fma_chains())
    if wq % tw and dot_intrinsic(sch, block, target) is not None:
        # a ragged last tile runs under a predicate, and TVM cannot tensorize a predicated
        # dot-product step (a VNNI host without AMX, Wq 13: the build failed)
        tw = tb.largest_divisor(wq, limit)
    return cx1_t, tw


def chunk_blocks(co1: int, taps: int, dtype_bytes: int, cx1_t: int, target,
                 step: int = 1) -> int:
    """dy channel blocks (Cout / 16, ``co1`` of them) per reduction chunk of a dense dx: the
    most (a multiple of ``step`` dividing ``co1``) whose weight panel (``cx1_t`` C1x blocks x
    ``taps`` taps x the chunk's Cout x 16 lanes) fits :data:`CHUNK_L1_SHARE` of L1d, at
    least ``step``; ``co1`` (one chunk: no split) when the whole reduction's panel fits.

    Without chunks every register tile streams its whole panel through L1: on an Emerald
    Rapids core a batch-8 14x14 layer of 256 channels read 295 KB of weights per 14-position
    tile from L2 (dx 67-82 GFLOP/s on one core); in chunks of 16 Cout it reads 18 KB per task
    and chunk, reused by the task's 28 tiles."""
    per_block = cx1_t * taps * C0 * C0 * dtype_bytes
    budget = int(target.l1d_kib * 1024 * CHUNK_L1_SHARE)
    fit = max(step, budget // per_block // step * step)
    return max(d for d in tb.divisors(co1) if d % step == 0 and (d <= fit or d == step))


def task_rows(n_other: int, hq: int, row_bytes: int, target) -> int:
    """Hq rows per task of a chunked dx phase: the most (a divisor of ``hq``: no ragged
    task) whose accumulator block fits :data:`BLOCK_L2_SHARE` of L2 and whose
    ``n_other * hq / rows`` tasks keep the cores busy, else the rows whose tasks share out
    best (:func:`schedules.toolbox.sharing_choice`).
    More rows, more tiles reuse each chunk's panel while it is in L1."""
    cap = max(1, int(target.l2_kib * 1024 * BLOCK_L2_SHARE) // row_bytes)
    rows = sorted((d for d in tb.divisors(hq) if d <= cap), reverse=True)
    return tb.sharing_choice(rows, lambda r: n_other * (hq // r), target.cores)[0]


def dx_acc_tiles(sch, block, target, kc: int = 0):
    """Register tile of one dx phase: C1x blocks x Wq positions x the lane axis. ``kc``: dy
    channel blocks per chunk of the weight panels (:func:`weight_panels`; 0: none). A phase
    whose own taps' panel overflows L1 runs its reduction in chunks of a multiple of ``kc``
    (:func:`chunk_blocks`), each task :func:`task_rows` rows chunk by chunk
    (:func:`schedules.toolbox.register_tile`'s ``chunk``); else the whole reduction is under
    the tile and each task is one row, or one tile of a row where rows are too few to share
    out over the cores (:func:`schedules.toolbox.lead_loops`)."""
    cx1_t, tw = tile_shape(sch, block, target)
    spatial, red = tb.split_loops(sch, block)
    dot = dot_intrinsic(sch, block, target)
    kc = phase_chunk(sch, block, target, cx1_t, kc) if kc else 0
    if not kc:
        per_lane = len(red) == 3
        n, c1x, hq, wq = (tb.extent(sch, lp) for lp in spatial[:4])
        lead = tb.lead_loops([n, -(-c1x // cx1_t), hq, -(-wq // tw)], target.cores, least=3)
        return tb.register_tile(sch, block, target, spatial, red, {1: cx1_t, 3: tw},
                                par=list(range(lead)), serial=[3] if lead == 3 else [],
                                red_inner=(red[1],) if per_lane else (), dot_intrin=dot), 0
    return chunk_tiles(sch, block, target, cx1_t, tw, kc, dot), kc


def phase_chunk(sch, block, target, cx1_t: int, kc: int) -> int:
    """dy channel blocks per reduction chunk of the phase ``block`` (a multiple of the
    weight panels' ``kc``, :func:`chunk_blocks` over the phase's own taps), 0 where its whole
    reduction's panel fits."""
    _, red = tb.split_loops(sch, block)
    co1, jh, jw, _ = (tb.extent(sch, lp) for lp in red)
    # the weight stage of a layout without dot products: float32 (int32 for int8)
    kc = chunk_blocks(co1, jh * jw, 4, cx1_t, target, step=kc)
    return 0 if kc == co1 else kc


def chunk_tiles(sch, block, target, cx1_t: int, tw: int, kc: int, dot=None,
                every_block: bool = False):
    """The register tiles of a dx phase whose reduction runs in chunks of ``kc`` dy channel
    blocks (:func:`dx_acc_tiles`): each task takes :func:`task_rows` rows of an image and
    ``cx1_t`` C1x blocks of them, or with ``every_block`` every C1x block (one after the
    other, each over every row of the task: :func:`pad_in_task`'s tasks, which pad their own
    rows of dy). Where those tasks are too few for the cores, each row's tiles are cut into
    parts (:func:`row_segments`), each part a task. Returns
    :func:`schedules.toolbox.register_tile`'s result."""
    spatial, red = tb.split_loops(sch, block)
    b, cx1, qh, qw, cx0 = spatial
    n, c1x, hq, wq = (tb.extent(sch, lp) for lp in (b, cx1, qh, qw))
    blocks = c1x if every_block else cx1_t
    row_bytes = blocks * wq * C0 * 4  # the task's accumulators: float32 or int32
    rows = task_rows(n * c1x // blocks, hq, row_bytes, target)
    qh_o, qh_i = sch.split(qh, [None, rows])
    co1_o, co1_i = sch.split(red[0], [None, kc])
    segs = 1 if every_block else row_segments(n * c1x // blocks * (hq // rows), wq, tw,
                                              target.cores)
    lead = [b, cx1, qh_o]
    if segs > 1:
        qw_s, qw = sch.split(qw, [segs, None])
        lead.append(qw_s)
    k = len(lead)
    par, serial = ([0, 2], [1, 3, 4]) if every_block else (list(range(k)), [k, k + 1])
    return tb.register_tile(sch, block, target, [*lead, qh_i, qw, cx0],
                            [co1_o, co1_i, *red[1:]], {1: cx1_t, k + 1: tw}, par=par,
                            serial=serial, dot_intrin=dot, chunk=1)


def row_segments(tasks: int, wq: int, tw: int, cores: int) -> int:
    """Parts of whole register tiles (``tw`` of ``wq`` positions) each row of a chunked dx
    phase is cut into, each part a task: 1 where ``tasks`` (rows) share out over ``cores``
    (:func:`schedules.toolbox.balance`), else the fewest parts that do, else those that
    share out best. A part keeps a chunk's weight panel in L1 for all of its tiles; 112 rows
    on 32 cores left an eighth of them idle."""
    if wq % tw:
        return 1
    return tb.sharing_choice(tb.divisors(wq // tw), lambda p: tasks * p, cores, tb.balance)[0]


def pad_in_task(sch, workload, block, kc: int):
    """Where it pays, tile the chunked dx phase ``block`` (the pad's one reader) so that each
    task takes every C1x block of its rows (:func:`chunk_tiles`) and computes ``dx_dy_pad``
    inside the task: its rows of dy, padded into cache just before its tiles read them,
    instead of a pass of its own that writes the whole pad to memory for the tasks to read
    back. Only where those tasks still share out over the cores and their pads together
    cover the whole pad at most :data:`schedules.toolbox.TASK_REPEAT_LIMIT` times
    (:func:`schedules.toolbox.task_repeat`: the taps' halo rows are padded by both tasks
    beside them). Returns ``(register_tile's result, kc)``, or None (nothing done)."""
    target = workload.target
    pad = workload.find(sch, tag.DX_DY_PAD)
    if pad is None:
        return None
    cx1_t, tw = tile_shape(sch, block, target)
    kc = phase_chunk(sch, block, target, cx1_t, kc)
    spatial, _ = tb.split_loops(sch, block)
    n, c1x, hq, wq = (tb.extent(sch, lp) for lp in spatial[:4])
    rows = task_rows(n, hq, c1x * wq * C0 * 4, target)
    if not kc or tb.task_share(n * hq // rows, target.cores) < tb.BALANCE_MIN:
        return None
    repeat = tb.in_task_repeat(sch, pad, block, lambda trial, acc: chunk_tiles(
        trial, acc, target, cx1_t, tw, kc, every_block=True))
    if repeat is None:
        return None
    tiled = chunk_tiles(sch, block, target, cx1_t, tw, kc, every_block=True)
    sch.compute_at(pad, sch.get_loops(block)[0], preserve_unit_loops=True)
    tb.vectorize_split(sch, sch.get_loops(pad)[-1], tb.c0_vectors(target)[1])
    workload.note(sch.get(pad).name_hint, RULE,
                  f"dy padded in each task (its rows, in cache; {repeat:.2f}x the pad)")
    return tiled, kc


def weight_panels(sch, weight, cx1_t: int, kc: int) -> None:
    """Lay ``dx_weight`` ``[C1x, KH, KW, CO, 16]`` out as the chunks read it:
    ``[C1x / cx1_t, CO / (kc*16), KH, KW, kc*16, cx1_t, 16]``, one contiguous panel per
    (tile's C1x blocks, chunk), the tile's ``cx1_t`` weight vectors of a step side by side.
    In the plain layout a chunk's rows sit a multiple of 4 KB apart (every tap and every C1x
    block), so they share a few L1 sets and evict each other however small the chunk."""
    ct, kcc = cx1_t, kc * C0
    sch.transform_layout(weight, ("write", 0), lambda c1, kh, kw, co, c0: (
        c1 // ct, co // kcc, kh, kw, co % kcc, c1 % ct, c0))


def chunking(sch, workload, accs, target) -> tuple[int, int]:
    """``(cx1_t, kc)`` of a dense float dx whose weight panel per register tile overflows
    L1 (:func:`chunk_blocks` over every tap), else ``(0, 0)``: grouped, dot-product and
    few-channel layouts, and layers whose panel fits, keep the whole reduction under the
    tile."""
    weight = workload.find(sch, tag.DX_WEIGHT)
    if weight is None or not accs or tb.spatial_count(sch, accs[0]) != 5:
        return 0, 0
    buf = sch.get(weight).writes[0].source
    _, red = tb.split_loops(sch, accs[0])
    if len(buf.shape) != 5 or len(red) != 4 or dot_intrinsic(sch, accs[0], target):
        return 0, 0
    _, kh, kw, co_ext, _ = (int(d) for d in buf.shape)
    cx1_t = tile_shape(sch, accs[0], target)[0]
    kc = chunk_blocks(co_ext // C0, kh * kw, buf.dtype.bits // 8, cx1_t, target)
    return (cx1_t, kc) if kc < co_ext // C0 else (0, 0)


def weight_sums(sch, block) -> None:
    """``dx_wsum*`` ``[C1x, 16]`` (int8 weight sums): the 16 lanes in one vector, the taps and
    Cout summed below the channel block (unscheduled, they ran as scalar loops on one
    core)."""
    if tb.spatial_count(sch, block) != 2:  # [Cin] (positions): small, left as it is
        return
    cx1, cx0, *red = sch.get_loops(block)
    sch.reorder(cx1, *red, cx0)
    sch.vectorize(cx0)
    sch.decompose_reduction(block, red[0])


def amx_tiles(sch, workload, block, single_phase: bool) -> bool | None:
    """AMX tiles for a dot-product phase where the target has them (:mod:`schedules.amx`):
    Wq positions as tile rows, C1x blocks as the tiles' 16 lanes, the rows ``(N, C1x tiles,
    Hq)`` across cores; with one phase dx is written from each tile's accumulators. None
    (nothing done) where the instruction does not apply, else whether dx was written from
    the tiles."""
    ins = amx.instruction(sch, block, workload.target)
    spatial, red = tb.split_loops(sch, block)
    if ins is None or tb.extent(sch, red[-2]) > amx.K_GROUPS:
        return None
    b, cx1, qh, qw, cx0 = spatial
    t = amx.tile_reduction(sch, block, qw, cx0, cx1, [b, cx1, qh], workload.target.cores)
    workload.note(sch.get(block).name_hint, RULE,
                  f"AMX {ins.llvm.rsplit('.', 1)[-1]}: {t.mt}x{t.nt} accumulator tiles of "
                  f"{t.rows} Wq positions x 16 lanes, the whole reduction under them")
    return single_phase and fusion.write_from_tile(
        sch, workload, t.write_back, workload.find(sch, tag.CONV2D_BACKPROP_INPUT), RULE)


@schedules.register(tag.CONV2D_BACKPROP_INPUT, "x86")
def schedule_dx_x86(sch, workload) -> None:
    target = workload.target
    accs = workload.find_all(sch, tag.DX_ACC)
    stages = [tag.DX_DY_CAST, tag.DX_DY_PAD, tag.DX_WEIGHT, tag.CONV2D_BACKPROP_INPUT]
    cx1_t, kc = chunking(sch, workload, accs, target)
    in_tasks = None
    for acc in accs:
        name = sch.get(acc).name_hint
        # [N, Cin, Hq, Wq] (few input channels) or [N, C1x, Hq, Wq, C0]
        if tb.spatial_count(sch, acc) == 4:
            if in_tasks is None:
                in_tasks = positions_in_tasks(sch, workload, accs)
                if in_tasks:
                    stages.remove(tag.DX_DY_PAD)
                    stages.remove(tag.CONV2D_BACKPROP_INPUT)
            if not in_tasks:
                dx_positions_tile(sch, acc, target)
            workload.note(name, RULE, "few input channels: W positions in vector lanes"
                          + (", in the tasks of dx's rows" if in_tasks else ""))
            continue
        written = amx_tiles(sch, workload, acc, len(accs) == 1)
        if written is not None:
            if written:
                stages.remove(tag.CONV2D_BACKPROP_INPUT)
            continue
        in_task = pad_in_task(sch, workload, acc, kc) if kc and len(accs) == 1 else None
        (wb, _), kc_acc = in_task or dx_acc_tiles(sch, acc, target, kc)
        workload.note(name, RULE, "C1x blocks x Wq positions x C0 lanes in registers"
                      + (f", Cout in chunks of {kc_acc * C0} (weight panels in L1)"
                         if kc_acc else "")
                      + (", each task every C1x block of its rows" if in_task else ""))
        if in_task:
            stages.remove(tag.DX_DY_PAD)
        # one phase: dx (and a fused epilogue) is written straight from the register tile
        if len(accs) == 1 and fusion.write_from_tile(
                sch, workload, wb, workload.find(sch, tag.CONV2D_BACKPROP_INPUT), RULE):
            stages.remove(tag.CONV2D_BACKPROP_INPUT)
    schedule_fallbacks(sch, workload, tag.CONV2D_BACKPROP_INPUT, RULE)
    for block in workload.find_all(sch, tag.DX_WSUM):
        weight_sums(sch, block)
        workload.note(sch.get(block).name_hint, RULE, "weight sums, the lanes in a vector")
    if kc:
        weight_panels(sch, workload.find(sch, tag.DX_WEIGHT), cx1_t, kc)
    for stage in stages:
        block = workload.find(sch, stage)
        if block is None:
            continue
        notes = sch.get(block).annotations
        run, src = int(notes.get(tag.LANE_RUN, 0)), int(notes.get(tag.SOURCE_RUN, 0))
        name = sch.get(block).name_hint
        if stage == tag.DX_DY_PAD and not (run or src) and tb.transpose_tile(sch, block,
                                                                             target):
            workload.note(name, RULE, "dy's C0 lanes into W rows: inside the padding "
                          "whole vectors, no bounds test; the pad's borders apart")
            continue
        tb.elementwise_c0(sch, block, target, run=run or src)
        workload.note(name, RULE,
                      f"regathered dy: runs of {run} equal lanes, one load each" if run
                      else f"re-blocked dy: runs of {src} lanes from one 5HD block, one vector "
                      "load each" if src else "elementwise 5HD stage")
