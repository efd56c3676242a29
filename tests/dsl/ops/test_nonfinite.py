"""A NaN / Inf in one input reaches exactly the outputs the math says (padding is never
multiplied in): dx, dw, aclnn ConvolutionBackward and avg-pool backward against float64
references that skip padding (dx and grad_input in scatter form, dw over real x only)."""

import numpy as np
import pytest

import dsl
import dsl.api.aclnn
import targets
from dsl import kernel_cache
from dsl.ops.layout import fracz_to_weight

from cases import C
from helpers import (
    assert_nonfinite_positions,
    dw_data,
    dw_kernel,
    dx_data,
    dx_kernel,
    nc1hwc0_to_nchw,
    nchw_to_5hd,
    weight_to_fracz,
)
from reference import avg_pool2d_backward as ref_pool_dx
from reference import avg_pool2d_out_size
from reference import conv2d_backprop_filter as ref_dw
from reference import conv2d_backprop_input as ref_dx
from reference import convolution_backward as ref_cb

CASES = [
    C(2, 19, 21, 7, 8, 3, 1, (1, 1, 1, 1), 1, 1),             # padded 3x3, odd channels
    C(1, 8, 12, 13, 12, (3, 2), (3, 2), (2, 1, 0, 2), 2, 1),  # stride 3, dilation 2, asym pad
    C(1, 16, 16, 11, 11, 3, 2, (2, 2, 2, 2), 2, 1),           # gcd(stride, dilation) > 1
    C(1, 32, 32, 6, 6, 3, 1, (1, 1, 1, 1), 1, 8),             # grouped
    C(1, 3, 16, 15, 15, 7, 2, (3, 3, 3, 3), 1, 1),            # stem (positions / Cout lanes)
]
VALUES = [np.nan, np.inf, -np.inf]


def cid(c):
    return f"ci{c['cin']}_co{c['cout']}_k{c['kh']}{c['kw']}_s{c['stride'][0]}_g{c['groups']}"


def same_nonfinite(out, ref, what):
    out, fin = assert_nonfinite_positions(out, ref, what)
    np.testing.assert_allclose(out[fin], ref[fin], rtol=1e-4, atol=1e-4)


def corners_and_middle(shape):
    """Positions at the borders (where padding is read) and one inside."""
    return [tuple(0 for _ in shape), tuple(s - 1 for s in shape), tuple(s // 2 for s in shape),
            (0, *(s - 1 for s in shape[1:]))]


# dx multiplies the taps that fall outside dy by dy's zero padding; a non-finite weight
# switches the kernel to its exact twins (dsl.runtime.run_if), so it too lands only where the
# math puts it. Every dx path: padded, strided + dilated, grouped, W positions in lanes.
# (16-bit inputs share the float32 kernels' stages after the cast: dense cases, weights only)
DX_NONFINITE = [(c, into, "float32") for c in CASES for into in ("dy", "w")] + [
    (c, "w", dt) for dt in ("float16", "bfloat16") for c in CASES
    if c["groups"] == 1 and c["stride"][0] != 3]


@pytest.mark.parametrize("c,into,dtype", DX_NONFINITE,
                         ids=[f"{cid(c)}-{into}-{dt}" for c, into, dt in DX_NONFINITE])
def test_dx_nonfinite(c, into, dtype):
    kernel = dx_kernel(c, dtype, "float32")
    x_shape = (c["n"], c["cin"], c["h"], c["w"])
    for i, value in enumerate(VALUES):
        dy, w = dx_data(c, "float32")
        t = w if into == "w" else dy
        for pos in corners_and_middle(t.shape)[i::3] + corners_and_middle(t.shape)[3:]:
            t[pos] = value
        dy, w = (_as(a, dtype) for a in (dy, w))
        out = nc1hwc0_to_nchw(kernel(weight_to_fracz(w, c["groups"]), nchw_to_5hd(dy)),
                              c["cin"])
        ref = ref_dx(dy.astype("float64"), w.astype("float64"), x_shape, c["stride"],
                     c["pads"], c["dil"], c["groups"])
        same_nonfinite(out, ref, f"dx {cid(c)} {dtype} {into}={value}")
        # the same kernel goes back to its fast path for finite weights
        if into == "w":
            w_ok = np.nan_to_num(w.astype("float32"), nan=0.5, posinf=0.5, neginf=0.5)
            w_ok = _as(w_ok, dtype)
            out = nc1hwc0_to_nchw(kernel(weight_to_fracz(w_ok, c["groups"]),
                                         nchw_to_5hd(dy)), c["cin"])
            ref = ref_dx(dy.astype("float64"), w_ok.astype("float64"), x_shape, c["stride"],
                         c["pads"], c["dil"], c["groups"])
            same_nonfinite(out, ref, f"dx {cid(c)} {dtype} finite again after {value}")


def _as(a, dtype):
    """``a`` in ``dtype`` (bfloat16 through ml_dtypes, as the host packers take it)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return a.astype(ml_dtypes.bfloat16)
    return a.astype(dtype)


# bfloat16 dw of a dense layer is laid out for vdpbf16ps (pairs of Wo positions): its fast
# reduction multiplies x's padding, and the x column past an odd Wo (here the last one, which
# no output reads), by zero dy, so a non-finite x or dy switches it to its exact twin. Laid
# out for an AVX512-BF16 target on every host.
ODD_WO = C(2, 20, 18, 7, 8, 3, 2, (0, 0, 0, 0), 1, 1)  # Wo 3: the pair past it reads x col 7
DW_NONFINITE = [(c, into, "float32") for c in CASES for into in ("x", "dy")] + [
    (c, into, "bfloat16") for c in [*CASES, ODD_WO] if c["groups"] == 1 and c["cin"] > 3
    for into in ("x", "dy")]


@pytest.mark.parametrize("c,into,dtype", DW_NONFINITE,
                         ids=[f"{cid(c)}-{into}-{dt}" for c, into, dt in DW_NONFINITE])
def test_dw_nonfinite(c, into, dtype):
    layout = "sapphirerapids" if dtype == "bfloat16" else None
    kernel = dw_kernel(c, dtype, "float32", layout_for=layout)
    w_shape = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    for i, value in enumerate(VALUES):
        x, dy = dw_data(c, "float32")
        t = x if into == "x" else dy
        for pos in corners_and_middle(t.shape)[i::3] + corners_and_middle(t.shape)[3:]:
            t[pos] = value
        x, dy = _as(x, dtype), _as(dy, dtype)
        out = fracz_to_weight(kernel(nchw_to_5hd(x), nchw_to_5hd(dy)), w_shape, c["groups"])
        ref = ref_dw(x.astype("float64"), dy.astype("float64"), w_shape, c["stride"],
                     c["pads"], c["dil"], c["groups"])
        same_nonfinite(out, ref, f"dw {cid(c)} {dtype} {into}={value}")



# batch 1: the scans' partial maxima take rows of C1 and H too (dsl.ops.fallback.row_axes),
# so a NaN / inf must be found in whichever row it falls
ROWS = C(1, 16, 32, 40, 40, 3, 1, (1, 1, 1, 1), 1, 1)


def test_scan_rows_span_leading_axes_and_stay_long():
    from dsl.ops.fallback import MIN_ROW_ELEMS, MIN_ROWS, row_axes

    assert row_axes([1, 2, 40, 40, 16]) == 3  # 80 rows of 640: a fourth axis would leave 16
    assert row_axes([8, 256, 1024]) == 2  # 2048 rows of a 1024-wide line
    assert row_axes([256, 4, 16, 16]) == 1  # the first axis alone already gives the rows
    assert row_axes([36, 4, 16, 16]) == 1  # 144 rows would hold 256 < MIN_ROW_ELEMS each
    assert row_axes([4096]) == 0  # one row
    for shape in ([1, 2, 40, 40, 16], [8, 256, 1024], [3, 5, 7, 11, 13]):
        k = row_axes(shape)
        rows = int(np.prod(shape[:k]))
        assert rows >= MIN_ROWS or k == len(shape) - 1 \
            or np.prod(shape) // (rows * shape[k]) < MIN_ROW_ELEMS


@pytest.mark.parametrize("into", ["x", "dy"])
def test_dw_nonfinite_found_in_every_row_of_a_batch_1_scan(into):
    kernel = dw_kernel(ROWS, "float32", "float32")
    w_shape = (ROWS["cout"], ROWS["cin"], ROWS["kh"], ROWS["kw"])
    # one at a time: any one found sends the whole kernel to its exact twin
    for pos, value in (((0, -1, 17, 23), np.nan), ((0, 0, -1, 0), np.inf)):
        x, dy = dw_data(ROWS, "float32")
        (x if into == "x" else dy)[pos] = value  # the last channel; the last row
        out = fracz_to_weight(kernel(nchw_to_5hd(x), nchw_to_5hd(dy)), w_shape, 1)
        ref = ref_dw(x.astype("float64"), dy.astype("float64"), w_shape, ROWS["stride"],
                     ROWS["pads"], ROWS["dil"], 1)
        same_nonfinite(out, ref, f"dw batch 1 {into}[{pos}] = {value}")

def test_dw_reference_skips_padding():
    """The dw reference itself: an Inf dy whose taps partly read padding leaves those taps
    finite (x = 1 everywhere, 3x3 pad 1: dy[0, 0] meets x only at taps kh, kw >= 1)."""
    x = np.ones((1, 1, 3, 3))
    dy = np.zeros((1, 1, 3, 3))
    dy[0, 0, 0, 0] = np.inf
    got = ref_dw(x, dy, (1, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)[0, 0]
    assert np.isfinite(got[0]).all() and np.isfinite(got[:, 0]).all()
    assert np.isposinf(got[1:, 1:]).all()


AVG = [((2, 3, 9, 8), [3], [2], [1], False, True, 0),
       ((1, 2, 11, 10), [5], [3], [2], True, False, 0)]


@pytest.mark.parametrize("c", AVG, ids=["k3s2p1", "k5s3p2_ceil"])
def test_avg_pool_backward_nonfinite(c):
    shape, k, s, p, ceil, cip, div = c
    pairs = [tuple(v * 2 if len(v) == 1 else v) for v in (k, s, p)]
    x = np.zeros(shape, np.float32)
    ho = avg_pool2d_out_size(shape[-2], pairs[0][0], pairs[1][0], pairs[2][0], ceil)
    wo = avg_pool2d_out_size(shape[-1], pairs[0][1], pairs[1][1], pairs[2][1], ceil)
    for value in VALUES:
        dy = np.random.default_rng(0).uniform(-1, 1, (*shape[:-2], ho, wo)).astype(np.float32)
        for pos in corners_and_middle(dy.shape):
            dy[pos] = value
        out = dsl.aclnn.avg_pool2d_backward(dy, x, *c[1:])
        ref = ref_pool_dx(dy, shape, *pairs, ceil, cip, div)
        same_nonfinite(out, ref, f"avgpool {c} {value}")


def _geometry(size, cin, cout, k, stride, pad, transposed=False, opad=0, groups=1):
    nd = len(size)
    if transposed:
        out = tuple((i - 1) * stride - 2 * pad + (k - 1) + opad + 1 for i in size)
        w = (cin, cout // groups, *(k,) * nd)
    else:
        out = tuple((i + 2 * pad - k) // stride + 1 for i in size)
        w = (cout, cin // groups, *(k,) * nd)
    return (2, cin, *size), w, (2, cout, *out)


# (size, cin, cout, k, stride, pad, transposed, output_padding, groups): every grad_input and
# grad_weight path of the operator (plain with stride phases and a padded kernel, transposed,
# grouped with expanded packs, exact depthwise in NC*, 1-D and 3-D)
ACLNN = {
    "plain": ((7, 8), 5, 6, 3, 2, 1, False, 0, 1),
    "transposed": ((5, 4), 4, 6, 3, 2, 1, True, 1, 2),
    "grouped": ((6, 7), 8, 8, 3, 1, 1, False, 0, 4),
    "depthwise_nc": ((6, 8), 3, 3, 3, 1, 1, False, 0, 3),
    "depthwise_nc_s2": ((8, 15), 4, 4, 3, 2, 1, False, 0, 4),  # zero taps, lanes shuffled
    "depthwise_nc_phases": ((5, 32), 3, 3, 3, 2, 1, False, 0, 3),  # dw reads x by phase
    "depthwise_nc_dx": ((12, 36), 4, 4, 3, 2, 1, False, 0, 4),  # NC* dx, channel-last dw
    # dw's lanes past a row of 14 read x's last columns (NaN there): left out of the sum
    "depthwise_nc_lanes": ((9, 14), 3, 3, 3, 1, 1, False, 0, 3),  # channel-last dx
    "depthwise_nc_lanes_s2": ((12, 12), 4, 4, 3, 2, 1, False, 0, 4),  # rows of 6: 8 lanes
    "conv1d": ((11,), 3, 4, 5, 2, 2, False, 0, 1),
    "conv3d": ((4, 5, 4), 2, 3, 3, 1, 1, False, 0, 1),
}


# Every reduction of the operator multiplies its packs' zero padding (and a padded kernel's
# zero taps) in; a NaN / Inf in any input switches the kernel to its exact twins
# (dsl.ops.fallback), so it reaches exactly the outputs the math pairs it with.
@pytest.mark.parametrize("into", ["x", "w", "dy"])
@pytest.mark.parametrize("g", list(ACLNN.values()), ids=list(ACLNN))
def test_aclnn_convolution_backward_nonfinite(g, into):
    size, cin, cout, k, stride, pad, transposed, opad, groups = g
    nd = len(size)
    xs, ws, dys = _geometry(size, cin, cout, k, stride, pad, transposed, opad, groups)
    for value in VALUES:
        rng = np.random.default_rng(1)
        dy, x, w = (rng.uniform(-1, 1, s).astype(np.float32) for s in (dys, xs, ws))
        t = {"w": w, "x": x, "dy": dy}[into]
        for pos in corners_and_middle(t.shape):
            t[pos] = value
        out = dsl.aclnn.convolution_backward(dy, x, w, [cout], [stride] * nd, [pad] * nd,
                                             [1] * nd, transposed, [opad] * nd, groups,
                                             [True] * 3, 0)
        ref = ref_cb(dy, x, w, (stride,) * nd, ((pad, pad),) * nd, (1,) * nd, transposed,
                     (opad,) * nd, groups)
        for idx, what in enumerate(("grad_input", "grad_weight", "grad_bias")):
            same_nonfinite(out[idx], ref[idx], f"aclnn {g} {into}={value} {what}")


# DeconvGradFilter multiplies dy_pad's zeros (the crop and the rows past dy) by x in its GEMM;
# a NaN / Inf in x switches it to its exact twin, a NaN / Inf in dy meets only real x.
DECONV = {"cropped_s2": ((2, 5, 6, 3), (2, 9, 11, 4), 3, 2, 1, 1, 1),
          "grouped_dilated": ((1, 4, 4, 4), (1, 8, 9, 6), 3, 2, (2, 1), (1, 2), 2),
          # 6-row tiles over 16 oc per group on AVX2: a ragged last tile, zero-filled panels
          "ragged_g2": ((2, 4, 5, 32), (2, 9, 11, 32), 3, 2, 1, 1, 2)}
RAGGED_TARGET = "x86-avx2"  # the ragged case is built for it, so AVX-512 hosts run it too


@pytest.mark.parametrize("into", ["x", "dy"])
@pytest.mark.parametrize("g", list(DECONV.values()), ids=list(DECONV))
def test_deconv_grad_filter_nonfinite(g, into):
    from tvm import te

    from dsl.ops.deconv_grad_filter import deconv_grad_filter

    from reference import deconv_grad_filter as ref_deconv

    x_shape, dy_shape, k, s, p, d, group = g
    pair = [v if isinstance(v, tuple) else (v, v) for v in (k, s, p, d)]

    def make():
        dy = te.placeholder(dy_shape, "float32", name="dy")
        x = te.placeholder(x_shape, "float32", name="x")
        return [dy, x], [deconv_grad_filter(dy, x, kernel=k, stride=s, pad=p, dilation=d,
                                            group=group)]

    tgt = targets.get(RAGGED_TARGET) if g == DECONV["ragged_g2"] else None
    kernel = kernel_cache.get_kernel({"op": "nonfinite_deconv", "g": g}, make,
                                     prefix="t_nf_deconv", target=tgt)
    for value in VALUES:
        rng = np.random.default_rng(2)
        dy, x = (rng.uniform(-1, 1, sh).astype(np.float32) for sh in (dy_shape, x_shape))
        t = x if into == "x" else dy
        for pos in corners_and_middle(t.shape):
            t[pos] = value
        ref = ref_deconv(dy, x, *pair, group)
        same_nonfinite(kernel(dy, x), ref, f"deconv {g} {into}={value}")
