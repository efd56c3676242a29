"""Layout packers: round trips, the index maps of the issue, and TE kernels equal to numpy."""

import numpy as np
import pytest

import dsl
from dsl import kernel_cache, layout
from dsl import tvm as dtvm


@pytest.mark.parametrize("shape", [(2, 20, 3, 5), (1, 16, 4, 4), (3, 5, 2, 7, 3)])
def test_5hd_round_trip_and_index_map(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    x5 = layout.nchw_to_5hd(x)
    n, c = shape[:2]
    assert x5.shape == (n, -(-c // 16), *shape[2:], 16)
    for ch in range(c):
        np.testing.assert_array_equal(x5[:, ch // 16, ..., ch % 16], x[:, ch])
    flat = np.moveaxis(x5, -1, 2).reshape(n, -1, *shape[2:])
    assert not flat[:, c:].any()
    np.testing.assert_array_equal(layout.nc1hwc0_to_nchw(x5, c), x)


@pytest.mark.parametrize("w_shape,groups", [((20, 35, 2, 3), 1), ((320, 3, 2, 2), 32),
                                            ((32, 1, 3, 3), 32), ((30, 2, 1, 3), 3)])
def test_fracz_matches_issue_index_map(w_shape, groups):
    w = np.random.default_rng(1).standard_normal(w_shape).astype("float32")
    fz = layout.weight_to_fracz(w, groups)
    lay = layout.GroupLayout.from_weight(w_shape, groups)
    cout, cin_g, kh, kw = w_shape
    cout_g, e_mult = cout // groups, lay.multiple_extend
    # the issue's 6-D definition, written out directly
    six = fz.reshape(lay.g_extend, lay.dx_c1e, kh, kw, lay.dy_c1e * 16, 16)
    expect = np.zeros_like(six)
    for g in range(groups):
        ge, e = divmod(g, e_mult)
        for ci in range(cin_g):
            for co in range(cout_g):
                cx = e * cin_g + ci
                expect[ge, cx // 16, :, :, e * cout_g + co, cx % 16] = w[g * cout_g + co, ci]
    np.testing.assert_array_equal(six, expect)
    np.testing.assert_array_equal(layout.fracz_to_weight(fz, w_shape, groups), w)


def _te_kernel(sig, make):
    return kernel_cache.get_kernel(sig, make, prefix="t_layout")


@pytest.mark.parametrize("w_shape,groups", [((20, 35, 2, 3), 1), ((32, 1, 3, 3), 32),
                                            ((30, 2, 1, 3), 3)])
def test_te_layout_kernels_equal_numpy(w_shape, groups):
    w = np.random.default_rng(2).standard_normal(w_shape).astype("float16")

    def make_to():
        t = dtvm.placeholder(w_shape, name="w", dtype="float16")
        return [t], [layout.weight_to_fracz_compute(t, groups)]

    fz = _te_kernel({"op": "to_fracz", "w": w_shape, "g": groups}, make_to)(w)
    np.testing.assert_array_equal(fz, layout.weight_to_fracz(w, groups))

    def make_from():
        t = dtvm.placeholder(fz.shape, name="fz", dtype="float16")
        return [t], [layout.fracz_to_weight_compute(t, w_shape, groups)]

    back = _te_kernel({"op": "from_fracz", "w": w_shape, "g": groups}, make_from)(fz)
    np.testing.assert_array_equal(back, w)


@pytest.mark.parametrize("shape", [(2, 20, 3, 5), (1, 32, 7, 7)])
def test_te_5hd_kernels_equal_numpy(shape):
    x = np.random.default_rng(3).standard_normal(shape).astype("float32")

    def make_to():
        t = dtvm.placeholder(shape, name="x", dtype="float32")
        return [t], [layout.nchw_to_5hd_compute(t)]

    x5 = _te_kernel({"op": "to_5hd", "s": shape}, make_to)(x)
    np.testing.assert_array_equal(x5, layout.nchw_to_5hd(x))

    def make_from():
        t = dtvm.placeholder(x5.shape, name="x5", dtype="float32")
        return [t], [layout.nc1hwc0_to_nchw_compute(t, shape[1])]

    np.testing.assert_array_equal(_te_kernel({"op": "from_5hd", "s": shape}, make_from)(x5), x)


def test_transdata_kernel_through_build(tmp_path):
    """A user builds a transdata kernel with the TBE workflow."""
    x = dtvm.placeholder((1, 20, 4, 4), name="x", dtype="float16")
    y = layout.nchw_to_5hd_compute(x)
    dsl.build(dsl.auto_schedule(y), {"name": "transdata", "tensor_list": [x, y],
                                     "kernel_meta_parent_dir": str(tmp_path)})
    a = np.arange(320, dtype="float16").reshape(1, 20, 4, 4)
    np.testing.assert_array_equal(dsl.load("transdata", tmp_path)(a), layout.nchw_to_5hd(a))


def test_layout_errors():
    with pytest.raises(dsl.DslError):
        layout.nc1hwc0_to_nchw(np.zeros((1, 1, 2, 2, 8)), 4)
    with pytest.raises(dsl.DslError):
        layout.fracz_to_weight(np.zeros((1, 1, 16, 16)), (16, 32, 1, 1))
    with pytest.raises(dsl.DslError):
        layout.weight_to_fracz(np.zeros((4, 4, 1)), 1)
