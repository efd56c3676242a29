"""Pattern rule for window reductions: a depthwise conv2d (NCHW, padded), a window max and a
1-D moving sum written as a user would, vectorised along the output row with a tile of rows
in registers; odd, prime and short rows (one odd vector where no whole, half or quarter
register divides the row; the rule refuses rows no vector of 4 to four registers' lanes
divides: the outer-reduction rule takes them), batch > 1, fp32 and fp16, against numpy
float64."""

import re

import numpy as np
import pytest
from pattern_helpers import build_run, check, rand
from tvm import te

import targets


def _depthwise(n, c, h, w, kh, kw, ph, pw, dtype, stride=1):
    x = te.placeholder((n, c, h, w), name="x", dtype=dtype)
    wt = te.placeholder((c, 1, kh, kw), name="w", dtype=dtype)
    xp = te.compute((n, c, h + 2 * ph, w + 2 * pw), lambda b, o, i, j: te.if_then_else(
        te.all(i >= ph, i < h + ph, j >= pw, j < w + pw), x[b, o, i - ph, j - pw],
        te.const(0, dtype)), name="xpad")
    ry, rx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")
    s = stride
    ho, wo = (h + 2 * ph - kh) // s + 1, (w + 2 * pw - kw) // s + 1
    y = te.compute((n, c, ho, wo), lambda b, o, i, j: te.sum(
        xp[b, o, i * s + ry, j * s + rx] * wt[o, 0, ry, rx], axis=[ry, rx]), name="dw")
    return x, wt, y


def _ref_depthwise(xn, wn, ph, pw, s=1):
    x = np.pad(xn.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    _, _, kh, kw = wn.shape
    ho, wo = (x.shape[2] - kh) // s + 1, (x.shape[3] - kw) // s + 1
    out = np.zeros((x.shape[0], x.shape[1], ho, wo))
    for i in range(kh):
        for j in range(kw):
            out += x[:, :, i:i + s * (ho - 1) + 1:s, j:j + s * (wo - 1) + 1:s] * \
                wn[None, :, 0, i, j, None, None]
    return out


def _lanes_dividing(w: int, dtype: str, target=None) -> int:
    """The lanes the rule is expected to take along a row of ``w`` (0: refused)."""
    full = (target or targets.current()).lanes(dtype)
    whole = [v for v in (full, full // 2, full // 4) if v >= 4 and w % v == 0]
    odd = [v for v in range(4, min(w, 4 * full) + 1) if w % v == 0]
    return whole[0] if whole else max(odd, default=0)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo", [(1, 5, 56, 56, 3, 3, 1, 1), (2, 3, 9, 16, 5, 5, 2, 2),
                                 (2, 7, 11, 12, 3, 1, 1, 0), (1, 4, 6, 29, 3, 3, 1, 1),
                                 (3, 2, 5, 7, 2, 2, 0, 0), (2, 3, 14, 14, 3, 3, 1, 1),
                                 (1, 2, 5, 57, 3, 3, 1, 1), (1, 2, 4, 67, 3, 3, 1, 1)], ids=str)
def test_depthwise_conv2d(geo, dtype):
    """Rows of 56 (7 half-width vectors with AVX-512), 16, 12 (quarter width); 29, 6, 14
    and 57 (no whole, half or quarter register divides them: one odd vector where it fits
    four registers); 67 (prime, over four registers: the outer-reduction rule); 3x3 / 5x5 /
    3x1 / 2x2 windows, the padding stage computed inside each task."""
    n, c, h, w, kh, kw, ph, pw = geo
    rng = np.random.default_rng(61)
    x, wt, y = _depthwise(n, c, h, w, kh, kw, ph, pw, dtype)
    xn, wn = rand((n, c, h, w), dtype, rng), rand((c, 1, kh, kw), dtype, rng)
    (out,), why = build_run([y], [x, wt], [xn, wn])
    check(out, _ref_depthwise(xn, wn, ph, pw), dtype, f"depthwise {geo}")
    wo = w + 2 * pw - kw + 1
    lanes = _lanes_dividing(wo, dtype)
    if lanes:
        assert why.rule_of("dw") == "patterns.window", str(why)
        assert f"vectors of {lanes} along v_j" in dict((s, t) for s, _, t in why.stages)["dw"]
        if ph or pw:
            assert why.rule_of("xpad") == "patterns.window", str(why)
    else:
        assert why.rule_of("dw") == "patterns.outer_reduction", str(why)
    assert why.fell_to_generic() == []


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_window_max_and_moving_sum(dtype):
    """A 3x3 window max (no padding, any reducer) and a 1-D moving sum of 5 (no rows axis)."""
    rng = np.random.default_rng(67)
    x = te.placeholder((2, 3, 10, 34), name="x", dtype=dtype)
    ry, rx = te.reduce_axis((0, 3), name="ry"), te.reduce_axis((0, 3), name="rx")
    mx = te.compute((2, 3, 8, 32), lambda b, c, i, j: te.max(x[b, c, i + ry, j + rx],
                                                             axis=[ry, rx]), name="wmax")
    s = te.placeholder((5, 68), name="s", dtype=dtype)
    k = te.reduce_axis((0, 5), name="k")
    ms = te.compute((5, 64), lambda r, j: te.sum(s[r, j + k], axis=k), name="msum")
    xn, sn = rand((2, 3, 10, 34), dtype, rng), rand((5, 68), dtype, rng)
    (o1, o2), why = build_run([mx, ms], [x, s], [xn, sn])
    win = np.lib.stride_tricks.sliding_window_view(xn.astype(np.float64), (3, 3), axis=(2, 3))
    check(o1, win.max(axis=(-2, -1)), dtype, "window max")
    mov = np.lib.stride_tricks.sliding_window_view(sn.astype(np.float64), 5, axis=1)
    check(o2, mov.sum(-1), dtype, "moving sum")
    assert why.rule_of("wmax") == "patterns.window", str(why)
    assert why.rule_of("msum") == "patterns.window", str(why)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo", [(1, 3, 16, 32, 3, 3, 1, 1), (2, 2, 9, 18, 3, 3, 1, 1),
                                 (1, 2, 7, 15, 5, 5, 2, 2), (2, 3, 5, 113, 3, 3, 1, 1)],
                         ids=str)
def test_strided_depthwise_conv2d(geo, dtype):
    """Stride 2: the padding stage's rows split into two phases where its padded width is
    even (34, 20: then the window reads whole vectors), read every other lane where odd
    (19); against the float64 reference."""
    n, c, h, w, kh, kw, ph, pw = geo
    rng = np.random.default_rng(71)
    x, wt, y = _depthwise(n, c, h, w, kh, kw, ph, pw, dtype, stride=2)
    xn, wn = rand((n, c, h, w), dtype, rng), rand((c, 1, kh, kw), dtype, rng)
    (out,), why = build_run([y], [x, wt], [xn, wn])
    check(out, _ref_depthwise(xn, wn, ph, pw, 2), dtype, f"strided depthwise {geo}")
    note = dict((s, t) for s, _, t in why.stages)["dw"]
    wo = (w + 2 * pw - kw) // 2 + 1
    if _lanes_dividing(wo, dtype):
        assert why.rule_of("dw") == "patterns.window", str(why)
        assert ("split into 2 phases" in note) == ((w + 2 * pw) % 2 == 0), note


def test_strided_window_max_reads_its_input_in_place():
    """A stride-2 window max over a kernel input (no stage to re-lay): strided reads."""
    rng = np.random.default_rng(73)
    x = te.placeholder((2, 3, 17, 33), name="x")
    ry, rx = te.reduce_axis((0, 3), name="ry"), te.reduce_axis((0, 3), name="rx")
    mx = te.compute((2, 3, 8, 16), lambda b, c, i, j: te.max(x[b, c, 2 * i + ry, 2 * j + rx],
                                                             axis=[ry, rx]), name="pool")
    xn = rand((2, 3, 17, 33), "float32", rng)
    (out,), why = build_run([mx], [x], [xn])
    win = np.lib.stride_tricks.sliding_window_view(xn.astype(np.float64), (3, 3), axis=(2, 3))
    check(out, win[:, :, ::2, ::2].max(axis=(-2, -1)), "float32", "strided window max")
    assert why.rule_of("pool") == "patterns.window", str(why)


def test_depthwise_bias_relu_fused_into_the_write_back():
    """A depthwise conv2d + bias + ReLU (a MobileNet block) is one pass: the consumer fused
    into the tile's write-back, not a pass of its own over the output."""
    n, c, h, w = 2, 6, 10, 24
    rng = np.random.default_rng(79)
    x, wt, y = _depthwise(n, c, h, w, 3, 3, 1, 1, "float32")
    bias = te.placeholder((c,), name="bias")
    z = te.compute(y.shape, lambda b, o, i, j: te.max(y[b, o, i, j] + bias[o], 0.0), name="z")
    xn, wn, bn = rand((n, c, h, w), "float32", rng), rand((c, 1, 3, 3), "float32", rng), \
        rand((c,), "float32", rng)
    (out,), why = build_run([z], [x, wt, bias], [xn, wn, bn])
    ref = np.maximum(_ref_depthwise(xn, wn, 1, 1) + bn[None, :, None, None], 0)
    check(out, ref, "float32", "depthwise + bias + relu")
    assert why.rule_of("dw") == "patterns.window+epilogue", str(why)
    assert why.rule_of("z") == "patterns.window+epilogue", str(why)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo", [(1, 9, 14, 64, 1), (2, 5, 7, 40, 2), (1, 6, 11, 12, 1),
                                 (2, 4, 5, 7, 0)], ids=str)
def test_nhwc_depthwise_conv2d(geo, dtype):
    """NHWC: the channels are the vector axis and output columns the tile's rows (``x[b, i +
    ry, j + rx, c]``); 64, 40 and 12 channels (full, half and quarter width; 12 half-
    precision lanes: one odd vector), 7 in a 1x1 window (no window: the outer-reduction
    rule); 3x3 and 5x5 windows, batch > 1."""
    n, h, w, c, pad = geo
    k = 2 * pad + 1
    rng = np.random.default_rng(83)
    x = te.placeholder((n, h, w, c), name="x", dtype=dtype)
    wt = te.placeholder((k, k, c), name="w", dtype=dtype)
    xp = te.compute((n, h + 2 * pad, w + 2 * pad, c), lambda b, i, j, o: te.if_then_else(
        te.all(i >= pad, i < h + pad, j >= pad, j < w + pad), x[b, i - pad, j - pad, o],
        te.const(0, dtype)), name="xpad")
    ry, rx = te.reduce_axis((0, k), name="ry"), te.reduce_axis((0, k), name="rx")
    y = te.compute((n, h, w, c), lambda b, i, j, o: te.sum(
        xp[b, i + ry, j + rx, o] * wt[ry, rx, o], axis=[ry, rx]), name="dw")
    xn, wn = rand((n, h, w, c), dtype, rng), rand((k, k, c), dtype, rng)
    (out,), why = build_run([y], [x, wt], [xn, wn])
    ref = _ref_depthwise(xn.transpose(0, 3, 1, 2), wn.transpose(2, 0, 1)[:, None], pad, pad)
    check(out, ref.transpose(0, 2, 3, 1), dtype, f"nhwc depthwise {geo}")
    # a 1x1 "window" (pad 0) is no window: the outer-reduction rule
    want = "patterns.window" if _lanes_dividing(c, dtype) and k > 1 else \
        "patterns.outer_reduction"
    assert why.rule_of("dw") == want, str(why)


def _nhwc_window(n, h, w, c, k, pads, stride, dtype, op="sum"):
    """A user's NHWC depthwise window (``op="sum"``: times a per-channel weight) or max
    window over an input padded ``pads = (top, bottom, left, right)`` (with the lowest
    value for a max)."""
    t, b, lf, r = pads
    x = te.placeholder((n, h, w, c), name="x", dtype=dtype)
    wt = te.placeholder((k, k, c), name="w", dtype=dtype)
    fill = te.const(0, dtype) if op == "sum" else te.min_value(dtype)
    xp = te.compute((n, h + t + b, w + lf + r, c), lambda a, i, j, o: te.if_then_else(
        te.all(i >= t, i < h + t, j >= lf, j < w + lf), x[a, i - t, j - lf, o], fill),
        name="xpad")
    ry, rx = te.reduce_axis((0, k), name="ry"), te.reduce_axis((0, k), name="rx")
    ho, wo = (h + t + b - k) // stride + 1, (w + lf + r - k) // stride + 1
    if op == "sum":
        y = te.compute((n, ho, wo, c), lambda a, i, j, o: te.sum(
            xp[a, i * stride + ry, j * stride + rx, o] * wt[ry, rx, o], axis=[ry, rx]),
            name="dw")
    else:
        y = te.compute((n, ho, wo, c), lambda a, i, j, o: te.max(
            xp[a, i * stride + ry, j * stride + rx, o], axis=[ry, rx]), name="dw")
    return x, wt, y


def _ref_nhwc_window(xn, wn, pads, stride, op="sum"):
    t, b, lf, r = pads
    fill = 0.0 if op == "sum" else -np.inf
    x = np.pad(xn.astype(np.float64), ((0, 0), (t, b), (lf, r), (0, 0)), constant_values=fill)
    k = wn.shape[0]
    ho, wo = (x.shape[1] - k) // stride + 1, (x.shape[2] - k) // stride + 1
    taps = [x[:, i:i + stride * (ho - 1) + 1:stride, j:j + stride * (wo - 1) + 1:stride]
            for i in range(k) for j in range(k)]
    if op == "max":
        return np.max(taps, axis=0)
    return sum(tap * wn[i // k, i % k].astype(np.float64) for i, tap in enumerate(taps))


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo", [
    # n, h, w, c, window, padding (top, bottom, left, right), stride, op, tile: (rows x
    # vectors) for float32 and float16 (twice the lanes)
    (2, 13, 16, 32, 3, (1, 1, 1, 1), 1, "sum", ((4, 2), (4, 1))),   # 4 columns
    (1, 12, 11, 64, 3, (0, 2, 1, 0), 2, "sum", ((1, 4), (1, 2))),   # stride 2: whole pixels
    (3, 7, 12, 48, 5, (2, 2, 2, 2), 1, "sum", ((4, 1), (4, 1))),    # 5x5, 3 vectors a pixel
    (2, 10, 8, 128, 3, (1, 1, 1, 1), 1, "max", ((4, 2), (4, 2))),   # max window, -inf padded
    (1, 9, 14, 256, 3, (1, 1, 1, 1), 1, "sum", ((7, 2), (7, 2))),   # rows of 14: 7 columns
    (1, 9, 14, 256, 3, (1, 1, 1, 1), 2, "sum", ((7, 2), (1, 8))),   # wide pixels at stride 2
], ids=str)
def test_nhwc_window_loads_its_input_directly(geo, dtype, cores):
    """A channels-last window's padding is inlined (its guard tests the tap's pixel, the same
    for every lane), so the taps load the input directly; its tile is 4 output columns by
    the vectors 8 accumulators hold at stride 1 where 4 divides the row, whole pixels at a
    stride where they fit 8 registers, else the 7 or 8 columns by 2 vectors of before.
    Against float64 with asymmetric padding, stride 2, 5x5, a max window, batch > 1, 1
    and 2 cores."""
    n, h, w, c, k, pads, stride, op, tiles = geo
    target = targets.get("x86-avx512").with_cores(cores)
    rng = np.random.default_rng(97)
    x, wt, y = _nhwc_window(n, h, w, c, k, pads, stride, dtype, op)
    xn, wn = rand((n, h, w, c), dtype, rng), rand((k, k, c), dtype, rng)
    ins, arrays = ([x, wt], [xn, wn]) if op == "sum" else ([x], [xn])
    (out,), why = build_run([y], ins, arrays, target=target)
    check(out, _ref_nhwc_window(xn, wn, pads, stride, op), dtype, f"nhwc window {geo}")
    note = dict((s_, t_) for s_, _, t_ in why.stages)["dw"]
    assert why.rule_of("dw") == "patterns.window", str(why)
    assert "xpad inlined" in note, note
    tile = re.search(r"a tile of (\d+) rows x (\d+) vectors", note).groups()
    assert tuple(map(int, tile)) == tiles[dtype == "float16"], note


@pytest.mark.parametrize("name", ["x86-64", "x86-avx2", "x86-avx512"])
@pytest.mark.parametrize("w, stride", [(14, 1), (57, 1), (113, 2)], ids=str)
def test_odd_rows_on_every_vector_width(name, w, stride):
    """Rows no whole, half or quarter register divides (14, 57; 113 at stride 2: 57) take
    one odd vector, the largest divisor of the row up to four registers (57 on AVX-512, 19
    on AVX2; none of 4-16 on SSE: the outer-reduction rule), the register tile sized by the
    registers such a vector holds. Run where the machine runs the target."""
    tgt = targets.get(name)
    if not targets.runnable(tgt):
        pytest.skip(f"this machine cannot run {name}")
    x, wt, y = _depthwise(2, 3, 5, w, 3, 3, 1, 1, "float32", stride=stride)
    rng = np.random.default_rng(89)
    xn, wn = rand((2, 3, 5, w), "float32", rng), rand((3, 1, 3, 3), "float32", rng)
    (out,), why = build_run([y], [x, wt], [xn, wn], target=tgt)
    check(out, _ref_depthwise(xn, wn, 1, 1, stride), "float32", f"{name} row {w}")
    lanes = _lanes_dividing((w + 2 - 3) // stride + 1, "float32", tgt)
    if not lanes:
        assert why.rule_of("dw") == "patterns.outer_reduction", str(why)
        return
    assert why.rule_of("dw") == "patterns.window", str(why)
    note = dict((s, t) for s, _, t in why.stages)["dw"]
    rows, nv = (int(v) for v in re.search(r"a tile of (\d+) rows x (\d+) vectors",
                                          note).groups())
    regs = -(-lanes // tgt.lanes("float32"))  # the registers one odd vector holds
    budget = {512: 24, 256: 10, 128: 10}[tgt.vector_bits]
    assert f"vectors of {lanes} along v_j" in note and rows * nv * regs <= budget, note


def _pad_vector_lanes(sch, tensors, pad: str) -> list[int]:
    """The extents of the vectorised loops that hold block ``pad`` (or a part of it) in the
    scheduled function."""
    import tvm
    import tvm_ffi

    loops: list = []
    tvm_ffi.structural_walk(sch.s_tir(tensors).mod["main"].body, (tvm.tirx.For, loops.append),
                            order="post")
    lanes = []
    for lp in (lp for lp in loops if lp.kind == tvm.tirx.ForKind.VECTORIZED):
        blocks: list = []
        tvm_ffi.structural_walk(lp.body, (tvm.s_tir.SBlock, blocks.append), order="post")
        if any(b.name_hint.startswith(pad) for b in blocks):  # loop_partition renames
            lanes.append(int(lp.extent))
    return lanes


@pytest.mark.parametrize("name", ["x86-64", "x86-avx2", "x86-avx512"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo", [(2, 5, 7, 7, 1, 1), (3, 4, 6, 6, 1, 1), (1, 3, 5, 12, 1, 1),
                                 (2, 3, 4, 9, 2, 1), (2, 3, 6, 8, 1, 1)], ids=str)
def test_short_padded_rows_copy_their_interior_in_vectors(geo, dtype, name):
    """A padding stage computed per task whose rows are shorter than one vector (a 7x7 plane
    padded to 9 on AVX-512) copies each row's interior in vectors (one odd vector of 7;
    quarter registers for 12), the borders plain (it was copied element by element); rows of
    a vector or more (8 padded to 10 on AVX2 and SSE) keep their old copy. A 5x3 window over
    rows of 9 (padded by 2 rows, 1 column), fp32 and fp16, each target run where the machine
    runs it, against float64."""
    import dsl

    n, c, h, w, ph, pw = geo
    tgt = targets.get(name)
    if not targets.runnable(tgt):
        pytest.skip(f"this machine cannot run {name}")
    kh = 2 * ph + 1
    x, wt, y = _depthwise(n, c, h, w, kh, 3, ph, pw, dtype)
    rng = np.random.default_rng(w * h + ph)
    xn, wn = rand((n, c, h, w), dtype, rng), rand((c, 1, kh, 3), dtype, rng)
    (out,), why = build_run([y], [x, wt], [xn, wn], target=tgt)
    check(out, _ref_depthwise(xn, wn, ph, pw), dtype, f"{name} depthwise {geo}")
    assert why.rule_of("xpad") == "patterns.window", str(why)
    row = w + 2 * pw
    short = row < tgt.lanes(dtype)
    vectors = _pad_vector_lanes(dsl.auto_schedule([y], target=tgt), [x, wt, y], "xpad")
    if short:
        assert sum(vectors) == w and len(set(vectors)) == 1, (vectors, why)


@pytest.mark.parametrize("name", ["x86-64", "x86-avx2", "x86-avx512"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo", [(2, 8, 7, 1), (3, 6, 6, 1), (2, 5, 7, 1), (2, 8, 14, 2),
                                 (1, 4, 14, 1)], ids=str)
def test_small_planes_share_a_register_tile(geo, dtype, name):
    """Where one register tile covers a whole output plane (7x7, 6x6), it holds as many
    planes (channels) as divide the channel count, up to 4, within the planes' accumulator
    budget (all registers but 4 with AVX-512, but 2 below): 4 planes of 7 rows with AVX-512, 2
    with AVX2; 3 of 6 channels; 5 channels (prime, 5 x 7 rows over the budget) one. A strided
    window (14 -> 7) and a plane of two tiles (14 rows) keep one plane a tile. Each target
    run where the machine runs it, against float64."""
    n, c, hw, stride = geo
    tgt = targets.get(name)
    if not targets.runnable(tgt):
        pytest.skip(f"this machine cannot run {name}")
    x, wt, y = _depthwise(n, c, hw, hw, 3, 3, 1, 1, dtype, stride=stride)
    rng = np.random.default_rng(c * hw + stride)
    xn, wn = rand((n, c, hw, hw), dtype, rng), rand((c, 1, 3, 3), dtype, rng)
    (out,), why = build_run([y], [x, wt], [xn, wn], target=tgt)
    check(out, _ref_depthwise(xn, wn, 1, 1, stride), dtype, f"{name} planes {geo}")
    note = dict((s, t) for s, _, t in why.stages)["dw"]
    rows, nv = (int(v) for v in re.search(r"a tile of (\d+) rows x (\d+) vectors",
                                          note).groups())
    wo = (hw + 2 - 3) // stride + 1
    lanes = _lanes_dividing(wo, dtype, tgt)
    whole = stride == 1 and rows == wo and nv * lanes == wo
    regs = -(-lanes // tgt.lanes(dtype))
    budget = {512: 28, 256: 14, 128: 14}[tgt.vector_bits] // regs
    expect = max(q for q in range(1, 5) if c % q == 0 and q * rows * nv <= budget) \
        if whole else 1
    found = re.search(r"(\d+) planes of v_o a tile", note)
    assert (int(found.group(1)) if found else 1) == expect, note
    if name == "x86-avx512" and dtype == "float32":  # the cases the docstring names
        assert expect == {(2, 8, 7, 1): 4, (3, 6, 6, 1): 3, (2, 5, 7, 1): 1}.get(geo, 1), note
    if name == "x86-avx2" and geo == (2, 8, 7, 1):
        assert expect == 2, note


def test_parallel_window_tile_takes_no_workspace():
    """A window's register tile (and a padded plane) under 1 KiB lives on the stack of each
    parallel task: TVM serves only "global" buffers that small from the stack and every
    "local" one from the workspace pool, an allocation and a free per task, which also kept
    LLVM from holding the tile in registers (the tile is "global" since the eighteenth
    session). Checked in the LLVM IR of a kernel built for 2 cores: no workspace call."""
    import tvm

    import dsl
    from dsl.runtime.build import build, compile_module

    x, wt, y = _depthwise(8, 64, 5, 5, 3, 3, 1, 1, "float32")
    sch = dsl.auto_schedule([y], target=targets.get("host").with_cores(2))
    assert "planes" in dict((s, t) for s, _, t in dsl.explain(sch).stages)["dw"]
    mod = build(sch, {"name": "window_stack", "tensor_list": [x, wt, y], "need_build": False})
    lib = compile_module(mod, sch.target.tvm_target())
    ir = lib.mod.inspect_source("ll")
    assert "parallel" in ir.lower() or "TVMBackendParallelLaunch" in ir
    calls = [ln for ln in ir.splitlines() if "@__TVMBackendAllocWorkspace" in ln and "load" in ln]
    assert calls == [], calls
    rng = np.random.default_rng(5)
    xn, wn = rand((8, 64, 5, 5), "float32", rng), rand((64, 1, 3, 3), "float32", rng)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros((8, 64, 5, 5), "float32"), dev)
    lib["main"](tvm.runtime.tensor(xn, dev), tvm.runtime.tensor(wn, dev), out)
    check(out.numpy(), _ref_depthwise(xn, wn, 1, 1), "float32", "window on the stack")
