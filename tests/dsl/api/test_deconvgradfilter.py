"""The seed's interface: fp_/hp_deconv_grad_filter_s/_p with param[] and core_mask."""

import os
import time

import numpy as np
import pytest

import dsl
import targets
from dsl import kernel_cache
from dsl.api.deconvgradfilter import (
    STATS,
    aligned_empty,
    fp_deconv_grad_filter_p,
    fp_deconv_grad_filter_s,
    hp_deconv_grad_filter_p,
    hp_deconv_grad_filter_s,
)

from helpers import assert_close
from reference import deconv_grad_filter as ref_dw

API = {"float32": (fp_deconv_grad_filter_p, fp_deconv_grad_filter_s),
       "float16": (hp_deconv_grad_filter_p, hp_deconv_grad_filter_s)}
CORES = targets.machine_cores()
FULL_MASK = (1 << CORES) - 1


def P(b, ih, iw, ic, oh, ow, oc, kh, kw, sh=1, sw=1, pu=0, pl=0, dh=1, dw=1, g=1, ws=None):
    """A param[] laid out as the seed lists it (param[17] the workspace, optional)."""
    p = [b, ih, iw, ic, b, oh, ow, oc, kh, kw, sh, sw, pu, pl, dh, dw, g]
    return p if ws is None else [*p, ws]


SEED = P(16, 4, 4, 4, 4, 4, 4, 4, 4, ws=0x10050000)  # the seed's example
GROUPED = P(2, 5, 4, 6, 11, 9, 4, 3, 2, 2, 3, 1, 2, 2, 1, 2)
DEPTHWISE = P(2, 6, 6, 8, 12, 12, 8, 3, 3, 2, 2, 1, 1, 1, 1, 8)
LONG_K = P(16, 16, 16, 4, 16, 16, 4, 2, 2)  # reduction split into partial sums


def dw_size(p):
    return p[16] * (p[7] // p[16]) * p[8] * p[9] * (p[3] // p[16])


def seed_data(p, dtype, seed=0):
    """The seed's recipe: rand() % 10 / 50 + 0.1, flat buffers."""
    rng = np.random.default_rng(seed)
    x = (rng.integers(0, 10, p[0] * p[1] * p[2] * p[3]) / 50 + 0.1).astype(dtype)
    dy = (rng.integers(0, 10, p[4] * p[5] * p[6] * p[7]) / 50 + 0.1).astype(dtype)
    return dy, x


def reference(p, dy, x):
    r = ref_dw(dy.reshape(p[4:8]), x.reshape(p[0:4]), p[8:10], p[10:12], p[12:14], p[14:16],
               p[16])
    return r.reshape(p[16], -1, p[3] // p[16])  # the seed's [group, OCg*kh*kw, ICg]


def run(fn, p, dy, x, *mask):
    dw = np.zeros(dw_size(p), dy.dtype)
    fn(dy, x, dw, p, *mask)
    return dw


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("p", [SEED, GROUPED, DEPTHWISE, LONG_K],
                         ids=["seed", "grouped", "depthwise", "long_k"])
def test_private_and_shared_agree_bitwise(p, dtype):
    private, shared = API[dtype]
    dy, x = seed_data(p, dtype)
    ref = reference(p, dy, x)
    out = run(private, p, dy, x)
    assert_close(out.reshape(ref.shape), ref, dtype, "private")
    masks = sorted({1, 1 << (CORES - 1), FULL_MASK, 0b11 & FULL_MASK})
    for mask in masks:
        got = run(shared, p, dy, x, mask)
        assert np.array_equal(got, out), f"core_mask {bin(mask)} differs from private"


def test_shaped_flat_and_strided_buffers():
    p = GROUPED
    dy, x = seed_data(p, "float32", seed=3)
    ref = reference(p, dy, x)
    dw = np.full(ref.shape, np.nan, np.float32)  # the seed's layout [G, OCg*kh*kw, ICg]
    fp_deconv_grad_filter_p(dy, x.reshape(p[0:4]), dw, np.array(p, np.int64))
    assert_close(dw, ref, "float32", "shaped")
    base = np.full(2 * ref.size, np.nan, np.float32)
    strided = base[::2]  # neither contiguous nor shareable with TVM: written by copy
    fp_deconv_grad_filter_s(dy.reshape(p[4:8]), x, strided, p, FULL_MASK)
    assert np.array_equal(strided.reshape(ref.shape), dw)
    assert np.isnan(base[1::2]).all(), "elements between the strided ones must stay"
    aligned = aligned_empty(ref.shape, np.float32)  # shared with the kernel, no copy
    fp_deconv_grad_filter_p(dy, x, aligned, p + [12345])
    assert np.array_equal(aligned, dw)


def test_misaligned_buffers_are_used_in_place():
    """The kernels assume element alignment only: arrays off a 64-byte boundary (numpy's
    allocator guarantees 16 bytes) are handed over as they are, dw written in place."""
    from dsl.api.deconvgradfilter import _tvm_view

    p = GROUPED
    dy, x = seed_data(p, "float32", seed=4)
    ref = reference(p, dy, x)
    views = []
    for a, elems in ((dy, 1), (x, 3)):
        v = aligned_empty(a.size + elems, np.float32)[elems:]
        v[...] = a.ravel()
        views.append(v)
    dw = aligned_empty(ref.size + 1, np.float32)[1:].reshape(ref.shape)
    assert all(v.ctypes.data % 64 for v in (*views, dw))
    shared = _tvm_view(dw, ref.shape, copy=False)
    assert shared is not None and shared.data_ptr() == dw.ctypes.data  # no copy
    fp_deconv_grad_filter_s(views[0], views[1], dw, p, FULL_MASK)
    assert_close(dw, ref, "float32", "misaligned")


def test_dw_overlapping_an_input_is_computed_from_the_original_input():
    p = SEED  # dw (1024 elements) is the first quarter of dy's buffer
    dy, x = seed_data(p, "float32", seed=6)
    buf = aligned_empty(dy.size, np.float32)
    buf[...] = dy
    ref = reference(p, dy, x)
    fp_deconv_grad_filter_p(buf, x, buf[:dw_size(p)], p)
    assert_close(buf[:dw_size(p)].reshape(ref.shape), ref, "float32", "aliased")
    assert np.array_equal(buf[dw_size(p):], dy[dw_size(p):])


def test_param_17_absent_or_any_value():
    dy, x = seed_data(SEED, "float32")
    outs = [run(fp_deconv_grad_filter_p, SEED[:17] + extra, dy, x)
            for extra in ([], [0], [-1], [2**62])]
    assert all(np.array_equal(o, outs[0]) for o in outs)


def test_kernel_built_once_per_parameter_set():
    dy, x = seed_data(DEPTHWISE, "float16", seed=5)
    run(hp_deconv_grad_filter_p, DEPTHWISE, dy, x)
    builds, hits = kernel_cache.STATS["builds"], kernel_cache.STATS["hits"]
    for _ in range(3):
        run(hp_deconv_grad_filter_p, DEPTHWISE, dy, x)
    assert kernel_cache.STATS["builds"] == builds
    assert kernel_cache.STATS["hits"] == hits + 3


def _cpu_ticks() -> dict[int, int]:
    """utime + stime (clock ticks) of every thread of this process."""
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        ticks[int(tid)] = int(fields[11]) + int(fields[12])
    return ticks


def _busy_threads(fn, min_ticks=20, max_seconds=20.0):
    """Run ``fn`` until the process accrued ``min_ticks`` CPU ticks; per-thread deltas."""
    before = _cpu_ticks()
    t0 = time.monotonic()
    while True:
        fn()
        now = _cpu_ticks()
        delta = {t: now[t] - before.get(t, 0) for t in now}
        if sum(delta.values()) >= min_ticks or time.monotonic() - t0 > max_seconds:
            return delta


BIG = P(8, 16, 16, 64, 32, 32, 64, 4, 4, 2, 2, 1, 1)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_private_version_runs_on_the_calling_thread_only(monkeypatch):
    import threading

    # TVM would run any parallel loop on this many threads: the kernel must have none
    monkeypatch.setenv("TVM_NUM_THREADS", str(max(2, CORES)))
    monkeypatch.setenv("TVM_BIND_THREADS", "0")
    dy, x = seed_data(BIG, "float32")
    dw = np.zeros(dw_size(BIG), np.float32)
    fp_deconv_grad_filter_p(dy, x, dw, BIG)  # build outside the measurement
    time.sleep(0.3)  # let spinning pool threads (TVM's, PyTorch's OpenMP) go to sleep
    delta = _busy_threads(lambda: fp_deconv_grad_filter_p(dy, x, dw, BIG), min_ticks=30)
    me = threading.get_native_id()
    assert STATS["threads"] == 1
    others = sum(v for t, v in delta.items() if t != me)
    # a kernel splitting its work over two threads would give ``others`` about ``delta[me]``
    assert delta[me] >= 20 and others <= max(2, delta[me] // 5), delta


@pytest.mark.skipif(CORES < 2 or not os.path.isdir("/proc/self/task"),
                    reason="needs two cores and Linux /proc")
def test_shared_version_uses_popcount_threads():
    dy, x = seed_data(BIG, "float32")
    dw = np.zeros(dw_size(BIG), np.float32)
    fp_deconv_grad_filter_s(dy, x, dw, BIG, 0b11)
    assert STATS["threads"] == 2  # TVM's own count for the pool that ran the kernel
    delta = _busy_threads(lambda: fp_deconv_grad_filter_s(dy, x, dw, BIG, 0b11))
    assert sum(1 for v in delta.values() if v >= 2) >= 2, delta
    fp_deconv_grad_filter_s(dy, x, dw, BIG, 0b10)
    assert STATS["threads"] == 1


@pytest.mark.skipif(CORES < 2, reason="needs two cores")
def test_shared_version_runs_on_the_callers_pool_when_its_size_matches(monkeypatch):
    import tvm

    from dsl.api import deconvgradfilter as api

    def no_helper():
        raise AssertionError("handed to the helper thread")

    dy, x = seed_data(BIG, "float32")
    dw = np.zeros(dw_size(BIG), np.float32)
    mine = api._caller_pool_threads()
    assert mine == tvm.runtime.num_threads()
    monkeypatch.setattr(api, "_executor", no_helper)
    fp_deconv_grad_filter_s(dy, x, dw, BIG, (1 << mine) - 1)
    assert STATS["threads"] == mine
    other = next((c for c in range(2, CORES + 1) if c != mine), None)
    if other is not None:  # a count the caller's pool does not have: the helper runs it
        with pytest.raises(AssertionError, match="helper"):
            fp_deconv_grad_filter_s(dy, x, dw, BIG, (1 << other) - 1)


@pytest.mark.skipif(CORES < 2, reason="needs two cores")
def test_shared_version_reconfigures_a_pool_at_another_count_then_restores_the_default(
        monkeypatch):
    import tvm

    from dsl.api import deconvgradfilter as api

    monkeypatch.setattr(api, "_caller_pool_threads", lambda: 0)  # another count: the helper

    def helper_threads():
        return api._executor().submit(tvm.runtime.num_threads).result()

    dy, x = seed_data(BIG, "float32")
    dw = np.zeros(dw_size(BIG), np.float32)
    fp_deconv_grad_filter_s(dy, x, dw, BIG, 0b11)
    default = helper_threads()
    api._executor().submit(api._configure, 1).result()  # a pool left at another count
    try:
        assert helper_threads() == 1
        fp_deconv_grad_filter_s(dy, x, dw, BIG, 0b11)
        assert STATS["threads"] == 2
        assert helper_threads() == default
    finally:
        api._executor().submit(api._configure, 0).result()


def _with(p, **changes):
    q = list(p)
    for k, v in changes.items():
        q[int(k[1:])] = v
    return q


@pytest.mark.parametrize("changes, code, param", [
    ({"i4": 15}, "E60003", "param[4]"),                 # batch mismatch
    ({"i3": 6, "i16": 4}, "E60002", "param[3]"),         # in_c not divisible by group
    ({"i7": 6, "i16": 4}, "E60002", "param[7]"),         # out_c not divisible by group
    ({"i16": 0}, "E60108", "param[16]"),
    ({"i10": 0}, "E60011", "param[10]"),                # stride
    ({"i11": -2}, "E60011", "param[11]"),
    ({"i14": 0}, "E60011", "param[14]"),                # dilation
    ({"i15": -1}, "E60011", "param[15]"),
    ({"i12": -1}, "E60011", "param[12]"),               # pad
    ({"i12": 20}, "E60025", "param[5]"),                # dy too small for any tap (rows)
    ({"i6": 1, "i13": 7}, "E60025", "param[6]"),        # ... (columns)
    ({"i8": 0}, "E60003", "param[8]"),
    ({"i1": True}, "E60005", "param[1]"),
    ({"i2": 4.0}, "E60005", "param[2]"),
    ({"i0": 1 << 60, "i4": 1 << 60}, "E60003", "param[0]"),  # beyond int64 indexing
    ({"i5": 1 << 62}, "E60003", "param[5]"),            # dy beyond int64: names out_h
    ({"i9": 1 << 62}, "E60003", "param[9]"),             # dw beyond int64: names kernel_w
])
def test_param_errors_before_any_work(changes, code, param):
    p = _with(SEED, **changes)
    dy, x = seed_data(SEED, "float32")
    dw = np.full(dw_size(SEED), 7.0, np.float32)
    builds = kernel_cache.STATS["builds"]
    with pytest.raises(dsl.DslError) as e:
        fp_deconv_grad_filter_s(dy, x, dw, p, 1)
    assert e.value.code == code and e.value.param == param, e.value
    assert param in str(e.value)
    assert (dw == 7.0).all() and kernel_cache.STATS["builds"] == builds


def test_buffer_and_mask_errors_leave_dw_untouched():
    dy, x = seed_data(SEED, "float32")
    dw = np.full(dw_size(SEED), 7.0, np.float32)
    cases = [
        (lambda: fp_deconv_grad_filter_p(dy, x, dw[:-1], SEED), "dw.size"),
        (lambda: fp_deconv_grad_filter_p(dy[:-4], x, dw, SEED), "dy.size"),
        (lambda: fp_deconv_grad_filter_p(dy, x[:5], dw, SEED), "x.size"),
        (lambda: hp_deconv_grad_filter_p(dy, x, dw, SEED), "dy.dtype"),
        (lambda: fp_deconv_grad_filter_p(dy, x.astype(np.float16), dw, SEED), "x.dtype"),
        (lambda: fp_deconv_grad_filter_p(dy, x, dw, SEED[:16]), "param"),
        (lambda: fp_deconv_grad_filter_p(dy, x, dw, "16,4,4"), "param"),
        (lambda: fp_deconv_grad_filter_p(dy, x, dw, np.array(SEED, float)), "param"),
        (lambda: fp_deconv_grad_filter_p(dy.tolist(), x, dw, SEED), "dy"),
        (lambda: fp_deconv_grad_filter_s(dy, x, dw, SEED, 0), "core_mask"),
        (lambda: fp_deconv_grad_filter_s(dy, x, dw, SEED, -1), "core_mask"),
        (lambda: fp_deconv_grad_filter_s(dy, x, dw, SEED, 1 << CORES), "core_mask"),
        (lambda: fp_deconv_grad_filter_s(dy, x, dw, SEED, True), "core_mask"),
    ]
    builds = kernel_cache.STATS["builds"]
    for call, param in cases:
        with pytest.raises(dsl.DslError) as e:
            call()
        assert e.value.param == param, e.value
    ro = np.zeros(dw_size(SEED), np.float32)
    ro.flags.writeable = False
    with pytest.raises(dsl.DslError):
        fp_deconv_grad_filter_p(dy, x, ro, SEED)
    assert (dw == 7.0).all() and kernel_cache.STATS["builds"] == builds


def test_dw_size_error_names_the_params():
    dy, x = seed_data(SEED, "float32")
    with pytest.raises(dsl.DslError) as e:
        fp_deconv_grad_filter_p(dy, x, np.zeros(10, np.float32), SEED)
    for i in (3, 7, 8, 9, 16):
        assert f"param[{i}]" in e.value.rule


def test_repeated_calls_reuse_the_checked_geometry_and_the_cache_key():
    from dsl.api import deconvgradfilter as api

    geo = api.parse_param(list(BIG))
    assert api.parse_param(list(BIG)) is geo  # checked once
    bad = list(BIG)
    bad[3] = 0  # in_c
    with pytest.raises(dsl.DslError):
        api.parse_param(bad)
    with pytest.raises(dsl.DslError):
        api.parse_param(bad)  # a failed check is never remembered
    dy, x = seed_data(BIG, "float32")
    dw = np.zeros(dw_size(BIG), np.float32)
    fp_deconv_grad_filter_p(dy, x, dw, BIG)
    first = dw.copy()
    kernel_cache.clear_memory()  # the remembered key no longer answers: looked up again
    dw[...] = 0
    fp_deconv_grad_filter_p(dy, x, dw, BIG)
    np.testing.assert_array_equal(dw, first)
