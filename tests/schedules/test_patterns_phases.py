"""Stride-phase split of a sum over a zero-inserted operand (:mod:`schedules.patterns.phases`):
strided input gradients and transposed convolutions written as users write them (one
zero-insertion stage, or topi's dilate + pad + conv), 1-D, 2-D and 3-D, strides 2 and 3 and
per axis, asymmetric padding, phases without taps, odd and prime sizes, channels not multiples
of 16, batch > 1, fp32 / fp16 / int8, an epilogue after the sum, against numpy float64 (exact
integers for int8)."""

import itertools

import numpy as np
import pytest
from pattern_helpers import build_run, check, rand
from tvm import te

from schedules.patterns import phases


def _user_dx(n, c, k, spatial, kernel, stride, pads, dtype, acc=None):
    """dx of a strided convolution (x: [n, c, *spatial], w: [k, c, *kernel], pads ``(before,
    after)`` per axis) as a user writes it: dy zero-inserted and padded in one stage, then
    convolved with the flipped weights."""
    d = len(spatial)
    acc = acc or dtype
    outs = [(h + pb + pa - kk) // s + 1 for h, kk, s, (pb, pa) in zip(spatial, kernel, stride,
                                                                     pads)]
    dy = te.placeholder((n, k, *outs), name="dy", dtype=dtype)
    w = te.placeholder((k, c, *kernel), name="w", dtype=dtype)
    q = [kk - 1 - pb for kk, (pb, _) in zip(kernel, pads)]
    full = [h + kk - 1 for h, kk in zip(spatial, kernel)]

    def dilated(b, o, *u):
        inside = [te.all(u[a] >= q[a], u[a] < q[a] + stride[a] * (outs[a] - 1) + 1,
                         (u[a] - q[a]) % stride[a] == 0) for a in range(d)]
        src = [(u[a] - q[a]) // stride[a] for a in range(d)]
        return te.if_then_else(te.all(*inside), dy[(b, o, *src)], te.const(0, dtype))

    dil = te.compute((n, k, *full), dilated, name="dy_dilated")
    rc = te.reduce_axis((0, k), name="rc")
    taps = [te.reduce_axis((0, kk), name=f"r{a}") for a, kk in enumerate(kernel)]

    def dx(b, ci, *i):
        a = dil[(b, rc, *(i[a] + taps[a] for a in range(d)))].astype(acc)
        b_ = w[(rc, ci, *(kernel[a] - 1 - taps[a] for a in range(d)))].astype(acc)
        return te.sum(a * b_, axis=[rc, *taps])

    return dy, w, te.compute((n, c, *spatial), dx, name="dx")


def _inline_dx(n, c, k, spatial, kernel, stride, pads, dtype):
    """The same dx written as a gather inside the sum: ``dy[.., (h + p - r) // s, ..]`` where
    ``(h + p - r) % s == 0`` and in bounds (no zero-inserted stage; taps read reversed)."""
    d = len(spatial)
    outs = [(h + pb + pa - kk) // s + 1 for h, kk, s, (pb, pa) in zip(spatial, kernel, stride,
                                                                     pads)]
    dy = te.placeholder((n, k, *outs), name="dy", dtype=dtype)
    w = te.placeholder((k, c, *kernel), name="w", dtype=dtype)
    rc = te.reduce_axis((0, k), name="rc")
    taps = [te.reduce_axis((0, kk), name=f"r{a}") for a, kk in enumerate(kernel)]

    def dx(b, ci, *i):
        at = [i[a] + pads[a][0] - taps[a] for a in range(d)]
        ok = te.all(*(te.all(at[a] % stride[a] == 0, at[a] >= 0, at[a] // stride[a] < outs[a])
                      for a in range(d)))
        src = dy[(b, rc, *(at[a] // stride[a] for a in range(d)))]
        return te.sum(te.if_then_else(ok, src, te.const(0, dtype)) * w[(rc, ci, *taps)],
                      axis=[rc, *taps])

    return dy, w, te.compute((n, c, *spatial), dx, name="dx")


def _ref_dx(dyn, wn, spatial, stride, pads):
    """dx from the math: every dy[b, o, i] times w[o, c, r] lands at i * s - pad + r."""
    n, _, *outs = dyn.shape
    _, c, *kernel = wn.shape
    canvas = [max(s * (o - 1) + kk, pb + h) for s, o, kk, (pb, _), h in
              zip(stride, outs, kernel, pads, spatial)]
    out = np.zeros((n, c, *canvas))
    dy64, w64 = dyn.astype(np.float64), wn.astype(np.float64)
    for r in itertools.product(*(range(kk) for kk in kernel)):
        contrib = np.einsum("bo...,oc->bc...", dy64, w64[(slice(None), slice(None), *r)])
        where = tuple(slice(rr, rr + s * (o - 1) + 1, s) for rr, s, o in zip(r, stride, outs))
        out[(slice(None), slice(None), *where)] += contrib
    crop = tuple(slice(pb, pb + h) for (pb, _), h in zip(pads, spatial))
    return out[(slice(None), slice(None), *crop)]


def _rules(why) -> dict:
    return {stage: rule for stage, rule, _ in why.stages}


def _phases(why, out="dx") -> list:
    """The phase contractions the split made (``dx_phase_0_1``; not the weight slices)."""
    return [s for s in _rules(why) if s.startswith(f"{out}_phase_")]


def _assert_split(why, n_phases):
    rules = _rules(why)
    split = _phases(why)
    assert len(split) == n_phases, rules
    assert all(rules[s].startswith("patterns.contraction") for s in split), rules
    assert rules["dx"] == "patterns.interleave", rules


GEOMETRIES = [
    # n, c, k, spatial, kernel, stride, pads ((before, after) per axis), phases with taps
    (2, 5, 7, (14, 14), (3, 3), (2, 2), ((1, 1), (1, 1)), 4),
    (1, 16, 32, (28, 28), (3, 3), (2, 2), ((1, 1), (1, 1)), 4),
    (1, 6, 10, (11, 13), (3, 3), (2, 2), ((0, 2), (1, 1)), 4),
    (1, 4, 8, (9, 9), (2, 2), (3, 3), ((0, 0), (0, 0)), 4),
    (2, 3, 5, (10, 7), (3, 3), (2, 1), ((1, 1), (1, 1)), 2),
    (1, 8, 12, (16, 16), (4, 4), (2, 2), ((1, 1), (1, 1)), 4),
    (1, 7, 3, (13, 17), (5, 5), (2, 2), ((2, 2), (2, 2)), 4),
]


@pytest.mark.parametrize(("geo", "dtype"), [(g, "float32") for g in GEOMETRIES] +
                         [(GEOMETRIES[0], "float16"), (GEOMETRIES[3], "float16")], ids=str)
def test_user_strided_dx(geo, dtype):
    """Strides 2 and 3 and (2, 1), asymmetric padding, a 4x4 kernel, a stride larger than the
    kernel (phases without taps: zeros), odd and prime sizes, 3..32 channels, batch 2."""
    n, c, k, spatial, kernel, stride, pads, n_phases = geo
    rng = np.random.default_rng(83)
    dy, w, dx = _user_dx(n, c, k, spatial, kernel, stride, pads, dtype)
    dyn = rand([int(v) for v in dy.shape], dtype, rng)
    wn = rand([int(v) for v in w.shape], dtype, rng)
    (out,), why = build_run([dx], [dy, w], [dyn, wn])
    check(out, _ref_dx(dyn, wn, spatial, stride, pads), dtype, str(geo))
    _assert_split(why, n_phases)


@pytest.mark.parametrize("geo", [GEOMETRIES[0], GEOMETRIES[2], GEOMETRIES[3], GEOMETRIES[4],
                                 ((2, 3, 4, (10,), (4,), (3,), ((2, 1),), 3))], ids=str)
def test_inline_gather_dx(geo):
    """The dx written as a guarded gather in the sum: outlined into a stage, then split."""
    n, c, k, spatial, kernel, stride, pads, n_phases = geo
    rng = np.random.default_rng(17)
    dy, w, dx = _inline_dx(n, c, k, spatial, kernel, stride, pads, "float32")
    dyn = rand([int(v) for v in dy.shape], "float32", rng)
    wn = rand([int(v) for v in w.shape], "float32", rng)
    (out,), why = build_run([dx], [dy, w], [dyn, wn])
    check(out, _ref_dx(dyn, wn, spatial, stride, pads), "float32", str(geo))
    _assert_split(why, n_phases)


def test_user_strided_dx_int8_exact():
    """int8 operands summed in int32: bit-exact."""
    rng = np.random.default_rng(5)
    spatial, kernel, stride, pads = (9, 11), (3, 3), (2, 2), ((1, 1), (1, 1))
    dy, w, dx = _user_dx(2, 6, 9, spatial, kernel, stride, pads, "int8", acc="int32")
    dyn = rng.integers(-128, 128, [int(v) for v in dy.shape]).astype("int8")
    wn = rng.integers(-128, 128, [int(v) for v in w.shape]).astype("int8")
    (out,), why = build_run([dx], [dy, w], [dyn, wn])
    ref = _ref_dx(dyn, wn, spatial, stride, pads)
    np.testing.assert_array_equal(out.astype(np.int64), ref.astype(np.int64))
    _assert_split(why, 4)


@pytest.mark.parametrize("geo", [((12,), (3,), (2,), ((1, 1),)),
                                 ((8, 7, 9), (3, 3, 3), (2, 2, 2), ((1, 1),) * 3)], ids=str)
def test_user_strided_dx_1d_3d(geo):
    """A transposed conv1d (2 phases) and a 3-D dx (8 phases)."""
    spatial, kernel, stride, pads = geo
    rng = np.random.default_rng(7)
    dy, w, dx = _user_dx(2, 5, 6, spatial, kernel, stride, pads, "float32")
    dyn = rand([int(v) for v in dy.shape], "float32", rng)
    wn = rand([int(v) for v in w.shape], "float32", rng)
    (out,), why = build_run([dx], [dy, w], [dyn, wn])
    check(out, _ref_dx(dyn, wn, spatial, stride, pads), "float32", str(geo))
    assert len(_phases(why)) == 2 ** len(spatial)


@pytest.mark.parametrize("geo", [(1, 8, 6, 7, 7, 3, 2, (1, 1, 1, 1), (1, 1)),
                                 (2, 5, 4, 6, 5, 4, 2, (1, 0, 2, 1), (0, 0))], ids=str)
def test_topi_conv2d_transpose(geo):
    """topi's transposed conv2d (dilate, pad, then conv: three stages) against the math."""
    from tvm import topi

    n, cin, cout, ih, iw, kk, s, pad, out_pad = geo
    rng = np.random.default_rng(11)
    x = te.placeholder((n, cin, ih, iw), name="x")
    w = te.placeholder((cin, cout, kk, kk), name="w")
    y = topi.nn.conv2d_transpose_nchw(x, w, (s, s), pad, "float32", out_pad)
    xn, wn = rand((n, cin, ih, iw), "float32", rng), rand((cin, cout, kk, kk), "float32", rng)
    (out,), why = build_run([y], [x, w], [xn, wn])
    size = [int(v) for v in y.shape[2:]]
    pads = ((pad[0], pad[2]), (pad[1], pad[3]))
    check(out, _ref_dx(xn, wn, size, (s, s), pads), "float32", str(geo))
    assert len(_phases(why, y.op.name)) == 4, _rules(why)


def test_epilogue_after_split():
    """A bias and ReLU after the strided dx: the stages after the sum are rebuilt to read the
    phases, and the interleave takes the fused epilogue."""
    rng = np.random.default_rng(3)
    spatial, kernel, stride, pads = (10, 10), (3, 3), (2, 2), ((1, 1), (1, 1))
    dy, w, dx = _user_dx(1, 6, 8, spatial, kernel, stride, pads, "float32")
    bias = te.placeholder((6,), name="bias")
    y = te.compute(dx.shape, lambda b, c, i, j: te.max(dx[b, c, i, j] + bias[c], 0.0),
                   name="act")
    dyn = rand([int(v) for v in dy.shape], "float32", rng)
    wn = rand([int(v) for v in w.shape], "float32", rng)
    bn = rand((6,), "float32", rng)
    (out,), why = build_run([y], [dy, w, bias], [dyn, wn, bn])
    ref = np.maximum(_ref_dx(dyn, wn, spatial, stride, pads) + bn[None, :, None, None], 0)
    check(out, ref, "float32")
    assert _rules(why)["act"] == "patterns.interleave", _rules(why)


def _dilated_taps_dx(dy, w, dil_rate):
    """A strided dx whose flipped taps are dilated: the zero-inserted dy read at
    ``i + d * r`` (not ``i + r``)."""
    n, k, ho, wo = (int(v) for v in dy.shape)
    _, c, kh, kw = (int(v) for v in w.shape)
    q, s = dil_rate * (kh - 1) - 1, 2
    size = (ho - 1) * s + 1 + 2 * q
    dil = te.compute((n, k, size, size), lambda b, o, i, j: te.if_then_else(te.all(
        i >= q, j >= q, i < q + (ho - 1) * s + 1, j < q + (wo - 1) * s + 1, (i - q) % s == 0,
        (j - q) % s == 0), dy[b, o, (i - q) // s, (j - q) // s], 0.0), name="dy_dilated")
    rc = te.reduce_axis((0, k), "rc")
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    h = size - dil_rate * (kh - 1)
    return te.compute((n, c, h, h), lambda b, ci, i, j: te.sum(
        dil[b, rc, i + dil_rate * ry, j + dil_rate * rx] * w[rc, ci, kh - 1 - ry, kw - 1 - rx],
        axis=[rc, ry, rx]), name="dx")


def test_left_whole():
    """No split where it would not be exact or there are no zeros to skip (a stride-1 dx; a
    dilated strided dx, its taps read at ``i + 2 * r``), nor under a reduction downstream;
    each still right."""
    rng = np.random.default_rng(9)
    _, _, dx1 = _user_dx(1, 3, 4, (8, 8), (3, 3), (1, 1), ((1, 1), (1, 1)), "float32")
    assert phases.split(dx1) is None

    dy = te.placeholder((1, 4, 5, 5), name="dy")
    w = te.placeholder((4, 3, 3, 3), name="w")
    dxd = _dilated_taps_dx(dy, w, 2)
    assert phases.split(dxd) is None
    dyn, wn = rand((1, 4, 5, 5), "float32", rng), rand((4, 3, 3, 3), "float32", rng)
    (out,), _ = build_run([dxd], [dy, w], [dyn, wn])
    # the same sum from the math: dx[h] gets dy[i] * w[r] where h = 2 i - 1 + 2 (2 - r)
    full = np.zeros((1, 3, 13, 13))
    for r0, r1 in itertools.product(range(3), range(3)):
        contrib = np.einsum("boij,oc->bcij", dyn.astype(np.float64), wn[:, :, r0, r1])
        full[:, :, 2 * r0:2 * r0 + 9:2, 2 * r1:2 * r1 + 9:2] += contrib
    check(out, full[:, :, 1:1 + int(dxd.shape[2]), 1:1 + int(dxd.shape[3])], "float32")

    dy2, w2, dx2 = _user_dx(1, 3, 4, (8, 8), (3, 3), (2, 2), ((1, 1), (1, 1)), "float32")
    i = te.reduce_axis((0, 8), name="i")
    rowsum = te.compute((1, 3), lambda b, c: te.sum(dx2[b, c, i, 0], axis=i), name="rowsum")
    assert phases.split_phases([dy2, w2, rowsum])[2].same_as(rowsum)
    dyn = rand([int(v) for v in dy2.shape], "float32", rng)
    wn = rand([int(v) for v in w2.shape], "float32", rng)
    (out,), _ = build_run([rowsum], [dy2, w2], [dyn, wn])
    ref = _ref_dx(dyn, wn, (8, 8), (2, 2), ((1, 1), (1, 1)))[:, :, :, 0].sum(axis=2)
    check(out, ref, "float32")


def test_deep_chain_inlined_within_limit():
    """Looking for a zero insertion inlines at most ``INLINE_LIMIT`` stage reads: a chain of
    40 stages each reading its producer twice (2**40 reads fully inlined) is left as it is
    at once."""
    x = te.placeholder((8, 8), name="x")

    def square(y, k):
        return te.compute((8, 8), lambda i, j: y[i, j] * y[i, j], name=f"sq{k}")

    y = x
    for k in range(40):
        y = square(y, k)
    r = te.reduce_axis((0, 8), name="r")
    z = te.compute((8,), lambda i: te.sum(y[i, r], axis=r), name="z")
    assert phases.split_phases([x, z])[1].same_as(z)


def test_parity_choice_is_not_zero_insertion():
    """A stage that tests ``u % 2`` to choose between two values (an interleave of two
    signals, no zeros) is read whole: skipping its odd taps would drop ``b``."""
    rng = np.random.default_rng(21)
    a = te.placeholder((1, 3, 5), name="a")
    b = te.placeholder((1, 3, 5), name="b")
    w = te.placeholder((3, 4, 3), name="w")
    mix = te.compute((1, 3, 10), lambda n, c, u: te.if_then_else(
        u % 2 == 0, a[n, c, u // 2], b[n, c, u // 2]), name="mix")
    rc, r = te.reduce_axis((0, 3), name="rc"), te.reduce_axis((0, 3), name="r")
    y = te.compute((1, 4, 8), lambda n, o, i: te.sum(mix[n, rc, i + r] * w[rc, o, r],
                                                     axis=[rc, r]), name="y")
    assert phases.split(y) is None
    an, bn, wn = (rand(s, "float32", rng) for s in ((1, 3, 5), (1, 3, 5), (3, 4, 3)))
    (out,), _ = build_run([y], [a, b, w], [an, bn, wn])
    mixed = np.stack([an, bn], axis=-1).reshape(1, 3, 10).astype(np.float64)
    ref = np.stack([np.einsum("ncr,cor->no", mixed[:, :, i:i + 3], wn) for i in range(8)], -1)
    check(out, ref, "float32")


@pytest.mark.parametrize("r", [2, 3])
def test_interleave_pixel_shuffle(r):
    """A user's pixel shuffle (``x[.., c * r * r + (i % r) * r + j % r, i // r, j // r]``)
    takes the interleave rule: exact."""
    rng = np.random.default_rng(r)
    n, c, h, w = 2, 5, 6, 7
    x = te.placeholder((n, c * r * r, h, w), name="x")
    y = te.compute((n, c, h * r, w * r), lambda b, ci, i, j: x[
        b, ci * r * r + (i % r) * r + j % r, i // r, j // r], name="shuffle")
    xn = rand((n, c * r * r, h, w), "float32", rng)
    (out,), why = build_run([y], [x], [xn])
    ref = xn.reshape(n, c, r, r, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, c, h * r, w * r)
    np.testing.assert_array_equal(out, ref)
    assert _rules(why)["shuffle"] == "patterns.interleave", _rules(why)


@pytest.mark.parametrize("size", [(8, 12), (7, 9)], ids=str)
def test_interleave_nearest_upsample(size):
    """A nearest upsample (``x[.., i // 2, j // 3]``), also to odd sizes (a ragged last
    phase), takes the interleave rule; a space-to-depth (``x[.., j * 2 + k % 2]``: nothing
    read at ``j // s``) keeps the plain injective rule. Both exact."""
    rng = np.random.default_rng(4)
    ho, wo = size
    x = te.placeholder((3, 4, 4, 4), name="x")
    y = te.compute((3, 4, ho, wo), lambda b, c, i, j: x[b, c, i // 2, j // 3], name="up")
    xn = rand((3, 4, 4, 4), "float32", rng)
    (out,), why = build_run([y], [x], [xn])
    np.testing.assert_array_equal(out, xn[:, :, np.arange(ho) // 2][:, :, :, np.arange(wo) // 3])
    assert _rules(why)["up"] == "patterns.interleave", _rules(why)

    z = te.compute((3, 16, 2, 2), lambda b, k, i, j: x[b, k // 4, i * 2 + k % 4 // 2,
                                                     j * 2 + k % 2], name="unshuffle")
    (out,), why = build_run([z], [x], [xn])
    ref = xn.reshape(3, 4, 2, 2, 2, 2).transpose(0, 1, 3, 5, 2, 4).reshape(3, 16, 2, 2)
    np.testing.assert_array_equal(out, ref)
    assert _rules(why)["unshuffle"] == "patterns.injective", _rules(why)


@pytest.mark.parametrize("size", [(8, 12), (7, 11)], ids=str)
def test_interleave_max_pool_gradient(size):
    """A non-overlapping 2x2 max-pool's gradient as users write it (``dy[.., i // 2, j // 2]``
    where ``x[.., i, j]`` equals the pooled maximum ``y``: reads at ``v // 2`` beside bare
    ones), also with odd sizes (the last row and column have no window: zero), takes the
    interleave rule: exact."""
    rng = np.random.default_rng(12)
    n, c = 2, 3
    h, w = size
    ho, wo = h // 2, w // 2
    x = te.placeholder((n, c, h, w), name="x")
    y = te.placeholder((n, c, ho, wo), name="y")
    dy = te.placeholder((n, c, ho, wo), name="dy")

    def body(b, ci, i, j):
        inside = te.all(i < 2 * ho, j < 2 * wo)
        hit = te.all(inside, x[b, ci, i, j] == y[b, ci, i // 2, j // 2])
        return te.if_then_else(hit, dy[b, ci, i // 2, j // 2], 0.0)

    dx = te.compute((n, c, h, w), body, name="dx")
    xn = rand((n, c, h, w), "float32", rng)
    yn = xn[:, :, :2 * ho, :2 * wo].reshape(n, c, ho, 2, wo, 2).max(axis=(3, 5))
    dyn = rand((n, c, ho, wo), "float32", rng)
    (out,), why = build_run([dx], [x, y, dy], [xn, yn, dyn])
    up = lambda a: np.repeat(np.repeat(a, 2, axis=2), 2, axis=3)  # noqa: E731
    ref = np.zeros((n, c, h, w), np.float32)
    ref[:, :, :2 * ho, :2 * wo] = np.where(xn[:, :, :2 * ho, :2 * wo] == up(yn), up(dyn), 0.0)
    np.testing.assert_array_equal(out, ref)
    assert _rules(why)["dx"] == "patterns.interleave", _rules(why)


@pytest.mark.parametrize("cores, tasks", [(16, 13 * 40), (4, 13 * 40), (13, 13)])
def test_interleave_rows_too_few_for_the_cores(cores, tasks):
    """The 3x3 stride-2 max-pool gradient of one NHWC image (its four phases interleaved):
    13 row pairs are too few tasks for 16 cores (or 4), so the column pairs join them; 13
    cores take the row pairs alone. Built for those cores, run here: against numpy float64."""
    import dsl
    import targets
    from dsl.runtime.scaling import predict

    rng = np.random.default_rng(6)
    (h, w), c, (ho, wo) = (26, 80), 32, (13, 40)
    x = te.placeholder((1, h, w, c), name="x")
    y = te.placeholder((1, ho, wo, c), name="y")
    dy = te.placeholder((1, ho, wo, c), name="dy")
    ry, rx = te.reduce_axis((0, 3), "ry"), te.reduce_axis((0, 3), "rx")

    def body(b, i, j, ci):
        hh, ww = i + 1 - ry, j + 1 - rx
        ok = te.all(hh % 2 == 0, ww % 2 == 0, hh >= 0, ww >= 0, hh // 2 < ho, ww // 2 < wo)
        hit = te.if_then_else(x[b, i, j, ci] == y[b, hh // 2, ww // 2, ci],
                              dy[b, hh // 2, ww // 2, ci], 0.0)
        return te.sum(te.if_then_else(ok, hit, 0.0), axis=[ry, rx])

    dx = te.compute((1, h, w, c), body, name="dx")
    xn = rand((1, h, w, c), "float32", rng)
    xp = np.pad(xn.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-1e9)
    win = lambda a, r, t: a[:, r:r + 2 * ho - 1:2, t:t + 2 * wo - 1:2]  # noqa: E731
    yn = np.max([win(xp, r, t) for r in range(3) for t in range(3)], axis=0).astype("float32")
    dyn = rand((1, ho, wo, c), "float32", rng)
    ref = np.zeros((1, h + 2, w + 2, c))
    for r in range(3):
        for t in range(3):
            win(ref, r, t)[...] += np.where(win(xp, r, t) == yn, dyn, 0.0)
    tgt = targets.current().with_cores(cores)
    (out,), why = build_run([dx], [x, y, dy], [xn, yn, dyn], target=tgt)
    check(out, ref[:, 1:-1, 1:-1], "float32")
    assert _rules(why)["dx"] == "patterns.interleave", _rules(why)
    mod = dsl.build(dsl.auto_schedule([dx], target=tgt), {
        "name": "dx", "tensor_list": [x, y, dy, dx], "need_build": False})
    assert [s.tasks for s in predict(mod, cores).stages][-1] == tasks


def test_interleave_mixed_reads():
    """A nearest upsample added to a skip connection along the rows alone (``u[.., j // 3] +
    x[.., j]``) is interleaved; a per-16-lane scale (``g[j // 16]``: more phases than
    :data:`phases.MIXED_MAX`) and a grouped scale along an outer axis (``s[.., c // 4, ..]``)
    keep the plain injective rule. All exact."""
    rng = np.random.default_rng(13)
    x = te.placeholder((2, 8, 5, 33), name="x")
    u = te.placeholder((2, 8, 5, 11), name="u")
    g = te.placeholder((3,), name="g")
    s = te.placeholder((2, 2, 5, 33), name="s")
    xn, un = rand((2, 8, 5, 33), "float32", rng), rand((2, 8, 5, 11), "float32", rng)
    gn, sn = rand((3,), "float32", rng), rand((2, 2, 5, 33), "float32", rng)
    cases = [
        ("skip", lambda b, c, i, j: x[b, c, i, j] + u[b, c, i, j // 3], [u], [un],
         xn + np.repeat(un, 3, axis=3), "patterns.interleave"),
        ("scale16", lambda b, c, i, j: x[b, c, i, j] * g[j // 16], [g], [gn],
         xn * np.repeat(gn, 16)[:33], "patterns.injective"),
        ("grouped", lambda b, c, i, j: x[b, c, i, j] * s[b, c // 4, i, j], [s], [sn],
         xn * np.repeat(sn, 4, axis=1), "patterns.injective"),
    ]
    for name, fn, ins, arrays, ref, rule in cases:
        y = te.compute((2, 8, 5, 33), fn, name=name)
        (out,), why = build_run([y], [x, *ins], [xn, *arrays])
        np.testing.assert_array_equal(out, ref.astype(np.float32))
        assert _rules(why)[name] == rule, (name, _rules(why))


def _max_pool_dx(n, c, size, ks, s, pads):
    """A max pool's gradient as users write it: each input position gathers, over the
    windows that hold it, ``dy`` where it equals the window's maximum ``y``."""
    (h, w), ((pt, pb), (pl, pr)) = size, pads
    ho, wo = (h + pt + pb - ks) // s + 1, (w + pl + pr - ks) // s + 1
    x = te.placeholder((n, c, h, w), name="x")
    y = te.placeholder((n, c, ho, wo), name="y")
    dy = te.placeholder((n, c, ho, wo), name="dy")
    ry, rx = te.reduce_axis((0, ks), name="ry"), te.reduce_axis((0, ks), name="rx")

    def body(b, ci, i, j):
        hh, ww = i + pt - ry, j + pl - rx
        ok = te.all(hh % s == 0, ww % s == 0, hh >= 0, ww >= 0, hh // s < ho, ww // s < wo)
        hit = te.if_then_else(x[b, ci, i, j] == y[b, ci, hh // s, ww // s],
                              dy[b, ci, hh // s, ww // s], 0.0)
        return te.sum(te.if_then_else(ok, hit, 0.0), axis=[ry, rx])

    return x, y, dy, te.compute((n, c, h, w), body, name="dx")


def _ref_max_pool_dx(xn, dyn, ks, s, pads):
    """``dx`` from the windows: pooled maxima, then ``dy`` added at every position equal to
    its window's maximum (float64)."""
    (pt, pb), (pl, pr) = pads
    xp = np.pad(xn.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)),
                constant_values=-np.inf)
    n, c, ho, wo = dyn.shape
    yn = np.empty((n, c, ho, wo))
    dxp = np.zeros_like(xp)
    for i, j in itertools.product(range(ho), range(wo)):
        win = xp[:, :, i * s:i * s + ks, j * s:j * s + ks]
        yn[:, :, i, j] = win.max(axis=(2, 3))
        hit = win == yn[:, :, i, j][:, :, None, None]
        dxp[:, :, i * s:i * s + ks, j * s:j * s + ks] += hit * dyn[:, :, i, j][:, :, None, None]
    h, w = xn.shape[2:]
    return yn.astype(np.float32), dxp[:, :, pt:pt + h, pl:pl + w]


@pytest.mark.parametrize(("size", "ks", "s", "pads"), [
    ((12, 12), 3, 2, ((1, 1), (1, 1))),    # resnet's stem pool
    ((13, 11), 3, 2, ((1, 0), (0, 1))),    # odd sizes, asymmetric padding
    ((14, 10), 2, 2, ((0, 0), (0, 0))),    # non-overlapping, as a gather
    ((17, 13), 3, 3, ((1, 1), (0, 2))),    # stride 3
    ((11, 11), 5, 2, ((2, 2), (2, 2))),    # 3 x 3 taps in a phase
], ids=str)
def test_max_pool_gradient_split(size, ks, s, pads):
    """A max pool's gradient whose summand also reads ``x`` at the output position, so no
    stage over ``u`` alone holds it (:func:`phases._direct`): split into phases of a few
    taps each, written out and computed in the interleave. Against numpy float64."""
    rng = np.random.default_rng(sum(size) + ks + s)
    n, c = 2, 5
    x, y, dy, dx = _max_pool_dx(n, c, size, ks, s, pads)
    xn = rand((n, c, *size), "float32", rng)
    dyn = rand([int(v) for v in dy.shape], "float32", rng)
    yn, ref = _ref_max_pool_dx(xn, dyn, ks, s, pads)
    (out,), why = build_run([dx], [x, y, dy], [xn, yn, dyn])
    check(out, ref, "float32")
    rules = _rules(why)
    assert rules["dx"] == "patterns.interleave", rules
    assert all(rules[k] == "patterns.inline" for k in rules if k.startswith("dx_phase_")), rules


@pytest.mark.parametrize(("size", "ks", "pads"), [((9, 12), 3, ((1, 1), (1, 1))),
                                                 ((7, 10), 2, ((0, 1), (1, 0)))], ids=str)
def test_max_pool_gradient_stride_one(size, ks, pads):
    """A stride-1 max pool's gradient has no phases: its few guarded taps are written out
    term by term (:func:`phases._expand_guarded`), an injective stage. Against numpy
    float64."""
    rng = np.random.default_rng(sum(size) + ks)
    x, y, dy, dx = _max_pool_dx(2, 4, size, ks, 1, pads)
    xn = rand((2, 4, *size), "float32", rng)
    dyn = rand([int(v) for v in dy.shape], "float32", rng)
    yn, ref = _ref_max_pool_dx(xn, dyn, ks, 1, pads)
    (out,), why = build_run([dx], [x, y, dy], [xn, yn, dyn])
    check(out, ref, "float32")
    assert _rules(why)["dx"] == "patterns.injective", _rules(why)


@pytest.mark.parametrize(("ks", "expanded"), [(3, True), (5, False)])
def test_inline_padded_window_written_out(ks, expanded):
    """A depthwise conv2d whose padding is a guard inside its 3x3 sum is written out the
    same way; a sum of more than :data:`phases.EXPAND_TAPS` steps (5x5) is not. Against
    numpy."""
    rng = np.random.default_rng(51 + ks)
    n, c, h, w, p = 2, 3, 9, 20, ks // 2
    x = te.placeholder((n, c, h, w), name="x")
    wt = te.placeholder((c, ks, ks), name="wt")
    ry, rx = te.reduce_axis((0, ks), name="ry"), te.reduce_axis((0, ks), name="rx")
    y = te.compute((n, c, h, w), lambda b, ci, i, j: te.sum(te.if_then_else(
        te.all(i + ry >= p, i + ry < h + p, j + rx >= p, j + rx < w + p),
        x[b, ci, i + ry - p, j + rx - p], 0.0) * wt[ci, ry, rx], axis=[ry, rx]), name="dwf")
    xn, wn = rand((n, c, h, w), "float32", rng), rand((c, ks, ks), "float32", rng)
    (out,), why = build_run([y], [x, wt], [xn, wn])
    xp = np.pad(xn.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    ref = sum(xp[:, :, r:r + h, t:t + w] * wn[None, :, r, t, None, None]
              for r in range(ks) for t in range(ks))
    check(out, ref, "float32")
    assert (_rules(why)["dwf"] == "patterns.injective") == expanded, _rules(why)


def test_direct_split_left_whole():
    """A summand that is not zero off the residue (a term added outside the guarded
    gather) is not split, by either way (outlining the gather, :func:`phases._outlined`,
    used to split it and drop the term at the skipped taps)."""
    x, y, dy, _ = _max_pool_dx(1, 2, (8, 8), 3, 2, ((1, 1), (1, 1)))
    ry, rx = te.reduce_axis((0, 3), name="ry"), te.reduce_axis((0, 3), name="rx")

    def body(b, ci, i, j):
        hh, ww = i + 1 - ry, j + 1 - rx
        ok = te.all(hh % 2 == 0, ww % 2 == 0, hh >= 0, ww >= 0, hh // 2 < 4, ww // 2 < 4)
        return te.sum(te.if_then_else(ok, dy[b, ci, hh // 2, ww // 2], 0.0)
                      + x[b, ci, i, j] * 0.5, axis=[ry, rx])

    dx = te.compute((1, 2, 8, 8), body, name="dx")
    assert phases.split(dx) is None


def _pool_or_depthwise_dx(n, c, h, ks, p, s, weights: bool):
    """The dx of a strided depthwise conv2d (``weights``) or of an average pool, written as a
    gather: one tap per phase where the stride divides the window's step."""
    ho = (h + 2 * p - ks) // s + 1
    dy = te.placeholder((n, c, ho, ho), name="dy")
    w = te.placeholder((c, 1, ks, ks), name="w")
    ry, rx = te.reduce_axis((0, ks), name="ry"), te.reduce_axis((0, ks), name="rx")

    def body(b, ci, i, j):
        hh, ww = i + p - ry, j + p - rx
        ok = te.all(hh % s == 0, ww % s == 0, hh >= 0, ww >= 0, hh // s < ho, ww // s < ho)
        tap = w[ci, 0, ry, rx] if weights else te.const(1.0 / ks / ks, "float32")
        return te.sum(te.if_then_else(ok, dy[b, ci, hh // s, ww // s], 0.0) * tap,
                      axis=[ry, rx])

    return dy, w, te.compute((n, c, h, h), body, name="dx")


@pytest.mark.parametrize("weights", [True, False], ids=["depthwise", "avg_pool"])
def test_depthwise_and_pool_dx_phases(weights):
    """Each phase a window reduction; the one-tap phase a plain product (no reduction left,
    inlined into the interleave). Against numpy float64."""
    n, c, h, ks, p, s = 2, 5, 12, 3, 1, 2
    rng = np.random.default_rng(29)
    dy, w, dx = _pool_or_depthwise_dx(n, c, h, ks, p, s, weights)
    dyn = rand([int(v) for v in dy.shape], "float32", rng)
    wn = rand((c, 1, ks, ks), "float32", rng) if weights else \
        np.full((c, 1, ks, ks), 1.0 / ks / ks, np.float32)
    ins, arrays = ([dy, w], [dyn, wn]) if weights else ([dy], [dyn])
    (out,), why = build_run([dx], ins, arrays)
    ref = np.stack([_ref_dx(dyn[:, k:k + 1], wn[k:k + 1], (h, h), (s, s), ((p, p), (p, p)))[:, 0]
                    for k in range(c)], axis=1)
    check(out, ref, "float32")
    rules = _rules(why)
    assert rules["dx_phase_0_0"] == "patterns.inline", rules
    assert rules["dx"] == "patterns.interleave", rules
