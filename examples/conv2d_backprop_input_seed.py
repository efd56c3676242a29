"""Seed 001's example of conv2d_backprop_input, ported by changing only its import lines.

The seed's code runs unchanged at module level (it defines the computation); ``main()`` carries
it on: schedule, build into ``kernel_meta/``, run on random data and check the result.
"""

import time

import numpy as np

# --- the seed example; only the three import lines differ (was: from tbe import tvm, ...) ---
# isort: off
from dsl import tvm
import dsl
from dsl.compute import cube_util  # noqa: F401  (imported by the seed, unused there too)
# isort: on

out_backprop_shape = (1, 1, 7, 7, 16)
out_backprop_dtype = "float16"
filter_frac = (1, 1, 16, 16)
filter_dtype = "float16"
filter_sizes = (16, 16, 1, 1)
input_sizes = (1, 16, 7, 7)
out_backprop = tvm.placeholder(out_backprop_shape, name="out_backprop", dtype=out_backprop_dtype)
filters = tvm.placeholder(filter_frac, name="filters", dtype=filter_dtype)
strides = [1, 1]
padding = [0, 0, 0, 0]
dilations = [1, 1, 1, 1]
res_dtype = "float32"
offset_x = 0
offset_w = None
kernel_name = "conv2d_backprop_input_dx_1_1_7_7_16_dy_1_1_7_7_16_dw_16_16_1_1_s_1_1_p_SAME"
group_dict = {
    "groups": 1,
    "g_extend": 1,
    "multiple_extend": 1,
    "dx_c1_extend": (input_sizes[1] + 16 - 1) // 16,
    "dy_c1_extend": out_backprop_shape[1],
    "dx_c_ori": input_sizes[1],
    "dy_c_ori": filter_sizes[0],
    "filter_batch_ori": filter_sizes[0],
    "filter_c_ori": filter_sizes[1],
    "filter_ori_format": "NCHW"
}
para_dict = {
    "strides": strides,
    "padding": padding,
    "dilations": dilations,
    "res_dtype": res_dtype,
    "offset_x": offset_x,
    "offset_w": offset_w,
    "kernel_name": kernel_name,
    "group_dict": group_dict
}
input_backprop = dsl.conv2d_backprop_input(
    filters=filters,
    out_backprop=out_backprop,
    filter_sizes=filter_sizes,
    input_sizes=input_sizes,
    para_dict=para_dict
)
# --- end of the seed example ----------------------------------------------------------------


def main(kernel_meta_parent_dir=None) -> dict:
    from dsl.layout import nc1hwc0_to_nchw, nchw_to_5hd, weight_to_fracz
    from dsl.verify import dx_adjoint_error

    t0 = time.perf_counter()
    sch = dsl.auto_schedule(input_backprop)
    dsl.build(sch, {"name": kernel_name, "tensor_list": [filters, out_backprop, input_backprop],
                    "kernel_meta_parent_dir": kernel_meta_parent_dir})
    build_s = time.perf_counter() - t0
    kernel = dsl.load(kernel_name, kernel_meta_parent_dir)

    rng = np.random.default_rng(1)
    dy = rng.uniform(-1, 1, (1, 16, 7, 7)).astype("float16")
    w = rng.uniform(-1, 1, filter_sizes).astype("float16")
    t0 = time.perf_counter()
    dx5 = kernel(weight_to_fracz(w), nchw_to_5hd(dy))
    run_s = time.perf_counter() - t0
    err = dx_adjoint_error(nc1hwc0_to_nchw(dx5, input_sizes[1]), dy, w, strides, padding,
                           dilations[2:], 1)
    if err > 1e-5:
        raise RuntimeError(f"{kernel_name}: adjoint check failed, relative error {err:.3g}")
    return {"kernel": kernel_name, "build_s": build_s, "run_s": run_s, "error": err}


if __name__ == "__main__":
    print(main())
