"""The ``dsl::`` PyTorch operators: PyTorch's forward, this project's backward kernels.

Operators (``torch.ops.dsl.<name>``, each with a fake (meta) implementation for
``torch.compile`` and, for the forwards, an autograd formula):

``convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
groups)``
    ``aten.convolution``'s forward; its backward is ``dsl::convolution_backward``.
``convolution_backward(grad_output, input, weight, stride, padding, dilation, transposed,
output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias)``
    ``aclnnConvolutionBackward`` (:func:`dsl.aclnn.convolution_backward_kernel`): NCL / NCHW /
    NCDHW tensors, weight ``(Cout, Cin/groups, *k)`` or, transposed, ``(Cin, Cout/groups, *k)``.
    A gradient whose ``output_mask`` entry is False comes back as an empty ``(0,)`` tensor.
``avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad,
divisor_override)``
    ``aten.avg_pool2d``'s forward; its backward is ``dsl::avg_pool2d_backward``.
``avg_pool2d_backward(grad_output, input, kernel_size, stride, padding, ceil_mode,
count_include_pad, divisor_override) -> grad_input``
    ``aclnnAvgPool2dBackward`` (:func:`dsl.aclnn.avg_pool2d_backward_kernel`), NCHW or CHW.

The math (``dy`` the output gradient): ``grad_input = conv^T(dy, W)``, ``grad_weight[co, ci,
k] = sum_{n,o} dy[n, co, o] x[n, ci, o*s - p + k*d]`` (per group), ``grad_bias = sum_{n,o} dy``;
average pooling's ``dx[h, w] = sum over windows containing (h, w) of dy / divisor`` (see
:mod:`dsl.ops.convolution_backward` and :mod:`dsl.ops.avg_pool2d_backward`).

Dtypes: float32, float16, bfloat16 and float64 (accumulated in float32, float64 for float64);
results have the dtype of the tensors. Any memory format is accepted: channels-last and other
strided tensors are made contiguous (one copy) because the kernels read NC* layouts; contiguous
tensors pass to the kernel through DLPack without a copy and the kernel writes the gradients
straight into the tensors returned.

Kernels: one per signature (shapes, dtypes, parameters, target), built on first use, kept in
memory here and on disk by :mod:`dsl.runtime.kernel_cache` (a new process reuses the ``.so``);
the first build is logged on the ``"dsl"`` logger. Calls are thread-safe. Their parallel loops
run on PyTorch's own OpenMP threads, ``torch.get_num_threads()`` of them
(:mod:`dsl.runtime.openmp`: one thread pool, not two fighting for the cores), or on as many TVM
threads where that shim is unavailable.
"""

from __future__ import annotations

import os
import threading
from collections import Counter

import torch
from torch import Tensor

import targets
from dsl.runtime import kernel_cache, openmp

# Between our kernels PyTorch runs its own parallel ops: TVM's idle workers must not spin on
# the cores PyTorch's threads need (read when TVM's pool starts; a user's setting wins).
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

# calls of each backward kernel (tests use it to see that the dsl kernels really ran)
STATS: Counter = Counter()
_KERNELS: dict = {}  # signature -> (plan, kernel): skips re-checking a known call
_KERNELS_LOCK = threading.Lock()
_TLS = threading.local()


def _dtype(t: Tensor) -> str:
    return str(t.dtype)[6:]  # "torch.float32" -> "float32"


def _set_threads() -> None:
    """Size this thread's TVM pool to ``torch.get_num_threads()`` (TVM pools are per calling
    thread; reconfigured only when the count changes)."""
    n = max(1, min(torch.get_num_threads(), targets.machine_cores()))
    if getattr(_TLS, "threads", None) != n:
        from dsl.api.deconvgradfilter import _configure

        if getattr(_TLS, "threads", None) is None:
            # TVM makes a thread's pool as large as the first size set: make it every core,
            # so a later torch.set_num_threads can grow it
            _configure(targets.machine_cores())
        _configure(n)
        _TLS.threads = n


def _cached(key: tuple, make):
    hit = _KERNELS.get(key)
    if hit is None:
        hit = make()  # kernel_cache serialises builds; two threads may both check, one builds
        # parallel loops on PyTorch's OpenMP team, not a second pool (dsl.runtime.openmp)
        openmp.adopt(hit[1] if isinstance(hit, tuple) else hit)
        with _KERNELS_LOCK:
            hit = _KERNELS.setdefault(key, hit)
            while len(_KERNELS) > max(1, kernel_cache.MAX_KERNELS):
                # bounded like the kernel cache, so an evicted kernel's library can unload
                _KERNELS.pop(next(iter(_KERNELS)))
    return hit


def _run(kernel, inputs: list, outputs: list) -> None:
    _set_threads()
    kernel(*inputs, out=outputs)


# --- convolution -----------------------------------------------------------------------------

@torch.library.custom_op("dsl::convolution", mutates_args=())
def convolution(input: Tensor, weight: Tensor, bias: Tensor | None, stride: list[int],  # noqa: A002
                padding: list[int], dilation: list[int], transposed: bool,
                output_padding: list[int], groups: int) -> Tensor:
    """PyTorch's convolution forward, differentiated by ``dsl::convolution_backward``."""
    return torch.ops.aten.convolution.default(input, weight, bias, stride, padding, dilation,
                                              transposed, output_padding, groups)


@convolution.register_fake
def _convolution_fake(input, weight, bias, stride, padding, dilation, transposed,  # noqa: A002
                      output_padding, groups):
    return torch.ops.aten.convolution.default(input, weight, bias, stride, padding, dilation,
                                              transposed, output_padding, groups)


@torch.library.custom_op("dsl::convolution_backward", mutates_args=())
def convolution_backward(grad_output: Tensor, input: Tensor, weight: Tensor,  # noqa: A002
                         stride: list[int], padding: list[int], dilation: list[int],
                         transposed: bool, output_padding: list[int], groups: int,
                         output_mask: list[bool]) -> tuple[Tensor, Tensor, Tensor]:
    """``(grad_input, grad_weight, grad_bias)`` by this project's ConvolutionBackward kernel."""
    from dsl.api.aclnn import convolution_backward_kernel

    go, x, w = grad_output.contiguous(), input.contiguous(), weight.contiguous()
    mask = [bool(m) for m in output_mask]
    bias_sizes = [w.shape[1] * groups] if transposed else [w.shape[0]]
    key = ("conv", tuple(go.shape), tuple(x.shape), tuple(w.shape), _dtype(go), _dtype(x),
           _dtype(w), tuple(stride), tuple(padding), tuple(dilation), transposed,
           tuple(output_padding), groups, tuple(mask), targets.current())
    plan, kernel = _cached(key, lambda: convolution_backward_kernel(
        go.shape, _dtype(go), x.shape, _dtype(x), w.shape, _dtype(w), bias_sizes, stride,
        padding, dilation, transposed, output_padding, groups, mask))
    dts = [getattr(torch, d) for d in plan.out_dtypes]
    outs = [torch.empty(s, dtype=d) if m else go.new_empty(0)
            for s, d, m in zip((x.shape, w.shape, bias_sizes), dts, mask)]
    if kernel is None:  # an empty batch or channel count: no kernel (see the aclnn API)
        _empty_grads(go, outs, mask)
        return tuple(outs)
    arrays = {"grad_output": go, "input": x, "weight": w}
    STATS["convolution_backward"] += 1
    _run(kernel, [arrays[t["name"]] for t in kernel.inputs], [o for o, m in zip(outs, mask) if m])
    return tuple(outs)


def _empty_grads(go: Tensor, outs: list, mask: list) -> None:
    """grad_input is empty, grad_weight zero, grad_bias the sum of grad_output."""
    if mask[1]:
        outs[1].zero_()
    if mask[2]:
        dims = [0, *range(2, go.dim())]
        outs[2].copy_(go.sum(dim=dims, dtype=torch.float64 if go.dtype == torch.float64
                             else torch.float32))


@convolution_backward.register_fake
def _convolution_backward_fake(grad_output, input, weight, stride, padding, dilation,  # noqa: A002
                               transposed, output_padding, groups, output_mask):
    from dsl.ops.convolution_backward import promote

    go = grad_output
    cb = weight.shape[1] * groups if transposed else weight.shape[0]
    dts = (promote(_dtype(input), _dtype(go)), promote(_dtype(weight), _dtype(go)), _dtype(go))
    shapes = (input.shape, weight.shape, (cb,))
    return tuple(go.new_empty(s, dtype=getattr(torch, d)) if m else go.new_empty(0)
                 for s, d, m in zip(shapes, dts, output_mask))


def _conv_setup(ctx, inputs, output) -> None:
    input, weight, bias, *params = inputs  # noqa: A001
    ctx.save_for_backward(input, weight)
    ctx.params = params
    ctx.has_bias = bias is not None


def _conv_backward(ctx, grad_output):
    input, weight = ctx.saved_tensors  # noqa: A001
    need = ctx.needs_input_grad
    mask = [bool(need[0]), bool(need[1]), bool(ctx.has_bias and need[2])]
    if not any(mask):
        return (None,) * 9
    gi, gw, gb = convolution_backward(grad_output, input, weight, *ctx.params, mask)
    return (gi if mask[0] else None, gw if mask[1] else None, gb if mask[2] else None,
            *(None,) * 6)


convolution.register_autograd(_conv_backward, setup_context=_conv_setup)


# --- avg_pool2d ------------------------------------------------------------------------------

@torch.library.custom_op("dsl::avg_pool2d", mutates_args=())
def avg_pool2d(input: Tensor, kernel_size: list[int], stride: list[int],  # noqa: A002
               padding: list[int], ceil_mode: bool, count_include_pad: bool,
               divisor_override: int | None) -> Tensor:
    """PyTorch's avg_pool2d forward, differentiated by ``dsl::avg_pool2d_backward``."""
    return torch.ops.aten.avg_pool2d.default(input, kernel_size, stride, padding, ceil_mode,
                                             count_include_pad, divisor_override)


@avg_pool2d.register_fake
def _avg_pool2d_fake(input, kernel_size, stride, padding, ceil_mode, count_include_pad,  # noqa: A002
                     divisor_override):
    return torch.ops.aten.avg_pool2d.default(input, kernel_size, stride, padding, ceil_mode,
                                             count_include_pad, divisor_override)


@torch.library.custom_op("dsl::avg_pool2d_backward", mutates_args=())
def avg_pool2d_backward(grad_output: Tensor, input: Tensor, kernel_size: list[int],  # noqa: A002
                        stride: list[int], padding: list[int], ceil_mode: bool,
                        count_include_pad: bool, divisor_override: int | None) -> Tensor:
    """grad_input of ``avg_pool2d`` by this project's AvgPool2dBackward kernel (``input``
    supplies shape and dtype only)."""
    from dsl.api.aclnn import avg_pool2d_backward_kernel

    go = grad_output.contiguous()
    div = 0 if divisor_override is None else int(divisor_override)
    key = ("pool", tuple(go.shape), tuple(input.shape), _dtype(go), _dtype(input),
           tuple(kernel_size), tuple(stride), tuple(padding), ceil_mode, count_include_pad, div,
           targets.current())
    kernel = _cached(key, lambda: avg_pool2d_backward_kernel(
        go.shape, _dtype(go), input.shape, _dtype(input), list(kernel_size), list(stride),
        list(padding), bool(ceil_mode), bool(count_include_pad), div))
    out = torch.empty(input.shape, dtype=input.dtype)
    STATS["avg_pool2d_backward"] += 1
    _run(kernel, [go], [out])
    return out


@avg_pool2d_backward.register_fake
def _avg_pool2d_backward_fake(grad_output, input, kernel_size, stride, padding,  # noqa: A002
                              ceil_mode, count_include_pad, divisor_override):
    return input.new_empty(input.shape)


def _pool_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.params = inputs[1:]


def _pool_backward(ctx, grad_output):
    (input,) = ctx.saved_tensors  # noqa: A001
    return (avg_pool2d_backward(grad_output, input, *ctx.params), *(None,) * 6)


avg_pool2d.register_autograd(_pool_backward, setup_context=_pool_setup)
