"""``aclnnConvolutionBackward`` (seed 002) as one build-then-run numpy call.

The seed's two phases map onto :func:`convolution_backward`: ``GetWorkspaceSize`` (check the
call, build the executor) is the first call with a signature, which checks everything on plain
values, then schedules and compiles one kernel for the signature (shapes, dtypes, parameters,
target) and caches it (:mod:`dsl.runtime.kernel_cache`); ``aclnnConvolutionBackward`` (run it)
is every call. A second call with the same signature neither schedules nor compiles.

See :mod:`dsl.ops.convolution_backward` for the math, the layouts, the dtype promotion and the
cube_math_type emulation.
"""

from __future__ import annotations

import numpy as np

from dsl.errors import check_ndarray
from dsl.ops.convolution_backward import TAG, Plan, plan


def _dtype_name(param: str, a: object) -> str:
    return str(check_ndarray(param, a).dtype)


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _empty_result(p: Plan, grad_output: np.ndarray):
    """Gradients of a call whose input has N or C = 0, computed on the host (no kernel):
    grad_input is empty, grad_weight is zero (empty when C = 0), grad_bias sums grad_output
    (zero when N = 0)."""
    gi_dt, gw_dt, gb_dt = (_np_dtype(d) for d in p.out_dtypes)
    gi = np.zeros(p.input_shape, gi_dt) if p.output_mask[0] else None
    gw = np.zeros(p.weight_shape, gw_dt) if p.output_mask[1] else None
    gb = None
    if p.output_mask[2]:
        axes = (0, *range(2, grad_output.ndim))
        acc = np.dtype(p.acc_dtype)
        gb = grad_output.astype(acc).sum(axis=axes, dtype=acc).astype(gb_dt)
    return gi, gw, gb


def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,  # noqa: A002
                         transposed, output_padding, groups, output_mask, cube_math_type=0,
                         *, target=None):
    """Gradients of a 1-D/2-D/3-D (transposed) convolution on numpy arrays.

    Parameters
    ----------
    grad_output, input, weight : numpy.ndarray
        NCL / NCHW / NCDHW arrays (weight ``(Cout, Cin/groups, *k)``, or
        ``(Cin, Cout/groups, *k)`` when ``transposed``) of float32, float16 or bfloat16
        (``ml_dtypes.bfloat16``). ``input`` may have N or C = 0.
    bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask,
    cube_math_type :
        As in :func:`dsl.convolution_backward`.
    target : str or targets.CpuTarget, optional
        Defaults to the current target (``targets.current()``).

    Returns
    -------
    tuple
        ``(grad_input, grad_weight, grad_bias)`` numpy arrays, None where ``output_mask`` is
        False. Calls with empty inputs are answered on the host without compiling.
    """
    dts = [_dtype_name(n, a) for n, a in
           (("grad_output", grad_output), ("input", input), ("weight", weight))]
    p, kernel = convolution_backward_kernel(
        grad_output.shape, dts[0], input.shape, dts[1], weight.shape, dts[2], bias_sizes, stride,
        padding, dilation, transposed, output_padding, groups, output_mask, cube_math_type,
        target=target)
    if not any(p.output_mask):
        return None, None, None
    if p.empty:
        return _empty_result(p, grad_output)
    arrays = {"grad_output": grad_output, "input": input, "weight": weight}
    res = kernel(*(arrays[t["name"]] for t in kernel.inputs))
    res = list(res) if isinstance(res, tuple) else [res]
    out = []
    for m in p.output_mask:
        out.append(res.pop(0) if m else None)
    return tuple(out)


def convolution_backward_kernel(grad_output_shape, grad_output_dtype, input_shape, input_dtype,
                                weight_shape, weight_dtype, bias_sizes, stride, padding,
                                dilation, transposed, output_padding, groups, output_mask,
                                cube_math_type=0, *, target=None):
    """The checked call and its cached kernel, from shapes and dtypes alone.

    The executor half of :func:`convolution_backward` for callers that hold their own buffers
    (``dsl.pytorch``): ``kernel(*inputs, out=outputs)`` runs it on numpy arrays or torch /
    TVM tensors without copying. ``kernel.inputs`` names the inputs it reads (a subset of
    ``grad_output``, ``input``, ``weight``, in that order); its outputs are the masked
    gradients in ``(grad_input, grad_weight, grad_bias)`` order.

    Returns
    -------
    tuple
        ``(plan, kernel)``: :class:`dsl.ops.convolution_backward.Plan` (output dtypes:
        ``plan.out_dtypes``) and the :class:`dsl.Kernel`, None when nothing is computed
        (an all-False mask, or an empty input: see :func:`convolution_backward`).
    """
    from dsl.runtime import kernel_cache

    p = plan(tuple(grad_output_shape), grad_output_dtype, tuple(input_shape), input_dtype,
             tuple(weight_shape), weight_dtype, bias_sizes, stride, padding, dilation,
             transposed, output_padding, groups, output_mask, cube_math_type)
    if not any(p.output_mask) or p.empty:
        return p, None
    dts = p.dtypes

    def make():
        from tvm import te

        from dsl.ops.convolution_backward import convolution_backward as te_op
        from dsl.runtime.schedule import walk

        go = te.placeholder(p.grad_output_shape, name="grad_output", dtype=dts[0])
        x = te.placeholder(p.input_shape, name="input", dtype=dts[1])
        w = te.placeholder(p.weight_shape, name="weight", dtype=dts[2])
        outs = [t for t in te_op(go, x, w, bias_sizes, stride, padding, dilation, transposed,
                                 output_padding, groups, output_mask, cube_math_type)
                if t is not None]
        used, _ = walk(outs)
        order = {"grad_output": 0, "input": 1, "weight": 2}
        used.sort(key=lambda t: order[t.op.name])
        return used, outs

    signature = {"op": TAG, "plan": p.as_json(), "acc": p.acc_dtype}
    return p, kernel_cache.get_kernel(signature, make, prefix="aclnn_conv_bwd", target=target)
