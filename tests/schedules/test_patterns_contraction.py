"""Pattern rules for contractions: matmul, transposed and batched matmul, a user's NCHW conv2d
forward with its padding stage, with and without a fused epilogue; odd/prime sizes, fp32 and
fp16, 2-D to 5-D, against numpy float64, and the rule each stage took."""

import re

import numpy as np
import pytest
from pattern_helpers import build_run, check, rand
from tvm import te

import targets

MM = [(64, 48, 37), (13, 17, 19), (97, 101, 103), (1, 33, 5), (128, 96, 64)]


def _matmul(m, n, k, dtype, batch=(), trans_b=False):
    a = te.placeholder((*batch, m, k), name="a", dtype=dtype)
    b = te.placeholder((*batch, n, k) if trans_b else (*batch, k, n), name="b", dtype=dtype)
    r = te.reduce_axis((0, k), name="r")

    def body(*ix):
        *bt, i, j = ix
        rhs = b(*bt, j, r) if trans_b else b(*bt, r, j)
        return te.sum(a(*bt, i, r) * rhs, axis=r)

    return a, b, te.compute((*batch, m, n), body, name="c")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("mnk", MM, ids=str)
def test_matmul(mnk, dtype):
    m, n, k = mnk
    rng = np.random.default_rng(m)
    a, b, c = _matmul(m, n, k, dtype)
    an, bn = rand((m, k), dtype, rng), rand((k, n), dtype, rng)
    (out,), why = build_run([c], [a, b], [an, bn])
    check(out, an.astype(np.float64) @ bn.astype(np.float64), dtype, "matmul")
    rule = why.rule_of("c")
    # a single output row or column has no reuse along it: a reduction rule takes it
    expect = "patterns.contraction" if min(m, n) > 1 else "patterns.outer_reduction"
    assert rule == expect, str(why)


@pytest.mark.parametrize("batch", [(3,), (2, 3), (2, 1, 3)], ids=str)
@pytest.mark.parametrize("trans_b", [False, True], ids=["nn", "nt"])
def test_batched_matmul(batch, trans_b):
    m, n, k = 19, 29, 23
    rng = np.random.default_rng(7)
    a, b, c = _matmul(m, n, k, "float32", batch, trans_b)
    an = rand((*batch, m, k), "float32", rng)
    bn = rand((*batch, n, k) if trans_b else (*batch, k, n), "float32", rng)
    (out,), why = build_run([c], [a, b], [an, bn])
    b64 = bn.astype(np.float64)
    ref = an.astype(np.float64) @ (np.swapaxes(b64, -1, -2) if trans_b else b64)
    check(out, ref, "float32", "bmm")
    assert why.rule_of("c") == "patterns.contraction", str(why)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_matmul_bias_relu_epilogue_fused(dtype):
    m, n, k = 37, 40, 31
    rng = np.random.default_rng(11)
    a, b, c = _matmul(m, n, k, dtype)
    bias = te.placeholder((n,), name="bias", dtype=dtype)
    y = te.compute((m, n), lambda i, j: te.max(c[i, j] + bias[j], te.const(0, dtype)),
                   name="y")
    an, bn, zn = rand((m, k), dtype, rng), rand((k, n), dtype, rng), rand((n,), dtype, rng)
    (out,), why = build_run([y], [a, b, bias], [an, bn, zn])
    ref = np.maximum(an.astype(np.float64) @ bn.astype(np.float64) + zn.astype(np.float64), 0)
    check(out, ref, dtype, "gemm+bias+relu")
    assert why.rule_of("c") == "patterns.contraction+epilogue", str(why)
    assert why.rule_of("y") == "patterns.contraction+epilogue"


def _conv2d(n, ci, co, h, w, kh, kw, pad, dtype, stride=1):
    x = te.placeholder((n, ci, h, w), name="x", dtype=dtype)
    wt = te.placeholder((co, ci, kh, kw), name="w", dtype=dtype)
    hp, wp = h + 2 * pad, w + 2 * pad
    xp = te.compute((n, ci, hp, wp), lambda b, c, i, j: te.if_then_else(
        te.all(i >= pad, i < h + pad, j >= pad, j < w + pad), x[b, c, i - pad, j - pad],
        te.const(0, dtype)), name="xpad")
    rc = te.reduce_axis((0, ci), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    ho, wo = (hp - kh) // stride + 1, (wp - kw) // stride + 1
    y = te.compute((n, co, ho, wo), lambda b, o, i, j: te.sum(
        xp[b, rc, i * stride + ry, j * stride + rx] * wt[o, rc, ry, rx], axis=[rc, ry, rx]),
        name="conv")
    return x, wt, y


def _ref_conv(xn, wn, pad, stride=1):
    x = np.pad(xn.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    w = wn.astype(np.float64)
    co, _, kh, kw = w.shape
    ho, wo = (x.shape[2] - kh) // stride + 1, (x.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], co, ho, wo))
    for i in range(kh):
        for j in range(kw):
            win = x[:, :, i:i + stride * (ho - 1) + 1:stride, j:j + stride * (wo - 1) + 1:stride]
            out += np.einsum("nchw,oc->nohw", win, w[:, :, i, j])
    return out


def _run_conv(geo, dtype, seed: int, what: str):
    """Build, run and check the NCHW conv2d of ``geo`` = (n, ci, co, h, w, kh, kw, pad);
    returns ``dsl.explain``'s answer."""
    n, ci, co, h, w, kh, kw, pad = geo
    rng = np.random.default_rng(seed)
    x, wt, y = _conv2d(n, ci, co, h, w, kh, kw, pad, dtype)
    xn, wn = rand((n, ci, h, w), dtype, rng), rand((co, ci, kh, kw), dtype, rng)
    (out,), why = build_run([y], [x, wt], [xn, wn])
    check(out, _ref_conv(xn, wn, pad), dtype, what)
    return why


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo", [(2, 3, 8, 11, 13, 3, 3, 1), (1, 5, 7, 9, 17, 1, 1, 0),
                                 (3, 4, 16, 7, 5, 3, 2, 2)], ids=str)
def test_user_conv2d_forward(geo, dtype):
    pad = geo[-1]
    why = _run_conv(geo, dtype, 13, "conv2d")
    assert why.rule_of("conv") == "patterns.contraction", str(why)
    if pad:  # materialised once (or per row of the contraction), never inlined
        assert why.rule_of("xpad") in ("patterns.injective", "patterns.contraction"), str(why)
    else:  # zero padding: its guard always holds, a copy of x read through (not copied)
        assert why.rule_of("xpad") == "patterns.inline", str(why)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo", [(2, 3, 5, 9, 11, 3, 1, 2), (1, 4, 9, 13, 17, 5, 2, 3),
                                 (2, 3, 7, 10, 11, 3, 0, 2)], ids=str)
def test_user_conv2d_strided(geo, dtype):
    """A strided window is not contiguous along the output's width: the windowed operand is
    phase-split by the stride (``[.., W % s, W // s]``) and the micro-kernel takes it; odd
    widths (a padded split), stride 3, and an input read straight (no padding stage)."""
    n, ci, co, h, w, k, pad, stride = geo
    rng = np.random.default_rng(23)
    x, wt, y = _conv2d(n, ci, co, h, w, k, k, pad, dtype, stride=stride)
    xn, wn = rand((n, ci, h, w), dtype, rng), rand((co, ci, k, k), dtype, rng)
    (out,), why = build_run([y], [x, wt], [xn, wn])
    check(out, _ref_conv(xn, wn, pad, stride=stride), dtype, f"conv2d s{stride}")
    assert why.rule_of("conv") == "patterns.contraction", str(why)
    assert "phase-split by the stride" in dict((s, w) for s, _, w in why.stages)["conv"]
    assert why.fell_to_generic() == []


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("w,pad", [(58, 3), (41, 3), (37, 2)], ids=str)
def test_user_stem_conv_pads_each_phase_in_vectors(w, pad, dtype):
    """A stem-like conv2d (3 input channels, 7x7 taps, stride 2) whose padding stage is
    computed per row of the contraction and phase-split by the stride: the stage iterates
    the phase layout (it had written every other element of a row, element by element), its
    interior in vectors whose stride-2 reads the lane-shuffle pass turns into whole loads
    (the row loop is marked for it). Odd padded widths (41 + 6, 37 + 4: a padded split) keep
    the stage as it was; every result against float64."""
    import tvm

    import dsl
    from dsl.runtime.lane_shuffle_pass import KEY
    from schedules.loop_tests import walk_blocks

    n, ci, co, h, k, stride = 1, 3, 32, 40, 7, 2
    rng = np.random.default_rng(w)
    x, wt, y = _conv2d(n, ci, co, h, w, k, k, pad, dtype, stride=stride)
    xn, wn = rand((n, ci, h, w), dtype, rng), rand((co, ci, k, k), dtype, rng)
    (out,), why = build_run([y], [x, wt], [xn, wn])
    check(out, _ref_conv(xn, wn, pad, stride=stride), dtype, "stem conv2d")
    assert "xpad computed per parallel row" in dict((s, t) for s, _, t in why.stages)["conv"]
    func = dsl.auto_schedule([y]).s_tir([x, wt, y]).mod["main"]
    whole = (w + 2 * pad) % stride == 0
    assert (KEY in func.script()) == whole
    if whole:  # the stage's rows: [n, ci, hp, phase, q], parts of q in vectors
        vector_parts = []
        walk_blocks(func.body, lambda r, loops: vector_parts.append(r) if r.block.name_hint
                    == "xpad" and loops[-1].kind == tvm.tirx.ForKind.VECTORIZED else None)
        assert vector_parts and all(len(r.block.iter_vars) == 5 for r in vector_parts)


def test_strided_padding_in_a_pass_of_its_own_keeps_its_rows():
    """A strided conv2d whose padding stage is a pass of its own (48 output channels: the tile
    runs along them, its tasks not per parallel row) keeps the stage iterating its rows: laid
    out by phase and scheduled whole, its fused phase and row loop divided and took the
    remainder by the row at every element (a strided 32-group conv2d 2.8x slower so).
    Against float64."""
    import dsl
    from schedules.loop_tests import walk_blocks

    rng = np.random.default_rng(61)
    x, wt, y = _conv2d(1, 8, 48, 12, 56, 3, 3, 1, "float32", stride=2)
    xn, wn = rand((1, 8, 12, 56), "float32", rng), rand((48, 8, 3, 3), "float32", rng)
    (out,), why = build_run([y], [x, wt], [xn, wn])
    check(out, _ref_conv(xn, wn, 1, stride=2), "float32", "strided conv2d")
    assert why.rule_of("xpad") == "patterns.injective", str(why)
    func = dsl.auto_schedule([y]).s_tir([x, wt, y]).mod["main"]
    pads = []
    walk_blocks(func.body, lambda r, loops: pads.append(r) if r.block.name_hint == "xpad"
                else None)
    assert pads and all(len(r.block.iter_vars) == 4 for r in pads)
    assert "pragma_dsl_lane_shuffle" not in func.script()


def _nhwc_conv2d(n, ci, co, hw, k, pad, stride, dtype="float32", acc=None):
    """A user's NHWC conv2d (HWIO weights) in ``dtype``; ``acc``: each operand widened to it
    before the product (a bfloat16 conv2d summed in float32)."""
    x = te.placeholder((n, hw, hw, ci), name="x", dtype=dtype)
    wt = te.placeholder((k, k, ci, co), name="w", dtype=dtype)
    hp = hw + 2 * pad
    xp = te.compute((n, hp, hp, ci), lambda b, i, j, c: te.if_then_else(
        te.all(i >= pad, i < hw + pad, j >= pad, j < hw + pad), x[b, i - pad, j - pad, c],
        te.const(0, dtype)), name="xpad")
    ry, rx, rc = (te.reduce_axis((0, e), name=nm) for e, nm in ((k, "ry"), (k, "rx"), (ci, "rc")))
    o = (hp - k) // stride + 1

    def term(b, i, j, f):
        a, w = xp[b, i * stride + ry, j * stride + rx, rc], wt[ry, rx, rc, f]
        return a.astype(acc) * w.astype(acc) if acc else a * w

    y = te.compute((n, o, o, co), lambda b, i, j, f: te.sum(term(b, i, j, f), axis=[ry, rx, rc]),
                   name="conv")
    return x, wt, y


@pytest.mark.parametrize("geo, in_task", [
    ((2, 16, 32, 20, 3, 1, 2), True),   # stride 2: each task pads 3 rows for its 2
    ((1, 24, 48, 17, 3, 1, 2), True),   # odd size, channels no multiple of 16
    ((2, 16, 32, 20, 3, 1, 1), True),   # stride 1: tasks of 4 rows, 6 padded rows each
    ((2, 16, 32, 6, 3, 1, 1), False),   # 6 rows: a task of all 6 leaves a core idle
], ids=str)
def test_nhwc_padding_computed_in_each_task_where_it_repeats_little(geo, in_task):
    """A user's NHWC conv2d (tile along the output channels, tasks of rows of positions):
    its padding stage is computed in each task, the rows that task reads, where those parts
    cover the whole at most 1.5 times, instead of a pass that writes the padded copy to
    memory and reads it back (8x112x112x32 -> 32 channels, stride 2, one Zen 4 core: 0.92 ->
    1.14x PyTorch; a strided 32-group NCHW conv2d 1.26x faster); at stride 1 a task takes
    the fewest rows that bring it there (8x112x112x16: 1.075x). Against float64."""
    from dataclasses import replace

    n, ci, co, hw, k, pad, stride = geo
    rng = np.random.default_rng(71)
    x, wt, y = _nhwc_conv2d(*geo)
    xn, wn = rand((n, hw, hw, ci), "float32", rng), rand((k, k, ci, co), "float32", rng)
    # a 16 KiB L2: these small pads outgrow it, as a real layer's outgrows a real one
    tgt = replace(targets.get("host"), name="host-l2-16k", l2_kib=16)
    targets.register(tgt)
    (out,), why = build_run([y], [x, wt], [xn, wn], target=tgt)
    ref = _ref_conv(xn.transpose(0, 3, 1, 2), wn.transpose(3, 2, 0, 1), pad, stride=stride)
    check(out, ref.transpose(0, 2, 3, 1), "float32", f"nhwc conv2d {geo}")
    assert ("xpad computed per parallel task" in _stage_why(why, "conv")) == in_task, str(why)
    assert why.rule_of("xpad") == ("patterns.contraction" if in_task else "patterns.injective")


def _nhwc_conv2d_bias_relu(n, ci, co, hw, k, pad, stride, dtype):
    """:func:`_nhwc_conv2d` with a bias per output channel and a ReLU."""
    x, wt, y = _nhwc_conv2d(n, ci, co, hw, k, pad, stride, dtype)
    bias = te.placeholder((co,), name="bias", dtype=dtype)
    out = te.compute(y.shape, lambda *i: te.max(y(*i) + bias[i[-1]], te.const(0, dtype)),
                     name="act")
    return x, wt, bias, out


@pytest.mark.parametrize("geo, dtype, padded", [
    ((2, 36, 36, 9, 3, 1, 1), "float32", 48),    # 36 = 9 quarter registers -> 3 zmm
    ((1, 20, 100, 13, 3, 1, 2), "float32", 144),  # stride 2, 7 columns: 3 tiles of 7 x 3 zmm
    ((3, 7, 36, 11, 5, 2, 1), "float16", 48),    # 7 input channels, a 5 x 5 window, fp16
], ids=str)
def test_nhwc_output_channels_padded_to_whole_vectors(geo, dtype, padded):
    """A user's NHWC conv2d whose output channels are no whole number of the machine's
    vectors: the weight is copied zero-padded to whole vectors, the tile computes the padded
    channels in registers and its write-back (with the bias and ReLU fused) stores only the
    real ones (36 channels in 4-lane quarter registers ran 1.49x slower on one Zen 4 core).
    Odd sizes, batch > 1, stride 2, against float64."""
    n, ci, co, hw, k, pad, stride = geo
    rng = np.random.default_rng(83)
    x, wt, bias, out = _nhwc_conv2d_bias_relu(*geo, dtype)
    xn, wn = rand((n, hw, hw, ci), dtype, rng), rand((k, k, ci, co), dtype, rng)
    bn = rand((co,), dtype, rng)
    tgt = targets.get("x86-avx512")
    (res,), why = build_run([out], [x, wt, bias], [xn, wn, bn], target=tgt)
    ref = _ref_conv(xn.transpose(0, 3, 1, 2), wn.transpose(3, 2, 0, 1), pad, stride=stride)
    ref = np.maximum(ref.transpose(0, 2, 3, 1) + bn.astype(np.float64), 0.0)
    check(res, ref, dtype, f"nhwc conv2d {geo} {dtype}")
    conv = _stage_why(why, "conv")
    assert f"v_f padded to {padded} (cropped in the write-back)" in conv, str(why)
    assert "vectors of 16" in conv, str(why)


@pytest.mark.parametrize("target, padded", [
    ("znver4", False),          # 24 channels are 3 ymm, whose FMAs run at full rate there
    ("sapphirerapids", True),   # a ymm FMA does half a zmm's work: 2 zmm, 8 lanes wasted
    ("x86-avx2", False),        # 3 whole ymm: nothing to pad
])
def test_output_channels_padded_where_the_wider_fmas_do_more(target, padded):
    """Whether 24 output channels are padded to 32 is the target's FMA width's decision
    (24 channels padded ran 0.76x on one Zen 4 core); decided here, not run."""
    import dsl

    x, wt, bias, out = _nhwc_conv2d_bias_relu(2, 16, 24, 14, 3, 1, 1, "float32")
    sch = dsl.auto_schedule([out], target=targets.get(target))
    conv = _stage_why(dsl.explain(sch, [x, wt, bias, out]), "conv")
    assert ("v_f padded to 32" in conv) == padded, conv


@pytest.mark.parametrize("n, ci, co, positions, tile", [
    (2, 24, 100, 49, "domain padded to whole tiles"),  # 49 columns padded to 64, not 96
    (2, 256, 128, 49, "vectors along v_f"),             # 2 tiles of 48 would waste half
    (1, 16, 20, 20, "domain padded to whole tiles"),    # 20 columns: 2 vectors, one partial
], ids=str)
def test_flat_1x1_conv_pads_its_columns_to_whole_tiles(n, ci, co, positions, tile):
    """A user's 1x1 conv2d over flattened positions (``[n, c, h * w]``, an einsum): a tile of
    4 vectors over 49 columns ran with its last vector partial inside the reduction (10
    GFLOP/s for 8 x 512 -> 100 channels on one Zen 4 core, 8.8x slower than padded to 64);
    tiles are scored by the lanes the padding keeps (128 channels: 8 x 3 vectors padded to
    96 columns ran 2.4x slower than vectors along the channels). Against float64."""
    rng = np.random.default_rng(89)
    x = te.placeholder((n, ci, positions), name="x")
    wt = te.placeholder((co, ci), name="w")
    rc = te.reduce_axis((0, ci), name="rc")
    y = te.compute((n, co, positions), lambda b, f, p: te.sum(x[b, rc, p] * wt[f, rc], axis=rc),
                   name="conv")
    xn, wn = rand((n, ci, positions), "float32", rng), rand((co, ci), "float32", rng)
    (out,), why = build_run([y], [x, wt], [xn, wn], target=targets.get("x86-avx512"))
    ref = np.einsum("ncp,fc->nfp", xn.astype(np.float64), wn.astype(np.float64))
    check(out, ref, "float32", f"flat 1x1 conv {n, ci, co, positions}")
    assert tile in _stage_why(why, "conv"), str(why)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo, padded", [
    ((2, 5, 36, 6, 28, 3, 3, 1), 48),     # 36 channels, rows of 28: 7 quarter registers
    ((3, 160, 100, 7, 7, 1, 1, 0), 144),  # a 1x1 at 7 x 7: one partial vector a row
    ((1, 7, 20, 9, 28, 3, 5, 2), 32),     # 20 channels, an asymmetric 3 x 5 window
], ids=str)
def test_user_conv2d_output_channels_padded_for_vectors_along_them(geo, padded, dtype):
    """A user's NCHW conv2d whose output channels are no whole number of half-width vectors
    and whose rows fill no vector: the tile takes full-width vectors along the channels,
    padded to whole tiles (the weight copied zero-padded into its pack), and the write-back
    that transposes the tile stores only the real channels, the bias and ReLU fused into it
    (36 channels at 28 x 28 ran 3 x 7 quarter registers along the rows, 1.45x slower on one
    Zen 4 core; 100 at 7 x 7 2.3x slower). Batch > 1, odd sizes, against float64."""
    n, ci, co, h, w, kh, kw, pad = geo
    rng = np.random.default_rng(97)
    x, wt, y = _conv2d(n, ci, co, h, w, kh, kw, pad, dtype)
    bias = te.placeholder((co,), name="bias", dtype=dtype)
    out = te.compute(y.shape, lambda b, o, i, j: te.max(y[b, o, i, j] + bias[o],
                                                        te.const(0, dtype)), name="act")
    xn, wn = rand((n, ci, h, w), dtype, rng), rand((co, ci, kh, kw), dtype, rng)
    bn = rand((co,), dtype, rng)
    (res,), why = build_run([out], [x, wt, bias], [xn, wn, bn],
                            target=targets.get("x86-avx512"))
    ref = np.maximum(_ref_conv(xn, wn, pad) + bn.astype(np.float64)[:, None, None], 0.0)
    check(res, ref, dtype, f"conv2d {geo} {dtype}")
    conv = _stage_why(why, "conv")
    assert "vectors along v_o, S packed along it" in conv, str(why)
    assert f"v_o padded to {padded} (cropped in the write-back)" in conv, str(why)


@pytest.mark.parametrize("cores", [1, 2])
def test_user_dx_with_flipped_weights_takes_vectors_along_channels(cores):
    """A user's stride-1 conv2d input gradient (dy padded, convolved with the flipped weights
    ``w[k, c, 2 - ry, 2 - rx]``): each weight index reads one iterator, so the weights pack
    along the input channels and the tile takes its vectors there, as the forward conv2d's
    does (8x64x28x28: 2.05x faster on one Zen 4 core than 2 x 7 quarter registers along the
    rows). Each task packs its own block of the weights (their 3 x 3 taps too few to
    transpose in blocks); on 2 cores that pack had made the rule fail and fall to a scalar
    one.
    Against float64."""
    from dataclasses import replace

    n, k, c, h, w = 2, 16, 128, 5, 28
    rng = np.random.default_rng(101)
    dy = te.placeholder((n, k, h, w), name="dy")
    wt = te.placeholder((k, c, 3, 3), name="w")
    dyp = te.compute((n, k, h + 2, w + 2), lambda b, o, i, j: te.if_then_else(
        te.all(i >= 1, i <= h, j >= 1, j <= w), dy[b, o, i - 1, j - 1], 0.0), name="dy_pad")
    rk, ry, rx = (te.reduce_axis((0, e), name=nm) for e, nm in ((k, "rk"), (3, "ry"), (3, "rx")))
    dx = te.compute((n, c, h, w), lambda b, ci, i, j: te.sum(
        dyp[b, rk, i + ry, j + rx] * wt[rk, ci, 2 - ry, 2 - rx], axis=[rk, ry, rx]), name="dx")
    dyn, wn = rand((n, k, h, w), "float32", rng), rand((k, c, 3, 3), "float32", rng)
    # a 16 KiB L2: the 72 KiB of weights outgrow half of it, as a real layer's outgrow a real one
    tgt = replace(targets.get("x86-avx512"), name=f"avx512-l2-16k-{cores}c", l2_kib=16,
                  cores=cores)
    targets.register(tgt)
    (out,), why = build_run([dx], [dy, wt], [dyn, wn], target=tgt)
    flipped = wn[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
    check(out, _ref_conv(dyn, flipped, 1), "float32", f"user dx on {cores} cores")
    stage = _stage_why(why, "dx")
    assert "vectors along v_ci, S packed along it" in stage, str(why)
    assert "one v_ci block of it per task" in stage, str(why)


def _bf16(rng, shape):
    import ml_dtypes

    return rng.uniform(-1, 1, size=shape).astype(np.float32).astype(ml_dtypes.bfloat16)


def _bf16_target():
    tgt = targets.get("host")
    if not tgt.has("avx512_bf16"):
        pytest.skip("this machine has no AVX512-BF16")
    return tgt


@pytest.mark.parametrize("m, n, k, form, dot", [
    (37, 100, 64, "a*b", True),   # n padded to whole tiles of 4 vectors
    (64, 64, 30, "b*a", True),    # written the other way round
    (19, 48, 33, "a*b", False),   # an odd reduction: no pairs, multiply-adds
    (16, 32, 32, "cast(a*b)", False),  # the product rounded to bfloat16 first: as written
], ids=str)
def test_bf16_matmul_summed_in_fp32_runs_on_the_dot_instruction(m, n, k, form, dot):
    """A user's bfloat16 matmul summed in float32 (``a.astype("float32") * b.astype(...)``)
    runs on AVX512-BF16's ``vdpbf16ps`` (pairs of the reduction in one instruction, B packed
    ``[.., k // 2, n, k % 2]``): 512^3 on one Zen 4 core 114 -> 214 GFLOP/s (PyTorch 222),
    where its multiply-adds had capped it at the fp32 roof. Against float64."""
    rng = np.random.default_rng(103)
    a = te.placeholder((m, k), name="a", dtype="bfloat16")
    b = te.placeholder((k, n), name="b", dtype="bfloat16")
    r = te.reduce_axis((0, k), name="r")
    terms = {"a*b": lambda i, j: a[i, r].astype("float32") * b[r, j].astype("float32"),
             "b*a": lambda i, j: b[r, j].astype("float32") * a[i, r].astype("float32"),
             "cast(a*b)": lambda i, j: (a[i, r] * b[r, j]).astype("float32")}[form]
    c = te.compute((m, n), lambda i, j: te.sum(terms(i, j), axis=r), name="c")
    an, bn = _bf16(rng, (m, k)), _bf16(rng, (k, n))
    (out,), why = build_run([c], [a, b], [an, bn], target=_bf16_target())
    # a product rounded to bfloat16 (8 bits) keeps fp16's tolerance
    check(out, an.astype(np.float64) @ bn.astype(np.float64),
          "float16" if form == "cast(a*b)" else "float32", f"bf16 mm {m, n, k} {form}")
    assert why.rule_of("c") == "patterns.contraction", str(why)
    assert ("a dot-product instruction" in _stage_why(why, "c")) == dot, str(why)


@pytest.mark.parametrize("m, n, k", [(33, 80, 64), (16, 16, 36)], ids=str)
def test_u8_s8_matmul_summed_in_int32_runs_on_vnni(m, n, k):
    """The same for unsigned x signed bytes summed in int32: 4 steps of the reduction in one
    ``vpdpbusd`` (AVX-512 VNNI). Exact integers."""
    tgt = targets.get("host")
    if not tgt.has("avx512_vnni"):
        pytest.skip("this machine has no AVX-512 VNNI")
    rng = np.random.default_rng(109)
    a = te.placeholder((m, k), name="a", dtype="uint8")
    b = te.placeholder((k, n), name="b", dtype="int8")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(
        a[i, r].astype("int32") * b[r, j].astype("int32"), axis=r), name="c")
    an = rng.integers(0, 256, (m, k)).astype(np.uint8)
    bn = rng.integers(-128, 128, (k, n)).astype(np.int8)
    (out,), why = build_run([c], [a, b], [an, bn], target=tgt)
    np.testing.assert_array_equal(out, an.astype(np.int64) @ bn.astype(np.int64))
    assert "4 steps of v_r a dot-product instruction" in _stage_why(why, "c"), str(why)


@pytest.mark.parametrize("geo", [
    (2, 16, 32, 6, 28, 3, 3, 1),   # the padding stage writes the channel pairs innermost
    (1, 24, 48, 7, 7, 1, 1, 0),    # a 1x1 reads x itself: a copy with the pairs innermost
    (2, 8, 36, 5, 28, 3, 3, 1),    # 36 channels padded to 48
], ids=str)
def test_bf16_nchw_conv2d_summed_in_fp32_runs_on_the_dot_instruction(geo):
    """A user's bfloat16 NCHW conv2d summed in float32, the tile's vectors along the output
    channels: the weights packed with the input-channel pairs innermost, the input laid out
    ``[n, c // 2, h, w, c % 2]``, each broadcast pair and the lanes one ``vdpbf16ps``
    (8x64x56x56 on one Zen 4 core: 109 -> 182 GFLOP/s, PyTorch 202). Against float64."""
    n, ci, co, h, w, kh, kw, pad = geo
    rng = np.random.default_rng(127)
    x = te.placeholder((n, ci, h, w), name="x", dtype="bfloat16")
    wt = te.placeholder((co, ci, kh, kw), name="w", dtype="bfloat16")
    xp = te.compute((n, ci, h + 2 * pad, w + 2 * pad), lambda b, c, i, j: te.if_then_else(
        te.all(i >= pad, i < h + pad, j >= pad, j < w + pad), x[b, c, i - pad, j - pad],
        te.const(0, "bfloat16")), name="xpad")
    rc, ry, rx = (te.reduce_axis((0, e), name=nm) for e, nm in ((ci, "rc"), (kh, "ry"),
                                                                 (kw, "rx")))
    y = te.compute((n, co, h + 2 * pad - kh + 1, w + 2 * pad - kw + 1), lambda b, o, i, j: te.sum(
        xp[b, rc, i + ry, j + rx].astype("float32") * wt[o, rc, ry, rx].astype("float32"),
        axis=[rc, ry, rx]), name="conv")
    xn, wn = _bf16(rng, (n, ci, h, w)), _bf16(rng, (co, ci, kh, kw))
    (out,), why = build_run([y], [x, wt], [xn, wn], target=_bf16_target())
    check(out, _ref_conv(xn.astype(np.float64), wn.astype(np.float64), pad), "float32",
          f"bf16 nchw conv2d {geo}")
    stage = _stage_why(why, "conv")
    assert "vectors along v_o" in stage and "2 steps of v_rc a dot-product" in stage, str(why)


@pytest.mark.parametrize("geo", [(2, 16, 36, 9, 3, 1, 1), (1, 8, 32, 11, 3, 1, 2)], ids=str)
def test_bf16_nhwc_conv2d_summed_in_fp32_runs_on_the_dot_instruction(geo):
    """A user's bfloat16 NHWC conv2d summed in float32: the input channels in pairs on
    ``vdpbf16ps`` (36 output channels padded to 48, stride 2 phase-split): 8x64x56x56 at
    92% of one Zen 4 core's bf16 roof. Against float64."""
    n, ci, co, hw, k, pad, stride = geo
    rng = np.random.default_rng(107)
    x, wt, y = _nhwc_conv2d(*geo, "bfloat16", acc="float32")
    xn, wn = _bf16(rng, (n, hw, hw, ci)), _bf16(rng, (k, k, ci, co))
    (out,), why = build_run([y], [x, wt], [xn, wn], target=_bf16_target())
    ref = _ref_conv(xn.astype(np.float64).transpose(0, 3, 1, 2),
                    wn.astype(np.float64).transpose(3, 2, 0, 1), pad, stride=stride)
    check(out, ref.transpose(0, 2, 3, 1), "float32", f"bf16 nhwc conv2d {geo}")
    assert "2 steps of v_rc a dot-product instruction" in _stage_why(why, "conv"), str(why)


@pytest.mark.parametrize("length, taps", [(99, 3), (121, 3), (99, 1)], ids=str)
def test_tile_along_channels_leaves_registers_for_its_window_broadcasts(length, taps):
    """A user's NCL conv1d with vectors along the output channels: the tile's accumulators,
    its S vectors and the broadcasts its positions' taps share fit the registers (with
    :data:`ACROSS_SPARE_REGISTERS` more): over 99 positions and 3 taps the 11 x 2 tile (37)
    ran at 65 GFLOP/s on one Zen 4 core, 9 x 2 at 112. Against float64."""
    from schedules.patterns.contraction import ACROSS_SPARE_REGISTERS

    n, c, k = 2, 32, 32
    rng = np.random.default_rng(113)
    x = te.placeholder((n, c, length), name="x")
    wt = te.placeholder((k, c, taps), name="w")
    pad = taps // 2
    xp = te.compute((n, c, length + 2 * pad), lambda b, ci, i: te.if_then_else(
        te.all(i >= pad, i < length + pad), x[b, ci, i - pad], 0.0), name="xpad")
    rc, rk = te.reduce_axis((0, c), name="rc"), te.reduce_axis((0, taps), name="rk")
    y = te.compute((n, k, length), lambda b, f, i: te.sum(
        xp[b, rc, i + rk] * wt[f, rc, rk], axis=[rc, rk]), name="conv1d")
    xn, wn = rand((n, c, length), "float32", rng), rand((k, c, taps), "float32", rng)
    (out,), why = build_run([y], [x, wt], [xn, wn], target=targets.get("x86-avx512"))
    xq = np.pad(xn.astype(np.float64), ((0, 0), (0, 0), (pad, pad)))
    ref = sum(np.einsum("ncl,kc->nkl", xq[:, :, t:t + length], wn[:, :, t].astype(np.float64))
              for t in range(taps))
    check(out, ref, "float32", f"conv1d over {length}")
    stage = _stage_why(why, "conv1d")
    mr, nv = map(int, re.search(r"register tile (\d+) x (\d+) vectors", stage).groups())
    assert "vectors along v_f" in stage, stage
    assert mr * nv + nv + mr + taps - 1 <= 32 + ACROSS_SPARE_REGISTERS, stage


def _user_nchw_dw(n, c, k, size, taps, pads, stride):
    """A user's N-D NCHW weight gradient, ``dw[o, i, r..] = sum_{b, p..} dy[b, o, p..] *
    xpad[b, i, p * stride + r ..]`` (``size``, ``taps``, ``pads``: one entry per spatial
    axis; ``pads`` each ``(before, after)``): ``(dy, x, dw, float64 reference of dy and x
    data)``."""
    nd = len(size)
    padded = [h + a + b for h, (a, b) in zip(size, pads)]
    out = [(p - t) // stride + 1 for p, t in zip(padded, taps)]
    x = te.placeholder((n, c, *size), name="x")
    dy = te.placeholder((n, k, *out), name="dy")

    def pad(b, ci, *ix):
        inside = te.all(*(e for i, h, (a, _) in zip(ix, size, pads)
                          for e in (i >= a, i < h + a)))
        return te.if_then_else(inside, x[(b, ci, *(i - a for i, (a, _) in zip(ix, pads)))],
                               0.0)

    xp = te.compute((n, c, *padded), pad, name="xpad")
    rb = te.reduce_axis((0, n), name="rb")
    rp = [te.reduce_axis((0, e), name=f"rp{d}") for d, e in enumerate(out)]
    dw = te.compute((k, c, *taps), lambda o, i, *r: te.sum(
        dy[(rb, o, *rp)] * xp[(rb, i, *(p * stride + t for p, t in zip(rp, r)))],
        axis=[rb, *rp]), name="dw")

    def reference(dyn, xn):
        xq = np.pad(xn.astype(np.float64), ((0, 0), (0, 0), *pads))
        ref = np.zeros((k, c, *taps))
        for r in np.ndindex(*taps):
            win = xq[(slice(None), slice(None),
                      *(slice(t, t + stride * (e - 1) + 1, stride) for t, e in zip(r, out)))]
            ref[(slice(None), slice(None), *r)] = np.tensordot(
                dyn.astype(np.float64), win, axes=([0, *range(2, 2 + nd)],
                                                   [0, *range(2, 2 + nd)]))
        return ref

    return dy, x, dw, reference


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize("geo, along", [
    ((2, 40, 32, (20, 20), (3, 3), ((1, 2), (1, 2)), 1), "v_i"),   # asymmetric padding
    ((2, 24, 48, (18, 18), (1, 1), ((0, 0), (0, 0)), 1), "v_i"),   # 1x1: 1 position a tap
    ((2, 17, 32, (37, 37), (3, 3), ((1, 1), (1, 1)), 2), "v_i"),   # stride 2, prime sizes
    ((3, 17, 32, (50,), (3,), ((1, 1),), 1), "v_i"),               # conv1d
    ((2, 24, 36, (20, 20), (3, 3), ((1, 1), (1, 1)), 1), "v_i"),   # 36 channels, padded
    ((2, 24, 32, (7, 7), (3, 3), ((1, 1), (1, 1)), 1), "taps"),    # rows of 7: taps share
], ids=str)
def test_user_nchw_weight_gradient_tiles_along_its_channels(geo, along, cores):
    """A user's NCHW weight gradient ends in its taps (3, or 1): vectors along its output
    channels, the tile's positions along its input channels (:func:`_positions_axis`),
    where before they ran along the 3 taps (12 accumulators; with a window over 56 columns
    counted as taps, 3 of 16 lanes along the taps: 36 GFLOP/s on one Zen 4 core, PyTorch
    92). Over rows short enough to unroll (7) the taps share the broadcasts and keep the
    positions. Each task owns its block of the output across the taps (2 cores: the
    parallel loop fuses the blocks). Against float64."""
    n, c, k, size, taps, pads, stride = geo
    tgt = targets.get("host").with_cores(cores)
    dy, x, dw, reference = _user_nchw_dw(n, c, k, size, taps, pads, stride)
    rng = np.random.default_rng(211)
    dyn = rand([int(e) for e in dy.shape], "float32", rng)
    xn = rand([int(e) for e in x.shape], "float32", rng)
    (out,), why = build_run([dw], [dy, x], [dyn, xn], target=tgt)
    check(out, reference(dyn, xn), "float32", f"user dw {geo}")
    stage = _stage_why(why, "dw")
    along = f"v_{dw.op.axis[-1].var.name}" if along == "taps" else along
    assert "vectors along v_o" in stage and f"over {along} x v_o" in stage, stage


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize("k, chunk", [(3000, 1000), (2053, None)], ids=str)
def test_long_reduction_summed_in_chunks(k, chunk, cores):
    """A linear layer's weight gradient written by a user (``dw[o, i] = sum_n dy[n, o] *
    x[n, i]``) over a reduction whose packed panel of ``x`` outgrows half of L2 (3000 steps
    of 64 lanes: 750 KiB) sums it in chunks of at most :data:`REDUCTION_CHUNK` steps, the
    tile added to the output once a chunk; a prime reduction (2053: no chunk divides it)
    keeps one pass. Against float64."""
    from schedules.patterns.contraction import REDUCTION_CHUNK

    rng = np.random.default_rng(223)
    dy, x = te.placeholder((k, 48), name="dy"), te.placeholder((k, 64), name="x")
    r = te.reduce_axis((0, k), name="r")
    dw = te.compute((48, 64), lambda o, i: te.sum(dy[r, o] * x[r, i], axis=r), name="dw")
    dyn, xn = rand((k, 48), "float32", rng), rand((k, 64), "float32", rng)
    tgt = targets.get("x86-avx512").with_cores(cores)
    if not targets.runnable(tgt):
        pytest.skip("this machine cannot run AVX-512 code")
    (out,), why = build_run([dw], [dy, x], [dyn, xn], target=tgt)
    check(out, dyn.astype(np.float64).T @ xn.astype(np.float64), "float32", f"dy^T x {k}")
    stage = _stage_why(why, "dw")
    assert ("summed in chunks" in stage) == (chunk is not None), stage
    if chunk is not None:
        assert f"chunks of {chunk} steps" in stage and chunk <= REDUCTION_CHUNK, stage


@pytest.mark.parametrize("cores", [1, 2])
def test_user_nhwc_weight_gradient_over_a_large_image_sums_rows_in_chunks(cores):
    """A user's NHWC weight gradient (24 -> 32 channels, 3 images of 40 x 40: 4800 steps):
    the reduction's rows split into chunks (20 rows of 40 columns), each chunk's packed
    ``dy`` read from L2 by every tile and tap (8x112x112, 32 -> 64 channels: 1.43x on one Zen
    4 core, 1.37x on two). Against float64."""
    n, hw, c, k = 3, 40, 24, 32
    rng = np.random.default_rng(227)
    x = te.placeholder((n, hw, hw, c), name="x")
    dy = te.placeholder((n, hw, hw, k), name="dy")
    xp = te.compute((n, hw + 2, hw + 2, c), lambda b, i, j, ci: te.if_then_else(
        te.all(i >= 1, i <= hw, j >= 1, j <= hw), x[b, i - 1, j - 1, ci], 0.0), name="pad")
    b, i, j = (te.reduce_axis((0, e), name=nm) for e, nm in ((n, "b"), (hw, "i"), (hw, "j")))
    dw = te.compute((3, 3, c, k), lambda ry, rx, ci, o: te.sum(
        xp[b, i + ry, j + rx, ci] * dy[b, i, j, o], axis=[b, i, j]), name="dw")
    xn, dyn = rand((n, hw, hw, c), "float32", rng), rand((n, hw, hw, k), "float32", rng)
    (out,), why = build_run([dw], [x, dy], [xn, dyn],
                            target=targets.get("host").with_cores(cores))
    xq = np.pad(xn.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref = np.stack([np.stack([np.einsum("bijc,bijo->co", xq[:, ry:ry + hw, rx:rx + hw],
                                        dyn.astype(np.float64)) for rx in range(3)])
                    for ry in range(3)])
    check(out, ref, "float32", "nhwc dw")
    assert "summed in chunks of 800 steps" in _stage_why(why, "dw"), why.stages


def test_conv2d_relu_epilogue_5d_bias():
    """conv + a 5-D broadcast epilogue (bias per channel, viewed [n, co, ho, wo, 1])."""
    n, ci, co, h, w, k = 2, 3, 5, 6, 7, 3
    rng = np.random.default_rng(17)
    x, wt, y = _conv2d(n, ci, co, h, w, k, k, 1, "float32")
    bias = te.placeholder((co,), name="bias")
    z = te.compute((n, co, h, w, 1), lambda b, o, i, j, u: te.max(y[b, o, i, j] + bias[o], 0.0),
                   name="z")
    xn, wn, bn = rand((n, ci, h, w), "float32", rng), rand((co, ci, k, k), "float32", rng), \
        rand((co,), "float32", rng)
    (out,), why = build_run([z], [x, wt, bias], [xn, wn, bn])
    ref = np.maximum(_ref_conv(xn, wn, 1) + bn[None, :, None, None], 0)[..., None]
    check(out, ref, "float32", "conv+bias+relu")
    assert why.rule_of("conv") in ("patterns.contraction", "patterns.contraction+epilogue")
    assert why.fell_to_generic() == []


@pytest.mark.parametrize("name", ["x86-64", "x86-avx2", "x86-avx512"])
def test_matmul_every_target(name):
    tgt = targets.get(name)
    if not targets.runnable(tgt):
        pytest.skip(f"this machine cannot run {name} code")
    rng = np.random.default_rng(19)
    a, b, c = _matmul(29, 67, 31, "float32")
    an, bn = rand((29, 31), "float32", rng), rand((31, 67), "float32", rng)
    (out,), why = build_run([c], [a, b], [an, bn], target=tgt)
    check(out, an.astype(np.float64) @ bn.astype(np.float64), "float32", name)
    assert why.rule_of("c") == "patterns.contraction"


def _asm(sch, tensors, tgt) -> str:
    """The assembly of ``sch`` compiled (not run) for ``tgt``."""
    import tvm

    lib = tvm.compile(sch.s_tir(tensors).mod, target=tgt.tvm_target())
    mod = lib.mod.imports[0] if lib.mod.imports else lib.mod
    return mod.inspect_source("asm")


def test_matmul_avx512_code_uses_full_width_fma():
    """Compiled (not run) for AVX-512: the rule sizes its tile from 32 registers of 16 lanes,
    and the inner loop issues zmm FMAs."""

    import dsl

    tgt = targets.get("x86-avx512")
    a, b, c = _matmul(64, 64, 32, "float32")
    sch = dsl.auto_schedule([c], target=tgt)
    why = dsl.explain(sch, [a, b, c])
    assert why.rule_of("c") == "patterns.contraction"
    assert "vectors of 16" in dict((s, w) for s, _, w in why.stages)["c"]
    asm = _asm(sch, [a, b, c], tgt)
    fmas = re.findall(r"vfmadd\d+ps\s+[^\n]*", asm)
    assert fmas and all("%zmm" in line for line in fmas), fmas[:4]


@pytest.mark.parametrize("v_ext", [56, 40, 24, 120, 48, 28, 44, 20, 12])
@pytest.mark.parametrize("name", ["x86-avx512", "sapphirerapids", "znver4"])
def test_avx512_tile_never_leaves_a_ragged_vector_edge(name, v_ext):
    """With AVX-512 a ragged tile edge became masked gathers with the accumulators in memory
    (5x slower on a Xeon); a width 16 lanes do not divide takes whole half-width registers,
    one only quarter registers divide (28, 44, 20) takes those; a row shorter than one
    register (12) stays one partial vector, its mask the same at every step."""
    from schedules.patterns.contraction import micro_tile

    mr, nv, lanes = micro_tile(targets.get(name), 64, v_ext)
    if v_ext < 16:
        assert (nv, lanes) == (1, 16), (mr, nv, lanes)
        return
    assert lanes == (4 if v_ext % 8 else 8 if v_ext % 16 else 16) or \
        (lanes == 8 and v_ext % 16 == 0)
    assert v_ext % lanes == 0 and (v_ext % (nv * lanes) == 0 or nv * lanes >= v_ext), \
        (mr, nv, lanes)


@pytest.mark.parametrize("geo", [(1, 32, 32, 5, 28, 3, 1, 8), (2, 16, 20, 4, 20, 3, 1, 1),
                                 (2, 16, 20, 4, 12, 3, 1, 1)], ids=str)
def test_user_conv2d_rows_in_quarter_registers(geo):
    """A row of 28 (20) columns whose output channels cannot take the lanes (4 a group; 20
    channels): along the row in quarter registers on AVX-512 (it kept a partial zmm, 4x
    slower: the 32-group 128-channel 28x28 layer 0.65 -> 0.16 ms on one Zen 4 core), whole
    half or full registers elsewhere; a row of 12 keeps its one partial zmm (1.37x faster
    than 3 xmm). Against the float64 reference, built for this machine."""
    n, ci, co, h, w, k, pad, groups = geo
    rng = np.random.default_rng(59)
    x, wt, y = _grouped_conv2d(n, ci, co, h, w, k, pad, groups, "float32")
    xn, wn = rand((n, ci, h, w), "float32", rng), rand((co, ci // groups, k, k), "float32", rng)
    (out,), why = build_run([y], [x, wt], [xn, wn])
    check(out, _ref_grouped(xn, wn, pad, groups), "float32", f"conv2d {geo}")
    note = _stage_why(why, "conv")
    lanes = int(re.search(r"vectors of (\d+)", note).group(1))
    full = targets.current().vector_bits // 32
    if "vectors along v_o" not in note:
        quarter = full >= 16 and w % 8 != 0 and w > full
        assert (lanes == 4) == quarter and (w % lanes == 0 or w < lanes), note


@pytest.mark.parametrize("geo, along_m", [
    ((1, 32, 96, 3, 112, 1, 1, 0), False),  # 1x1, 32 steps: along the row (7 zmm)
    ((1, 96, 96, 3, 112, 1, 1, 0), False),  # 1x1, 96 steps
    ((1, 16, 64, 3, 112, 3, 3, 1), True),   # 3x3, 144 steps: taps share the broadcasts
    ((1, 32, 96, 3, 56, 1, 1, 0), True),    # 1x1 over rows of 56: no whole zmm along them
], ids=str)
def test_short_1x1_reduction_takes_whole_row_vectors(geo, along_m):
    """Vectors along the output channels cost a transposing write-back per tile, which over
    a short reduction with no window outweighs their better FMA-to-load ratio: a 1x1
    conv2d whose rows are whole zmm keeps its vectors along the row (a user's 2x32x112x112
    -> 192: 1.80x faster on one Zen 4 core). Decided for AVX-512; results against the
    float64 reference on this machine."""
    import dsl

    n, ci, co, h, w, kh, kw, pad = geo
    x, wt, y = _conv2d(n, ci, co, h, w, kh, kw, pad, "float32")
    sch = dsl.auto_schedule([y], target=targets.get("x86-avx512"))
    note = _stage_why(dsl.explain(sch, [x, wt, y]), "conv")
    assert ("vectors along v_o" in note) == along_m, note
    _run_conv(geo, "float32", 61, f"conv2d {geo}")


@pytest.mark.parametrize("geo, rows", [
    ((2, 24, 48, 3, 56, 1, 1, 0), 4),    # 1x1, 24 steps: 4 positions, not 7
    ((1, 40, 48, 3, 28, 1, 1, 0), 4),    # 1x1, 40 steps
    ((1, 64, 32, 3, 14, 3, 3, 1), 7),    # 3x3, 576 steps: 7 (the row's divisor) kept
], ids=str)
def test_short_reduction_tiles_along_m_hold_a_power_of_two_positions(geo, rows):
    """A tile with vectors along the output channels writes its positions back by
    transposing: in blocks of shuffles for 4 or 8 positions, lane by lane for 7, which over
    a short reduction costs more than the 7-position tile saves (a user's 4x24x56x56 -> 144
    1x1 conv2d: 1.23x faster in 4 x 3 than 7 x 3 on one Zen 4 core). Decided for AVX-512;
    results against the float64 reference on this machine."""
    import dsl

    n, ci, co, h, w, kh, kw, pad = geo
    x, wt, y = _conv2d(n, ci, co, h, w, kh, kw, pad, "float32")
    sch = dsl.auto_schedule([y], target=targets.get("x86-avx512"))
    note = _stage_why(dsl.explain(sch, [x, wt, y]), "conv")
    assert "vectors along v_o" in note and f"register tile {rows} x " in note, note
    _run_conv(geo, "float32", 67, f"conv2d {geo}")


def test_avx512_conv2d_56_columns_compiles_to_registers():
    """Compiled (not run) for Sapphire Rapids: a 56-wide conv row is whole ymm registers,
    with no gather and no odd-width vector assembled through the stack."""

    import dsl

    tgt = targets.get("sapphirerapids")
    x, wt, y = _conv2d(1, 8, 8, 6, 56, 3, 3, 1, "float32")
    sch = dsl.auto_schedule([y], target=tgt)
    asm = _asm(sch, [x, wt, y], tgt)
    assert re.search(r"vfmadd\d+ps", asm)
    assert not re.search(r"vgather|vinsertps", asm)


@pytest.mark.parametrize("name", ["znver4", "sapphirerapids"])
def test_avx512_grouped_28_columns_compiles_to_quarter_registers(name):
    """Compiled (not run) for each AVX-512 target: a 32-group conv2d's rows of 28 are whole
    xmm registers, with no gather, no masked vector and no lane-by-lane inserts."""

    import dsl

    tgt = targets.get(name)
    x, wt, y = _grouped_conv2d(1, 32, 32, 6, 28, 3, 1, 8, "float32")
    sch = dsl.auto_schedule([y], target=tgt)
    asm = _asm(sch, [x, wt, y], tgt)
    assert re.search(r"vfmadd\d+ps\s+[^\n]*%xmm", asm)
    assert not re.search(r"vgather|vinsertps|\{%k\d\}", asm)


@pytest.mark.parametrize("name", ["znver4", "sapphirerapids"])
def test_across_channels_write_back_is_shuffles_not_scatters(name):
    """Compiled (not run): the channel-lane tile of a 56x56 NCHW conv2d leaves by whole
    accumulator vectors whose lanes LLVM shuffles into output rows, not by a scatter of
    each output row's lanes (a tenth of the kernel on one Zen 4 core)."""

    import dsl

    tgt = targets.get(name).with_cores(1)
    x, wt, y = _conv2d(1, 64, 64, 4, 56, 3, 3, 1, "float32")
    sch = dsl.auto_schedule([y], target=tgt)
    assert "vectors along v_o" in _stage_why(dsl.explain(sch), "conv")
    asm = _asm(sch, [x, wt, y], tgt)
    assert re.search(r"vfmadd\d+ps", asm)
    assert not re.search(r"vscatter|vgather", asm)


@pytest.mark.parametrize("w", [24, 16, 48])
def test_user_conv2d_tile_across_whole_row(w):
    """A row of whole registers covered by one tile (24 = 3 x 8 lanes) is split into
    registers, not vectorised as one odd-width vector; results checked on this machine."""
    rng = np.random.default_rng(29)
    x, wt, y = _conv2d(2, 3, 8, 5, w, 3, 3, 1, "float32")
    xn, wn = rand((2, 3, 5, w), "float32", rng), rand((8, 3, 3, 3), "float32", rng)
    (out,), why = build_run([y], [x, wt], [xn, wn])
    check(out, _ref_conv(xn, wn, 1), "float32", f"conv2d w{w}")
    assert why.rule_of("conv") == "patterns.contraction"


def _stage_why(why, stage: str) -> str:
    return dict((s, w) for s, _, w in why.stages)[stage]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo", [(2, 5, 32, 9, 14, 3, 3, 1), (1, 3, 48, 7, 7, 3, 2, 0),
                                 (3, 7, 16, 5, 11, 1, 5, 2)], ids=str)
def test_user_conv2d_vectors_across_output_channels(geo, dtype):
    """Rows shorter than a vector pair but output channels in whole vectors: the tile holds
    the channels in the lanes and broadcasts the input (an NCHW conv2d's 56 columns would be
    half-width registers); odd, prime and 1-wide windows, asymmetric kernels, batch > 1."""
    why = _run_conv(geo, dtype, 31, "conv2d across channels")
    assert "vectors along v_o" in _stage_why(why, "conv"), str(why)
    assert why.fell_to_generic() == []


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo", [(2, 5, 40, 7, 31, 5, 5, 2), (1, 3, 24, 5, 13, 3, 3, 1),
                                 (3, 2, 8, 4, 7, 3, 1, 0)], ids=str)
def test_user_conv2d_half_width_vectors_across_channels(geo, dtype):
    """Rows no tile covers in whole vectors (31, 13, 7 columns) and channels full registers
    do not divide (40 = 5 ymm with AVX-512): the tile holds the channels in half-width
    vectors rather than keep a partial vector inside the reduction; prime widths, 5x5 and
    3x1 windows, batch > 1, checked against the float64 reference."""
    why = _run_conv(geo, dtype, 43, "conv2d, half-width vectors across channels")
    note = _stage_why(why, "conv")
    full = targets.current().vector_bits // 32
    lanes = full if geo[2] % full == 0 or full < 8 else full // 2
    assert "vectors along v_o" in note and f"vectors of {lanes} " in note, note


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo", [(2, 8, 32, 5, 14, 3, 3, 1), (1, 4, 48, 3, 7, 1, 1, 0),
                                 (1, 3, 16, 6, 9, 2, 4, 1)], ids=str)
def test_across_channels_weights_packed_in_transposed_blocks(geo, dtype):
    """The channel-lane tile's weights ``[co, ci, kh, kw]`` are packed ``[co // w, ci, kh,
    kw, co % w]`` in blocks of (ci, kh, kw) steps by a vector of channels (blocks of 8 and
    of 4 steps); 3x3, 1x1 and 2x4 windows, against the float64 reference."""
    why = _run_conv(geo, dtype, 47, "conv2d, weights packed in transposed blocks")
    note = _stage_why(why, "conv")
    assert "vectors along v_o" in note and "transposed in blocks" in note, note



@pytest.mark.parametrize("cores, per_task", [(2, True), (1, True), (16, False)])
def test_large_weights_packed_one_block_per_task(cores, per_task):
    """Weights beyond half of L2 (256 x 64 x 3 x 3 fp32, 576 KB) with at least two blocks of
    output channels a core: each task packs its own block (the pack computed inside the
    parallel loop); on 16 cores the 4 blocks (of 64 channels: a 5 x 4-vector tile) are too
    few and the whole pack stays a pass of its own. Odd 7x5 rows, batch 2, against the
    float64 reference both ways."""
    n, ci, co, h, w, k, pad = 2, 64, 256, 7, 5, 3, 1
    rng = np.random.default_rng(53)
    x, wt, y = _conv2d(n, ci, co, h, w, k, k, pad, "float32")
    xn, wn = rand((n, ci, h, w), "float32", rng), rand((co, ci, k, k), "float32", rng)
    tgt = targets.current().with_cores(cores)
    (out,), why = build_run([y], [x, wt], [xn, wn], target=tgt)
    check(out, _ref_conv(xn, wn, pad), "float32", f"weights packed per task ({cores} cores)")
    note = _stage_why(why, "conv")
    assert "vectors along v_o" in note, note
    assert ("block of it per task" in note) == per_task, note


def _grouped_conv2d(n, ci, co, h, w, k, pad, groups, dtype):
    """A user's grouped NCHW conv2d: output channel ``o`` reads input channels
    ``o // (co / groups) * (ci / groups) + rc``."""
    cg, kg = ci // groups, co // groups
    x = te.placeholder((n, ci, h, w), name="x", dtype=dtype)
    wt = te.placeholder((co, cg, k, k), name="w", dtype=dtype)
    xp = te.compute((n, ci, h + 2 * pad, w + 2 * pad), lambda b, c, i, j: te.if_then_else(
        te.all(i >= pad, i < h + pad, j >= pad, j < w + pad), x[b, c, i - pad, j - pad],
        te.const(0, dtype)), name="xpad")
    rc, ry, rx = (te.reduce_axis((0, e), name=nm) for e, nm in ((cg, "rc"), (k, "ry"),
                                                                (k, "rx")))
    y = te.compute((n, co, h + 2 * pad - k + 1, w + 2 * pad - k + 1), lambda b, o, i, j: te.sum(
        xp[b, o // kg * cg + rc, i + ry, j + rx] * wt[o, rc, ry, rx], axis=[rc, ry, rx]),
        name="conv")
    return x, wt, y


def _ref_grouped(xn, wn, pad, groups):
    cg, kg = xn.shape[1] // groups, wn.shape[0] // groups
    return np.concatenate([_ref_conv(xn[:, g * cg:(g + 1) * cg], wn[g * kg:(g + 1) * kg], pad)
                           for g in range(groups)], axis=1)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo", [(1, 16, 64, 6, 14, 3, 1, 2), (2, 12, 24, 5, 9, 3, 1, 3),
                                 (1, 6, 4, 5, 11, 3, 1, 2), (1, 20, 40, 4, 31, 5, 2, 5),
                                 (2, 8, 8, 6, 13, 3, 1, 8)], ids=str)
def test_user_grouped_conv2d_is_a_contraction(geo, dtype):
    """A grouped conv2d reads its input channels by group (``o // K``): the contraction rule
    takes it, its channel-lane tile inside one group, so the group's input is one broadcast
    per step (a 4-group 28x28x128 layer: 2 -> 98 GFLOP/s on one Zen 4 core, PyTorch 90);
    groups of 32, 8, 2 and 8 channels, prime widths, batch > 1; depthwise (one channel a
    group: nothing to reuse along the channels) is a reduction. Against the float64
    reference."""
    n, ci, co, h, w, k, pad, groups = geo
    rng = np.random.default_rng(53)
    x, wt, y = _grouped_conv2d(n, ci, co, h, w, k, pad, groups, dtype)
    xn, wn = rand((n, ci, h, w), dtype, rng), rand((co, ci // groups, k, k), dtype, rng)
    (out,), why = build_run([y], [x, wt], [xn, wn])
    check(out, _ref_grouped(xn, wn, pad, groups), dtype, f"grouped conv2d {geo}")
    kg = co // groups
    assert why.rule_of("conv").startswith("patterns.contraction") == (kg > 1), str(why)
    note = _stage_why(why, "conv")
    if "vectors along v_o" in note:  # a tile of channels never straddles two groups
        lanes = int(re.search(r"vectors of (\d+)", note).group(1))
        nv = int(re.search(r" x (\d+) vectors", note).group(1))
        assert kg % (nv * lanes) == 0, note


def _grouped_nhwc_conv2d(n, ci, co, hw, k, pads, stride, groups, dtype):
    """A user's grouped NHWC conv2d (weights ``[k, k, ci / groups, co]``): output channel
    ``o`` reads input channels ``o // (co / groups) * (ci / groups) + rc``; ``pads`` (top,
    bottom, left, right)."""
    cg, kg = ci // groups, co // groups
    t, b, lf, r = pads
    x = te.placeholder((n, hw, hw, ci), name="x", dtype=dtype)
    wt = te.placeholder((k, k, cg, co), name="w", dtype=dtype)
    xp = te.compute((n, hw + t + b, hw + lf + r, ci), lambda a, i, j, c: te.if_then_else(
        te.all(i >= t, i < hw + t, j >= lf, j < hw + lf), x[a, i - t, j - lf, c],
        te.const(0, dtype)), name="xpad")
    ry, rx, rc = (te.reduce_axis((0, e), name=nm) for e, nm in ((k, "ry"), (k, "rx"), (cg, "rc")))
    ho, wo = (hw + t + b - k) // stride + 1, (hw + lf + r - k) // stride + 1
    y = te.compute((n, ho, wo, co), lambda a, i, j, o: te.sum(
        xp[a, i * stride + ry, j * stride + rx, o // kg * cg + rc] * wt[ry, rx, rc, o],
        axis=[ry, rx, rc]), name="conv")
    return x, wt, y


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("geo", [
    (2, 9, 64, 64, 3, (1, 1, 1, 1), 1, 4, True),     # 16 channels a group
    (1, 11, 48, 96, 3, (0, 2, 1, 1), 2, 3, True),    # 32 a group, asymmetric, stride 2
    (2, 7, 40, 40, 5, (2, 2, 2, 2), 1, 5, True),     # 8 a group, 5x5
    (1, 10, 32, 32, 3, (1, 1, 1, 1), 1, 8, False),   # 4 a group: the reduction rule
], ids=str)
def test_user_grouped_nhwc_conv2d_is_a_contraction(geo, dtype, cores):
    """NHWC puts the output channels innermost, and the input reads them by group: the tile
    along them lies inside one group (``contraction.v_group``), the input one broadcast a
    tile (8x28x28, 128 -> 128 channels, 4 groups, one Zen 4 core: 132 -> 4.3 ms, 0.03 ->
    1.0x PyTorch). Groups of fewer than ``GROUP_V_MIN`` channels keep the reduction rule.
    Against float64."""
    from schedules.patterns.contraction import GROUP_V_MIN

    n, hw, ci, co, k, pads, stride, groups, tiled = geo
    rng = np.random.default_rng(57)
    x, wt, y = _grouped_nhwc_conv2d(n, ci, co, hw, k, pads, stride, groups, dtype)
    xn, wn = rand((n, hw, hw, ci), dtype, rng), rand((k, k, ci // groups, co), dtype, rng)
    (out,), why = build_run([y], [x, wt], [xn, wn],
                            target=targets.get("x86-avx512").with_cores(cores))
    t, b, lf, r = pads
    xpad = np.pad(xn.astype(np.float64), ((0, 0), (t, b), (lf, r), (0, 0)))
    cg, kg = ci // groups, co // groups
    ref = np.concatenate([_ref_conv(
        xpad[..., g * cg:(g + 1) * cg].transpose(0, 3, 1, 2),
        wn[..., g * kg:(g + 1) * kg].astype(np.float64).transpose(3, 2, 0, 1), 0, stride)
        for g in range(groups)], axis=1).transpose(0, 2, 3, 1)
    check(out, ref, dtype, f"grouped nhwc conv2d {geo}")
    assert (kg >= GROUP_V_MIN) == tiled
    assert why.rule_of("conv").startswith("patterns.contraction") == tiled, str(why)
    if tiled:
        note = _stage_why(why, "conv")
        lanes = int(re.search(r"vectors of (\d+)", note).group(1))
        nv = int(re.search(r" x (\d+) vectors", note).group(1))
        assert "over" in note and kg % (nv * lanes) == 0, note


@pytest.mark.parametrize("name", ["znver4", "sapphirerapids", "x86-avx2"])
def test_a_ragged_row_takes_the_channels_on_every_target(name):
    """The 31-column, 40-channel conv2d (20 GFLOP/s along its rows on one Zen 4 core, 102
    across its channels) goes across the channels whatever the target's vector and FMA
    width."""
    import tvm

    from schedules.patterns.analysis import block_facts
    from schedules.patterns.contraction import _across_m, _ragged, fma_share, roles, scored_tile

    tgt = targets.get(name)
    x, wt, y = _conv2d(2, 24, 40, 31, 31, 5, 5, 2, "float32")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, wt, y]))
    f = block_facts(sch, sch.get_sblock("conv"))
    s_op, v_op, m, v, _ = roles(f)
    (_, nv, lanes), along_v = scored_tile(tgt, f.extents[m], f.extents[v])
    assert _ragged(31, nv * lanes, lanes)
    mr, nv, lanes = _across_m(tgt, f, s_op, m, v, along_v, ragged_v=True)
    full, regs = tgt.vector_bits // 32, 32 if tgt.vector_bits >= 512 else 16
    assert lanes == (full if 40 % full == 0 else full // 2), lanes  # 5 ymm, or AVX2's 5
    assert 40 % (nv * lanes) == 0 and mr * nv + nv + 8 <= regs, (mr, nv, lanes)
    # a half-width FMA does as much as a full one where the FMA units are half-width
    assert fma_share(tgt, full // 2) == (1.0 if name == "znver4" else 0.5)


def test_user_conv2d_across_channels_bias_relu_and_rows_inside():
    """The channel-lane tile fuses a bias + ReLU epilogue into its transposing write-back,
    and computes the padding rows each parallel row reads inside that row's iteration."""
    n, ci, co, h, w, k = 2, 6, 32, 11, 12, 3
    rng = np.random.default_rng(37)
    x, wt, y = _conv2d(n, ci, co, h, w, k, k, 1, "float32")
    bias = te.placeholder((co,), name="bias")
    z = te.compute(y.shape, lambda b, o, i, j: te.max(y[b, o, i, j] + bias[o], 0.0), name="z")
    xn, wn, bn = rand((n, ci, h, w), "float32", rng), rand((co, ci, k, k), "float32", rng), \
        rand((co,), "float32", rng)
    (out,), why = build_run([z], [x, wt, bias], [xn, wn, bn])
    check(out, np.maximum(_ref_conv(xn, wn, 1) + bn[None, :, None, None], 0), "float32",
          "conv+bias+relu across channels")
    assert why.rule_of("conv") == "patterns.contraction+epilogue", str(why)
    assert "vectors along v_o" in _stage_why(why, "conv")
    assert why.rule_of("xpad") == "patterns.contraction+epilogue"
    assert "computed inside conv" in _stage_why(why, "xpad")


@pytest.mark.parametrize("name, w", [("x86-avx2", 7), ("x86-avx2", 12), ("x86-avx512", 56),
                                     ("znver4", 14)])
def test_across_channels_tile_on_every_vector_width(name, w):
    """The channel-lane tile sized from the target's registers (16 on AVX2, 32 on AVX-512)
    for rows that are not whole full-width vectors; run where the machine can."""
    from schedules.patterns.analysis import block_facts
    from schedules.patterns.contraction import _across_m, roles, scored_tile

    tgt = targets.get(name)
    import tvm

    x, wt, y = _conv2d(1, 8, 64, 6, w, 3, 3, 1, "float32")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, wt, y]))
    f = block_facts(sch, sch.get_sblock("conv"))
    s_op, v_op, m, v, _ = roles(f)
    _, along_v = scored_tile(tgt, f.extents[m], f.extents[v])
    mr, nv, lanes = _across_m(tgt, f, s_op, m, v, along_v)
    regs = 32 if tgt.vector_bits >= 512 else 16
    assert lanes == tgt.vector_bits // 32 and w % mr == 0 and 64 % (nv * lanes) == 0
    assert mr * nv + nv + 8 <= regs, (mr, nv, lanes)
    if targets.runnable(tgt):
        rng = np.random.default_rng(41)
        xn, wn = rand((1, 8, 6, w), "float32", rng), rand((64, 8, 3, 3), "float32", rng)
        (out,), why = build_run([y], [x, wt], [xn, wn], target=tgt)
        check(out, _ref_conv(xn, wn, 1), "float32", name)


@pytest.mark.parametrize("l2_kib, m, k, rows", [
    (2048, 1024, 1024, 256),  # 256 rows x 4 KB of S: half of L2, the cap of 64 tiles
    (1024, 1024, 1024, 128),  # a Zen 4 / Zen 5 L2
    (256, 1024, 1024, 32),    # a small L2
    (2048, 165, 33, 165),     # the whole of a short m in one block, no padded tile
])
def test_l2_block_rows_come_from_the_target_l2(l2_kib, m, k, rows):
    """The micro-tiles of one block (their S rows stay in L2 while V's panel streams past
    them): half the target's L2, at most 64 tiles (on one core: on more, the blocks of a
    short m also shrink to give the cores tasks)."""
    from dataclasses import replace

    import dsl

    tgt = replace(targets.get("host"), name=f"host-l2-{l2_kib}", l2_kib=l2_kib, cores=1)
    targets.register(tgt)
    a, b, c = _matmul(m, 64, k, "float32")
    why = str(dsl.explain(dsl.auto_schedule([c], target=tgt)))
    mr, tiles = re.search(r"register tile (\d+) x .*, (\d+) tiles per L2 block", why).groups()
    assert int(mr) * int(tiles) == rows, why


def test_a_tall_l2_block_matches_numpy():
    """33 micro-tiles of 5 rows in one block (more than the 8 of a 256 KB L2), ragged k, on
    one core (on two, one block would be one task: 33 blocks of one tile share out)."""
    m, n, k = 165, 64, 37
    rng = np.random.default_rng(11)
    a, b, c = _matmul(m, n, k, "float32")
    an, bn = rand((m, k), "float32", rng), rand((k, n), "float32", rng)
    (out,), why = build_run([c], [a, b], [an, bn], target=targets.current().with_cores(1))
    assert "33 tiles per L2 block" in str(why), str(why)
    check(out, an.astype(np.float64) @ bn.astype(np.float64), "float32", "tall block")


def _user_nhwc_dw(h: int, w: int, seed: int):
    """A user's NHWC conv2d weight gradient (``dw[o, ry, rx, c] = sum dy[b, i, j, o] *
    xpad[b, i + ry, j + rx, c]``, 64 x 64 channels, 3 x 3 taps, one image): ``(x, dy, dw,
    x data, dy data, float64 reference)``."""
    n, c, k = 1, 64, 64
    x = te.placeholder((n, h, w, c), name="x")
    dy = te.placeholder((n, h, w, k), name="dy")
    xp = te.compute((n, h + 2, w + 2, c), lambda b, i, j, ci: te.if_then_else(
        te.all(i >= 1, i <= h, j >= 1, j <= w), x[b, i - 1, j - 1, ci], 0.0), name="pad")
    b, i, j = (te.reduce_axis((0, e), name=nm) for e, nm in ((n, "b"), (h, "i"), (w, "j")))
    dw = te.compute((k, 3, 3, c), lambda o, ry, rx, ci: te.sum(
        dy[b, i, j, o] * xp[b, i + ry, j + rx, ci], axis=[b, i, j]), name="dw")
    rng = np.random.default_rng(seed)
    xn, dyn = rand((n, h, w, c), "float32", rng), rand((n, h, w, k), "float32", rng)
    xpn = np.pad(xn.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref = np.stack([np.stack([np.einsum("bijo,bijc->oc", dyn.astype(np.float64),
                                        xpn[:, ry:ry + h, rx:rx + w]) for rx in range(3)], 1)
                    for ry in range(3)], 1)
    return x, dy, dw, xn, dyn, ref


def _share(outs, tensors, cores: int) -> float:
    """The static model's busy share of ``cores`` for the graph's kernel."""
    import dsl
    from dsl.runtime.scaling import predict

    tgt = targets.current().with_cores(cores)
    mod = dsl.build(dsl.auto_schedule(outs, target=tgt),
                    {"name": "user_graph", "tensor_list": tensors, "need_build": False})
    return predict(mod, cores).share


@pytest.mark.parametrize("cores", [2, 16])
def test_l2_blocks_shrink_until_the_tasks_share_out(cores):
    """:func:`_user_nhwc_dw`: the cache's blocks of 8 tiles are 18 tasks; on 16 cores the
    blocks shrink until the tasks keep the cores busy (static model), on 2 they stay.
    Against numpy float64 either way."""
    x, dy, dw, xn, dyn, ref = _user_nhwc_dw(9, 8, seed=13)
    (out,), why = build_run([dw], [x, dy], [xn, dyn], target=targets.current().with_cores(cores))
    check(out, ref, "float32")
    blocks = int(re.search(r"(\d+) tiles per L2 block", str(why)).group(1))
    share = _share([dw], [x, dy, dw], cores)
    if cores == 2:
        assert blocks == 8 and share >= 0.97, (blocks, share)
    else:  # 18 tasks of 8 tiles: 0.56
        assert blocks < 8 and share >= 0.9, (blocks, share)


@pytest.mark.parametrize("cores, parts", [(2, 0), (16, 0), (32, 2), (64, 4)])
def test_too_few_tiles_for_the_cores_sum_rows_in_parts(cores, parts):
    """:func:`_user_nhwc_dw` of a 56 x 56 image in 144 one-tile tasks (3 x 3 taps x 16 tiles
    of 4 channels): 3 rounds for 2.25 on 64 cores, 5 for 4.5 on 32. There the image rows
    split into partial sums, each part's tiles tasks of their own, added after; on 2 and 16
    cores the tiles share out as they are. (A small image stays whole: its partials, added
    on one core, would cost more than the idle cores.) Against numpy float64 (built for
    many cores, run on this machine)."""
    x, dy, dw, xn, dyn, ref = _user_nhwc_dw(56, 56, seed=14)
    (out,), why = build_run([dw], [x, dy], [xn, dyn], target=targets.current().with_cores(cores))
    check(out, ref, "float32", f"{cores} cores")
    found = re.search(r"(\d+) partial sums over (\w+)", str(why))
    assert (int(found.group(1)) if found else 0) == parts, str(why)
    assert found is None or found.group(2).endswith("i")  # the rows, not the batch of 1
    assert _share([dw], [x, dy, dw], cores) >= 0.9
