"""int8 ``conv2d_backprop_input`` as TBE defines it, bit-exact against exact integers.

``out_backprop`` and ``filters`` int8 (5HD C0 = 32; int8 dx FracZ ``(G*Cout1g*KH*KW, Cin1g, 16,
32)``), ``res_dtype`` int32 (5HD C0 = 16). Every position of the stride-dilated, padded dy that
is not a real dy element reads ``offset_x``. The reference builds that dy literally.
"""

import numpy as np
import pytest

import dsl
import targets
from dsl import kernel_cache

from cases import C
from helpers import case_id, out_hw
from reference import conv2d_backprop_input as ref_dx


def ref_dx_int8(dy, w, x_shape, stride, pads, dil, groups, offset_x):
    """Exact int64 dx: ``dx[n, c, h, w] = sum_{co in c's group, kh, kw} D[n, co, h + top - kh*dh,
    w + left - kw*dw] * W[co, c % Cin_g, kh, kw]`` where ``D[u, v]`` is ``dy[u/sh, v/sw]`` when
    both divide exactly and land inside dy, else ``offset_x`` (a stride hole or padding)."""
    dy, w = np.asarray(dy, np.int64), np.asarray(w, np.int64)
    n, cin, h, wd = x_shape
    cout, cin_g, kh, kw = w.shape
    (sh, sw), (dh, dw), cout_g = stride, dil, cout // groups
    _, _, ho, wo = dy.shape
    lo_h, lo_w = pads[0] - (kh - 1) * dh, pads[2] - (kw - 1) * dw  # smallest u, v read
    hi_h, hi_w = h - 1 + pads[0], wd - 1 + pads[2]
    d = np.full((n, cout, hi_h - lo_h + 1, hi_w - lo_w + 1), offset_x, np.int64)
    for i in range(ho):
        for j in range(wo):
            u, v = i * sh - lo_h, j * sw - lo_w
            if 0 <= u < d.shape[2] and 0 <= v < d.shape[3]:
                d[:, :, u, v] = dy[:, :, i, j]
    dx = np.zeros((n, cin, h, wd), np.int64)
    for g in range(groups):
        ds, ws = d[:, g * cout_g:(g + 1) * cout_g], w[g * cout_g:(g + 1) * cout_g]
        for a in range(kh):
            for b in range(kw):
                u0, v0 = pads[0] - a * dh - lo_h, pads[2] - b * dw - lo_w
                patch = ds[:, :, u0:u0 + h, v0:v0 + wd]
                dx[:, g * cin_g:(g + 1) * cin_g] += np.einsum("nohw,oc->nchw", patch,
                                                              ws[:, :, a, b])
    return dx


def int8_kernel(c, offset_x, target=None, layout_for=None):
    """The int8 dx kernel of case ``c``, built for ``target`` (host); ``layout_for``: the
    target whose facts lay the compute out (default: the one in force), so the ``vpdpbusd``
    layout is checked on a host without VNNI too."""
    ho, wo = out_hw(c)
    w_sizes = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    fz_shape = dsl.layout.Int8DxLayout.from_weight(w_sizes, c["groups"]).fracz_shape

    def make():
        from tvm import te
        dy = te.placeholder((c["n"], -(-c["cout"] // 32), ho, wo, 32), name="out_backprop",
                            dtype="int8")
        w = te.placeholder(fz_shape, name="filters", dtype="int8")
        with targets.use(layout_for or targets.current()):
            dx = dsl.conv2d_backprop_input(
                w, dy, w_sizes, (c["n"], c["cin"], c["h"], c["w"]),
                {"strides": list(c["stride"]), "padding": list(c["pads"]),
                 "dilations": [1, 1, *c["dil"]], "res_dtype": "int32", "offset_x": offset_x,
                 "offset_w": None, "groups": c["groups"]})
        return [w, dy], [dx]

    sig = {"op": "dx_int8", "case": c, "offset_x": offset_x, "layout_for": layout_for}
    return kernel_cache.get_kernel(sig, make, prefix="t_dx8", target=target)


def int8_data(c, seed=0):
    rng = np.random.default_rng(seed)
    ho, wo = out_hw(c)
    dy = rng.integers(-128, 128, (c["n"], c["cout"], ho, wo)).astype(np.int8)
    w = rng.integers(-128, 128, (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"]))
    return dy, w.astype(np.int8)


def run_int8(c, offset_x, layout_for=None):
    dy, w = int8_data(c)
    fz, dy5 = dsl.layout.weight_to_fracz(w, c["groups"]), dsl.layout.nchw_to_5hd(dy)
    assert dy5.shape[-1] == 32 and fz.shape[-2:] == (16, 32)
    out5 = int8_kernel(c, offset_x, layout_for=layout_for)(fz, dy5)
    assert out5.dtype == np.int32 and out5.shape[-1] == 16
    flat = np.moveaxis(out5, -1, 2).reshape(out5.shape[0], -1, *out5.shape[2:4])
    assert not flat[:, c["cin"]:].any(), "pad channels must be zero"
    ref = ref_dx_int8(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"],
                      c["dil"], c["groups"], offset_x)
    return dsl.layout.nc1hwc0_to_nchw(out5, c["cin"]), ref, dy, w


INT8_CASES = [
    (C(2, 19, 37, 7, 8, 3, 1, (1, 1, 1, 1), 1, 1), (0, -128)),      # odd channels, batch 2
    (C(1, 16, 40, 9, 10, 3, 2, (1, 0, 0, 1), 1, 1), (5, 127)),      # stride 2, asym pad
    (C(2, 8, 12, 13, 12, (3, 2), (3, 2), (2, 1, 0, 2), 2, 1), (0, -128)),  # stride 3, dil 2
    (C(1, 3, 20, 11, 11, 5, 2, (2, 2, 2, 2), 1, 1), (127,)),       # stem (positions lanes)
    (C(1, 32, 64, 6, 6, 3, 1, (1, 1, 1, 1), 1, 8), (5,)),           # grouped, Cout_g 8
    (C(2, 24, 24, 7, 7, 3, 2, (1, 1, 1, 1), 1, 24), (-128,)),       # depthwise
    (C(1, 12, 20, 5, 5, 2, 1, (0, 0, 0, 0), (2, 1), 4), (0, 127)),  # Cin_g 3, Cout_g 5
]
PARAMS = [(c, off) for c, offs in INT8_CASES for off in offs]


@pytest.mark.parametrize("c,offset_x", PARAMS,
                         ids=[f"{case_id(c)}_off{o}" for c, o in PARAMS])
def test_dx_int8_bit_exact(c, offset_x):
    out, ref, dy, w = run_int8(c, offset_x)
    np.testing.assert_array_equal(out, ref)
    if offset_x == 0:  # the exact integers are the float reference's
        fref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"],
                      c["dil"], c["groups"])
        np.testing.assert_array_equal(ref, fref.astype(np.int64))


# dense layers (Cin in the lanes), where a VNNI target lays dy out as unsigned bytes and the
# weight as [.., Cout/4, 16, 4] for vpdpbusd
DOT_CASES = [
    (C(2, 37, 20, 7, 8, 3, 1, (1, 1, 1, 1), 1, 1), (0, -128, 127)),  # odd channels, batch 2
    (C(1, 16, 40, 9, 10, 3, 2, (1, 0, 0, 1), 1, 1), (5,)),            # stride 2, asym pad
    (C(1, 40, 24, 13, 12, (3, 2), (3, 2), (2, 1, 0, 2), 2, 1), (-7,)),  # stride 3, dil 2
    (C(2, 33, 17, 11, 9, 1, 1, (0, 0, 0, 0), 1, 1), (0, 3)),          # 1x1, prime sizes
    # where the host has AMX (tdpbusd tiles): 2 x 2 accumulator tiles of 16 rows, a prime row
    (C(2, 64, 40, 5, 32, 3, 1, (1, 1, 1, 1), 1, 1), (0, 9)),
    (C(1, 32, 33, 7, 13, 3, 1, (1, 1, 1, 1), 1, 1), (-3,)),
]
DOT_PARAMS = [(c, off) for c, offs in DOT_CASES for off in offs]


@pytest.mark.parametrize("c,offset_x", DOT_PARAMS,
                         ids=[f"{case_id(c)}_off{o}" for c, o in DOT_PARAMS])
def test_dx_int8_vnni_layout_bit_exact(c, offset_x):
    """The vpdpbusd layout (unsigned dy, per-phase weight sums taken off) is exact on any
    host: laid out for a VNNI target, scheduled for this one (tensorized where it has VNNI,
    multiply-adds where not)."""
    from dsl.ops.conv2d_backprop_input import dot_depth
    from dsl.ops.group import GroupLayout

    w_sizes = (c["cout"], c["cin"], c["kh"], c["kw"])
    with targets.use("icelake-server"):
        assert dot_depth("int8", GroupLayout.from_weight(w_sizes, 1), False) == 4
    out, ref, _, _ = run_int8(c, offset_x, layout_for="icelake-server")
    np.testing.assert_array_equal(out, ref)


def test_int8_reference_offset_is_holes_and_padding():
    """The reference's offset term alone: dy == offset_x everywhere gives offset_x * sum(W)."""
    c = C(1, 2, 3, 5, 6, 3, 2, (1, 0, 2, 1), 1, 1)
    ho, wo = out_hw(c)
    w = np.arange(3 * 2 * 9).reshape(3, 2, 3, 3) - 20
    dy = np.full((1, 3, ho, wo), 7)
    got = ref_dx_int8(dy, w, (1, 2, 5, 6), (2, 2), (1, 0, 2, 1), (1, 1), 1, 7)
    np.testing.assert_array_equal(got, np.broadcast_to(
        7 * w.sum(axis=(0, 2, 3))[None, :, None, None], got.shape))


def test_int8_layouts_and_group_dict():
    w = np.arange(12 * 3 * 2 * 3).reshape(12, 3, 2, 3).astype(np.int8)
    fz = dsl.layout.weight_to_fracz(w, 4)
    gd = dsl.calculate_group((1, 12, 1, 1), (1, 12, 1, 1), w.shape, 4, filter_dtype="int8")
    assert gd["dy_c1_extend"] == 1 and gd["multiple_extend"] == 4
    assert fz.shape == (gd["g_extend"] * gd["dy_c1_extend"] * 2 * 3, gd["dx_c1_extend"], 16, 32)
    np.testing.assert_array_equal(dsl.layout.fracz_to_weight(fz, w.shape, 4), w)
    # the reduction block of 32 Cout channels innermost: W[co, ci, kh, kw] at [.., ci, co]
    w1 = np.arange(40 * 17).reshape(40, 17, 1, 1).astype(np.int8)
    fz1 = dsl.layout.weight_to_fracz(w1)
    assert fz1.shape == (2, 2, 16, 32)
    assert fz1[1, 1, 0, 3] == w1[35, 16, 0, 0]
    x = np.arange(2 * 40 * 3).reshape(2, 40, 3, 1).astype(np.int8)
    x5 = dsl.layout.nchw_to_5hd(x)
    assert x5.shape == (2, 2, 3, 1, 32) and x5[1, 1, 2, 0, 7] == x[1, 39, 2, 0]
    np.testing.assert_array_equal(dsl.layout.nc1hwc0_to_nchw(x5, 40), x)
    # float layouts unchanged
    assert dsl.layout.nchw_to_5hd(x.astype(np.float32)).shape == (2, 3, 3, 1, 16)


@pytest.mark.parametrize("extra,param", [
    ({"res_dtype": "float32"}, "res_dtype"),
    ({"res_dtype": "int32", "offset_x": 128}, "offset_x"),
    ({"res_dtype": "int32", "offset_w": 1}, "offset_w"),
])
def test_int8_bad_para_refused(extra, param):
    from tvm import te
    dy = te.placeholder((1, 1, 5, 5, 32), name="dy", dtype="int8")
    w = te.placeholder((9, 1, 16, 32), name="w", dtype="int8")
    with pytest.raises(dsl.DslError, match=param):
        dsl.conv2d_backprop_input(w, dy, (16, 16, 3, 3), (1, 16, 7, 7), extra)


def test_float_refuses_int32_result():
    from tvm import te
    dy = te.placeholder((1, 1, 5, 5, 16), name="dy", dtype="float32")
    w = te.placeholder((9, 1, 16, 16), name="w", dtype="float32")
    with pytest.raises(dsl.DslError, match="res_dtype"):
        dsl.conv2d_backprop_input(w, dy, (16, 16, 3, 3), (1, 16, 7, 7), {"res_dtype": "int32"})
