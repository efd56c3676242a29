"""dw through the built .so against the float64 reference (and PyTorch when installed)."""

import numpy as np
import pytest

import dsl
from dsl import tvm
from dsl.ops.layout import fracz_to_weight

from cases import CONV_CASES
from helpers import (
    HAVE_TORCH,
    assert_close,
    case_id,
    dw_data,
    dw_kernel,
    nchw_to_5hd,
    weight_to_fracz,
)
from reference import conv2d_backprop_filter as ref_dw


def run_dw(c, dtype, res_dtype, target=None):
    x, dy = dw_data(c, dtype)
    kernel = dw_kernel(c, dtype, res_dtype, target)
    out = kernel(nchw_to_5hd(x), nchw_to_5hd(dy))
    w_shape = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    ref = ref_dw(x, dy, w_shape, c["stride"], c["pads"], c["dil"], c["groups"])
    assert out.dtype == np.dtype(res_dtype)
    # everything outside the weight's own positions (cross-group, pad channels) is exactly 0
    mask = weight_to_fracz(np.ones(w_shape, np.float32), c["groups"]) != 0
    assert not out[~mask].any(), "cross-group / pad positions must be exactly zero"
    return fracz_to_weight(out, w_shape, c["groups"]), ref, x, dy


@pytest.mark.parametrize("c", CONV_CASES, ids=case_id)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_dw_matches_reference(c, dtype):
    out, ref, _, _ = run_dw(c, dtype, "float32")
    assert_close(out, ref, "float32", case_id(c))


@pytest.mark.parametrize("c", CONV_CASES[1:3], ids=case_id)
def test_dw_float16_result(c):
    out, ref, _, _ = run_dw(c, "float16", "float16")
    assert_close(out, ref, "float16", case_id(c))


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch not installed")
@pytest.mark.parametrize("c", [CONV_CASES[i] for i in (3, 7, 8, 9)], ids=case_id)
def test_dw_matches_torch(c):
    import torch
    out, _, x, dy = run_dw(c, "float32", "float32")
    pt, pb, pl, pr = c["pads"]
    w_shape = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    w = torch.zeros(w_shape, dtype=torch.float64, requires_grad=True)
    xp = torch.nn.functional.pad(torch.tensor(x, dtype=torch.float64), (pl, pr, pt, pb))
    y = torch.nn.functional.conv2d(xp, w, stride=c["stride"], dilation=c["dil"],
                                   groups=c["groups"])
    y.backward(torch.tensor(dy, dtype=torch.float64))
    assert_close(out, w.grad.numpy(), "float32", "torch " + case_id(c))


def test_dw_errors():
    x = tvm.placeholder((1, 1, 7, 7, 16), name="fmap", dtype="float16")
    dy = tvm.placeholder((1, 1, 7, 7, 16), name="dy", dtype="float16")
    with pytest.raises(dsl.DslError) as e:
        dsl.conv2d_backprop_filter(x, dy, (16, 16, 1, 1), {"groups": 0})
    assert e.value.code == "E60108" and "groups" in e.value.param
    with pytest.raises(dsl.DslError) as e:
        dsl.conv2d_backprop_filter(x, dy, (16, 8, 1, 1), {"groups": 3})
    assert e.value.code in ("E60002", "E60108")
    dy32 = tvm.placeholder((1, 1, 7, 7, 16), name="dy", dtype="float32")
    with pytest.raises(dsl.DslError) as e:
        dsl.conv2d_backprop_filter(x, dy32, (16, 16, 1, 1), {})
    assert e.value.code == "E65002"
    with pytest.raises(dsl.DslError) as e:
        dsl.conv2d_backprop_filter(x, dy, (16, 16, 3, 3), {"strides": [2, 2]})
    assert e.value.code == "E60024"
    with pytest.raises(dsl.DslError) as e:
        dsl.conv2d_backprop_filter(x, dy, (16, 16, 1, 1), {"groups": True})
    assert e.value.code == "E60005"
