"""Regression tests for the bugs the reliability campaign found (one test per bug).

Bugs found by the hostile corpus are pinned by their corpus entries (``rel_corpus.py``, named
in comments there and in the README); the ones here need a set-up of their own.
"""

from __future__ import annotations

import os
import shutil
import threading
import time

import numpy as np
import pytest
from rel_builder import build, check_kernel, graph

import dsl
from dsl import kernel_cache
from dsl.runtime.build import _lock


def _mapped(path_part: str) -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if path_part in line)


def test_dropped_kernel_unloads_its_library(tmp_path):
    """tvm.runtime.load_module pins every library for the process' life (1 mapped .so per
    kernel ever loaded); dsl.load now lets the Kernel own it."""
    build(str(tmp_path), "unload_k", "A")
    kernel = dsl.load("unload_k", tmp_path)
    func = kernel.func
    del kernel
    assert _mapped(str(tmp_path)) > 0, "a function still held keeps its library loaded"
    func = None  # noqa: F841 - drop the last reference
    import gc

    gc.collect()
    assert _mapped(str(tmp_path)) == 0


def _io(g):
    return [g[0], g[1]], [g[2]]


def test_kernel_cache_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setenv("DSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernel_cache, "MAX_KERNELS", 2)
    kernel_cache.clear_memory()
    try:
        for i, v in enumerate("ABA"):
            kernel_cache.get_kernel({"rel_bound": v, "i": i}, lambda v=v: _io(graph(v)),
                                    prefix="bound")
        assert len(kernel_cache._MEMORY) == 2
    finally:
        kernel_cache.clear_memory()


def test_load_waits_for_a_publish_in_progress(tmp_path):
    """load used to read .so and .json without the build lock: a reader racing a publish could
    pair one build's .so with another's .json (refused, E60040) or dlopen a .so replaced after
    it was hashed. It now shares the lock the publisher holds."""
    build(str(tmp_path), "pub_k", "A")
    meta = tmp_path / "kernel_meta"
    other = tmp_path / "other"
    build(str(other), "pub_k", "B")
    result = {}

    def reader():
        result["variant"] = check_kernel(str(tmp_path), "pub_k")

    with _lock(meta / ".pub_k.lock"):
        shutil.copy(other / "kernel_meta" / "pub_k.so", meta / "pub_k.so")  # half published
        t = threading.Thread(target=reader)
        t.start()
        time.sleep(0.5)
        assert t.is_alive(), "load did not wait for the publisher's lock"
        shutil.copy(other / "kernel_meta" / "pub_k.json", meta / "pub_k.json")
    t.join(60)
    assert result["variant"] == "B"


def test_temporaries_carry_the_builder_pid(tmp_path, monkeypatch):
    """Temporaries were named ``.<name>.<random>``: one left by a killed build could never be
    told from a live builder's, so they piled up. The pid makes them sweepable."""
    seen = []
    real = os.replace

    def spy(src, dst, *a, **k):
        seen.append(os.path.basename(src))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", spy)
    build(str(tmp_path), "tmp_k", "A")
    assert seen and all(s.startswith(f".tmp_k.{os.getpid()}.") for s in seen)


# Found by hypothesis (test_properties, dx with a non-finite weight), shrunk to this case:
# the dx kernel gathers over every tap and multiplies taps that fall outside dy by the zero
# padding of dy, so a NaN / inf weight turned 0 * NaN into NaN at dx positions that tap never
# reaches (the scatter-form reference, like the math, has no such product). Fixed by the exact
# twins that run when the kernel finds a non-finite weight (dsl.runtime.run_if).
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_dx_nonfinite_weight_does_not_leak_through_padding(value):
    from helpers import dx_kernel
    from reference import conv2d_backprop_input as ref_dx

    c = {"n": 1, "cin": 1, "cout": 1, "h": 1, "w": 2, "kh": 1, "kw": 2, "stride": (1, 1),
         "pads": (0, 0, 0, 0), "dil": (1, 1), "groups": 1}
    dy = np.array([[[[0.5]]]], "float32")
    w = np.array([[[[value, 0.25]]]], "float32")
    out5 = dx_kernel(c, "float32", "float32")(dsl.layout.weight_to_fracz(w),
                                              dsl.layout.nchw_to_5hd(dy))
    out = dsl.layout.nc1hwc0_to_nchw(out5, 1)
    ref = ref_dx(dy, w, (1, 1, 1, 2), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    assert np.isfinite(ref[0, 0, 0, 1])  # dx[.., 1] = dy[0] * w[1] only
    np.testing.assert_array_equal(out[0, 0, 0, 1], ref[0, 0, 0, 1])


@pytest.mark.parametrize("content", ["[" * 100_000 + "]" * 100_000, "", "{", '{"sha256": 1}',
                                     "[]"], ids=["nested-bomb", "empty", "truncated",
                                                 "sha-int", "array"])
def test_build_replaces_any_unusable_existing_json(tmp_path, content):
    """build read the old .json to decide on reuse; a deeply nested one raised RecursionError
    (not a ValueError) out of build. Any unusable .json must just be rebuilt over."""
    meta = tmp_path / "kernel_meta"
    meta.mkdir()
    (meta / "old_k.json").write_text(content)
    build(str(tmp_path), "old_k", "A")
    assert check_kernel(str(tmp_path), "old_k") == "A"


# Found by hypothesis (deep profile, test_dx_matches_reference), shrunk to this case: along W
# the only output column reads the left padding, so dx is identically zero and its compute
# reads neither dy nor the filters; build then refused the kernel's own tensor_list
# ("'filters' is neither an input nor an output"). Unread placeholders are now arguments.
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_dx_whose_every_tap_is_padding_builds_and_is_zero(dtype):
    from helpers import dx_data, dx_kernel
    from reference import conv2d_backprop_input as ref_dx

    c = {"n": 1, "cin": 1, "cout": 1, "h": 1, "w": 1, "kh": 1, "kw": 1, "stride": (1, 2),
         "pads": (0, 0, 1, 0), "dil": (1, 1), "groups": 1}
    dy, w = dx_data(c, dtype)
    out5 = dx_kernel(c, dtype, dtype)(dsl.layout.weight_to_fracz(w), dsl.layout.nchw_to_5hd(dy))
    ref = ref_dx(dy, w, (1, 1, 1, 1), (1, 2), (0, 0, 1, 0), (1, 1), 1)
    assert not ref.any() and not out5.any()


def test_build_ignores_a_fifo_planted_as_its_json(tmp_path):
    """build read ``<name>.json`` to decide on reuse without checking it is a regular file: a
    FIFO there blocked the build forever."""
    meta = tmp_path / "kernel_meta"
    meta.mkdir()
    os.mkfifo(meta / "fifo_k.json")
    done = threading.Event()
    t = threading.Thread(target=lambda: (build(str(tmp_path), "fifo_k", "A"), done.set()),
                         daemon=True)
    t.start()
    t.join(120)
    if not done.is_set():  # unblock the reader so the thread can end
        with open(meta / "fifo_k.json", "w"):
            pass
    assert done.is_set(), "build blocked on a FIFO"
    assert check_kernel(str(tmp_path), "fifo_k") == "A"


def test_build_on_a_full_disk_is_refused_not_aborted(tmp_path, monkeypatch):
    """LLVM aborts the process on a failed write ("LLVM ERROR: IO failure on output stream",
    seen with RLIMIT_FSIZE): a build on a full disk killed Python. It is refused up front."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1 << 20))
    with pytest.raises(dsl.DslError) as info:
        build(str(tmp_path), "full_k", "A")
    assert info.value.code == "E60040" and "free" in str(info.value)
    assert not [p for p in (tmp_path / "kernel_meta").iterdir() if not p.name.endswith(".lock")]
