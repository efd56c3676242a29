"""Every target's dx / dw / layout kernels, built with their default schedules and checked
against the float64 references (all targets run on an AVX-512 machine; others skip)."""

import numpy as np
import pytest

import targets
from dsl.ops.layout import fracz_to_weight, nc1hwc0_to_nchw, nchw_to_5hd, weight_to_fracz

from cases import CONV_CASES, C
from helpers import assert_close, case_id, dw_data, dw_kernel, dx_data, dx_kernel
from reference import conv2d_backprop_filter as ref_dw
from reference import conv2d_backprop_input as ref_dx

# Small, but each hits a different schedule path: channel tails, a width that no register
# tile divides, stride-phase blocks (one phase with no taps), dilation, groups, depthwise.
CASES = [
    CONV_CASES[1],                                    # C % 16 != 0, batch 2
    C(1, 32, 48, 5, 23, 3, 1, (1, 1, 1, 1), 1, 1),    # W = 23: ragged register tile
    C(1, 32, 16, 9, 13, 1, 2, (0, 0, 0, 0), 1, 1),    # 1x1 s2: odd phases get no tap
    CONV_CASES[3],                                    # stride 3, dilation 2
    CONV_CASES[7],                                    # ResNeXt-like grouped
    CONV_CASES[8],                                    # depthwise stride 2
    CONV_CASES[10],                                   # Cin_g 3, Cout_g 5
]
NAMES = targets.names()


def _target(name):
    tgt = targets.get(name)
    if not targets.runnable(tgt):
        pytest.skip(f"this machine cannot run {name}")
    return tgt


@pytest.mark.parametrize("c", CASES, ids=case_id)
@pytest.mark.parametrize("name", NAMES)
def test_dx_every_target(name, c):
    tgt = _target(name)
    dtype = "float16" if c is CASES[0] else "float32"
    dy, w = dx_data(c, dtype)
    out5 = dx_kernel(c, dtype, "float32", tgt.name)(weight_to_fracz(w, c["groups"]),
                                                    nchw_to_5hd(dy))
    ref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"], c["dil"],
                 c["groups"])
    flat = np.moveaxis(out5, -1, 2).reshape(out5.shape[0], -1, *out5.shape[2:4])
    assert not flat[:, c["cin"]:].any(), "pad channels must be zero"
    assert_close(nc1hwc0_to_nchw(out5, c["cin"]), ref, "float32", f"{name} {case_id(c)}")


@pytest.mark.parametrize("c", CASES, ids=case_id)
@pytest.mark.parametrize("name", NAMES)
def test_dw_every_target(name, c):
    tgt = _target(name)
    dtype = "float16" if c is CASES[0] else "float32"
    x, dy = dw_data(c, dtype)
    out = dw_kernel(c, dtype, "float32", tgt.name)(nchw_to_5hd(x), nchw_to_5hd(dy))
    w_shape = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    mask = weight_to_fracz(np.ones(w_shape, np.float32), c["groups"]) != 0
    assert not out[~mask].any(), "cross-group / pad positions must be exactly zero"
    ref = ref_dw(x, dy, w_shape, c["stride"], c["pads"], c["dil"], c["groups"])
    assert_close(fracz_to_weight(out, w_shape, c["groups"]), ref, "float32",
                 f"{name} {case_id(c)}")


@pytest.mark.parametrize("name", NAMES)
def test_layout_kernels_every_target(name):
    from tvm import te

    from dsl import kernel_cache, layout

    tgt = _target(name)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 20, 5, 7)).astype(np.float32)
    w = rng.standard_normal((12, 3, 3, 2)).astype(np.float32)

    x5, fz = nchw_to_5hd(x), weight_to_fracz(w, 4)

    def one(inp, fn):
        def make():
            t = te.placeholder(inp.shape, name="src", dtype="float32")
            return [t], [fn(t)]
        return make

    makers = {
        "to_5hd": (x, layout.nchw_to_5hd_compute, x5),
        "from_5hd": (x5, lambda t: layout.nc1hwc0_to_nchw_compute(t, x.shape[1]), x),
        "to_fracz": (w, lambda t: layout.weight_to_fracz_compute(t, groups=4), fz),
        "from_fracz": (fz, lambda t: layout.fracz_to_weight_compute(t, w.shape, 4), w),
    }
    for kind, (inp, fn, want) in makers.items():
        kernel = kernel_cache.get_kernel({"layout": kind, "shape": inp.shape}, one(inp, fn),
                                         prefix="t_layout", target=tgt)
        np.testing.assert_array_equal(kernel(inp), want, err_msg=f"{name} {kind}")
