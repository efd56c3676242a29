"""``aclnnAvgPool2dBackward`` as one numpy call (seed 004).

``aclnnAvgPool2dBackwardGetWorkspaceSize`` + ``aclnnAvgPool2dBackward`` become
:func:`avg_pool2d_backward`: it checks the call, builds the kernel for that signature the first
time (:mod:`dsl.runtime.kernel_cache`), runs it and returns gradInput.
"""

from __future__ import annotations

import numpy as np

from dsl.errors import check_ndarray

PREFIX = "aclnn_avg_pool2d_backward"


def _array(param: str, a: object) -> np.ndarray:
    return check_ndarray(param, a)


def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override, cube_math_type=0, *, target=None):
    """gradInput of ``avg_pool2d``, PyTorch semantics (see :mod:`dsl.ops.avg_pool2d_backward`).

    Parameters
    ----------
    grad_output : numpy.ndarray
        dy, NCHW ``(N, C, Ho, Wo)`` or NCL-style 3-D ``(C, Ho, Wo)``; float32, float16 or
        bfloat16 (``ml_dtypes.bfloat16``).
    self : numpy.ndarray
        The forward input ``(N, C, H, W)`` / ``(C, H, W)`` of grad_output's dtype; only its
        shape and dtype are used.
    kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, cube_math_type
        As :func:`dsl.avg_pool2d_backward` (``stride=[]`` means the kernel size,
        ``divisor_override=0`` means none).
    target : str or targets.CpuTarget, optional
        Build target; default :func:`targets.current`.

    Returns
    -------
    numpy.ndarray
        gradInput, the shape and dtype of ``self``.

    Raises
    ------
    dsl.DslError
        Before anything is built, for any argument the operator refuses.
    """
    dy = _array("grad_output", grad_output)
    x = _array("self", self)
    kernel = avg_pool2d_backward_kernel(dy.shape, str(dy.dtype), x.shape, str(x.dtype),
                                        kernel_size, stride, padding, ceil_mode,
                                        count_include_pad, divisor_override, cube_math_type,
                                        target=target)
    return kernel(dy)


def avg_pool2d_backward_kernel(grad_output_shape, grad_output_dtype, self_shape, self_dtype,
                               kernel_size, stride, padding, ceil_mode, count_include_pad,
                               divisor_override, cube_math_type=0, *, target=None):
    """The cached kernel of :func:`avg_pool2d_backward` for a signature, from shapes and dtypes
    alone: ``kernel(grad_output, out=grad_input)`` on numpy arrays or torch / TVM tensors,
    without copying (``dsl.pytorch`` calls it so)."""
    from dsl.ops.avg_pool2d_backward import avg_pool2d_backward as te_op
    from dsl.ops.avg_pool2d_backward import check_avg_pool2d_backward
    from dsl.runtime.kernel_cache import get_kernel

    geo = check_avg_pool2d_backward(tuple(grad_output_shape), str(grad_output_dtype),
                                    tuple(self_shape), str(self_dtype), kernel_size, stride,
                                    padding, ceil_mode, count_include_pad, divisor_override,
                                    cube_math_type)

    def make():
        from tvm import te

        dy_t = te.placeholder(geo.out_shape, dtype=geo.dtype, name="grad_output")
        x_t = te.placeholder(geo.in_shape, dtype=geo.dtype, name="self")
        dx_t = te_op(dy_t, x_t, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, cube_math_type)
        return [dy_t], [dx_t]  # self's values are never read, so it is no kernel argument

    # cube_math_type is checked above but does not change the kernel, so it is not keyed.
    return get_kernel({"op": "aclnnAvgPool2dBackward", **geo.as_json()}, make,
                      prefix=PREFIX, target=target)
