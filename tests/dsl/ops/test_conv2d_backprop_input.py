"""dx through the built .so against the float64 reference (and PyTorch when installed)."""

import numpy as np
import pytest

import dsl
from dsl import tvm

from cases import CONV_CASES
from helpers import (
    HAVE_TORCH,
    assert_close,
    case_id,
    dx_data,
    dx_kernel,
    nc1hwc0_to_nchw,
    nchw_to_5hd,
    weight_to_fracz,
)
from reference import conv2d_backprop_input as ref_dx


def run_dx(c, dtype, res_dtype, target=None):
    dy, w = dx_data(c, dtype)
    kernel = dx_kernel(c, dtype, res_dtype, target)
    out5 = kernel(weight_to_fracz(w, c["groups"]), nchw_to_5hd(dy))
    ref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"], c["dil"],
                 c["groups"])
    assert out5.dtype == np.dtype(res_dtype)
    flat = np.moveaxis(out5, -1, 2).reshape(out5.shape[0], -1, *out5.shape[2:4])
    assert not flat[:, c["cin"]:].any(), "pad channels must be zero"
    return nc1hwc0_to_nchw(out5, c["cin"]), ref, dy, w


@pytest.mark.parametrize("c", CONV_CASES, ids=case_id)
@pytest.mark.parametrize("dtype,res_dtype", [("float16", "float32"), ("float32", "float32")])
def test_dx_matches_reference(c, dtype, res_dtype):
    out, ref, _, _ = run_dx(c, dtype, res_dtype)
    assert_close(out, ref, res_dtype, case_id(c))


@pytest.mark.parametrize("c", CONV_CASES[:4] + CONV_CASES[8:9], ids=case_id)
def test_dx_float16_result(c):
    out, ref, _, _ = run_dx(c, "float16", "float16")
    assert_close(out, ref, "float16", case_id(c))


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch not installed")
@pytest.mark.parametrize("c", [CONV_CASES[i] for i in (2, 3, 7, 8)], ids=case_id)
def test_dx_matches_torch(c):
    import torch
    out, _, dy, w = run_dx(c, "float32", "float32")
    pt, pb, pl, pr = c["pads"]
    x = torch.zeros((c["n"], c["cin"], c["h"], c["w"]), dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.conv2d(torch.nn.functional.pad(x, (pl, pr, pt, pb)),
                                   torch.tensor(w, dtype=torch.float64), stride=c["stride"],
                                   dilation=c["dil"], groups=c["groups"])
    y.backward(torch.tensor(dy, dtype=torch.float64))
    assert_close(out, x.grad.numpy(), "float32", "torch " + case_id(c))


def _placeholders(dy_shape=(1, 1, 7, 7, 16), fz_shape=(1, 1, 16, 16), dtype="float16"):
    return (tvm.placeholder(fz_shape, name="filters", dtype=dtype),
            tvm.placeholder(dy_shape, name="out_backprop", dtype=dtype))


BAD = [
    ({"strides": [0, 1]}, "E60011", "strides"),
    ({"strides": [1]}, "E60003", "strides"),
    ({"padding": [0, 0, -1, 0]}, "E60011", "padding"),
    ({"dilations": [2, 1, 1, 1]}, "E60011", "dilations"),
    ({"res_dtype": "int8"}, "E60006", "res_dtype"),
    ({"offset_x": 3}, "E60011", "offset_x"),
    ({"offset_w": 1}, "E60012", "offset_w"),
    ({"stride": [1, 1]}, "E60012", "stride"),
    ({"kernel_name": "../evil"}, "E60030", "kernel_name"),
    ({"strides": [True, 1]}, "E60005", "strides"),
    ({"group_dict": {"groups": 1}}, "E60108", "group_dict"),
]


@pytest.mark.parametrize("extra,code,param", BAD, ids=[b[2] + "-" + b[1] for b in BAD])
def test_dx_bad_para_dict(extra, code, param):
    w, dy = _placeholders()
    with pytest.raises(dsl.DslError) as e:
        dsl.conv2d_backprop_input(w, dy, (16, 16, 1, 1), (1, 16, 7, 7), extra)
    assert e.value.code == code and param in e.value.param, str(e.value)
    assert isinstance(e.value, RuntimeError)


def test_dx_geometry_errors():
    w, dy = _placeholders(dy_shape=(1, 1, 6, 7, 16))
    with pytest.raises(dsl.DslError) as e:
        dsl.conv2d_backprop_input(w, dy, (16, 16, 1, 1), (1, 16, 7, 7), {})
    assert e.value.code == "E60024" and "= 7" in str(e.value)
    w, dy = _placeholders()
    with pytest.raises(dsl.DslError) as e:  # Cin != filter C * groups
        dsl.conv2d_backprop_input(w, dy, (16, 16, 1, 1), (1, 32, 7, 7), {"groups": 1})
    assert e.value.code == "E60002"
    w, dy = _placeholders(dtype="float32")
    w16, _ = _placeholders()
    with pytest.raises(dsl.DslError) as e:
        dsl.conv2d_backprop_input(w16, dy, (16, 16, 1, 1), (1, 16, 7, 7), {})
    assert e.value.code == "E65002"
    w, dy = _placeholders(fz_shape=(2, 1, 16, 16))
    with pytest.raises(dsl.DslError) as e:
        dsl.conv2d_backprop_input(w, dy, (16, 16, 1, 1), (1, 16, 7, 7), {})
    assert e.value.code == "E60002" and "filters.shape" in e.value.param
    w, dy = _placeholders()
    with pytest.raises(dsl.DslError) as e:
        dsl.conv2d_backprop_input(w, dy, (16, 16, 9, 9), (1, 16, 7, 7), {})
    assert e.value.code in ("E60025", "E60002")


def test_dx_wrong_group_dict_rejected():
    from dsl.ops.group import calculate_group
    gd = calculate_group((1, 32, 6, 6), (1, 32, 6, 6), (32, 4, 3, 3), 8)
    fz = dsl.layout.GroupLayout.from_weight((32, 4, 3, 3), 8).fracz_shape
    w, dy = _placeholders(dy_shape=(1, 2, 6, 6, 16), fz_shape=fz)
    p = {"padding": [1, 1, 1, 1], "group_dict": gd}
    dsl.conv2d_backprop_input(w, dy, (32, 4, 3, 3), (1, 32, 6, 6), p)  # the right one passes
    bad = dict(gd, multiple_extend=2)
    with pytest.raises(dsl.DslError) as e:
        dsl.conv2d_backprop_input(w, dy, (32, 4, 3, 3), (1, 32, 6, 6), {**p, "group_dict": bad})
    assert e.value.code == "E60108" and "multiple_extend" in e.value.param
