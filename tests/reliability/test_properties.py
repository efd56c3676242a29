"""Property-based correctness: random valid configurations against the float64 references.

Every kernel is built through ``helpers.dx_kernel`` / ``dw_kernel`` (cached by signature, on
disk under ``DSL_CACHE_DIR``), so a CI run only compiles the configurations it has not met.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from rel_strategies import budget, conv_configs, dtypes, weight_shapes

import dsl
from dsl import kernel_cache, layout
from dsl.compute import cube_util

from helpers import (
    assert_close,
    assert_nonfinite_positions,
    dw_data,
    dw_kernel,
    dx_data,
    dx_kernel,
    out_hw,
    rand,
)
from reference import conv2d_backprop_filter as ref_dw
from reference import conv2d_backprop_input as ref_dx


def _w_shape(c):
    return (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])


def _run_dx(c, dtype, res, dy, w):
    out5 = dx_kernel(c, dtype, res)(layout.weight_to_fracz(w, c["groups"]),
                                    layout.nchw_to_5hd(dy))
    assert out5.dtype == np.dtype(res)
    flat = np.moveaxis(out5, -1, 2).reshape(out5.shape[0], -1, *out5.shape[2:4])
    assert not flat[:, c["cin"]:].any(), "pad channels of dx must be zero"
    ref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"], c["dil"],
                 c["groups"])
    return layout.nc1hwc0_to_nchw(out5, c["cin"]), ref


def _run_dw(c, dtype, res, x, dy):
    fz = dw_kernel(c, dtype, res)(layout.nchw_to_5hd(x), layout.nchw_to_5hd(dy))
    assert fz.dtype == np.dtype(res)
    out = layout.fracz_to_weight(fz, _w_shape(c), c["groups"])
    # every FracZ position outside the weight map (pad channels, cross-group) is exactly zero
    np.testing.assert_array_equal(fz, layout.weight_to_fracz(out, c["groups"]))
    ref = ref_dw(x, dy, _w_shape(c), c["stride"], c["pads"], c["dil"], c["groups"])
    return out, ref


@settings(max_examples=budget(40, 400))
@given(c=conv_configs(), dtype=dtypes, res=dtypes, seed=st.integers(0, 2**16))
def test_dx_matches_reference(c, dtype, res, seed):
    dy, w = dx_data(c, dtype, seed)
    out, ref = _run_dx(c, dtype, res, dy, w)
    assert_close(out, ref, res, str(c))


@settings(max_examples=budget(40, 400))
@given(c=conv_configs(), dtype=dtypes, res=dtypes, seed=st.integers(0, 2**16))
def test_dw_matches_reference(c, dtype, res, seed):
    x, dy = dw_data(c, dtype, seed)
    out, ref = _run_dw(c, dtype, res, x, dy)
    assert_close(out, ref, res, str(c))


def _same_nonfinite(out, ref, what):
    out, fin = assert_nonfinite_positions(out, ref, what)
    assert_close(np.where(fin, out, 0), np.where(fin, ref, 0), "float32", what)


_SPECIAL = st.sampled_from([np.nan, np.inf, -np.inf])


@settings(max_examples=budget(20, 200))
@given(c=conv_configs(max_ch=24, max_hw=9), value=_SPECIAL, data=st.data())
def test_dx_nonfinite_dy_propagates_like_ieee(c, value, data):
    """A NaN / inf in dy reaches exactly the dx positions the math says, nothing else."""
    dy, w = dx_data(c, "float32", 1)
    pos = tuple(data.draw(st.integers(0, s - 1)) for s in dy.shape)
    dy[pos] = value
    out, ref = _run_dx(c, "float32", "float32", dy, w)
    _same_nonfinite(out, ref, f"{c} dy{pos}={value}")


@settings(max_examples=budget(20, 200))
@given(c=conv_configs(max_ch=24, max_hw=9), value=_SPECIAL, into_x=st.booleans(),
       data=st.data())
def test_dw_nonfinite_propagates_like_ieee(c, value, into_x, data):
    x, dy = dw_data(c, "float32", 2)
    target = x if into_x else dy
    pos = tuple(data.draw(st.integers(0, s - 1)) for s in target.shape)
    target[pos] = value
    out, ref = _run_dw(c, "float32", "float32", x, dy)
    _same_nonfinite(out, ref, f"{c} {'x' if into_x else 'dy'}{pos}={value}")


# --- layouts and group_dict (numpy only: many examples cost little) ---------------------------

@settings(max_examples=budget(150, 3000))
@given(n=st.integers(1, 3), c=st.integers(1, 70),
       spatial=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       dtype=st.sampled_from(["float16", "float32", "float64", "int8", "int32"]))
def test_5hd_round_trip(n, c, spatial, dtype):
    x = rand(np.random.default_rng(c), (n, c, *spatial), "float32")
    x = (x * 100).astype(dtype)
    x5 = layout.nchw_to_5hd(x)
    c0 = 32 if dtype == "int8" else 16  # TBE's CUBE_MKN int8 k0
    assert x5.shape == (n, -(-c // c0), *spatial, c0) and x5.dtype == x.dtype
    assert x5.flags.c_contiguous
    flat = np.moveaxis(x5, -1, 2).reshape(n, -1, *spatial)
    assert not flat[:, c:].any()
    np.testing.assert_array_equal(layout.nc1hwc0_to_nchw(x5, c), x)


@settings(max_examples=budget(150, 3000))
@given(ws=weight_shapes())
def test_fracz_is_an_injective_map_matching_calculate_group(ws):
    w_shape, groups = ws
    cout, cin_g, kh, kw = w_shape
    w = np.arange(1, int(np.prod(w_shape)) + 1, dtype=np.float64).reshape(w_shape)
    fz = layout.weight_to_fracz(w, groups)
    gd = dsl.calculate_group((1, cout, 1, 1), (1, cin_g * groups, 1, 1), w_shape, groups)
    assert fz.shape == (gd["g_extend"] * gd["dx_c1_extend"] * kh * kw, gd["dy_c1_extend"],
                        16, 16)
    # every weight lands in its own slot: no collisions, nothing dropped, the rest zero
    assert np.count_nonzero(fz) == w.size and sorted(fz[fz != 0]) == sorted(w.ravel())
    np.testing.assert_array_equal(layout.fracz_to_weight(fz, w_shape, groups), w)


@settings(max_examples=budget(200, 4000))
@given(ws=weight_shapes(max_ch=200), n=st.integers(1, 4), hw=st.integers(1, 9))
def test_calculate_group_invariants(ws, n, hw):
    (cout, cin_g, kh, kw), groups = ws
    args = ((n, cout, hw, hw), (n, cin_g * groups, hw, hw))
    gd = dsl.calculate_group(*args, (cout, cin_g, kh, kw), groups)
    e, g_ext = gd["multiple_extend"], gd["g_extend"]
    assert 1 <= e <= groups and (g_ext - 1) * e < groups <= g_ext * e
    assert gd["dx_c1_extend"] * 16 >= e * cin_g and gd["dy_c1_extend"] * 16 >= e * (
        cout // groups)
    assert gd == cube_util.calculate_group(*args, (cout, cin_g, kh, kw), groups)
    for fmt, perm in (("NHWC", (0, 2, 3, 1)), ("HWCN", (2, 3, 1, 0))):
        shaped = tuple((cout, cin_g, kh, kw)[i] for i in perm)
        other = dsl.calculate_group(*args, shaped, groups, filter_ori_format=fmt)
        assert {**other, "filter_ori_format": "NCHW"} == gd


# --- the TE layout computes build into kernels equal to the numpy packers ---------------------

def _layout_kernel(sig, make):
    return kernel_cache.get_kernel({"rel_layout": sig}, make, prefix="rel_layout")


@settings(max_examples=budget(6, 60))
@given(n=st.integers(1, 2), c=st.integers(1, 40), h=st.integers(1, 5), w=st.integers(1, 5),
       dtype=dtypes)
def test_te_5hd_computes_match_numpy(n, c, h, w, dtype):
    from tvm import te

    def make():
        x = te.placeholder((n, c, h, w), name="x", dtype=dtype)
        return [x], [layout.nchw_to_5hd_compute(x)]

    def make_back():
        x5 = te.placeholder((n, -(-c // 16), h, w, 16), name="x5", dtype=dtype)
        return [x5], [layout.nc1hwc0_to_nchw_compute(x5, c)]

    x = rand(np.random.default_rng(c), (n, c, h, w), dtype)
    x5 = _layout_kernel(("5hd", n, c, h, w, dtype), make)(x)
    np.testing.assert_array_equal(x5, layout.nchw_to_5hd(x))
    back = _layout_kernel(("nchw", n, c, h, w, dtype), make_back)(x5)
    np.testing.assert_array_equal(back, x)


@settings(max_examples=budget(6, 60))
@given(ws=weight_shapes(max_ch=40), dtype=dtypes)
def test_te_fracz_computes_match_numpy(ws, dtype):
    from tvm import te

    w_shape, groups = ws
    fz_shape = dsl.layout.GroupLayout.from_weight(w_shape, groups).fracz_shape

    def make():
        w = te.placeholder(w_shape, name="w", dtype=dtype)
        return [w], [layout.weight_to_fracz_compute(w, groups)]

    def make_back():
        fz = te.placeholder(fz_shape, name="fz", dtype=dtype)
        return [fz], [layout.fracz_to_weight_compute(fz, w_shape, groups)]

    w = rand(np.random.default_rng(groups), w_shape, dtype)
    fz = _layout_kernel(("fracz", w_shape, groups, dtype), make)(w)
    np.testing.assert_array_equal(fz, layout.weight_to_fracz(w, groups))
    back = _layout_kernel(("weight", w_shape, groups, dtype), make_back)(fz)
    np.testing.assert_array_equal(back, w)


def test_out_hw_helper_agrees_with_geometry():
    """The strategies rely on helpers.out_hw; pin it to the library's own geometry."""
    from dsl.ops.conv_geometry import ConvAxis

    c = {"h": 9, "w": 7, "kh": 3, "kw": 2, "stride": (2, 3), "pads": (1, 0, 2, 1),
         "dil": (2, 1)}
    assert out_hw(c) == (ConvAxis.out_size(9, 3, 2, 1, 0, 2), ConvAxis.out_size(7, 2, 3, 2, 1, 1))
