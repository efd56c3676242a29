"""dsl.pytorch operators: opcheck, float64 gradcheck, torch.compile, the dtypes and layouts.

Shapes are tiny: every distinct signature compiles one kernel.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
dsl_pytorch = pytest.importorskip("dsl.pytorch")
ops = dsl_pytorch

# (input shape, weight shape, params): params of dsl::convolution after (input, weight, bias)
CONVS = {
    "conv1d": ((2, 3, 7), (4, 3, 3), ([2], [1], [1], False, [0], 1)),
    "conv2d_grouped_dilated": ((2, 4, 6, 5), (6, 2, 3, 2), ([1, 2], [2, 1], [2, 1], False,
                                                             [0, 0], 2)),
    "conv3d": ((1, 2, 4, 5, 3), (3, 2, 2, 3, 2), ([1, 1, 1], [1, 0, 1], [1, 1, 1], False,
                                                  [0, 0, 0], 1)),
    "convT1d": ((2, 4, 5), (4, 3, 3), ([2], [1], [1], True, [1], 1)),
    "convT2d_grouped": ((2, 4, 3, 4), (4, 1, 3, 2), ([2, 1], [1, 0], [1, 2], True, [1, 0],
                                                     2)),
}
POOLS = {  # (input shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor)
    "pool_plain": ((2, 3, 6, 7), [2, 2], [], [0, 0], False, True, None),
    "pool_ceil_pad": ((2, 2, 7, 5), [3, 2], [2, 2], [1, 1], True, False, None),
    "pool_divisor": ((1, 2, 5, 5), [3, 3], [2, 1], [1, 0], False, True, 5),
}


def _conv_args(name, dtype=torch.float32, bias=True, grad=True):
    xs, ws, params = CONVS[name]
    g = torch.Generator().manual_seed(len(name))
    x = torch.randn(xs, generator=g, dtype=torch.float64).to(dtype).requires_grad_(grad)
    w = torch.randn(ws, generator=g, dtype=torch.float64).to(dtype).requires_grad_(grad)
    transposed, groups = params[3], params[5]
    cb = ws[1] * groups if transposed else ws[0]
    b = torch.randn(cb, generator=g, dtype=torch.float64).to(dtype).requires_grad_(grad) \
        if bias else None
    return (x, w, b, *params)


def _pool_args(name, dtype=torch.float32, grad=True):
    xs, *params = POOLS[name]
    g = torch.Generator().manual_seed(len(name))
    x = torch.randn(xs, generator=g, dtype=torch.float64).to(dtype).requires_grad_(grad)
    return (x, *params)


def _grad_output(out):
    g = torch.Generator().manual_seed(7)
    return torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)


@pytest.mark.parametrize("name", sorted(CONVS))
def test_opcheck_convolution(name):
    args = _conv_args(name)
    torch.library.opcheck(torch.ops.dsl.convolution.default, args)
    out = torch.ops.dsl.convolution(*args)
    x, w = args[0].detach(), args[1].detach()
    for mask in ([True, True, True], [True, False, False], [False, True, True]):
        torch.library.opcheck(torch.ops.dsl.convolution_backward.default,
                              (_grad_output(out), x, w, *args[3:], mask))


@pytest.mark.parametrize("name", sorted(POOLS))
def test_opcheck_avg_pool2d(name):
    args = _pool_args(name)
    torch.library.opcheck(torch.ops.dsl.avg_pool2d.default, args)
    out = torch.ops.dsl.avg_pool2d(*args)
    torch.library.opcheck(torch.ops.dsl.avg_pool2d_backward.default,
                          (_grad_output(out), args[0].detach(), *args[1:]))


@pytest.mark.parametrize("name", sorted(CONVS))
def test_gradcheck_convolution_float64(name):
    """float64 end to end: the backward kernel accumulates in float64, so the finite
    differences of PyTorch's float64 forward check it at gradcheck's default tolerances."""
    args = _conv_args(name, torch.float64)
    before = ops.STATS["convolution_backward"]
    assert torch.autograd.gradcheck(lambda x, w, b: ops.convolution(x, w, b, *args[3:]),
                                    args[:3])
    assert ops.STATS["convolution_backward"] > before


@pytest.mark.parametrize("name", sorted(POOLS))
def test_gradcheck_avg_pool2d_float64(name):
    args = _pool_args(name, torch.float64)
    before = ops.STATS["avg_pool2d_backward"]
    assert torch.autograd.gradcheck(lambda x: ops.avg_pool2d(x, *args[1:]), args[:1])
    assert ops.STATS["avg_pool2d_backward"] > before


def _native_conv(x, w, b, stride, padding, dilation, transposed, opad, groups):
    return torch.ops.aten.convolution(x, w, b, stride, padding, dilation, transposed, opad,
                                      groups)


def _grads(fn, args, n):
    out = fn(*args)
    out.backward(_grad_output(out))
    grads = [a.grad.clone() for a in args[:n] if a is not None]
    for a in args[:n]:
        if a is not None:
            a.grad = None
    return grads


TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("name", ["conv2d_grouped_dilated", "convT1d"])
def test_dtypes_match_native(name, dtype):
    """Each gradient against PyTorch's float64 gradient, within the dtype's rounding."""
    args = _conv_args(name, dtype)
    ref = [a.detach().double().requires_grad_() if a is not None else None for a in args[:3]]
    got = _grads(ops.convolution, args, 3)
    want = _grads(_native_conv, (*ref, *args[3:]), 3)
    for g, r in zip(got, want):
        assert g.dtype == dtype
        err = (g.double() - r).abs().max() / r.abs().max()
        assert err < TOL[dtype], (name, dtype, float(err))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_avg_pool_dtypes_match_native(dtype):
    args = _pool_args("pool_ceil_pad", dtype)
    ref = args[0].detach().double().requires_grad_()
    (got,) = _grads(ops.avg_pool2d, args, 1)
    (want,) = _grads(lambda x, *p: torch.ops.aten.avg_pool2d(x, *p), (ref, *args[1:]), 1)
    assert got.dtype == dtype
    assert (got.double() - want).abs().max() / want.abs().max() < TOL[dtype]


def test_channels_last_and_strided_inputs():
    """Channels-last (and sliced) tensors give the same gradients as contiguous ones."""
    x, w, b, *params = _conv_args("conv2d_grouped_dilated")
    base = _grads(ops.convolution, (x, w, b, *params), 3)
    xc = x.detach().to(memory_format=torch.channels_last).requires_grad_()
    wc = w.detach().to(memory_format=torch.channels_last).requires_grad_()
    assert not xc.is_contiguous()
    got = _grads(ops.convolution, (xc, wc, b, *params), 3)
    for g, r in zip(got, base):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-6)
    xp = _pool_args("pool_plain")[0]
    wide = torch.zeros((*xp.shape[:-1], xp.shape[-1] + 1))
    wide[..., 1:] = xp.detach()
    xs = wide[..., 1:].requires_grad_()  # a view at an odd offset: not 64-byte aligned
    pool = POOLS["pool_plain"][1:]
    torch.testing.assert_close(_grads(ops.avg_pool2d, (xs, *pool), 1)[0],
                               _grads(ops.avg_pool2d, (xp, *pool), 1)[0])


def test_torch_compile_fullgraph():
    def f(x, w, b):
        y = ops.convolution(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        y = ops.avg_pool2d(torch.relu(y), [2, 2], [], [0, 0], False, True, None)
        return y.square().sum()

    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 6, 6, generator=g, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, generator=g, requires_grad=True)
    b = torch.randn(4, generator=g, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    before = dict(ops.STATS)
    compiled(x, w, b).backward()
    got = [t.grad.clone() for t in (x, w, b)]
    assert ops.STATS["convolution_backward"] > before.get("convolution_backward", 0)
    assert ops.STATS["avg_pool2d_backward"] > before.get("avg_pool2d_backward", 0)
    for t in (x, w, b):
        t.grad = None
    f(x, w, b).backward()
    for g_, t in zip(got, (x, w, b)):
        torch.testing.assert_close(g_, t.grad, rtol=1e-5, atol=1e-5)


def test_empty_batch_needs_no_kernel():
    x = torch.zeros(0, 3, 5, requires_grad=True)
    w = torch.randn(4, 3, 3, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    ops.convolution(x, w, b, [1], [0], [1], False, [0], 1).sum().backward()
    assert x.grad.shape == x.shape and not w.grad.any() and not b.grad.any()


def test_threads_follow_torch():
    """The TVM pool of the calling thread is sized from torch.get_num_threads()."""
    import tvm

    import targets

    old = torch.get_num_threads()
    try:
        for n in sorted({1, min(2, targets.machine_cores())}):
            torch.set_num_threads(n)
            args = _conv_args("conv1d")
            _grads(ops.convolution, args, 3)
            assert tvm.runtime.num_threads() == n
    finally:
        torch.set_num_threads(old)


def test_backward_runs_on_torch_openmp_team():
    """dsl.pytorch adopts its kernels: their parallel loops run on PyTorch's OpenMP threads
    (dsl.runtime.openmp), as many as torch.get_num_threads(), and match native PyTorch."""
    from dsl.runtime import openmp

    ok, why = openmp.status()
    if not ok:
        pytest.skip(f"no OpenMP shim here: {why}")
    old = torch.get_num_threads()
    try:
        for n in sorted({1, min(2, os.cpu_count() or 1)}):
            torch.set_num_threads(n)
            x = torch.randn(3, 6, 11, 10, requires_grad=True)
            w = torch.randn(9, 2, 3, 3, requires_grad=True)
            before = openmp.launches()
            got = _grads(ops.convolution, (x, w, None, [1, 2], [1, 0], [1, 1], False, [0, 0], 3),
                         2)
            want = _grads(_native_conv, (x, w, None, [1, 2], [1, 0], [1, 1], False, [0, 0], 3),
                          2)
            assert openmp.launches() > before and openmp.last_team() == n
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    finally:
        torch.set_num_threads(old)


def test_import_dsl_does_not_import_torch():
    code = "import sys, dsl; assert 'torch' not in sys.modules; dsl.pytorch; " \
           "assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_first_use_of_a_signature_is_logged_then_cached(caplog):
    import logging

    from dsl.runtime import kernel_cache

    x = torch.randn(1, 1, 13, requires_grad=True)  # a signature no other test uses
    w = torch.randn(1, 1, 2, requires_grad=True)
    with caplog.at_level(logging.INFO, logger="dsl"):
        ops.convolution(x, w, None, [3], [0], [1], False, [0], 1).sum().backward()
    assert any("aclnn_conv_bwd" in r.getMessage() for r in caplog.records)
    caplog.clear()
    hits = kernel_cache.STATS["hits"]
    builds = kernel_cache.STATS["builds"]
    with caplog.at_level(logging.INFO, logger="dsl"):
        ops.convolution(x, w, None, [3], [0], [1], False, [0], 1).sum().backward()
    assert not caplog.records and kernel_cache.STATS["builds"] == builds
    assert kernel_cache.STATS["hits"] == hits  # answered by dsl.pytorch's own signature map
