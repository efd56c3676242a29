"""Seed 003's example of conv2d_backprop_filter, ported by changing only its import lines.

The seed's code runs unchanged at module level; ``main()`` builds, runs and checks it.
"""

import time

import numpy as np

# --- the seed example; only the two import lines differ (was: from tbe import tvm, dsl) -----
# isort: off
from dsl import tvm
import dsl
# isort: on

out_backprop_shape = (1, 1, 7, 7, 16)
out_backprop_dtype = "float16"
fmap_shape = (1, 1, 7, 7, 16)
fmap_dtype = "float16"
filter_sizes = (16, 16, 1, 1)

out_backprop = tvm.placeholder(out_backprop_shape, name="out_backprop", dtype=out_backprop_dtype)
fmap = tvm.placeholder(fmap_shape, name="fmap", dtype=fmap_dtype)

strides = [1, 1]
padding = [0, 0, 0, 0]
dilations = [1, 1, 1, 1]
groups = 1
res_dtype = "float32"
kernel_name = "conv2d_backprop_filter_dx_1_1_7_7_16_dy_1_1_7_7_16_dw_16_16_1_1_s_1_1_p_SAME"

para_dict = {
    "strides": strides,
    "padding": padding,
    "dilations": dilations,
    "groups": groups,
    "res_dtype": res_dtype,
    "kernel_name": kernel_name
}

filter_backprop = dsl.conv2d_backprop_filter(
    input_x=fmap,
    out_backprop=out_backprop,
    filter_sizes=filter_sizes,
    para_dict=para_dict
)
# --- end of the seed example ----------------------------------------------------------------


def main(kernel_meta_parent_dir=None) -> dict:
    from dsl.layout import fracz_to_weight, nchw_to_5hd
    from dsl.verify import dw_adjoint_error

    t0 = time.perf_counter()
    sch = dsl.auto_schedule(filter_backprop)
    dsl.build(sch, {"name": kernel_name, "tensor_list": [fmap, out_backprop, filter_backprop],
                    "kernel_meta_parent_dir": kernel_meta_parent_dir})
    build_s = time.perf_counter() - t0
    kernel = dsl.load(kernel_name, kernel_meta_parent_dir)

    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (1, 16, 7, 7)).astype("float16")
    dy = rng.uniform(-1, 1, (1, 16, 7, 7)).astype("float16")
    t0 = time.perf_counter()
    dw_fz = kernel(nchw_to_5hd(x), nchw_to_5hd(dy))
    run_s = time.perf_counter() - t0
    err = dw_adjoint_error(fracz_to_weight(dw_fz, filter_sizes, groups), x, dy, strides,
                           padding, dilations[2:], groups)
    if err > 1e-5:
        raise RuntimeError(f"{kernel_name}: adjoint check failed, relative error {err:.3g}")
    return {"kernel": kernel_name, "build_s": build_s, "run_s": run_s, "error": err}


if __name__ == "__main__":
    print(main())
