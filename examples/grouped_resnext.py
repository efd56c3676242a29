"""A ResNeXt block's grouped 3x3 convolution (32 groups of 4 channels): dx and dw.

Shows ``calculate_group`` producing the group_dict, the group-extended FracZ weight
(4 original groups share one 16-channel block), and both gradients built and checked.
"""

import time

import numpy as np

import dsl
from dsl import tvm
from dsl.layout import GroupLayout, fracz_to_weight, nc1hwc0_to_nchw, nchw_to_5hd, weight_to_fracz
from dsl.verify import dw_adjoint_error, dx_adjoint_error

N, C, H, W, K, GROUPS = 2, 128, 14, 14, 3, 32
STRIDES, PADS, DIL = (1, 1), (1, 1, 1, 1), (1, 1)


def main(kernel_meta_parent_dir=None) -> dict:
    w_sizes = (C, C // GROUPS, K, K)
    group_dict = dsl.calculate_group((N, C, H, W), (N, C, H, W), w_sizes, GROUPS)
    fz_shape = GroupLayout.from_weight(w_sizes, GROUPS).fracz_shape
    dy = tvm.placeholder((N, C // 16, H, W, 16), name="out_backprop", dtype="float16")
    filters = tvm.placeholder(fz_shape, name="filters", dtype="float16")
    fmap = tvm.placeholder((N, C // 16, H, W, 16), name="fmap", dtype="float16")
    common = {"strides": list(STRIDES), "padding": list(PADS), "dilations": [1, 1, *DIL]}
    dx = dsl.conv2d_backprop_input(filters, dy, w_sizes, (N, C, H, W),
                                   {**common, "group_dict": group_dict, "res_dtype": "float32",
                                    "kernel_name": "resnext_dx"})
    dw = dsl.conv2d_backprop_filter(fmap, dy, w_sizes,
                                    {**common, "groups": GROUPS, "kernel_name": "resnext_dw"})
    t0 = time.perf_counter()
    cfg = {"kernel_meta_parent_dir": kernel_meta_parent_dir}
    dsl.build(dsl.auto_schedule(dx), {**cfg, "name": "resnext_dx",
                                      "tensor_list": [filters, dy, dx]})
    dsl.build(dsl.auto_schedule(dw), {**cfg, "name": "resnext_dw",
                                      "tensor_list": [fmap, dy, dw]})
    build_s = time.perf_counter() - t0

    rng = np.random.default_rng(3)
    x_np = rng.uniform(-1, 1, (N, C, H, W)).astype("float16")
    dy_np = rng.uniform(-1, 1, (N, C, H, W)).astype("float16")
    w_np = rng.uniform(-1, 1, w_sizes).astype("float16")
    t0 = time.perf_counter()
    dx_np = dsl.load("resnext_dx", kernel_meta_parent_dir)(weight_to_fracz(w_np, GROUPS),
                                                            nchw_to_5hd(dy_np))
    dw_np = dsl.load("resnext_dw", kernel_meta_parent_dir)(nchw_to_5hd(x_np), nchw_to_5hd(dy_np))
    run_s = time.perf_counter() - t0
    err = max(dx_adjoint_error(nc1hwc0_to_nchw(dx_np, C), dy_np, w_np, STRIDES, PADS, DIL,
                               GROUPS),
              dw_adjoint_error(fracz_to_weight(dw_np, w_sizes, GROUPS), x_np, dy_np, STRIDES,
                               PADS, DIL, GROUPS))
    if err > 1e-5:
        raise RuntimeError(f"grouped_resnext: adjoint check failed, relative error {err:.3g}")
    return {"kernel": "resnext_dx+resnext_dw", "group_dict": group_dict, "build_s": build_s,
            "run_s": run_s, "error": err}


if __name__ == "__main__":
    print(main())
