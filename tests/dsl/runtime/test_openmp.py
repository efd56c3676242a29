"""dsl.runtime.openmp: kernels' parallel loops on the process's OpenMP team (PyTorch's).

What must hold: an adopted kernel computes what it computed on TVM's pool, its launches go
through the shim with the calling thread's OpenMP team size (torch.set_num_threads), several
threads can call at once, and every way the shim can be unavailable leaves kernels on TVM's
pool, computing the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from dsl.runtime import openmp

from reference import convolution_backward as ref_conv_bwd

torch = pytest.importorskip("torch")  # the OpenMP runtime the shim adopts is PyTorch's

ROOT = Path(__file__).resolve().parents[3]
# a grouped conv2d backward with stride and asymmetric padding: its schedule has parallel loops
GO, X, W = (2, 6, 4, 4), (2, 4, 7, 9), (6, 2, 3, 3)
PARAMS = dict(stride=[2, 2], padding=[1, 0], dilation=[1, 1], transposed=False,
              output_padding=[0, 0], groups=2)


def _kernel(mask=(True, True, False)):
    from dsl.api.aclnn import convolution_backward_kernel

    return convolution_backward_kernel(GO, "float32", X, "float32", W, "float32", [6],
                                       **PARAMS, output_mask=list(mask))[1]


def _inputs():
    rng = np.random.default_rng(7)
    return {"grad_output": rng.standard_normal(GO).astype(np.float32),
            "input": rng.standard_normal(X).astype(np.float32),
            "weight": rng.standard_normal(W).astype(np.float32)}


def _run(kernel, arrays):
    return kernel(*[arrays[t["name"]] for t in kernel.inputs])


def _check_against_reference(outs, arrays):
    pads = [(p, p) for p in PARAMS["padding"]]
    dx, dw, _ = ref_conv_bwd(arrays["grad_output"], arrays["input"], arrays["weight"],
                             PARAMS["stride"], pads, PARAMS["dilation"], False, [0, 0],
                             PARAMS["groups"])
    for got, want in zip(outs, (dx, dw)):
        assert np.max(np.abs(got - want)) <= 2e-5 * max(1.0, np.max(np.abs(want)))


@pytest.fixture
def threads():
    old = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(old)


def test_adopted_kernel_computes_the_same_on_the_openmp_team(threads):
    ok, why = openmp.status()
    if not ok:
        pytest.skip(f"no OpenMP shim here: {why}")
    kernel, arrays = _kernel(), _inputs()
    assert openmp.LAUNCH_SLOT in kernel.parallel_slots  # the schedule has a parallel loop
    on_pool = _run(kernel, arrays) if not openmp.adopted(kernel) else None
    assert openmp.adopt(kernel) and openmp.adopted(kernel)
    before = openmp.launches()
    for n in sorted({1, min(2, os.cpu_count() or 1)}):
        threads(n)
        outs = _run(kernel, arrays)
        assert openmp.last_team() == n  # the team follows torch.set_num_threads
        _check_against_reference(outs, arrays)
        if on_pool is not None:
            for got, want in zip(outs, on_pool):
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert openmp.launches() > before


def test_threads_call_an_adopted_kernel_at_once(threads):
    kernel, arrays = _kernel(), _inputs()
    openmp.adopt(kernel)
    threads(min(2, os.cpu_count() or 1))
    want = _run(kernel, arrays)
    results, errors = [], []

    def call():
        try:
            for _ in range(20):
                results.append(_run(kernel, arrays))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    workers = [threading.Thread(target=call) for _ in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=300)
    assert not errors and not any(t.is_alive() for t in workers) and len(results) == 80
    for outs in results:
        for got, ref in zip(outs, want):
            np.testing.assert_array_equal(got, ref)


def test_kernel_without_parallel_loop_is_left_alone():
    from dsl.api.aclnn import convolution_backward_kernel

    # grad_bias of one channel: a single serial reduction
    kernel = convolution_backward_kernel((1, 1, 3), "float32", (1, 1, 5), "float32", (1, 1, 3),
                                         "float32", [1], [1], [0], [1], False, [0], 1,
                                         [False, False, True])[1]
    assert openmp.LAUNCH_SLOT not in kernel.parallel_slots
    assert not openmp.adopt(kernel) and not openmp.adopted(kernel)


def test_shim_is_built_once_and_published_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("DSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(openmp, "_STATE", {})
    ok, why = openmp.status()
    if not ok:
        pytest.skip(f"no OpenMP shim here: {why}")
    built = sorted((tmp_path / "runtime").iterdir())
    assert [p.name[:11] for p in built] == ["omp_launch_"] and built[0].suffix == ".so"
    monkeypatch.setattr(openmp, "_STATE", {})
    mtime = built[0].stat().st_mtime_ns
    assert openmp.status()[0] and built[0].stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert sorted((tmp_path / "runtime").iterdir()) == built  # no temporaries left


def test_no_compiler_keeps_tvm_pool(tmp_path, monkeypatch, caplog):
    import logging

    from tvm.support import cc

    kernel = _kernel(mask=(True, False, False))  # built with the compiler, before it goes
    monkeypatch.setenv("DSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(openmp, "_STATE", {})
    monkeypatch.setattr(cc, "get_cc", lambda: str(tmp_path / "no-such-cc"))
    with caplog.at_level(logging.INFO, logger="dsl"):
        ok, why = openmp.status()
    assert not ok and "cannot build the OpenMP launch shim" in why
    assert any("TVM's thread pool" in r.getMessage() for r in caplog.records)
    was = openmp.adopted(kernel)
    assert not openmp.adopt(kernel) and openmp.adopted(kernel) == was
    assert not list((tmp_path / "runtime").glob("*.tmp"))  # nothing half-written


def test_disabled_by_environment_keeps_tvm_pool():
    """DSL_OPENMP=0: dsl.pytorch's kernels run on TVM's pool and compute the same."""
    code = ("import torch, dsl.pytorch\n"
            "from dsl.runtime import openmp\n"
            "ok, why = openmp.status(); assert not ok and why == 'DSL_OPENMP=0', why\n"
            "x = torch.randn(2, 4, 7, 9, requires_grad=True)\n"
            "w = torch.randn(6, 2, 3, 3, requires_grad=True)\n"
            "dsl.pytorch.ops.convolution(x, w, None, [2, 2], [1, 0], [1, 1], False, [0, 0], 2)"
            ".sum().backward()\n"
            "x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()\n"
            "torch.nn.functional.conv2d(x2, w2, None, 2, (1, 0), 1, 2).sum().backward()\n"
            "assert torch.allclose(x.grad, x2.grad, atol=1e-5), 'dx'\n"
            "assert torch.allclose(w.grad, w2.grad, atol=1e-4), 'dw'\n"
            "assert openmp.launches() == 0\n")
    env = {**os.environ, "DSL_OPENMP": "0"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
