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


# --- element-aligned arguments: any address an element may start at runs in place ----------

def _off(shape, dtype, elems: int) -> np.ndarray:
    """A C-contiguous view starting ``elems`` elements past a 64-byte boundary."""
    n = int(np.prod(shape))
    buf = kmod._empty((n + elems,), dtype, "numpy")
    view = buf[elems:].reshape(shape)
    assert view.ctypes.data % 64 == elems * np.dtype(dtype).itemsize % 64
    return view


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("elems", [1, 3])
def test_misaligned_numpy_in_and_out_run_in_place(copies, dtype, elems):
    k = avg_pool2d_backward_kernel(DY_SHAPE, dtype, X_SHAPE, dtype, [2, 2], [], [0, 0], False,
                                   True, 0)
    dy, dx = _off(DY_SHAPE, dtype, elems), _off(X_SHAPE, dtype, elems)
    dy[...] = _dy().astype(dtype)
    dx[...] = np.nan
    copies.clear()
    assert k(dy, out=dx) is dx
    assert copies == []  # nothing computed aside: the kernel wrote into dx itself
    tol = 1e-6 if dtype == "float32" else 1e-3
    np.testing.assert_allclose(dx.astype(np.float64), _expect(dy.astype(np.float64)),
                               rtol=tol, atol=tol)


def test_plain_np_empty_arrays_run_in_place(kernel, copies):
    """numpy's allocator guarantees 16 bytes: whatever np.empty returns runs in place."""
    dy, dx = np.empty(DY_SHAPE, np.float32), np.empty(X_SHAPE, np.float32)
    dy[...] = _dy()
    copies.clear()
    kernel(dy, dx)
    assert copies == []
    np.testing.assert_allclose(dx, _expect(dy), rtol=1e-6)


def test_misaligned_torch_and_tvm_in_and_out(kernel, copies):
    import tvm_ffi

    dy = _off(DY_SHAPE, "float32", 1)
    dy[...] = _dy()
    want = _expect(dy)
    t_dx = _off(X_SHAPE, "float32", 3)
    t_in, t_out = tvm_ffi.from_dlpack(dy), tvm_ffi.from_dlpack(t_dx)
    assert t_in.data_ptr() % 64 and t_out.data_ptr() % 64
    copies.clear()
    assert kernel(t_in, out=t_out) is t_out and copies == []
    np.testing.assert_allclose(t_dx, want, rtol=1e-6)
    torch = pytest.importorskip("torch")
    g_dy = torch.zeros(dy.size + 1)[1:].view(DY_SHAPE)
    g_dy.copy_(torch.from_numpy(dy))
    g_dx = torch.full((int(np.prod(X_SHAPE)) + 2,), float("nan"))[2:].view(X_SHAPE)
    assert g_dy.data_ptr() % 64 and g_dx.data_ptr() % 64
    copies.clear()
    assert kernel(g_dy, out=g_dx) is g_dx and copies == []
    np.testing.assert_allclose(g_dx.numpy(), want, rtol=1e-6)
    # mixed kinds: torch in, misaligned numpy out
    n_dx = _off(X_SHAPE, "float32", 5)
    kernel(g_dy, out=n_dx)
    np.testing.assert_allclose(n_dx, want, rtol=1e-6)


def test_misaligned_output_overlapping_input_is_computed_aside(kernel):
    """An output sharing memory with an input (the kernel's pointers are noalias) is
    computed aside and copied in, at any alignment and for every kind."""
    dy = _dy()
    n = int(np.prod(X_SHAPE))
    buf = _off((n,), "float32", 1)
    buf[:dy.size] = dy.ravel()
    kernel(buf[:dy.size].reshape(DY_SHAPE), out=buf.reshape(X_SHAPE))
    np.testing.assert_allclose(buf.reshape(X_SHAPE), _expect(dy), rtol=1e-6)
    torch = pytest.importorskip("torch")
    g = torch.zeros(n + 1)[1:]
    g[:dy.size] = torch.from_numpy(dy.ravel())
    kernel(g[:dy.size].view(DY_SHAPE), out=g.view(X_SHAPE))
    np.testing.assert_allclose(g.view(X_SHAPE).numpy(), _expect(dy), rtol=1e-6)
    # the input inside the output, not at its start
    g = torch.zeros(n + 7)[3:]
    g[5:5 + dy.size] = torch.from_numpy(dy.ravel())
    kernel(g[5:5 + dy.size].view(DY_SHAPE), out=g[:n].view(X_SHAPE))
    np.testing.assert_allclose(g[:n].view(X_SHAPE).numpy(), _expect(dy), rtol=1e-6)


def test_torch_negative_view_is_read_as_its_values(kernel):
    torch = pytest.importorskip("torch")
    dy = torch.from_numpy(_dy())
    neg = torch._neg_view(dy)  # memory holds dy, the tensor means -dy
    assert neg.is_neg() and neg.is_contiguous()
    np.testing.assert_allclose(kernel(neg).numpy(), -_expect(dy.numpy()), rtol=1e-6)


def test_refused_calls_write_nothing(kernel):
    """Bad arguments raise DslError before the kernel runs: the output keeps its values."""
    dx = np.full(X_SHAPE, 7.0, np.float32)
    for bad in (_dy().astype(np.float64), _dy()[:1], _dy().ravel()[:-1],
                np.ma.masked_array(_dy())):
        with pytest.raises(dsl.DslError):
            kernel(bad, out=dx)
        assert (dx == 7.0).all()
    with pytest.raises(dsl.DslError, match="dtype"):
        kernel(_dy(), out=np.zeros(X_SHAPE, np.float64))
    with pytest.raises(dsl.DslError, match="shape"):
        kernel(tvm.runtime.tensor(_dy()[:1]), out=tvm.runtime.tensor(dx))
    ro = np.zeros(X_SHAPE, np.float32)
    ro.flags.writeable = False
    with pytest.raises(dsl.DslError, match="writeable"):
        kernel(_dy(), out=ro)


# --- bind: checked and converted once, then the generated function alone per call --------

def test_bind_runs_on_the_same_memory_every_call(kernel, copies):
    dy = kmod._empty(DY_SHAPE, "float32", "numpy")
    dy[...] = _dy()
    dx = np.full(X_SHAPE, np.nan, np.float32)
    copies.clear()
    run = kernel.bind(dy, out=dx)
    assert copies == [] and run.outputs is dx and run.kernel is kernel
    assert run() is None
    np.testing.assert_allclose(dx, _expect(dy), rtol=1e-6)
    dy *= -2  # new contents, same memory: the next call reads them
    run()
    np.testing.assert_allclose(dx, _expect(dy), rtol=1e-6)
    assert "BoundCall" in repr(run)


def test_bind_allocates_outputs_of_the_inputs_kind(kernel):
    dy = _dy()
    run = kernel.bind(dy)
    run()
    assert isinstance(run.outputs, np.ndarray)
    np.testing.assert_allclose(run.outputs, _expect(dy), rtol=1e-6)
    t_dy, t_dx = tvm.runtime.tensor(dy), tvm.runtime.empty(X_SHAPE, "float32", tvm.cpu())
    kernel.bind(t_dy, t_dx)()  # inputs then outputs, as a call takes them
    np.testing.assert_allclose(t_dx.numpy(), _expect(dy), rtol=1e-6)


def test_bind_torch_tensors(kernel):
    torch = pytest.importorskip("torch")
    dy = torch.from_numpy(_dy()).clone().requires_grad_()
    dx = torch.full(X_SHAPE, float("nan"))
    run = kernel.bind(dy, out=dx)
    run()
    torch.testing.assert_close(dx, torch.from_numpy(_expect(_dy())))
    with torch.no_grad():
        dy.mul_(3)
    run()
    torch.testing.assert_close(dx, torch.from_numpy(_expect(3 * _dy())))
    with pytest.raises(dsl.DslError, match="negative"):
        kernel.bind(torch._neg_view(dy.detach()), out=dx)


def test_bind_refuses_what_a_call_would_copy(kernel):
    dy, dx = _dy(), np.zeros(X_SHAPE, np.float32)
    with pytest.raises(dsl.DslError, match="C-contiguous"):
        kernel.bind(np.asfortranarray(dy), out=dx)
    with pytest.raises(dsl.DslError, match="C-contiguous"):
        kernel.bind(dy, out=np.zeros((2, 3, 6, 20), np.float32)[:, :, :, ::2])
    ro = dy.copy()
    ro.flags.writeable = False
    with pytest.raises(dsl.DslError, match="writeable"):
        kernel.bind(ro, out=dx)
    buf = kmod._empty((dx.size,), "float32", "numpy")
    with pytest.raises(dsl.DslError, match="overlaps an input"):
        kernel.bind(buf[:dy.size].reshape(DY_SHAPE), out=buf)
    with pytest.raises(dsl.DslError, match="dtype"):
        kernel.bind(dy.astype(np.float64), out=dx)
    with pytest.raises(dsl.DslError, match="bind"):
        kernel.bind(dy, dx, dx)
    assert (dx == 0).all()  # nothing ran


def test_flat_strided_and_read_only_arguments_still_work(kernel):
    dy = _dy()
    want = _expect(dy)
    np.testing.assert_allclose(kernel(dy.ravel()), want, rtol=1e-6)  # flat: reshaped
    np.testing.assert_allclose(kernel(np.asfortranarray(dy)), want, rtol=1e-6)  # copied
    ro = dy.copy()
    ro.flags.writeable = False
    out = np.empty(X_SHAPE, np.float32)[:, :, :, :]
    kernel(ro, out=out)
    np.testing.assert_allclose(out, want, rtol=1e-6)
    strided_out = np.zeros((2, 3, 6, 20), np.float32)[:, :, :, ::2]
    kernel(dy, out=strided_out)
    np.testing.assert_allclose(strided_out, want, rtol=1e-6)


def test_generated_code_assumes_only_element_alignment():
    """The library's arguments are declared element-aligned: no ``align 64`` parameter or
    alignment assumption for LLVM; a build under the old 64-byte convention has another cache
    key (its TIR differs), so an old library is never reused for the new calling convention."""
    from tvm import te

    from dsl.runtime import build
    from dsl.runtime.schedule import auto_schedule

    x = te.placeholder((37,), "float16", name="x")
    y = te.compute((37,), lambda i: x[i] * 2, name="y", tag="elewise")
    sch = auto_schedule([y])
    mod = build.lower(sch, "k", [x, y])
    assert [p.data_alignment for p in mod["k"].params] == [2, 2]
    ll = build.compile_module(mod, sch.target.tvm_target()).mod.inspect_source("ll")
    defines = [line for line in ll.splitlines() if line.startswith("define")]
    assert defines and not any("align 64" in line for line in defines)
    old = tvm.IRModule({"k": sch.s_tir([x, y]).mod["main"].with_attr("global_symbol", "k")})
    assert [p.data_alignment for p in old["k"].params] == [64, 64]
    assert build.cache_key(old, sch) != build.cache_key(mod, sch)
    assert build.versions()["json_format"] == 2


def test_cache_key_changes_with_the_compile_settings(monkeypatch):
    """The pass settings ``compile_module`` adds change the generated code, so a library
    built under other settings is never reused: the key hashes them too."""
    from tvm import te

    from dsl.runtime import build
    from dsl.runtime.schedule import auto_schedule

    x = te.placeholder((37,), "float32", name="x")
    y = te.compute((37,), lambda i: x[i] * 2, name="y", tag="elewise")
    sch = auto_schedule([y])
    mod = build.lower(sch, "k", [x, y])
    before = build.cache_key(mod, sch)
    monkeypatch.setattr(build, "COMPILE_CONFIG", {"tirx.UnrollLoop": {"auto_max_depth": 8}})
    assert build.cache_key(mod, sch) != before


def test_cache_key_hashes_the_llvm_a_kernel_imports():
    """TVMScript prints a ``pragma_import_llvm`` string (the LLVM IR a dot-product intrinsic
    links in) as a metadata reference: two kernels that differ only in it have two keys."""
    from tvm import s_tir, te

    from dsl.runtime import build
    from dsl.runtime.schedule import auto_schedule

    x = te.placeholder((37,), "float32", name="x")
    y = te.compute((37,), lambda i: x[i] * 2, name="y", tag="elewise")
    sch = auto_schedule([y])

    def key(code: str) -> str:
        ss = s_tir.Schedule(te.create_prim_func([x, y]))
        ss.annotate(ss.get_loops(ss.get_sblock("y"))[0], "pragma_import_llvm", code)
        return build.cache_key(ss.mod, sch)

    one, two = "\ndefine void @f() {\n  ret void\n}\n", "\ndefine void @g() {\n  ret void\n}\n"
    assert key(one) != key(two)
    assert key(one) == key(one)
