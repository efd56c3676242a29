"""A MobileNet depthwise 3x3 stride-2 convolution (groups = channels = 48): dx and dw.

Depthwise is the extreme group case: 16 original groups share one extended group
(``multiple_extend = 16``); the kernels still do no cross-group work.
"""

import time

import numpy as np

import dsl
from dsl import tvm
from dsl.layout import GroupLayout, fracz_to_weight, nc1hwc0_to_nchw, nchw_to_5hd, weight_to_fracz
from dsl.verify import dw_adjoint_error, dx_adjoint_error

N, C, H, W, K = 1, 48, 28, 28, 3
STRIDES, PADS, DIL = (2, 2), (1, 1, 1, 1), (1, 1)
HO = WO = (H + 2 - K) // 2 + 1


def main(kernel_meta_parent_dir=None) -> dict:
    w_sizes = (C, 1, K, K)
    fz_shape = GroupLayout.from_weight(w_sizes, C).fracz_shape
    c1 = -(-C // 16)
    dy = tvm.placeholder((N, c1, HO, WO, 16), name="out_backprop", dtype="float32")
    filters = tvm.placeholder(fz_shape, name="filters", dtype="float32")
    fmap = tvm.placeholder((N, c1, H, W, 16), name="fmap", dtype="float32")
    common = {"strides": list(STRIDES), "padding": list(PADS), "dilations": [1, 1, *DIL]}
    dx = dsl.conv2d_backprop_input(filters, dy, w_sizes, (N, C, H, W),
                                   {**common, "res_dtype": "float32"})  # group_dict derived
    dw = dsl.conv2d_backprop_filter(fmap, dy, w_sizes, {**common, "groups": C})
    t0 = time.perf_counter()
    cfg = {"kernel_meta_parent_dir": kernel_meta_parent_dir}
    dsl.build(dsl.auto_schedule(dx), {**cfg, "name": "depthwise_dx",
                                      "tensor_list": [filters, dy, dx]})
    dsl.build(dsl.auto_schedule(dw), {**cfg, "name": "depthwise_dw",
                                      "tensor_list": [fmap, dy, dw]})
    build_s = time.perf_counter() - t0

    rng = np.random.default_rng(4)
    x_np = rng.uniform(-1, 1, (N, C, H, W)).astype("float32")
    dy_np = rng.uniform(-1, 1, (N, C, HO, WO)).astype("float32")
    w_np = rng.uniform(-1, 1, w_sizes).astype("float32")
    t0 = time.perf_counter()
    dx_np = dsl.load("depthwise_dx", kernel_meta_parent_dir)(weight_to_fracz(w_np, C),
                                                              nchw_to_5hd(dy_np))
    dw_np = dsl.load("depthwise_dw", kernel_meta_parent_dir)(nchw_to_5hd(x_np),
                                                              nchw_to_5hd(dy_np))
    run_s = time.perf_counter() - t0
    err = max(dx_adjoint_error(nc1hwc0_to_nchw(dx_np, C), dy_np, w_np, STRIDES, PADS, DIL, C),
              dw_adjoint_error(fracz_to_weight(dw_np, w_sizes, C), x_np, dy_np, STRIDES, PADS,
                               DIL, C))
    if err > 1e-5:
        raise RuntimeError(f"depthwise: adjoint check failed, relative error {err:.3g}")
    return {"kernel": "depthwise_dx+depthwise_dw", "build_s": build_s, "run_s": run_s,
            "error": err}


if __name__ == "__main__":
    print(main())
