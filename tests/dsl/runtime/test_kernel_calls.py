"""Kernel.__call__ on numpy arrays, torch tensors and TVM tensors: zero copy, out=, checks."""

import numpy as np
import pytest
import tvm

import dsl
from dsl.api.aclnn import avg_pool2d_backward_kernel
from dsl.runtime import kernel as kmod

X_SHAPE, DY_SHAPE = (2, 3, 6, 10), (2, 3, 3, 5)


@pytest.fixture(scope="module")
def kernel():
    return avg_pool2d_backward_kernel(DY_SHAPE, "float32", X_SHAPE, "float32", [2, 2], [],
                                      [0, 0], False, True, 0)


def _dy():
    return np.random.default_rng(0).standard_normal(DY_SHAPE).astype("float32")


def _expect(dy):
    """Each dx element is its window's dy / 4 (2x2 windows, stride 2, no overlap)."""
    return np.repeat(np.repeat(dy, 2, axis=2), 2, axis=3) / 4


@pytest.fixture
def copies(monkeypatch):
    """Counts every buffer the call path allocates (a copy of an argument needs one)."""
    made = []
    real = kmod._empty

    def counting(*a, **k):
        made.append(a)
        return real(*a, **k)

    monkeypatch.setattr(kmod, "_empty", counting)
    return made


def test_numpy_out_is_zero_copy(kernel, copies):
    dy = kmod._empty(DY_SHAPE, "float32", "numpy")
    dy[...] = _dy()
    dx = kmod._empty(X_SHAPE, "float32", "numpy")
    copies.clear()
    assert kernel(dy, out=dx) is dx
    assert copies == []
    np.testing.assert_allclose(dx, _expect(dy), rtol=1e-6)


def test_tvm_tensors_in_and_out(kernel, copies):
    dy = _dy()
    t_dy, t_dx = tvm.runtime.tensor(dy), tvm.runtime.empty(X_SHAPE, "float32", tvm.cpu())
    copies.clear()
    assert kernel(t_dy, out=t_dx) is t_dx and copies == []
    np.testing.assert_allclose(t_dx.numpy(), _expect(dy), rtol=1e-6)
    got = kernel(t_dy)
    assert isinstance(got, tvm.runtime.Tensor)


def test_torch_tensors_zero_copy_and_unusual_layouts(kernel, copies):
    torch = pytest.importorskip("torch")
    dy = torch.from_numpy(_dy()).clone()  # torch allocations are 64-byte aligned
    dx = torch.full(X_SHAPE, float("nan"))
    ptr = dx.data_ptr()
    copies.clear()
    assert kernel(dy, out=dx) is dx and copies == [] and dx.data_ptr() == ptr
    want = torch.from_numpy(_expect(dy.numpy()))
    torch.testing.assert_close(dx, want)
    # requires_grad, channels-last, misaligned views: right answers (copied where needed)
    assert torch.equal(kernel(dy.clone().requires_grad_()), dx)
    cl = dy.to(memory_format=torch.channels_last)
    torch.testing.assert_close(kernel(cl), want)
    wide = torch.zeros(dy.numel() + 1)
    odd = wide[1:].view(DY_SHAPE)
    odd.copy_(dy)
    assert odd.data_ptr() % 64
    torch.testing.assert_close(kernel(odd), want)
    out_cl = torch.empty(X_SHAPE).to(memory_format=torch.channels_last)
    kernel(dy, out=out_cl)
    torch.testing.assert_close(out_cl, want)


def test_output_overlapping_input_is_computed_aside(kernel):
    dy = _dy()
    buf = kmod._empty((int(np.prod(X_SHAPE)),), "float32", "numpy")
    buf[:dy.size] = dy.ravel()
    view_dy = buf[:dy.size].reshape(DY_SHAPE)
    kernel(view_dy, out=buf)  # the output's memory starts with the input's
    np.testing.assert_allclose(buf.reshape(X_SHAPE), _expect(dy), rtol=1e-6)


def test_bfloat16_numpy_is_viewed_not_refused():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    k = avg_pool2d_backward_kernel(DY_SHAPE, "bfloat16", X_SHAPE, "bfloat16", [2, 2], [],
                                   [0, 0], False, True, 0)
    dy = _dy().astype(ml_dtypes.bfloat16)
    got = k(dy)
    assert got.dtype == dy.dtype
    np.testing.assert_allclose(got.astype(np.float32), _expect(dy.astype(np.float32)),
                               rtol=1e-2)


def test_bad_calls_raise_dsl_errors(kernel):
    dy = _dy()
    with pytest.raises(dsl.DslError, match="out="):
        kernel(dy, out=(np.empty(X_SHAPE, "float32"), np.empty(X_SHAPE, "float32")))
    with pytest.raises(dsl.DslError, match="dtype"):
        kernel(dy.astype("float64"))
    with pytest.raises(dsl.DslError, match="shape"):
        kernel(dy[:1])
    with pytest.raises(dsl.DslError, match="numpy.ndarray, a torch.Tensor or a TVM tensor"):
        kernel(dy.tolist())
    with pytest.raises(dsl.DslError, match="writeable"):
        ro = np.empty(X_SHAPE, "float32")
        ro.flags.writeable = False
        kernel(dy, ro)
    torch = pytest.importorskip("torch")
    with pytest.raises(dsl.DslError, match="shape"):
        kernel(torch.zeros(2, 3))
    if torch.device("meta").type == "meta":
        with pytest.raises(dsl.DslError, match="device"):
            kernel(torch.zeros(DY_SHAPE, device="meta"))
