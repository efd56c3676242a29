"""Contractions (matmul, batched matmul, convolutions): a register-blocked micro-kernel.

A contraction block is ``C[...] += S[...] * V[...]`` where ``V`` is the operand whose
innermost index is the output's innermost (contiguous) axis ``v`` with stride 1, and ``S``
the one without it. The micro-kernel keeps an ``mr x (nv * lanes)`` tile of ``C`` in vector
registers for the whole reduction: per reduction step it loads ``nv`` vectors of ``V``,
broadcasts ``mr`` scalars of ``S`` along ``m`` (the innermost output axis only ``S`` has:
the rows of a matmul, the output channels of a convolution) and issues ``mr * nv`` FMAs.
``mr`` and ``nv`` come from the register file (16 vector registers on SSE/AVX2, 32 on
AVX-512): accumulators + ``nv`` loads + one broadcast must fit, and among those tiles the
one with the most FMAs per load wins (a multiple of the ``v`` extent first).

Around it: ``mc`` rows of ``m`` (``m1`` micro-tiles) are a block whose ``S`` slice stays in
L2 while the ``V`` panel of one tile column is reused by every micro-tile of the block;
``(other outputs axes, m blocks[, v tiles])`` run across cores. ``V`` is packed once into
``[.., v // nr, k.., nr]`` (``cache_read`` + ``transform_layout``) when its layout would
stride each reduction step across rows (a matmul's ``B[k, j]``: at power-of-two ``N`` every
row of the panel maps to the same cache set) and the tile divides its extent. A consumer
(bias, activation, cast) that reads ``C`` elementwise is fused into the tile's write-back.

When ``v`` is short or no whole number of full-width vectors (an NCHW conv2d's rows of 56:
seven half-width ymm on AVX-512) while ``m`` is whole vectors, the tile turns round: vectors
along ``m`` (``S`` packed ``[m // (nv * lanes), k.., nv * lanes]``), ``mr`` positions of ``v``
broadcast from ``V``, the accumulators' buffer with ``m`` innermost and a write-back that
transposes the tile (:func:`_across_m` decides, by the same measure and a margin). The padding
stage ``V`` comes from is then computed inside each parallel row.
"""

from __future__ import annotations

import math

from schedules.patterns.analysis import stride_in
from schedules.patterns.common import (
    Detail,
    extent,
    producers_inside,
    product,
    split_by_phase,
    vectorize_registers,
    vectorize_tail,
)
from schedules.toolbox import tensorize_dot

# The S block of one core uses at most 1/PANEL_BYTES_FRACTION of its L2, and at most
# M_BLOCK_TILES micro-tiles: every block streams the whole V panel past its tiles (from L3
# when V outgrows L2), so the taller the block, the fewer times V is read. A 1024^3 matmul on
# one / two Emerald Rapids cores: 1/4 of L2 and 8 tiles (32 rows) 116 / 182 GFLOP/s, 1/2 and
# 64 (256 rows) 139 / 205 (same-process A/B, 31 rounds); the whole L2 (512 rows) 1.02x more.
PANEL_BYTES_FRACTION = 2
# Steps of the reduction a chunk sums where the packed panel of V outgrows half of L2
# (:func:`_reduction_chunk`). One Zen 4 core, same-process A/B against the whole reduction
# a pass: a user's linear weight gradient dy^T x 4096 x 1024 x 1024 1.14x (1024 steps;
# 2048: 1.07x, 256: 1.13x), 8192 x 768 x 3072 1.17x, a matmul over 4096 steps 1.10x, an
# NHWC conv2d weight gradient over 8x112x112 1.43x (2 cores 1.12x / 1.08x / 1.37x).
REDUCTION_CHUNK = 1024
# The least share of the cores the output's other axes must keep busy for the reduction to go
# in chunks (they alone run across cores then): a weight gradient's 9 taps on 2 cores (0.9)
# ran 1.37x faster chunked than its 144 tile tasks in one pass over 8x112x112.
CHUNK_SHARE_MIN = 0.85
M_BLOCK_TILES = 64
ACROSS_M_MARGIN = 1.25  # vectors along m only when clearly better: they cost a transpose
# The transposing write-back of a tile with vectors along m costs about as much as this many
# reduction steps of it, where V has no window along v: over a short reduction it outweighs
# the better FMA-to-load ratio. A user's 1x1 conv2d over rows of 112 (7 zmm), one Zen 4 core,
# along v / along m: 32 -> 192 channels 82 / 51 GFLOP/s, 64 -> 192 101 / 71, 96 -> 192
# 89 / 81 (same-process A/B, 2 x 32 -> 192: 1.80x; 64: 1.42x; 128 -> 128: 1.13x; on two
# cores 1.32x / 1.03x). A 3x3 one keeps the tile along m (16 -> 64 channels, 144 steps:
# 84 / 95), its overlapping taps sharing the broadcasts.
ACROSS_WRITE_BACK_STEPS = 64
# The same for a tile of an odd number of output positions over 4 (7): its write-back goes
# lane by lane (inserts and extracts), not in blocks of shuffles. A user's 1x1 conv2d,
# same-process A/B, one / two Zen 4 cores, 7 x 3 -> 4 x 3 tiles: 4x24x56x56 -> 144 1.23x /
# 1.21x, 8x40x28x28 -> 240 1.29x / 1.24x; over rows of 14 (96 steps) 8 x 2 ran 1.03x faster
# than 7 x 3 (kept: a ragged 8-tile). Counted over reductions of ODD_TILE_SHORT steps at most:
# over longer ones it is a few percent, and the tiles it would swap measured alike (a 3x3
# stride-2 conv2d of 64 channels, 7 x 2 or 4 x 4: 0.99-1.01x).
ODD_TILE_WRITE_BACK_STEPS = 32
ODD_TILE_SHORT = 128
BLOCKS_PER_CORE = 2  # a task per m block only with this many blocks a core (load balance)
ACROSS_S_LOAD_COST = 2.5  # an S vector from L2 against a V broadcast from L1
# A tile along m holds mr x nv accumulators, nv vectors of S and the mr + taps - 1 broadcasts
# its positions' window taps share; up to this many more than the registers LLVM absorbs
# (7 x 3 over 3 taps: 33 of 32 registers), more spill: a user's conv1d over 99 positions, 256
# channels, 3 taps, ran 11 x 2 (37) at 65 GFLOP/s on one Zen 4 core, 10 x 2 (34) over 100
# at 112.
ACROSS_SPARE_REGISTERS = 2
# A tile along m whose positions run along an axis this short holds at most 3 x 4 vectors
# (fewer than a 4 x 4 tile's 16 accumulators): its positions go along a longer axis of V's
# where one has no window (:func:`_positions_axis`).
SHORT_POSITIONS = 4
# The longest reduction iterator along a tile's positions that LLVM unrolls whole, so the
# positions share its broadcasts from one step to the next (:func:`_taps_along`): a user's
# NCHW weight gradient along its 3 column taps ran 3 x 4 vectors at 117 GFLOP/s over rows of
# 7 and 14 on one Zen 4 core (8 x 2 along its input channels: 102-113), and at 88 over rows
# of 28 (along the channels: 105).
UNROLLED_WINDOW = 16
# An AVX-512 tile along v with a partial vector, against a whole one: a user's grouped conv2d
# (128 channels, 32 groups, 28x28) ran at 11 GFLOP/s so and at 46 in quarter registers (2 x 7
# xmm) on one Zen 4 core, where 0.3 had kept the partial zmm
RAGGED_V_512 = 0.1
# A row shorter than one vector, in one partial vector: its mask is the same at every step
# and the accumulators stay in registers (8x64x12x12, 3x3 to 20 channels, one Zen 4 core:
# 0.456 ms so, 0.618 in 3 quarter registers a row)
ONE_PARTIAL_V = 0.3
# A tile of fewer than 4 vectors on a dot-product instruction (vdpbf16ps) counts this much of
# its FMAs per load: a user's bfloat16 matmul 256x1008x768 on one Zen 4 core ran 8 x 3
# vectors at 163 GFLOP/s, 12 x 2 at 173, 4 x 4 and 6 x 4 at 186 with v padded to 1024 (a
# padding scored_tile counts 0.75, which this outweighs); at 1024^3 4 x 4 ran 220 (94% of
# the bf16 roof).
DOT_NARROW = 0.6
# A windowed contraction's v (or, for a tile along m, m) is padded to whole full-width
# vectors (_pad_v, _across_m_padded) only where that tile's useful FLOPs (_useful_fmas) beat
# the unpadded tile's by this much: the padding costs a copy and a cropping write-back.
PAD_MARGIN = 1.1


# The fewest output channels a group may have for a tile along them (inside one group, the
# input one broadcast a tile): a user's grouped NHWC conv2d, one Zen 4 core, 8 channels a
# group (8x56x56, 64 -> 64) 75.6 -> 2.8 ms, 32 (8x28x28, 128 -> 128) 132 -> 4.3 ms; with 4 a
# group it stayed at 25 ms either way and with 2 went 9.7 -> 13.4 ms, so those keep the
# reduction rule.
GROUP_V_MIN = 8


def vector_registers(target) -> int:
    return 32 if target.vector_bits >= 512 else 16


def roles(f):
    """``(S, V, m, v, transposed)`` of a contraction (see the module docstring); raises if
    none fit. ``transposed``: ``V`` holds ``v`` as a bare index of an outer dimension (a
    matmul's ``B[j, k]``), so it must be packed to load vectors along ``v``."""
    last = f.write_vars[-1] if f.write_vars else set()
    if len(last) != 1:
        raise ValueError("the output's innermost index is not a bare iterator")
    v = next(iter(last))
    a, b = f.operands

    def m_of(s_op, v_op):
        ms = [x for x in f.spatial if f.extents[x] > 1 and x in s_op.all_vars()
              and x not in v_op.reuse_vars() and x != v]
        return ms[-1] if ms else None

    for s_op, v_op in ((a, b), (b, a)):
        if v_op.index_vars and v in v_op.index_vars[-1] and stride_in(v_op.indices[-1], v) == 1 \
                and _whole_groups(f, s_op, v) and m_of(s_op, v_op):
            return s_op, v_op, m_of(s_op, v_op), v, False
    for s_op, v_op in ((a, b), (b, a)):
        if any(str(ix) == v for ix in v_op.indices) and v not in s_op.all_vars() \
                and m_of(s_op, v_op):
            return s_op, v_op, m_of(s_op, v_op), v, True
    raise ValueError("no operand is contiguous along the output's innermost axis")


def _whole_groups(f, s_op, v: str) -> bool:
    """Whether ``S`` reads ``v`` not at all, or only by group (``v // K``, a grouped conv2d
    in NHWC: ``x[.., (o // K) * cg + c]``) with ``K`` dividing ``v``'s extent and at least
    :data:`GROUP_V_MIN`."""
    k = s_op.grouped.get(v)
    return v not in s_op.all_vars() or (k is not None and k >= GROUP_V_MIN and
                                        f.extents[v] % k == 0)


def v_group(f, s_op, v: str) -> int:
    """``K`` where ``S`` reads ``v`` only as ``v // K`` (the tile along ``v`` then lies in one
    group, ``S`` one broadcast a tile); 0 where it does not read ``v``."""
    return s_op.grouped.get(v, 0) if v in s_op.all_vars() else 0


def micro_tile(target, m_ext: int, v_ext: int, pad_ok: bool = False) -> tuple[int, int, int]:
    """``(mr, nv, lanes)``: the register tile (see the module docstring); :func:`scored_tile`
    without the score."""
    return scored_tile(target, m_ext, v_ext, pad_ok)[0]


def scored_tile(target, m_ext: int, v_ext: int, pad_ok: bool = False, dot: bool = False):
    """``((mr, nv, lanes), score)``: the register tile and its merit (FMAs per load, in
    full-width FMAs, discounted for ragged edges).

    Tiles are whole registers: ``nv`` vectors of ``lanes`` (the target's width, or half of
    it when only half-width vectors divide ``v``: 56 outputs are 7 ymm, never 3.5 zmm, whose
    odd-width vector LLVM assembles lane by lane through the stack). A tile that leaves a
    ragged edge costs most: the edge's guard sits inside the reduction loop, so tiles
    dividing both extents win over larger ones that do not, unless the domain can be padded
    (``pad_ok``). With AVX-512, LLVM turns that guard into masked gathers and keeps the
    accumulators in memory (a user conv2d with 56 columns ran at 14 GFLOP/s on one Xeon
    core, PyTorch 75), so a ragged vector edge weighs far more there
    (:data:`RAGGED_V_512`), and quarter registers are tried where only they divide ``v``;
    with AVX2 it versions the loop and the ragged tile stays fast (59 GFLOP/s on the same
    core). ``dot``: the tile runs on a dot-product instruction (:func:`_dot_pair`), where
    narrower tiles than 4 vectors count :data:`DOT_NARROW`, partial registers half (they
    keep multiply-adds)."""
    full = max(1, target.vector_bits // 32)  # fp16 math runs as fp32 on these targets
    regs = vector_registers(target)
    v_ragged = RAGGED_V_512 if target.vector_bits >= 512 else 0.6
    best, best_score = (1, 1, full), -1.0
    # quarter registers (xmm on AVX-512) where only they divide a row longer than one
    # register: 28 columns are 7 (a shorter row keeps its one partial vector, ONE_PARTIAL_V)
    quarter = (full // 4,) if full >= 16 and v_ext > full else ()
    widths = (full, full // 2, *quarter) if full >= 8 else (full,)
    for lanes in widths:
        for nv in range(1, 5 if lanes == full else 8):
            if nv > 1 and (nv - 1) * lanes >= v_ext:
                break
            for mr in range(min((regs - nv - 1) // nv, m_ext), 0, -1):
                score = _merit(mr, nv) * lanes / full  # per full-width FMA
                if mr * nv < 8:  # fewer accumulators than FMA latency x ports: stalls
                    score *= 0.7
                # padding costs copies (and measured no faster at 1024^3), a guard more
                if _ragged(v_ext, nv * lanes, lanes):
                    # one partial vector the whole row: the same mask every step, in registers
                    whole_row = nv == 1 and lanes > v_ext
                    if pad_ok and not whole_row:  # padded: counted in the lanes it keeps
                        # (49 columns: 4 vectors in one tile of 4, but 6 in two tiles of 3)
                        score *= 0.75 * v_ext / (-(-v_ext // (nv * lanes)) * nv * lanes)
                    else:
                        score *= 0.75 if pad_ok else ONE_PARTIAL_V if whole_row else v_ragged
                if m_ext % mr:
                    score *= 0.75 if pad_ok else 0.6
                if dot:  # the instruction takes whole registers and does twice the work
                    score *= 0.5 if lanes != full else DOT_NARROW if nv < 4 else 1.0
                if score > best_score:
                    best, best_score = (mr, nv, lanes), score
    return best, best_score


def _pack(sch, blk, op, f, var: str, width: int, copy: bool = True, pair=None):
    """Lay operand ``op`` out as ``[other.., var // width, reduction.., var % width]``: one
    contiguous ``width``-wide row per reduction step. ``copy``: through a new packed copy
    (``cache_read``); else the operand is already an intermediate buffer and is re-laid.
    ``pair``: ``(reduction iterator r, depth)``, the steps of ``r`` in groups of ``depth``
    innermost (``[.., r // depth, .., var % width, r % depth]``), as a dot-product
    instruction reads them."""
    from tvm.tirx import IndexMap

    dims = [next(iter(vs)) for vs in op.index_vars]
    vd = dims.index(var)
    red = [d for d, x in enumerate(dims) if x in f.reduce]
    other = [d for d in range(len(dims)) if d != vd and d not in red]
    rd, depth = (dims.index(pair[0]), pair[1]) if pair else (None, 1)

    def fn(*ix):
        steps = [ix[d] // depth if d == rd else ix[d] for d in red]
        return [*[ix[d] for d in other], ix[vd] // width, *steps, ix[vd] % width,
                *([ix[rd] % depth] if pair else [])]

    idx = next(i for i, r in enumerate(sch.get(blk).reads) if r.source.name == op.buffer)
    pack = sch.cache_read(blk, idx, "global") if copy else None
    # a ragged last tile reads zeros past the edge of the packed panel
    ragged = f.extents[var] % width != 0
    sch.transform_layout(blk, ("read", idx),
                         IndexMap.from_func(fn, ndim=len(dims), index_dtype="int32"),
                         pad_value=0.0 if ragged else None)
    return pack


def _pure(op) -> bool:
    return all(len(vs) == 1 and str(ix) in vs for ix, vs in zip(op.indices, op.index_vars))


def _reads_plainly(op, var: str) -> bool:
    """Whether ``op`` reads iterator ``var`` in exactly one dimension, as that whole index
    (``w[.., f]``, not ``x[.., i + rx]``)."""
    return sum(var in vs for vs in op.index_vars) == 1 and \
        any(str(ix) == var for ix in op.indices)


def _packable(op) -> bool:
    """Whether each of ``op``'s indices reads one iterator (``w[o, c, 2 - ry, 2 - rx]``, a
    user's flipped weights, as well as ``w[o, c, ry, rx]``), so :func:`_pack` can lay it
    out by its dimensions' iterators."""
    return all(len(vs) == 1 for vs in op.index_vars)


def _m_blocks(m_tiles: int, limit: int) -> int:
    """Micro-tiles per L2 block: the largest <= ``limit`` wasting at most 1/32 of the tiles
    to padding, else the one wasting least."""
    waste = {b: -(-m_tiles // b) * b - m_tiles for b in range(1, max(1, min(limit, m_tiles)) + 1)}
    ok = [b for b, w in waste.items() if 32 * w <= m_tiles]
    return max(ok) if ok else min(waste, key=lambda b: (waste[b], -b))


def _reduction_chunk(f, v_op, m: str, v: str, nv_lanes: int, target):
    """``(reduction axis, its steps a chunk, the chunk's steps)`` where the packed panel of
    ``V`` (the whole reduction by ``nv_lanes``) outgrows half of L2 and
    :func:`_blocked_nest` sums the reduction in chunks of about :data:`REDUCTION_CHUNK`
    steps: the innermost reduction axes whole, the next split by the largest divisor that
    fits. None where ``V`` is read through a window (no packed panel: a convolution's
    input rows), where the panel fits, where no chunk of at least 64 steps divides the axes,
    or where the output's other axes, which then alone run across cores (a weight
    gradient's 9 taps), would keep less than :data:`CHUNK_SHARE_MIN` of them busy (16
    cores: the tiles of each tap stay tasks, the reduction one pass)."""
    from schedules.toolbox import task_share

    panel = 4 * nv_lanes * product(f.extents[x] for x in f.reduce)
    if not f.reduce or not _pure(v_op) or panel <= (target.l2_kib << 10) // 2:
        return None
    rows = product(f.extents[x] for x in f.spatial if x not in (m, v))
    if rows > 1 and target.cores > 1 and task_share(rows, target.cores) < CHUNK_SHARE_MIN:
        return None
    inner = 1
    for ax in reversed(range(len(f.reduce))):
        if inner * f.extents[f.reduce[ax]] > REDUCTION_CHUNK:
            break
        inner *= f.extents[f.reduce[ax]]
    else:
        return None
    ext = f.extents[f.reduce[ax]]
    steps = max((d for d in range(1, ext + 1) if ext % d == 0 and d * inner <= REDUCTION_CHUNK),
                default=1)
    return (ax, steps, steps * inner) if steps * inner >= 64 else None


def _block_tiles(f, m: str, v: str, mr: int, nv_lanes: int, target, k_elems: int = 0) -> int:
    """Micro-tiles per L2 block: as many as keep the block's S slice (``k_elems`` steps: a
    chunk of the reduction, :func:`_reduction_chunk`; default all of it) in
    1/:data:`PANEL_BYTES_FRACTION` of L2 (at most :data:`M_BLOCK_TILES`), fewer where the
    tasks would leave cores idle (:func:`_blocks_for_cores`)."""
    k_elems = k_elems or product(f.extents[x] for x in f.reduce)
    limit = min(M_BLOCK_TILES,
                (target.l2_kib << 10) // PANEL_BYTES_FRACTION // (4 * k_elems * mr))
    return _blocks_for_cores(f, m, v, mr, nv_lanes, _m_blocks(-(-f.extents[m] // mr), limit),
                             target.cores)


def _blocks_for_cores(f, m: str, v: str, mr: int, nv_lanes: int, m1: int, cores: int) -> int:
    """Micro-tiles per L2 block (``m1`` the cache's choice), fewer where the tasks of
    :func:`_micro_kernel` (the other output axes x the m blocks, x the v blocks where those
    are few) would leave cores idle: the first of ``m1`` and the smaller block sizes whose
    tasks share out over ``cores`` (:func:`schedules.toolbox.sharing_choice`). A user's NHWC
    conv2d weight gradient, 64 x 64 channels and 3 x 3 taps, was 18 tasks of 8 tiles: on 16
    cores two rounds, the second for 2 of them (static model, dsl/runtime/scaling.py: 0.56
    of the cores busy, 1.0 with blocks of one tile)."""
    from schedules.toolbox import sharing_choice

    if cores < 2:
        return m1
    m_tiles = -(-f.extents[m] // mr)
    sizes = list(dict.fromkeys(_m_blocks(m_tiles, lim) for lim in range(m1, 0, -1)))
    return sharing_choice(sizes, lambda b: _tasks(f, m, v, mr, nv_lanes, b, cores), cores)[0]


def _tasks(f, m: str, v: str, mr: int, nv_lanes: int, m1: int, cores: int) -> int:
    """The tasks of :func:`_micro_kernel`'s parallel loop: the other output axes x the m
    blocks of ``m1`` tiles, x the v blocks where those are few."""
    n = product(f.extents[x] for x in f.spatial if x not in (m, v)) * \
        -(-f.extents[m] // (mr * m1))
    v_blocks = -(-f.extents[v] // nv_lanes)
    return n * v_blocks if _v_blocks_are_tasks(n, cores) else n


def _v_blocks_are_tasks(n_par: int, cores: int) -> bool:
    """Whether the blocks along v join ``n_par`` tasks (the other output axes x the m
    blocks) in :func:`_micro_kernel`'s parallel loop: where those are few for the cores."""
    return n_par < 4 * cores


def _pad_tiles(sch, name: str, f, pads: dict):
    """Pad the block's iteration domain to whole tiles (``pad_einsum``: zero-padded input
    copies, a cropping copy of the output), so no guard sits inside the reduction loop.
    Returns ``(facts of the padded block, names of the copy blocks)``; unchanged when the
    domain is already whole or TVM refuses (windowed operands)."""
    from schedules.patterns.analysis import block_facts, root_blocks

    padding = [pads.get(x, 1) for x in [*f.spatial, *f.reduce]]
    if all(f.extents[x] % p == 0 for x, p in zip([*f.spatial, *f.reduce], padding)):
        return f, []
    trial = sch.copy()
    try:
        trial.pad_einsum(trial.get_sblock(name), padding)
    except Exception:  # noqa: BLE001 - not an einsum TVM can pad: keep the guards
        return f, []
    before = {sch.get(b).name_hint for b in root_blocks(sch)}
    sch.pad_einsum(sch.get_sblock(name), padding)
    made = [sch.get(b).name_hint for b in root_blocks(sch)]
    return block_facts(sch, sch.get_sblock(name)), [n for n in made if n not in before]


def _pad_v(sch, name: str, f, target, tile: tuple):
    """Pad a windowed contraction's ``v`` to whole tiles of full-width vectors where they put
    :data:`PAD_MARGIN` times the useful FLOPs of the unpadded ``tile`` into the output
    (:func:`_useful_fmas`). Only where ``V`` reads ``v`` as a plain index and ``S`` lacks it
    (an NHWC conv2d's weight, then a zero-padded copy; the crop of the output is fused into
    the tile's write-back by :func:`_micro_kernel`). Returns :func:`_pad_axis`'s ``(facts,
    crop block, other new blocks)``, or None."""
    s_op, v_op, m, v, _ = roles(f)
    full = max(1, target.vector_bits // 32)
    v_ext = f.extents[v]
    if v_ext % full == 0 or not _reads_plainly(v_op, v):
        return None
    # to whole tiles of 1..4 vectors: 100 channels are 7 vectors, or 2 tiles of 4
    widths = {-(-v_ext // (k * full)) * k * full for k in range(1, 5)}
    padded = max(widths, key=lambda p: scored_tile(target, f.extents[m], p)[1] / p)
    m_ext = f.extents[m]
    if _useful_fmas(target, micro_tile(target, m_ext, padded), m_ext, v_ext, padded) <= \
            PAD_MARGIN * _useful_fmas(target, tile, m_ext, v_ext):
        return None
    return _pad_axis(sch, name, f, v, padded)


def _pad_axis(sch, name: str, f, axis: str, padded: int):
    """Pad contraction ``name``'s iterator ``axis`` to ``padded`` (TVM's ``pad_einsum``: the
    operand that reads it a zero-padded copy, the block writing a padded buffer that a crop
    block copies out). ``pad_einsum`` refuses a windowed (or flipped) operand, so every
    such read is re-indexed by the block's iterators first (``reindex``) and inlined back
    after. Returns ``(facts of the padded block, crop block, the other new blocks)``, or
    None where TVM refuses (the block unchanged)."""
    from schedules.patterns.analysis import block_facts, root_blocks

    def pad(s):
        blk = s.get_sblock(name)
        reindexed = []
        for op in [op for op in f.operands if not _pure(op)]:
            reads = [r.source.name for r in s.get(blk).reads]
            reindexed.append(s.reindex(blk, ("read", reads.index(op.buffer))))
        s.pad_einsum(blk, [padded if x == axis else 1 for x in [*f.spatial, *f.reduce]])
        for r in reindexed:
            s.compute_inline(r)
        return blk

    try:
        pad(sch.copy())
    except Exception:  # noqa: BLE001 - an operand TVM cannot pad: keep the block
        return None
    before = {sch.get(b).name_hint for b in root_blocks(sch)}
    blk = pad(sch)
    crop = sch.get(sch.get_consumers(blk)[0]).name_hint
    made = [sch.get(b).name_hint for b in root_blocks(sch)]
    return block_facts(sch, blk), crop, [n for n in made if n not in before and n != crop]


def _v_padded(v_ext: int, nv: int, lanes: int) -> int:
    """The lanes an einsum's tile of ``nv`` vectors of ``lanes`` computes along ``v`` once
    :func:`_pad_tiles` pads it: whole tiles (20 columns in two vectors: no partial one inside
    the reduction), a row shorter than one vector excepted (its one partial vector runs as
    fast)."""
    return -(-v_ext // (nv * lanes)) * nv * lanes if v_ext > lanes else v_ext


def _useful_fmas(target, tile: tuple, m_ext: int, v_ext: int, computed: int = 0) -> float:
    """The share of the FMA units' FLOPs a tile along ``v`` (:func:`scored_tile`) puts into
    ``v_ext`` output lanes: its FMAs' width (:func:`fma_share`), the lanes it computes past
    ``v_ext`` (``computed`` in all where padded) and the stalls :func:`scored_tile` counts
    (a guarded partial vector inside the reduction, few accumulators, a ragged ``m``); not
    its FMAs per load, which every tile here has enough of to keep the FMA units busy. A
    user's NHWC conv2d of 36, 20 or 116 output channels, one Zen 4 core: 1.49x, 1.22x and
    1.97x faster padded to 48, 32 and 128 than in quarter registers (an xmm FMA does half a
    zmm's work there); of 24 or 40, in ymm (full rate there), 0.76x and 0.83x padded; of 12,
    one partial zmm either way, 0.99x."""
    mr, nv, lanes = tile
    useful = fma_share(target, lanes) * v_ext / max(computed, -(-v_ext // lanes) * lanes)
    if computed <= v_ext and _ragged(v_ext, nv * lanes, lanes) and not (nv == 1 and lanes > v_ext):
        useful *= RAGGED_V_512 if target.vector_bits >= 512 else 0.6
    return useful * (0.7 if mr * nv < 8 else 1.0) * (0.6 if m_ext % mr else 1.0)


def _dot_pair(f, s_op, v_op, target, lanes: int):
    """``(tensor intrinsic, reduction iterator r, depth)`` where the contraction can run on the
    target's dot-product instruction (:func:`schedules.intrinsics.dot_for`: a user's
    bfloat16 matmul summed in float32, ``vdpbf16ps`` on AVX512-BF16, twice the FMA's work):
    vectors of its 16 lanes along ``v``, ``S``'s innermost index a plain reduction iterator
    ``r`` (its ``depth`` steps one contiguous group, broadcast) whose extent ``depth``
    divides, read by ``V`` as a plain index (packed ``[.., r // depth, v, r % depth]``). None
    otherwise: the products stay multiply-adds."""
    from schedules.intrinsics import LANES, dot_for

    if not f.operands_cast or not s_op.indices:
        return None
    hit = dot_for(s_op.dtype, v_op.dtype, f.out_dtype, target,
                  swapped=f.operands[0].buffer != s_op.buffer)
    if hit is None or lanes != LANES:
        return None
    intrin, depth = hit
    r = str(s_op.indices[-1])
    if r not in f.reduce or f.extents[r] % depth or not _reads_plainly(s_op, r) or \
            not _reads_plainly(v_op, r):
        return None
    return intrin, r, depth


def _dot_pair_across(f, s_op, v_op, target, lanes: int):
    """:func:`_dot_pair` for a tile with vectors along ``m`` (``S`` packed in vectors, ``V``
    broadcast): a reduction iterator ``r`` both operands read as a plain index, whose
    ``depth`` steps :func:`_pairs_innermost` lays out contiguously in ``V`` (a user's
    bfloat16 NCHW conv2d: the input channels of ``x[b, c, h + ry, w + rx]``)."""
    from schedules.intrinsics import LANES, dot_for

    if not f.operands_cast or lanes != LANES:
        return None
    hit = dot_for(v_op.dtype, s_op.dtype, f.out_dtype, target,
                  swapped=f.operands[0].buffer != v_op.buffer)
    if hit is None:
        return None
    intrin, depth = hit
    for r in f.reduce:
        if _reads_plainly(s_op, r) and _reads_plainly(v_op, r) and f.extents[r] % depth == 0:
            return intrin, r, depth
    return None


def _pairs_innermost(sch, blk, op, r: str, depth: int) -> str | None:
    """Lay ``op`` out with the ``depth`` steps of ``r`` innermost (``[.., c // 2, h, w,
    c % 2]``): through a copy where it is an argument of the kernel, else the stage that
    writes it writes it so. Returns the copy's block, or None."""
    from tvm.tirx import IndexMap

    ndim = len(op.indices)
    rd = next(d for d, ix in enumerate(op.indices) if str(ix) == r)
    idx = next(i for i, rg in enumerate(sch.get(blk).reads) if rg.source.name == op.buffer)
    produced = any(sch.get(p).writes[0].source.name == op.buffer
                   for p in sch.get_producers(blk))
    copy = None if produced else sch.cache_read(blk, idx, "global")
    sch.transform_layout(blk, ("read", idx), IndexMap.from_func(
        lambda *ix: [*(ix[d] // depth if d == rd else ix[d] for d in range(ndim)),
                     ix[rd] % depth], ndim=ndim, index_dtype="int32"))
    return None if copy is None else sch.get(copy).name_hint


def _should_pack(v_op, f, v: str, nr: int, m_ext: int, mr: int) -> bool:
    pure = _pure(v_op)
    strided = len(v_op.index_vars) >= 2 and bool(v_op.index_vars[-2] & set(f.reduce))
    return pure and strided and f.extents[v] % nr == 0 and m_ext > mr


def _strided_operand(f):
    """``(operand, stride)`` of a strided convolution: the operand whose innermost index
    steps the output's innermost iterator by a constant stride > 1 (``x[.., v * 2 + r]``),
    the other operand lacking it; None for anything else."""
    last = f.write_vars[-1] if f.write_vars else set()
    if len(last) != 1 or len(f.operands) != 2:
        return None
    v = next(iter(last))
    for op, other in (f.operands, f.operands[::-1]):
        if op.indices and v not in other.all_vars():
            s = stride_in(op.indices[-1], v)
            if s is not None and s > 1:
                return op, s
    return None


def _phase_split(sch, name: str, f):
    """Make a strided convolution's windowed operand contiguous along the output's innermost
    axis (:func:`.common.split_by_phase`), so the micro-kernel loads whole vectors. Returns
    ``(facts, copy blocks)``, or None."""
    hit = _strided_operand(f)
    return None if hit is None else split_by_phase(sch, name, [hit])


def schedule_contraction(sch, name: str, facts: dict, target, epilogue: str | None = None,
                         parts_ok: bool = True, dot_ok: bool | None = None):
    """The micro-kernel schedule of contraction ``name`` (optionally fusing ``epilogue``).
    Where its tiles are too few tasks for the cores, a reduction axis is split into partial
    sums first (:func:`schedules.patterns.reduction.in_partial_sums`; not with an epilogue,
    nor when ``parts_ok`` is False). ``dot_ok``: whether the tile may run on a dot-product
    instruction (None: where :func:`_dot_pair` allows and the whole schedule with it
    succeeds on a copy first; tensorize matches the block's expression as written, and a
    form it refuses keeps the multiply-adds instead of failing the rule)."""
    from schedules.patterns.injective import schedule_injective
    from schedules.patterns.reduction import in_partial_sums

    f = facts[name]
    split = None
    try:
        roles(f)
    except ValueError:
        phased = _phase_split(sch, name, f)
        if phased is None:
            raise
        f, split = phased
    s_op, v_op, m, v, transposed = roles(f)
    einsum = _pure(s_op) and _pure(v_op)
    full = max(1, target.vector_bits // 32)
    group = v_group(f, s_op, v)
    if group:  # a tile along v inside one group: no dot pairs, no padding of v, no across m
        dot_ok = False
    if dot_ok is None:
        dot_ok = (_dot_pair(f, s_op, v_op, target, full) or
                  _dot_pair_across(f, s_op, v_op, target, full)) is not None
        if dot_ok:
            try:
                schedule_contraction(sch.copy(), name, {**facts, name: f}, target, epilogue,
                                     parts_ok, True)
            except Exception:  # noqa: BLE001 - any refusal: the multiply-adds instead
                dot_ok = False
    dot_along = dot_ok and _dot_pair(f, s_op, v_op, target, full) is not None
    (mr, nv, lanes), score = scored_tile(target, f.extents[m], group or f.extents[v],
                                         pad_ok=einsum, dot=dot_along)
    if not (split or transposed or dot_along or group):  # a dot tile along v stays there
        across = _across_if_better(sch, name, f, target, epilogue, ((mr, nv, lanes), score),
                                   (einsum, dot_ok))
        if across is not None:
            return across
    nv_lanes = min(nv * lanes, f.extents[v])
    m1 = _block_tiles(f, m, v, mr, nv_lanes, target)
    # an epilogue needs the whole sum in the tile's registers
    chunk = _reduction_chunk(f, v_op, m, v, nv_lanes, target) if epilogue is None else None
    if chunk is not None:
        m1 = _block_tiles(f, m, v, mr, nv_lanes, target, k_elems=chunk[2])
    if parts_ok and epilogue is None and split is None:
        # too few tiles for the cores (a user's NHWC conv2d dw, 64 x 64 channels, 3 x 3
        # taps: 144, 0.75 of 64 cores by the static model of dsl/runtime/scaling.py): each
        # part's tiles tasks of their own
        note = in_partial_sums(sch, name, f, _tasks(f, m, v, mr, nv_lanes, m1, target.cores),
                               target, lambda part, g: schedule_contraction(
                                   sch, part, {**facts, part: g}, target, parts_ok=False,
                                   dot_ok=dot_ok),
                               "tiles")
        if note is not None:
            return note
    crop, v_copies = None, []
    padded = None if einsum or group else _pad_v(sch, name, f, target, (mr, nv, lanes))
    if padded is not None:
        f, crop, v_copies = padded
        (mr, nv, lanes), score = scored_tile(target, f.extents[m], f.extents[v],
                                             dot=dot_along)
        nv_lanes = min(nv * lanes, f.extents[v])
        m1 = _block_tiles(f, m, v, mr, nv_lanes, target)
    v_pad = _v_padded(f.extents[v], nv, lanes)
    f, copies = _pad_tiles(sch, name, f, {m: mr * m1, v: v_pad} if einsum else {})
    s_op, v_op, m, v, transposed = roles(f)
    m_ext, nv_lanes = f.extents[m], min(nv * lanes, f.extents[v])
    blk = sch.get_sblock(name)
    dot = _dot_pair(f, s_op, v_op, target, lanes) if dot_along and \
        f.extents[v] % lanes == 0 else None
    pack = None
    if transposed or dot or _should_pack(v_op, f, v, nv_lanes, m_ext, mr):
        # the zero-padded copy of V is laid out as it is made
        pack = _pack(sch, blk, v_op, f, v, nv_lanes, copy=v_op.buffer not in v_copies,
                     pair=dot[1:] if dot else None)
    if copies and s_op.buffer.endswith("_pad") and m_ext % mr == 0 and s_op.index_vars[-1] & \
            set(f.reduce) and not dot:
        # the zero-padded copy of S is made anyway: lay it out so the broadcasts of one
        # reduction step are adjacent
        _pack(sch, blk, s_op, f, m, mr, copy=False)
    # the user's padding stages (not the copies padding the domain to whole tiles)
    own = [op.buffer for op in (s_op, v_op) if op.buffer in facts and op.buffer not in copies]
    chunk = chunk if crop is None and dot is None and pack is not None else None
    inside = _micro_kernel(sch, blk, f, (m, mr, m1), (v, nv, lanes), target, epilogue, own,
                           crop, dot, chunk)
    packed = [sch.get(pack).name_hint] if pack is not None else []
    for stage in [*(split or []), *copies, *v_copies, *packed]:
        schedule_injective(sch, stage, target)
    return Detail(("input phase-split by the stride, " if split is not None else "")
                  + f"register tile {mr} x {nv} vectors of {lanes} ({mr * nv} accumulators) "
                  f"over {m} x {v}, {m1} tiles per L2 block"
                  + (", V packed" if pack is not None else "")
                  + (f", the reduction summed in chunks of {chunk[2]} steps" if chunk else "")
                  + (f", {dot[2]} steps of {dot[1]} a dot-product instruction" if dot else "")
                  + (", domain padded to whole tiles" if copies else "")
                  + (f", {v} padded to {f.extents[v]} (cropped in the write-back)"
                     if crop else "")
                  + (f", {', '.join(inside)} computed per parallel task" if inside else ""),
                  also=tuple(inside))


def _across_if_better(sch, name: str, f, target, epilogue, scored: tuple, flags: tuple):
    """Schedule contraction ``name`` with its vectors along ``m`` (:func:`_schedule_across_m`)
    where that tile beats the ``scored`` tile along ``v`` (:func:`_across_m`), or does with
    ``m`` padded to whole vectors (:func:`_across_m_padded`); None otherwise (nothing
    changed). ``flags``: ``(einsum, dot_ok)``, whether the operands are pure and whether a
    dot-product instruction may run the tile (one along m then divides ``v``: TVM cannot
    tensorize a guarded last tile)."""
    (mr, nv, lanes), score = scored
    einsum, dot_ok = flags
    s_op, v_op, m, v, _ = roles(f)
    full = max(1, target.vector_bits // 32)
    # an unpadded ragged tile along v keeps a partial vector inside the reduction
    ragged_v = not einsum and _ragged(f.extents[v], nv * lanes, lanes)
    # a tile along v of whole full-width vectors, V's positions read bare (no window along
    # v, whose overlapping taps share the broadcasts of a tile along m): across m must beat
    # it with its write-back counted
    whole_v = lanes == full and not _ragged(f.extents[v], nv * lanes, lanes)
    steps = product(f.extents[x] for x in f.reduce) if whole_v and _taps_along(
        f, v_op, v) == 1 else 0
    pair = _dot_pair_across(f, s_op, v_op, target, full) if dot_ok else None
    p = _positions_axis(f, s_op, v_op, m, v)
    across = _across_m(target, f, s_op, m, p, score, ragged_v, v_op.grouped.get(m), steps,
                       pair is not None)
    if across is not None:  # the instruction's 16 lanes: a half-width tile keeps the FMAs
        return _schedule_across_m(sch, name, f, (s_op, v_op, m, p), across, target,
                                  epilogue, dot=pair if across[2] == full else None)
    if m in v_op.grouped:
        return None
    v_computed = _v_padded(f.extents[v], nv, lanes) if einsum else 0
    padded = _across_m_padded(target, f, s_op, m, v, (mr, nv, lanes), v_computed,
                              pair is not None, positions=p)
    grown = None if padded is None else _pad_axis(sch, name, f, m, padded[1])
    if grown is None:
        return None
    f, crop, made = grown
    s_op, v_op, m, v, _ = roles(f)
    p = _positions_axis(f, s_op, v_op, m, v)
    pair = _dot_pair_across(f, s_op, v_op, target, padded[0][2]) if dot_ok else None
    return _schedule_across_m(sch, name, f, (s_op, v_op, m, p), padded[0], target, epilogue,
                              (crop, made), pair)


# How many times over the copies of a padding stage computed in each task of a contraction may
# cover the whole stage (the rows of the taps' halo padded again by the next task) for the
# stage to move into the tasks (_micro_kernel): a user's NHWC 3x3 stride-2 conv2d pads 3 rows
# for every 2 it moves down. Same-process A/B, one / two Zen 4 cores: NHWC 8x112x112x32 ->
# 32, stride 2, 1.22x / 1.13x; 8x56x56x64 1.04x; an NCHW 32-group 1x128x56x56 stride 2
# 1.26x / 1.84x.
TASK_PAD_REPEAT = 1.5


def _micro_kernel(sch, blk, f, m_tile, v_tile, target, epilogue, operands=(),
                  crop: str | None = None, dot=None, chunk=None) -> list[str]:
    """Loops ``[outer.., m0, v0, m1, reduction.., mr, nv, lanes]``; the tile in registers;
    the outer loops and ``m0`` across cores, or the outer ones alone with the last split in
    tasks of :func:`_task_rows` rows. The padding stage of an operand (``operands``: their
    buffers) is computed in each parallel task, for the part the task reads, where those
    parts repeat the whole at most :data:`TASK_PAD_REPEAT` times: a pass of its own wrote
    the padded copy to memory and read it back (a user's NHWC 8x112x112x32 3x3 stride-2
    conv2d: 12.8 MB). ``dot`` (:func:`_dot_pair`): the reduction iterator ``r`` split by the
    instruction's depth, its inner part under the lanes, and the two one instruction.
    Returns the stages moved."""
    m, mr, m1 = m_tile
    v, nv, lanes = v_tile
    v_ext = f.extents[v]
    nv_lanes = min(nv * lanes, v_ext)
    loops = sch.get_loops(blk)
    iters = [*f.spatial, *f.reduce]
    by = dict(zip(iters, loops))
    m0, m1l, mi = sch.split(by[m], [None, m1, mr])
    if v_ext <= lanes:
        v0, vv, vl = None, None, by[v]
    elif nv_lanes >= v_ext and v_ext % lanes == 0:  # whole registers across the axis
        v0 = None
        vv, vl = sch.split(by[v], [None, lanes])
    elif nv_lanes >= v_ext:
        v0, vv, vl = None, None, by[v]
    elif nv_lanes > lanes:
        v0, vv, vl = sch.split(by[v], [None, nv, lanes])
    else:
        v0, vl = sch.split(by[v], [None, nv_lanes])
        vv = None
    outer_names = [x for x in f.spatial if x not in (m, v)]
    outer = [by[x] for x in outer_names]
    red = [by[x] for x in f.reduce]
    depth_loop = []
    if dot is not None:
        _, r, depth = dot
        at = f.reduce.index(r)
        red[at], pair_loop = sch.split(red[at], [None, depth])
        depth_loop = [pair_loop]
    tile = [lp for lp in (mi, vv, vl) if lp is not None]
    rows = _task_rows(f, outer_names, operands, target)
    in_task = []
    if rows > 1:  # blocks of rows a task, whose padded rows overlap less
        io, ii = sch.split(outer[-1], [None, rows])
        outer, in_task = [*outer[:-1], io], [ii]
    if chunk is not None:  # the tile added to the output once a chunk of the reduction
        _blocked_nest(sch, blk, ([*outer, *in_task], m0, v0, m1l, red, tile), chunk, target)
        return []
    sch.reorder(*outer, *in_task, m0, *([v0] if v0 is not None else []), m1l, *red, *tile,
                *depth_loop)
    par = [*outer] if in_task else [*outer, m0]
    n_par = product(extent(sch, lp) for lp in par)
    if v0 is not None and _v_blocks_are_tasks(n_par, target.cores):
        par.append(v0)
    fused = _across_cores(sch, par, target)
    wb = _accumulators(sch, blk, crop)
    if epilogue is not None:
        sch.reverse_compute_inline(sch.get_sblock(epilogue))
    sch.reverse_compute_at(wb, m1l, preserve_unit_loops=True)
    sch.unroll(mi)
    if vv is not None:
        sch.unroll(vv)
    if dot is None:
        sch.vectorize(vl)
    inside = [name for buf in operands if _pad_repeat(sch, blk, buf) is not None
              for name in producers_inside(sch, blk, buf, fused, target)]
    init = sch.decompose_reduction(blk, red[0])
    if dot is not None:
        tensorize_dot(sch, blk, vl, init, fused, dot[0])
    wl = sch.get_loops(wb)[-1]
    if extent(sch, wl) > lanes and extent(sch, wl) % lanes == 0:
        wl = sch.split(wl, [None, lanes])[-1]
    sch.vectorize(wl)
    return inside


def _blocked_nest(sch, blk, loops, chunk, target) -> None:
    """:func:`_micro_kernel`'s loops for a reduction summed in chunks (:func:`_reduction_chunk`):
    ``[outer.., chunks.., m0, v0, m1, reduction in the chunk.., tile..]``, the tile's
    accumulators loaded from the output and stored back once a chunk (LLVM keeps them in
    registers across the chunk: the addresses do not move inside it), so each chunk's panel
    of ``V`` (``REDUCTION_CHUNK`` steps of ``nv`` vectors) is read from L2 by every tile of
    the ``m`` blocks, where the whole panel went past L2 and was read again from L3 for every
    block. The outer axes run across cores (:func:`_reduction_chunk` checks they are tasks
    enough), else the blocks within each chunk."""
    outer, m0, v0, m1l, red, tile = loops
    ax, steps, _ = chunk
    mi, *rest = tile
    if steps > 1:
        k0, k1 = sch.split(red[ax], [None, steps])
        chunks, inner = [*red[:ax], k0], [k1, *red[ax + 1:]]
    else:
        chunks, inner = red[:ax + 1], red[ax + 1:]
    blocks = [m0, *([v0] if v0 is not None else [])]
    sch.reorder(*outer, *chunks, *blocks, m1l, *inner, *tile)
    _across_cores(sch, outer if product(extent(sch, lp) for lp in outer) > 1 else blocks,
                  target)
    sch.unroll(mi)
    for lp in rest[:-1]:
        sch.unroll(lp)
    sch.vectorize(rest[-1] if rest else mi)
    init = sch.decompose_reduction(blk, chunks[0])
    sch.vectorize(sch.get_loops(init)[-1])


def _across_cores(sch, loops: list, target):
    """``loops`` fused into one, run across cores where it has two steps or more. Returns
    the fused loop."""
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if target.cores > 1 and extent(sch, fused) >= 2:
        sch.parallel(fused)
    return fused


def _accumulators(sch, blk, crop: str | None):
    """The write-back block of ``blk``'s register tile: a ``local`` copy of its output
    (``cache_write``), or where its output is padded (:func:`_pad_axis`) that padded buffer
    made ``local`` and the crop block that copies the real part out."""
    if crop is None:
        return sch.cache_write(blk, 0, "local")
    sch.set_scope(blk, 0, "local")
    return sch.get_sblock(crop)


def _task_rows(f, outer: list, operands, target) -> int:
    """Rows of the innermost outer axis (``outer[-1]``) per task of the micro-kernel: 1,
    unless a padding operand larger than L2 (a pass over it goes through memory) has a
    window along it (``taps`` rows for each step of ``stride``) that would have each task
    pad more than :data:`TASK_PAD_REPEAT` times the rows it moves down; then the fewest rows
    (a divisor of the axis) that bring it there, where their tasks still share out over the
    cores (a user's NHWC 3x3 stride-1 conv2d: 3 padded rows for each row, 6 for each 4;
    8x112x112x16: 1.075x / 1.057x on one / two Zen 4 cores; a 460 KB pad that stays in L2
    measured 0.97-0.99x so)."""
    import tvm

    from schedules import toolbox as tb
    from schedules.patterns.analysis import stride_in

    if not outer or not operands:
        return 1
    axis, n = outer[-1], f.extents[outer[-1]]
    others = product(f.extents[x] for x in outer[:-1])
    for op in f.operands:
        size = product(op.shape) * tvm.runtime.DataType(op.dtype).bits // 8
        if op.buffer not in operands or size <= target.l2_kib * 1024:
            continue
        dims = [ix for ix, names in zip(op.indices, op.index_vars) if axis in names]
        step = stride_in(dims[0], axis) if len(dims) == 1 else 0
        taps = _taps_along(f, op, axis)
        if not step or taps <= 1:
            continue
        for r in tb.divisors(n):
            if ((r - 1) * step + taps) / (r * step) <= TASK_PAD_REPEAT:
                share = tb.task_share(others * (n // r), target.cores)
                return r if r > 1 and share >= tb.BALANCE_MIN else 1
    return 1


def _pad_repeat(sch, blk, buffer: str) -> float | None:
    """How many times over the parts of the padding stage writing ``buffer`` that the tasks
    of ``blk`` read cover the whole stage (:func:`schedules.toolbox.task_repeat`), where it
    is a padding stage read by ``blk`` alone and that is at most :data:`TASK_PAD_REPEAT`;
    else None."""
    from schedules import toolbox as tb
    from schedules.patterns.analysis import block_facts

    for prod in sch.get_producers(blk):
        f = block_facts(sch, prod)
        if f.out_buffer == buffer and f.kind == "padding" and len(sch.get_consumers(prod)) == 1:
            rep = tb.task_repeat(sch, prod, blk)
            return rep if rep is not None and rep <= TASK_PAD_REPEAT else None
    return None


def _positions_axis(f, s_op, v_op, m: str, v: str) -> str:
    """The axis of a tile along ``m`` whose positions are ``V``'s broadcasts: ``v``, unless
    it is shorter than :data:`SHORT_POSITIONS` and no window along it shares broadcasts;
    then the longest spatial axis that ``V`` alone reads, as a plain index. A user's NCHW
    weight gradient (``dw[o, i, ry, rx] = sum dy[n, o, h, w] * x[n, i, h + ry, w + rx]``)
    ends in 3 taps, or in 1 (1x1), which leave 12 or 4 accumulators; its input channels
    ``i`` leave 16 (one Zen 4 core: 8x64 -> 64 at 56 x 56, 3 x 3, 18.6 -> 17.5 ms; 8x128 at
    28 x 28 21.0 -> 17.6 ms; 1x1 64 -> 128 13.4 -> 5.0 ms)."""
    if f.extents[v] >= SHORT_POSITIONS or _taps_along(f, v_op, v) > 1:
        return v
    longer = [x for x in f.spatial if x not in (m, v) and x not in s_op.all_vars()
              and _reads_plainly(v_op, x) and f.extents[x] > f.extents[v]]
    return max(longer, key=lambda x: f.extents[x]) if longer else v


def _merit(rows: int, vectors: int) -> float:
    """A ``rows x vectors`` register tile's FMAs per load, then its size as a tie-break."""
    return rows * vectors / (rows + vectors) + 0.01 * rows * vectors


def _across_m(target, f, s_op, m: str, v: str, score_along_v: float,
              ragged_v: bool = False, group: int | None = None, steps: int = 0,
              exact_v: bool = False):
    """``(mr, nv, lanes)`` of the tile with its vectors along ``m`` instead of ``v`` (``mr``
    output positions along ``v``, each a broadcast of ``V``; ``nv`` vectors of ``S`` packed
    along ``m``), when it beats the tile along ``v`` by :data:`ACROSS_M_MARGIN`: a windowed
    contraction whose rows are short or not a whole number of vectors (an NCHW conv2d's 56
    columns are 7 ymm, half the machine's width, while its 64 output channels are 4 full zmm),
    or always when the tile along ``v`` leaves a partial vector (``ragged_v``; a 31-column
    conv2d: 20 GFLOP/s with a 31-lane vector along v, 102 across its 40 channels in 5 ymm on
    one Zen 4 core). Half-width vectors where full ones do not divide ``m``, worth their
    :func:`fma_share`. None when ``S`` cannot be packed along ``m`` or no tile covers ``m``
    in whole vectors. ``group``: ``V`` reads ``m`` only as ``m // group`` (a grouped
    conv2d's input channels), so a tile's ``nv`` vectors must lie in one group, where that
    read is one broadcast. ``steps``: the reduction's length where the tile along ``v`` is
    whole full-width vectors, whose write-back is a plain store: the transposing one then
    counts as :data:`ACROSS_WRITE_BACK_STEPS` more steps (0: not counted). A tile of an odd
    number of positions counts :data:`ODD_TILE_WRITE_BACK_STEPS` more."""
    k_steps = product(f.extents[x] for x in f.reduce)
    full = max(1, target.vector_bits // 32)
    m_ext, v_ext = f.extents[m], f.extents[v]
    if group:
        m_ext = math.gcd(m_ext, group)  # the tile's vectors divide the group
    if not _packable(s_op):
        return None
    # half-width vectors only where full ones do not divide m (40 channels: 5 ymm)
    lanes = full if m_ext % full == 0 or full < 8 else full // 2
    if m_ext % lanes:
        return None
    v_op = next(op for op in f.operands if op is not s_op)
    best, _ = _across_tiles(target, m_ext, v_ext, k_steps, lanes, pad=False,
                            taps=_taps_along(f, v_op, v), exact_v=exact_v)
    if best is None or ragged_v:  # along v, a partial vector: slower than any of these
        return best
    # the same measure the tile along v was chosen by, so the two compare
    mr, nv, lanes = best
    alike = _merit(mr, nv) * fma_share(target, lanes) * (0.6 if v_ext % mr else 1.0)
    if steps:
        alike /= 1 + ACROSS_WRITE_BACK_STEPS / steps
    return best if alike > ACROSS_M_MARGIN * score_along_v else None


def _across_m_padded(target, f, s_op, m: str, v: str, along_v: tuple, v_computed: int = 0,
                     exact_v: bool = False, positions: str | None = None):
    """``((mr, nv, lanes), padded m)``: :func:`_across_m`'s tile where ``m`` is no whole
    number of half-width vectors, in full-width ones with ``m`` padded to whole tiles, where
    it puts :data:`PAD_MARGIN` times the useful FLOPs (:func:`_useful_fmas`) of the tile
    ``along_v`` into the output. A user's NCHW conv2d, one Zen 4 core: 36 output channels at
    28 x 28 ran 3 x 7 quarter registers along the rows (1.45x faster padded to 48), 100 at
    7 x 7 one partial vector of 7 lanes a row (2.37x padded to 144); 24 -> 36 channels at
    56 x 56, 7 ymm a row (full rate there), ran 0.72x padded. Only where ``S`` reads ``m``
    as a plain index; None where no tile wins. ``v_computed``: the lanes the tile along
    ``v`` computes where it is padded (an einsum's, :func:`_pad_tiles`). ``positions``: the
    axis the tile's positions run along (:func:`_positions_axis`; default ``v``)."""
    full = max(1, target.vector_bits // 32)
    p = positions or v
    m_ext, v_ext, p_ext = f.extents[m], f.extents[v], f.extents[p]
    if full < 8 or m_ext % (full // 2) == 0 or not _packable(s_op) or \
            not _reads_plainly(s_op, m):
        return None
    k_steps = product(f.extents[x] for x in f.reduce)
    v_op = next(op for op in f.operands if op is not s_op)
    best, padded = _across_tiles(target, m_ext, p_ext, k_steps, full, pad=True,
                                 taps=_taps_along(f, v_op, p), exact_v=exact_v)
    if best is None:
        return None
    mr, nv, lanes = best
    useful = (fma_share(target, lanes) * m_ext / padded * (0.6 if p_ext % mr else 1.0)
              * (0.7 if mr * nv < 8 else 1.0))
    if useful <= PAD_MARGIN * _useful_fmas(target, along_v, m_ext, v_ext, v_computed):
        return None
    return best, padded


def _across_tiles(target, m_ext: int, v_ext: int, k_steps: int, lanes: int, pad: bool,
                  taps: int = 1, exact_v: bool = False):
    """``(best tile, m padded to it)`` of the tiles with vectors along ``m`` (see
    :func:`_across_m`): those dividing ``m``, or with ``pad`` every one, ``m`` padded to its
    width and the score counted in the lanes kept. ``taps``: the window's taps along ``v``,
    whose broadcasts the tile's positions share (:data:`ACROSS_SPARE_REGISTERS`).
    ``exact_v``: only tiles whose positions divide ``v`` (TVM cannot tensorize the guarded
    last tile of a dot-product one)."""
    full = max(1, target.vector_bits // 32)
    regs = vector_registers(target)
    best, best_score, best_pad = None, 0.0, m_ext
    for nv in range(1, 5 if lanes == full else 8):
        padded = -(-m_ext // (nv * lanes)) * nv * lanes
        if padded != m_ext and not pad:
            continue
        # registers LLVM keeps for the broadcasts it shares between overlapping window
        # taps: 14 x 2 accumulators spill, 10 x 2 do not
        for mr in range(1, min(v_ext, (regs - nv - 8) // nv) + 1):
            if mr * nv + nv + mr + taps - 1 > regs + ACROSS_SPARE_REGISTERS:
                break
            if exact_v and v_ext % mr:
                continue
            # S's vectors stream from L2 (its panel spans the whole reduction), V's
            # broadcasts hit L1: an S load costs more
            score = (mr * nv / (mr + ACROSS_S_LOAD_COST * nv) * fma_share(target, lanes)
                     * (0.6 if v_ext % mr else 1.0) * m_ext / padded)
            if mr * nv < 8:
                score *= 0.7
            if mr > 4 and mr % 2 and k_steps <= ODD_TILE_SHORT:  # lane by lane
                score /= 1 + ODD_TILE_WRITE_BACK_STEPS / k_steps
            if score > best_score:
                best, best_score, best_pad = (mr, nv, lanes), score, padded
    return best, best_pad


def _taps_along(f, op, var: str) -> int:
    """The taps a window moves ``op``'s index along ``var`` by: the product of the extents of
    the reduction iterators indexing the dimensions ``var`` indexes (1: no window). Of an
    index ``i + r``, the shorter iterator is the window: a convolution's ``x[.., v + rx]``
    has ``rx``'s 3 taps along its 56 columns ``v``. A weight gradient's ``x[.., rw + s]``
    sums the columns ``rw`` for each of its 3 taps ``s``: they share broadcasts along ``s``
    only where LLVM unrolls ``rw`` whole (up to :data:`UNROLLED_WINDOW` steps: 7 or 14
    columns); 56 counted so, no tile along its output channels fitted the registers, and
    it ran 3 of 16 lanes."""
    dims = [vs for vs in op.index_vars if var in vs]
    return product(f.extents[x] for vs in dims for x in vs if x in f.reduce and (
        f.extents[x] <= f.extents[var] or f.extents[x] <= UNROLLED_WINDOW))


def _ragged(extent_: int, width: int, lanes: int) -> bool:
    """Whether ``width`` lanes in vectors of ``lanes`` leave a partial vector over
    ``extent_`` (a guard, or an odd-width vector, inside the reduction)."""
    return bool(extent_ % min(width, extent_) or (width > extent_ and extent_ % lanes))


def fma_share(target, lanes: int) -> float:
    """The fp32 FLOPs an FMA of ``lanes`` lanes does, as a share of a full-width one's:
    where the FMA units are narrower than the registers (Zen 4 splits a zmm FMA in two
    256-bit halves) a half-width FMA does as much per cycle as a full one."""
    full = max(1, target.vector_bits // 32)
    unit = target.fma_bits // 32 if target.fma_units else full
    return min(lanes, unit) / min(full, unit)


def _schedule_across_m(sch, name: str, f, roles_, tile, target, epilogue,
                       padding=None, dot=None) -> Detail:
    """Vectors along ``m``: ``S`` packed ``[m // (nv * lanes), reduction.., nv * lanes]``,
    loops ``[outer.., m0, v0, reduction.., mr, nv, lanes]`` (``m0`` first when the outer
    rows are too few to share the cores); the accumulators' buffer holds ``m`` innermost and
    the write-back transposes the tile into the output (once per tile, after the whole
    reduction). ``dot`` (:func:`_dot_pair_across`): the pairs of its reduction iterator
    innermost in ``S``'s pack and in ``V`` (:func:`_pairs_innermost`), under the lanes, one
    dot-product instruction."""
    from tvm.tirx import IndexMap

    s_op, v_op, m, v = roles_
    mr, nv, lanes = tile
    blk = sch.get_sblock(name)
    pack = _pack(sch, blk, s_op, f, m, nv * lanes, pair=dot[1:] if dot else None)
    inlined = _inline_into_pack(sch, pack)
    relaid = _pairs_innermost(sch, blk, v_op, *dot[1:]) if dot else None
    by = dict(zip([*f.spatial, *f.reduce], sch.get_loops(blk)))
    m0, mv, ml = sch.split(by[m], [None, nv, lanes])
    v0, vi = sch.split(by[v], [None, mr])
    if dot:
        by[dot[1]], pair_loop = sch.split(by[dot[1]], [None, dot[2]])
    red = [by[x] for x in _row_taps_first(f, v_op, m)]
    outer = [by[x] for x in f.spatial if x not in (m, v)]
    tile_loops = (vi, mv, ml, pair_loop) if dot else (vi, mv, ml)
    per_block = _pack_per_block(sch, f, s_op, m0, outer, target)
    if f.write_vars[-1] != {v}:
        (fused, v0), by_row = _positions_first(sch, (m0, v0), outer, red, tile_loops,
                                               per_block, target), False
    elif per_block:
        sch.reorder(m0, *outer, v0, *red, *tile_loops)
        fused, by_row = m0, False
        if target.cores > 1:
            sch.parallel(m0)
    else:
        fused, v0, by_row = _across_loops(sch, outer, (m0, v0), red, tile_loops, target)
    crop, made = padding or (None, [])
    wb = _accumulators(sch, blk, crop)
    # the accumulators' buffer with m innermost, so a tile row is whole vectors
    nd = len(f.spatial)
    mi = f.spatial.index(m)
    sch.transform_layout(blk, ("write", 0), IndexMap.from_func(
        lambda *ix: [*ix[:mi], *ix[mi + 1:], ix[mi]], ndim=nd, index_dtype="int32"))
    if epilogue is not None:
        sch.reverse_compute_inline(sch.get_sblock(epilogue))
    sch.reverse_compute_at(wb, v0, preserve_unit_loops=True)
    _write_back_along_m(sch, wb, nd, mi, lanes)
    sch.unroll(vi)
    sch.unroll(mv)
    if dot is None:
        sch.vectorize(ml)
    inside = producers_inside(sch, blk, v_op.buffer, fused, target) if by_row and \
        relaid is None else []
    init = sch.decompose_reduction(blk, red[0])
    if dot is not None:
        tensorize_dot(sch, blk, ml, init, fused, dot[0])
    from schedules.patterns.injective import schedule_injective

    if per_block:
        sch.compute_at(pack, m0, preserve_unit_loops=True)
    blocked = dot is None and _transpose_pack(sch, pack, f, s_op, m, nv * lanes, target)
    if not blocked and per_block:  # inside its task: the source's runs vectorised, no cores
        store = sch.get(pack).body
        vectorize_tail(sch, list(sch.get_loops(pack)[-2:]), target, str(store.buffer.dtype))
    elif not blocked:
        schedule_injective(sch, sch.get(pack).name_hint, target)
    for stage in [*made, *([relaid] if relaid else [])]:
        if stage not in inlined:
            schedule_injective(sch, stage, target)
    return Detail(f"register tile {mr} x {nv} vectors of {lanes} ({mr * nv} accumulators) "
                  f"over {v} x {m}: vectors along {m}, S packed along it"
                  + (" (transposed in blocks)" if blocked else "")
                  + (f", one {m} block of it per task" if per_block else "")
                  + f", {v} broadcast"
                  + (f", {m} padded to {f.extents[m]} (cropped in the write-back)"
                     if crop else "")
                  + (f", {dot[2]} steps of {dot[1]} a dot-product instruction" if dot else "")
                  + (f", {', '.join(inside)} computed per parallel row" if inside else "")
                  + (f", {', '.join(inlined)} computed in the pack" if inlined else ""),
                  also=(*inside, *(n for n in inlined if n not in made)))


def _row_taps_first(f, v_op, m: str) -> list[str]:
    """The reduction iterators, those that move ``V`` along an outer window axis with an
    output position first (a convolution's row taps ``ry`` of ``x[.., h + ry, v + rx]``; ``rz``,
    ``ry`` in 3-D), the rest in their order. At the border an output row's first or last row
    tap reads only padding; outermost in the reduction, it is one test over all the input
    channels that :mod:`schedules.zero_taps` can skip, where inside the channel loop it
    decided only the 3 steps of ``rx`` and went untested. A user's NCHW 3x3 conv2d on one Zen
    4 core: 8x512x7x7 17.1 -> 15.9 ms (2 of 7 output rows lose a third of their taps),
    1x256x14x14 2.14 -> 2.03 ms, 1x64x56x56 stride 2 1.09 -> 1.06, 5x5 over 31x31 0.93 ->
    0.89."""
    taps = [r for r in f.reduce
            if any(r in vs and vs - {r} - {m} - set(f.reduce) for vs in v_op.index_vars[:-1])]
    return [*taps, *(r for r in f.reduce if r not in taps)]


def _inline_into_pack(sch, pack) -> list[str]:
    """An injective stage that only the pack reads (a user's flipped weights, a phase's
    taps of them: :mod:`.phases`) computed inside the pack instead of in a pass of its own
    before it. Returns the stages inlined."""
    from schedules.patterns.analysis import block_facts

    done = []
    for prod in sch.get_producers(pack):
        if block_facts(sch, prod).injective and len(sch.get_consumers(prod)) == 1:
            done.append(sch.get(prod).name_hint)
            sch.compute_inline(prod)
    return done


def _transpose_pack(sch, pack, f, op, var: str, width: int, target) -> bool:
    """Schedule :func:`_pack`'s copy of ``op`` when ``var`` is not its innermost axis and
    the axes after it are reduction axes (weights ``[co, ci, ry, rx]`` packed ``[co // 32,
    ci, ry, rx, co % 32]``): those axes fused into one contiguous run of the source, and
    the copy done in blocks of :data:`schedules.toolbox.TRANSPOSE_TILE` steps of it by a
    vector of ``var``, so each block's vectors gather from the same source lines while they
    are in L1. Vectorised along the run (the plain copy's way), each vector went out lane
    by lane to addresses ``width`` apart: a fifth of a 14x14x256 NCHW conv2d on a Zen 4
    core. Returns False (nothing changed) where it does not apply."""
    from schedules.patterns.common import parallel_loops
    from schedules.toolbox import transpose_blocks, transpose_tiles

    dims = [next(iter(vs)) for vs in op.index_vars]
    vd = dims.index(var)
    # under compute_at (:func:`_pack_per_block`) the task's loops come first
    all_loops = sch.get_loops(pack)
    task, loops = all_loops[:-len(dims)], all_loops[-len(dims):]
    tail = dims[vd + 1:]
    if not tail or len(loops) != len(dims) or not set(tail) <= set(f.reduce):
        return False
    elems = product(extent(sch, lp) for lp in loops)
    run = sch.fuse(*loops[vd + 1:]) if len(tail) > 1 else loops[-1]
    tu, tv = transpose_tiles(extent(sch, run), 1)[0], min(width, target.lanes("float32"))
    if tu < 2 or width % tv or extent(sch, loops[vd]) % width:
        return False
    v_o, v_i = sch.split(loops[vd], [None, width])
    sch.reorder(*loops[:vd], v_o, run, v_i)
    blocks = transpose_blocks(sch, run, v_i, tu, tv)
    if not task:
        parallel_loops(sch, [*loops[:vd], v_o, blocks[0]], target, elems)
    return True


def _pack_per_block(sch, f, s_op, m0, outer: list, target) -> bool:
    """Whether each task packs its own ``m`` block of ``S`` (the pack computed at ``m0``,
    ``m0`` the parallel loop, the rows inside it) instead of the whole of ``S`` being packed
    in a pass of its own and streamed past every row: when the packed ``S`` outgrows
    1/:data:`PANEL_BYTES_FRACTION` of L2 (a 14x14x256 3x3 conv2d's 2.4 MB of weights, read
    back from L3 once per row of 14) and every core gets at least
    :data:`BLOCKS_PER_CORE` blocks. The pack then writes into L2, where its block is read
    once per row, and its source stays in L3 between calls: that conv2d 1.05-1.06x faster
    on one and two Zen 4 cores (same-process A/B, 15 rounds). With fewer blocks than that
    (many cores) the rows share the cores and the pack stays a pass of its own."""
    from tvm.runtime import DataType

    s_bytes = DataType(s_op.dtype).bits // 8 * product(int(n) for n in s_op.shape)
    return (bool(outer) and s_bytes > (target.l2_kib << 10) // PANEL_BYTES_FRACTION
            and extent(sch, m0) >= BLOCKS_PER_CORE * target.cores)


def _write_back_along_m(sch, wb, nd: int, mi: int, lanes: int) -> None:
    """The across-``m`` tile's write-back with ``m`` innermost in whole registers (each
    accumulator read once, whole) and the tile's other axes unrolled, so LLVM builds the
    output's rows (contiguous along ``v``) from the accumulators' lanes with shuffles.
    Left to LLVM with ``v`` innermost, each output vector took one lane of each of ``mr``
    accumulators and the tile went out by scatters: a tenth of a 56x56x64 NCHW conv2d on a
    Zen 4 core (this way 1.03-1.06x faster on one core, 1.02-1.03x on two; 25-round A/B)."""
    loops = sch.get_loops(wb)[-nd:]
    rest = [lp for i, lp in enumerate(loops) if i != mi]
    m_loop = loops[mi]
    sch.reorder(*rest, m_loop)
    vectorize_registers(sch, m_loop, lanes)
    for lp in rest:
        if extent(sch, lp) > 1:
            sch.unroll(lp)


def _positions_first(sch, m0_v0, outer, red, tile, per_block: bool, target):
    """Order ``[m0, v0, outer.., reduction.., tile..]`` for a tile whose positions run along
    another axis than the output's innermost (:func:`_positions_axis`): each task owns a
    block of the output across all of its outer axes (a weight gradient's taps), so the
    lines its transposing write-back fills are whole before another task reads them, and
    its window of ``V`` stays in cache from one tap to the next (one Zen 4 core, against
    the taps outside the blocks: 1.05x at 7x7, 14x14 and 112x112). ``m0`` and ``v0`` run
    across cores (``m0`` alone where each task packs its block of ``S``), the outer axes
    joining them where the blocks are too few. Returns ``(the parallel loop, the loop right
    above the reduction)``, where the tile's write-back goes."""
    m0, v0 = m0_v0
    sch.reorder(m0, v0, *outer, *red, *tile)
    if per_block:
        fused = m0
    else:
        fused = sch.fuse(m0, v0)
        if outer and extent(sch, fused) < 4 * target.cores:
            fused = sch.fuse(fused, *outer)
            outer = []
        v0 = fused
    if target.cores > 1 and extent(sch, fused) >= 2:
        sch.parallel(fused)
    return fused, outer[-1] if outer else v0


def _across_loops(sch, outer, m0_v0, red, tile, target):
    """Order ``[outer.., m0, v0, reduction.., tile..]`` with the outer rows across cores, or
    ``m0`` (and ``v0``) joining them when the rows are too few to share the cores. Returns
    ``(parallel loop, v0 (fused away: the parallel loop), whether the parallel loop is the
    rows alone)``: then a row's V window (its padding computed per row) serves every m0."""
    m0, v0 = m0_v0
    by_row = product(extent(sch, lp) for lp in outer) >= 4 * target.cores
    if by_row:
        sch.reorder(*outer, m0, v0, *red, *tile)
        fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    else:
        sch.reorder(m0, *outer, v0, *red, *tile)
        fused = sch.fuse(m0, *outer) if outer else m0
        if extent(sch, fused) < 4 * target.cores:
            fused = v0 = sch.fuse(fused, v0)
    if target.cores > 1 and extent(sch, fused) >= 2:
        sch.parallel(fused)
    return fused, v0, by_row
