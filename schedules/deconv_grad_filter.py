"""x86 schedule of ``deconv_grad_filter``: a register-tiled, cache-blocked GEMM.

Per group, ``dw[(oc, kh, kw), ic] = sum_{(b, ih, iw)} dy_pad[...] * x[b, ih, iw, ic]`` is a GEMM
with M = OCg*KH*KW, N = ICg and K = B*in_h*in_w. The micro-kernel keeps a ``rows x vector``
tile of fp32 accumulators in registers: each reduction step loads the vector operand once and
broadcasts one scalar of the other per row (an outer product, as a BLAS micro-kernel does).
The vector axis (:func:`plan`) is ``oc`` (contiguous in dy), ``ic`` (contiguous in NHWC x) or,
for depthwise-like layers with ``ICg == 1``, ``g``, whichever fills the lanes best (``oc`` on a
tie: x is then broadcast in place and dy read as vectors from the pad copy the kernel makes
anyway); the accumulators are laid out with it innermost.

Two shapes of loop nest:

* many output tiles (the usual case): one pass over K in chunks of ``K_CHUNK`` steps; within a
  chunk every ``(kh, kw)`` tap of a ``(g, oc)`` block (``(g, ic)`` for vectors along ic)
  accumulates into ``dw_acc``, the row tiles innermost, so the tiles of a tap share its
  vectors from L1 and the taps share the chunk of the broadcast operand from L1/L2 (dcgan
  bench layer, one EMR core: 1.30x over tiles outermost). The blocks run across
  ``target.cores`` threads (one parallel launch per call). Where dy is read as
  vectors along ``oc`` (in place or in panels) and the taps stay inside the tasks, each chunk
  pads its own rows of dy in cache (``_blocked``).
* few output tiles and a long K: the ``(b, ih)`` loop is split into ``P`` partial sums
  (``rfactor``) computed in parallel into ``local`` accumulator tiles, then added.

When the tile broadcasts ``dy`` (vector along ``ic``), or loads it as vectors along ``oc`` that
use under a quarter of what each step strides over (:func:`_dy_in_panels`: a group's 32 of 256
channels), the zero-padded ``dy`` is laid out as GotoBLAS panels: the tile's ``oc`` channels
innermost and one plane per stride phase (``[g, oc // rows, y % sh, x % sw, b, y // sh, x //
sw, oc % rows]``, ``oc`` within group ``g``), so consecutive reduction steps read consecutive
bytes instead of touching a new cache line each (a k4 s2 layer: 42 -> 74 GFLOP/s on one Zen 3
core). The pad is a copy the kernel made anyway. x is packed the same way (``[c // lanes, b, h,
w, c % lanes]``) when its rows hold other tiles' channels: read in place, a power-of-two
``in_c`` puts every step in the same few L1 sets (grouped_g8 bench layer on 2 Zen 3 cores: 122
-> 132 GFLOP/s).

The tile has the target's accumulator budget of rows (6 x 16 on AVX2); where 6 does not
divide the row axis (64 channels), the last row tile is ragged and gets a loop nest of its
own (:func:`schedules.toolbox.split_last_tile`), and each group's dy panels are zero-filled
to whole tiles (dcgan bench layer, 2 Zen 3 cores: 4 x 16 tile 138, 6 x 16 tiles 160 GFLOP/s).

The choice between them and ``P`` depend only on the shapes and the vector width, never on
``target.cores``, and every loop over K runs in one order: for a given shape each output
element is summed in the same order whatever the number of cores, so results are
bit-identical. The core count only chooses which output loops are tasks (:func:`task_loops`)
and, where the row tiles become tasks, whole row tiles instead of a ragged last one: both
regroup the outputs, not any output's sum.
"""

from __future__ import annotations

import json
import math

from dsl.ops import tag
from schedules import register
from schedules.fallback import schedule_fallbacks, twin_block
from schedules.toolbox import (
    BALANCE_MIN,
    STEP_UNROLL,
    accumulator_registers,
    balance,
    divisors,
    extent,
    fill_vector_factor,
    largest_divisor,
    lead_loops,
    parallel,
    root_blocks,
    row_tile,
    split_last_tile,
    unroll_steps,
    vectorize_innermost,
)

RULE = "x86 blocked GEMM"
PARALLEL_ITEMS = 32  # outer work items wanted (shape-only, so results do not depend on cores)
MIN_CHUNK = 2048  # reduction steps (K / P) below which splitting K does not pay
K_CHUNK = 256  # reduction steps per cache block of the one-pass GEMM


AXES = ("g", "oc", "kw", "ic")  # the dw axes a tile splits (kh stays whole, outer)
ROWS = {"ic": ("oc", "kw"), "oc": ("ic", "kw"), "g": ("oc", "kw")}


def plan(p: dict, lanes: int, acc_regs: int, ragged: bool = True) -> dict:
    """Tile sizes for a geometry (``p``: the op's JSON parameters); a pure function of the
    shapes, the vector width and the accumulator registers (``acc_regs``).

    The vector axis is the one whose width fills vector registers best: ``ic`` (contiguous in
    x, dy broadcast), ``oc`` (contiguous in dy, x broadcast) or, when ``ICg == 1``, ``g``
    (both contiguous along ``g`` for depthwise). Two more axes make the rows of the register
    tile; the first may take a ragged last tile (:func:`schedules.toolbox.row_tile`:
    ``"ragged"`` in the result) unless ``ragged`` is False or K is split into partial sums.
    """
    group, in_c, out_c = p["group"], p["in_c"], p["out_c"]
    ext = {"g": group, "oc": out_c // group, "kw": p["kernel_w"], "ic": in_c // group}
    # On a tie, vectors along oc: dy is read as vectors from the pad copy the kernel makes
    # anyway (in panels only where :func:`_dy_in_panels` says) and x is broadcast in place;
    # vectors along ic broadcast dy, whose panels must then hold the rows, and re-pack x
    # (DeconvGradFilter bench layers, 2 Zen 5 cores: 10-15% faster).
    cands = ("oc", "ic", "g") if ext["ic"] == 1 and group > 1 else ("oc", "ic")

    def lanes_used(axis):
        v = fill_vector_factor(ext[axis], lanes)
        return v / -(-v // lanes)

    mode = max(cands, key=lambda a: (lanes_used(a), -cands.index(a)))
    v = fill_vector_factor(ext[mode], lanes)
    rows = max(1, acc_regs // -(-v // lanes))
    inner = {a: 1 for a in AXES}
    inner[mode] = v
    r1, r2 = ROWS[mode]
    inner[r1] = row_tile(ext[r1], rows) if ragged else largest_divisor(ext[r1], rows)
    inner[r2] = largest_divisor(ext[r2], rows // inner[r1])
    outer = p["kernel_h"]
    for a in AXES:
        outer *= -(-ext[a] // inner[a])
    f_ext = p["batch"] * p["in_h"]
    k_total = f_ext * p["in_w"]
    parts = 1
    if outer < PARALLEL_ITEMS:
        for d in divisors(f_ext):
            if k_total // d < MIN_CHUNK:
                break
            parts = d
            if outer * d >= PARALLEL_ITEMS:
                break
    ragged = ext[r1] % inner[r1] != 0
    if ragged and parts > 1:  # the partial sums' loop nest keeps whole tiles
        return plan(p, lanes, acc_regs, ragged=False)
    return {"mode": mode, "inner": inner, "rows": (r1, r2), "parts": parts, "outer": outer,
            "ragged": ragged}


def _lead_sizes(cfg, p) -> list[int]:
    """Extents of the loops above the reduction chunks that may become tasks, outermost
    first: ``g``, the tile axis that is not the rows' (``other``), ``kh``, ``kw`` and the
    row tiles (``tiles``)."""
    ext = {"g": p["group"], "oc": p["out_c"] // p["group"], "ic": p["in_c"] // p["group"],
           "kw": p["kernel_w"]}
    tiles = cfg["rows"][0]
    other = "ic" if tiles == "oc" else "oc"
    return [-(-ext[a] // cfg["inner"][a]) if a != "kh" else p["kernel_h"]
            for a in ("g", other, "kh", "kw", tiles)]


def task_loops(cfg: dict, p: dict, lanes: int, acc_regs: int, cores: int) -> dict:
    """``cfg`` with ``"lead"``, how many of :func:`_lead_sizes`' loops run across ``cores``
    (one pass over K; :func:`parallel_lead` over the first four), or with the row tiles
    as a fifth task loop where the output blocks and taps alone leave cores idle (the dcgan
    bench layer has 32 of them: a 48-core server would keep 0.67 of its cores busy). A
    ragged row tile cannot be a task of its own (its loop nest is apart), so then every row
    tile is whole (``plan(..., ragged=False)``). Results do not change: the tiles only
    regroup the outputs; each output still sums K in one order."""
    sizes = _lead_sizes(cfg, p)
    n = parallel_lead(sizes[:4], cores)
    share = balance(math.prod(sizes[:n]), cores)
    if cfg["parts"] > 1 or share >= BALANCE_MIN:
        return {**cfg, "lead": n}
    whole = plan(p, lanes, acc_regs, ragged=False) if cfg["ragged"] else cfg
    if whole["parts"] == 1 and balance(math.prod(_lead_sizes(whole, p)), cores) > share + 1e-9:
        return {**whole, "lead": 5}
    return {**cfg, "lead": n}


def _parallel(sch, loops, cores: int) -> None:
    """Fuse ``loops`` and run them across cores; for one core, leave them unfused (the
    results do not depend on the core count, see the module docstring)."""
    if cores > 1 and loops:
        parallel(sch, loops, cores)


def _elementwise(sch, block, lanes: int, cores: int) -> None:
    """Vectorise the innermost axis (split by ``lanes`` when long) and parallelise the rest."""
    vectorize_innermost(sch, block, lanes, split_above=4 * lanes)
    loops = sch.get_loops(block)
    if len(loops) > 1:
        _parallel(sch, loops[:min(2, len(loops) - 1)], cores)


@register(tag.DECONV_GRAD_FILTER, "x86")
def schedule_deconv_grad_filter(sch, workload) -> None:
    tgt = workload.target
    lanes = tgt.lanes("float32")  # fp16 inputs are widened: the arithmetic is fp32
    p = json.loads(workload.attrs["dsl_params"])
    cores, regs = tgt.cores, accumulator_registers(tgt)
    cfg = task_loops(plan(p, lanes, regs), p, lanes, regs, cores)
    pad = workload.find(sch, tag.DECONV_DY_PAD)
    acc = workload.find(sch, tag.DECONV_ACC)
    out = workload.find(sch, tag.DECONV_GRAD_FILTER)
    pad_why, fill = "elementwise pad", None
    if _dy_in_panels(cfg, p):
        pad_why, fill = _pack_dy(sch, pad, p, cfg["inner"]["oc"])
    acc_name = sch.get(acc).name_hint
    notes = [(out, "elementwise cast")]
    if fill is not None:  # TVM's block writing the panels' zero padding
        _parallel(sch, sch.get_loops(fill)[:2], cores)
        notes.append((fill, "zeros of the last panels' padding: groups across cores"))
    width = _x_panel_width(cfg, p)
    if width:
        xp = _pack_x(sch, acc, pad, width)
        _elementwise(sch, xp, lanes, cores)
        notes.append((xp, f"x into panels of {width} channels"))
    for block, why in notes:
        workload.note(sch.get(block).name_hint, RULE, why)
    g, oc, kh, kw, ic, b, ih, iw = sch.get_loops(acc)
    split = {}
    for name, loop in zip(AXES, (g, oc, kw, ic)):
        in_tile = name == cfg["mode"] or name in cfg["rows"]
        split[name] = sch.split(loop, [None, cfg["inner"][name]]) if in_tile else (loop, None)
    outer = [split["g"][0], split["oc"][0], kh, split["kw"][0], split["ic"][0]]
    r1, r2 = (split[a][1] for a in cfg["rows"])
    vec = split[cfg["mode"]][1]
    in_chunk = False
    if cfg["parts"] == 1:
        in_chunk = _blocked(sch, acc, cfg, p, outer, (b, ih), iw, (r1, r2, vec), cores,
                            pad if fill is None else None)
    else:
        _split_k(sch, acc, cfg, outer, sch.fuse(b, ih), iw, (r1, r2, vec), cores)
    workload.note(acc_name, RULE, _tile_note(cfg))
    _elementwise(sch, out, lanes, cores)
    if in_chunk:
        vectorize_innermost(sch, pad, lanes, split_above=4 * lanes)
        pad_why = "dy padded per K chunk, in cache" + (
            f" ({pad_why})" if _dy_in_panels(cfg, p) else "")
    else:
        _elementwise(sch, pad, lanes, cores)
    workload.note(sch.get(pad).name_hint, RULE, pad_why)
    schedule_fallbacks(sch, workload, tag.DECONV_GRAD_FILTER, RULE)


# Vectors along oc read dy in place (from its pad copy) unless a step would use under this
# share of the bytes it strides over (stride_w * out_c floats): then dy goes into panels of
# the tile's channels. Reading a quarter, the pad copy stays a plain copy (dcgan bench layer,
# 64 channels, stride 2, 2 Zen 5 cores: 1.91 ms in place, 2.06 in panels); reading 1/16 (a
# grouped layer's 32 of 256 channels), the lines of a K chunk fall in a few L1 sets and are
# gone before the next (kh, kw) tile reuses them (grouped_g8: 1.28 ms in place, 1.10 ms).
OC_VECTOR_IN_PLACE_SHARE = 0.25


def _dy_in_panels(cfg, p) -> bool:
    """Whether dy_pad is laid out as panels of ``cfg["inner"]["oc"]`` channels: always when
    the tile broadcasts dy (vectors along ic), when a vector-along-oc step would read too
    small a share of what it strides over, never for vectors along g."""
    if cfg["mode"] == "ic":
        return cfg["rows"][0] == "oc"
    if cfg["mode"] == "oc":
        used = cfg["inner"]["oc"] / (p["stride_w"] * p["out_c"])
        return used < OC_VECTOR_IN_PLACE_SHARE
    return False


def _x_panel_width(cfg, p) -> int:
    """Channels per panel of x, 0 where x is read in place (see :func:`_pack_x`): vectors
    along ic whose rows hold other tiles' channels. Broadcast (vectors along oc), x stays in
    place: panels of a group's channels measured no faster (grouped_g8 bench layer)."""
    if cfg["mode"] == "ic" and cfg["inner"]["ic"] < p["in_c"]:
        return cfg["inner"]["ic"]
    return 0


def _tile_note(cfg) -> str:
    inner, (r1, r2) = cfg["inner"], cfg["rows"]
    note = (f"{cfg['mode']}-vector register tile of {inner[r1]} {r1} x {inner[r2]} {r2} rows, "
            f"{cfg['parts']} K part(s)")
    return (note + (f", the last {r1} tile in a loop nest of its own" if cfg["ragged"] else "")
            + (f", the {r1} tiles tasks of their own" if cfg.get("lead") == 5 else "")
            + (f", {STEP_UNROLL} reduction steps per iteration" if cfg.get("unrolled") else ""))


def _blocked(sch, acc, cfg, p, outer, f, iw, tile, cores, pad=None) -> bool:
    """One pass over K in chunks of about ``K_CHUNK`` steps. Within a chunk, every tap's
    register tiles accumulate into ``dw_acc``, the row tiles innermost: they all read the same
    vectors (one tap's dy of one ``oc`` tile, or one ``ic`` tile of x), which stay in L1
    across them, while the chunk of the broadcast operand stays in L1/L2 for every tap. A
    ragged last row tile gets a loop nest of its own (:func:`split_last_tile`).

    The output tiles above the chunk loop run across cores: ``(g, other)`` blocks, with the
    taps' rows ``kh`` and columns joining them where too few blocks share out evenly
    (:func:`parallel_lead`).

    ``pad`` (dy read as vectors along oc, in place or in panels): dy is zero-padded per
    chunk, rows of one image at a time, just before the taps read it, into a buffer of the
    chunk's size that stays in L2, instead of all of dy padded first (as large as dy, from
    memory; dcgan bench layer, one and two EMR cores: 1.21x; in panels, grouped_g8 bench
    layer, one and two Zen 4 cores: 1.01x / 1.055x, bit-identical). Not where the taps are
    tasks of their own, which would each pad the same chunk, nor where TVM writes the last
    panels' zeros in a block of its own. Returns whether ``pad`` was placed."""
    r1, r2, vec = tile
    g_o, oc_o, kh, kw_o, ic_o = outer
    b, ih = f
    _vector_axis_last(sch, acc, cfg, 0)
    tiles, other = (oc_o, ic_o) if cfg["rows"][0] == "oc" else (ic_o, oc_o)
    lead, n_par = [g_o, other, kh, kw_o, tiles], cfg["lead"]
    if n_par < len(lead):  # the row tiles stay innermost under the chunk and the taps
        lead.pop()
    if pad is not None and (cfg["mode"] != "oc" or n_par > 2):
        pad = None  # a task per tap would pad the same chunk once per tap
    if pad is None:
        rows = largest_divisor(p["batch"] * p["in_h"], max(1, K_CHUNK // p["in_w"]))
        f_o, f_i = sch.split(sch.fuse(b, ih), [None, rows])
        chunk = [f_o]
    else:  # whole rows of one image: the chunk's padded rows are then one box
        rows = largest_divisor(p["in_h"], max(1, K_CHUNK // p["in_w"]))
        f_o, f_i = sch.split(ih, [None, rows])
        chunk = [b, f_o]
    par, taps = _phase_tasks(sch, lead, n_par, p, cfg, cores)
    sch.reorder(*par, *chunk, *taps, *([tiles] if len(lead) < 5 else []), f_i, iw, r1, r2,
                vec)
    if pad is not None:
        sch.compute_at(pad, f_o, preserve_unit_loops=True)
    _micro_kernel(sch, acc, (r1, r2, vec), par, chunk[0], cores)
    # a row of 28 steps exited its loop every 336 cycles (dcgan bench layer, 4 steps per
    # iteration: 1.013-1.037x / 1.029-1.030x on one / two Emerald Rapids cores, two
    # same-process A/Bs of 61 rounds)
    cfg["unrolled"] = unroll_steps(sch, iw)
    if cfg["ragged"]:  # after the init is split off: TVM partitions a plain update block
        split_last_tile(sch, tiles)
    return pad is not None


def _phase_tasks(sch, lead: list, n_par: int, p: dict, cfg: dict, cores: int):
    """``(task loops, tap loops under the chunk)``. Where the innermost task loop is a tap
    axis of a strided layer (``kh`` or ``kw``, stride ``s``, no dilation), its taps ``k`` and
    ``k + s`` read the same phase of dy, one row or column apart: it is split into ``(step,
    phase)``, the phase a task loop and the step under the chunk loop, so a task runs all the
    taps of its phase on one read of dy and x instead of each tap streaming them again.
    Only where the fewer tasks share out over the cores as well (:func:`balance`).
    Same-process A/B on a lent 16-core EMR: dcgan bench layer 1.13x on 16 cores (16 tasks of
    two taps for 32 of one), 1.19x on 4; grouped_g8 1.14x on 16; on 8 cores its 8 (oc, kh)
    tasks stay (halved, they would leave cores idle), as 128 tasks on 48 cores would (64
    keep 0.67 of them busy, 128 0.89). Not for the row tiles as tasks (the fifth loop)."""
    par, taps = lead[:n_par], lead[n_par:]
    if n_par not in (3, 4):
        return par, taps
    axis = "hw"[n_par - 3]
    s, loop = p[f"stride_{axis}"], lead[n_par - 1]
    n, tasks = extent(sch, loop), math.prod(extent(sch, lp) for lp in par)
    whole = axis == "h" or cfg["inner"]["kw"] == 1  # the tile holds one kw column
    shared = balance(tasks // s, cores) >= balance(tasks, cores) - 1e-9
    if s == 1 or p[f"dilation_{axis}"] != 1 or n % s or not shared or not whole:
        return par, taps
    step, phase = sch.split(loop, [None, s])
    return [*par[:-1], phase], [step, *taps]


def parallel_lead(sizes: list[int], cores: int) -> int:
    """How many of the lead loops (their ``sizes``, outermost first: ``g``, the other
    tile axis, ``kh``, ``kw``) go above the chunk loop and across cores: the fewest (at
    least two) whose blocks share out evenly (:func:`schedules.toolbox.balance`), else those
    that share out best. A tap loop there costs a re-read of the broadcast operand's chunk
    from L2 per tap (dcgan bench layer, two cores: its two ``oc`` blocks run 1.08x faster
    than eight ``(oc, kh)`` blocks, and 32 blocks 0.82x)."""
    return lead_loops(sizes, cores)


def _vector_axis_last(sch, block, cfg, first: int) -> None:
    """Move the vector axis innermost in the accumulators ``block`` writes (its dims from
    ``first`` on are g, oc, kh, kw, ic; ic already is)."""
    if cfg["mode"] != "ic":
        pos = first + ("g", "oc").index(cfg["mode"])
        sch.transform_layout(block, ("write", 0), lambda *i: (*i[:pos], *i[pos + 1:], i[pos]))
        twin = twin_block(sch, block) if first == 0 else None
        if twin is not None:  # the write-back takes its values at the same indices
            sch.transform_layout(twin, ("write", 0),
                                 lambda *i: (*i[:pos], *i[pos + 1:], i[pos]))


def _micro_kernel(sch, block, tile, par, red, cores) -> None:
    """The register tile: vector lanes, unrolled rows, ``par`` across cores, the init
    split off above the reduction loop ``red`` and vectorised."""
    r1, r2, vec = tile
    sch.vectorize(vec)
    sch.unroll(r2)
    sch.unroll(r1)
    _parallel(sch, par, cores)
    init = sch.decompose_reduction(block, red)
    sch.vectorize(sch.get_loops(init)[-1])


def _split_k(sch, acc, cfg, outer, f, iw, tile, cores) -> None:
    """Few output tiles, long K: ``parts`` partial sums (rfactor) run in parallel, each tile's
    accumulators in a ``local`` buffer, then the partials are added."""
    r1, r2, vec = tile
    f_o, f = sch.split(f, [cfg["parts"], None])
    sch.reorder(f_o, *outer, f, iw, r1, r2, vec)
    gemm = sch.rfactor(f_o, factor_axis=0)
    loops = sch.get_loops(gemm)
    outer = loops[:6]
    f, iw, r1, r2, vec = loops[6:]

    # accumulators in a local tile (registers once unrolled / vectorised)
    tile = sch.cache_write(gemm, 0, "local")
    _vector_axis_last(sch, gemm, cfg, 1)  # dims: part, g, oc, kh, kw, ic
    sch.reverse_compute_at(tile, outer[-1], preserve_unit_loops=True)
    sch.vectorize(sch.get_loops(tile)[-1])
    _micro_kernel(sch, gemm, (r1, r2, vec), outer, f, cores)

    # the sum of the partials into acc: partial loop innermost
    part, *spatial = sch.get_loops(acc)
    sch.reorder(*spatial, part)
    _parallel(sch, spatial[:2], cores)


def _pack_dy(sch, pad, p, rows: int) -> tuple:
    """dy_pad as GotoBLAS panels, so a register tile's broadcasts walk contiguous memory:
    ``rows`` channels innermost, and one plane per stride phase along an axis whose padded
    extent the stride divides (TVM cannot invert the split of a ragged one). Where ``rows``
    does not divide the channels of a group (a ragged last tile), each group's channels
    are padded with zeros up to whole panels, so that a panel never spans two groups: TVM
    writes the zeros in a block of its own, returned with the note (else None)."""
    _, hp, wp, _ = (int(d) for d in sch.get(pad).writes[0].source.shape)
    sh = p["stride_h"] if hp % p["stride_h"] == 0 else 1
    sw = p["stride_w"] if wp % p["stride_w"] == 0 else 1
    ocg = p["out_c"] // p["group"]

    def by_group(b, y, x, c):  # TVM cannot invert a padded split of c % ocg in one map
        return (c // ocg, y % sh, x % sw, b, y // sh, x // sw, c % ocg)

    def panels(g, py, px, b, y, x, o):
        return (g, o // rows, py, px, b, y, x, o % rows)

    sch.transform_layout(pad, ("write", 0), by_group)
    if ocg % rows == 0:
        sch.transform_layout(pad, ("write", 0), panels)
        return f"pad into panels of {rows} channels, {sh} x {sw} stride-phase planes", None
    sch.transform_layout(pad, ("write", 0), panels, pad_value=0.0)
    packed = sch.get(pad)
    fill = next(b for b in root_blocks(sch) if not sch.get(b).same_as(packed)
                and sch.get(b).writes[0].source.same_as(packed.writes[0].source))
    return (f"pad into panels of {rows} channels (the last of each group zero-filled), "
            f"{sh} x {sw} stride-phase planes"), fill


def _pack_x(sch, acc, pad, lanes: int):
    """x as panels of its tile's ``lanes`` channels (``[c // lanes, b, h, w, c % lanes]``),
    so consecutive reduction steps load consecutive bytes: read in place, the steps are
    ``in_c`` floats apart, and with a power-of-two ``in_c`` they fall in a few L1 sets and
    evict each other before the next tile reuses them."""
    dy_pad = sch.get(pad).writes[0].source
    index = next(i for i, r in enumerate(sch.get(acc).reads) if not r.source.same_as(dy_pad))
    xp = sch.cache_read(acc, index, "global", consumer_blocks=[acc])
    sch.transform_layout(xp, ("write", 0),
                         lambda b, h, w, c: (c // lanes, b, h, w, c % lanes))
    return xp
