"""Limits are those of the math and the CPU, not of the Ascend chip.

TBE refuses strides > 63 (its load3d instruction), pads and dilations > 255, and aclnn's
avg-pool more than 65535 channels; none of these is needed here. Each case builds at or past an
old bound on a small shape and matches the float64 reference; what is mathematically
inconsistent (an output of size < 1, sizes that disagree, non-positive strides) is still refused
before anything is built.
"""

import numpy as np
import pytest

import dsl
from dsl import tvm
from dsl.errors import E_GEOMETRY_IN, E_GEOMETRY_OUT, E_RANGE
from dsl.ops.layout import fracz_to_weight

from helpers import (
    assert_close,
    case_id,
    dw_data,
    dw_kernel,
    dx_data,
    dx_kernel,
    nc1hwc0_to_nchw,
    nchw_to_5hd,
    para,
    weight_to_fracz,
)
from reference import avg_pool2d_backward as ref_pool
from reference import conv2d_backprop_filter as ref_dw
from reference import conv2d_backprop_input as ref_dx


def _case(h, w, kh, kw, stride, pads=(0, 0, 0, 0), dil=(1, 1), n=2, cin=5, cout=7):
    return {"n": n, "cin": cin, "cout": cout, "h": h, "w": w, "kh": kh, "kw": kw,
            "stride": stride, "pads": pads, "dil": dil, "groups": 1}


BEYOND = [
    _case(127, 66, 3, 3, (63, 63)),  # at the old stride bound
    _case(130, 67, 3, 3, (64, 64)),  # just past it
    _case(205, 203, 3, 2, (100, 100), pads=(1, 0, 0, 1)),
    _case(301, 4, 2, 1, (150, 1)),  # stride past the kernel: rows no tap reads
    _case(3, 4, 3, 2, (2, 1), pads=(255, 256, 256, 300), n=1),  # pads past 255
    _case(260, 302, 2, 2, (1, 1), dil=(256, 300), n=1),  # dilations past 255
]


@pytest.mark.parametrize("c", BEYOND, ids=case_id)
def test_dx_beyond_the_chip_limits_matches_reference(c):
    dy, w = dx_data(c, "float32")
    out5 = dx_kernel(c, "float32", "float32")(weight_to_fracz(w), nchw_to_5hd(dy))
    ref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"], c["dil"], 1)
    assert_close(nc1hwc0_to_nchw(out5, c["cin"]), ref, "float32", case_id(c))


@pytest.mark.parametrize("c", BEYOND, ids=case_id)
def test_dw_beyond_the_chip_limits_matches_reference(c):
    x, dy = dw_data(c, "float32")
    out = dw_kernel(c, "float32", "float32")(nchw_to_5hd(x), nchw_to_5hd(dy))
    w_shape = (c["cout"], c["cin"], c["kh"], c["kw"])
    ref = ref_dw(x, dy, w_shape, c["stride"], c["pads"], c["dil"], 1)
    assert_close(fracz_to_weight(out, w_shape), ref, "float32", case_id(c))


def test_aclnn_convolution_backward_with_stride_100_matches_reference():
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (2, 3, 205, 9)).astype("float32")
    w = rng.uniform(-1, 1, (4, 3, 3, 2)).astype("float32")
    go = rng.uniform(-1, 1, (2, 4, 3, 8)).astype("float32")
    gi, gw, _ = dsl.aclnn.convolution_backward(
        go, x, w, None, [100, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False], 0)
    ref_i = ref_dx(go, w, x.shape, (100, 1), (0, 0, 0, 0), (1, 1), 1)
    ref_w = ref_dw(x, go, w.shape, (100, 1), (0, 0, 0, 0), (1, 1), 1)
    assert_close(gi, ref_i, "float32", "grad_input")
    assert_close(gw, ref_w, "float32", "grad_weight")


def test_avg_pool_with_more_than_65535_channels_matches_reference():
    rng = np.random.default_rng(4)
    x = np.zeros((1, 70001, 3, 2), "float32")
    dy = rng.uniform(-1, 1, (1, 70001, 2, 1)).astype("float32")
    gx = dsl.aclnn.avg_pool2d_backward(dy, x, [2, 2], [1, 1], [0, 0], False, True, 0)
    ref = ref_pool(dy, x.shape, (2, 2), (1, 1), (0, 0), False, True, 0)
    assert_close(gx, ref, "float32", "avg_pool 70001 channels")


def _dx_call(c, dy_hw=None):
    from helpers import out_hw

    ho, wo = dy_hw or out_hw(c)
    w_sizes = (c["cout"], c["cin"], c["kh"], c["kw"])
    fz = dsl.layout.GroupLayout.from_weight(w_sizes, 1).fracz_shape
    dy = tvm.placeholder((c["n"], 1, ho, wo, 16), name="out_backprop", dtype="float32")
    w = tvm.placeholder(fz, name="filters", dtype="float32")
    return dsl.conv2d_backprop_input(w, dy, w_sizes, (c["n"], c["cin"], c["h"], c["w"]),
                                     para(c, res_dtype="float32"))


@pytest.mark.parametrize("c,dy_hw,code,param", [
    # a large stride does not excuse a dy of the wrong size
    (_case(205, 203, 3, 2, (100, 100)), (3, 2), E_GEOMETRY_IN, "out_backprop W"),
    # a dilated kernel longer than the padded input: no output row at all
    (_case(255, 4, 2, 1, (1, 1), dil=(256, 1)), (1, 4), E_GEOMETRY_OUT, "kernel H"),
    (_case(3, 4, 3, 2, (1, 1), pads=(0, 0, 0, 0)), (2, 3), E_GEOMETRY_IN, "out_backprop H"),
    (_case(5, 5, 3, 3, (0, 1)), (3, 3), E_RANGE, "para_dict['strides'][0]"),
    (_case(5, 5, 3, 3, (2**31, 1)), (1, 3), E_RANGE, "para_dict['strides'][0]"),
    (_case(5, 5, 3, 3, (1, 1), pads=(-1, 0, 0, 0)), (2, 3), E_RANGE, "para_dict['padding'][0]"),
    (_case(5, 5, 3, 3, (1, 1), dil=(0, 1)), (3, 3), E_RANGE, "para_dict['dilations'][2]"),
])
def test_inconsistent_geometry_is_still_refused(c, dy_hw, code, param):
    with pytest.raises(dsl.DslError) as e:
        _dx_call(c, dy_hw)
    assert (e.value.code, e.value.param) == (code, param)
