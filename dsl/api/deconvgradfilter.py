"""The DSP library's ``deconvgradfilter.h`` in Python: DeconvGradFilter on numpy arrays.

Four entry points, as the seed declares them::

    fp_deconv_grad_filter_s(dy, x, dw, param, core_mask)   # float32, shared storage
    hp_deconv_grad_filter_s(dy, x, dw, param, core_mask)   # float16, shared storage
    fp_deconv_grad_filter_p(dy, x, dw, param)              # float32, private storage
    hp_deconv_grad_filter_p(dy, x, dw, param)              # float16, private storage

Each computes the weight gradient of an NHWC transposed convolution (see
:mod:`dsl.ops.deconv_grad_filter` for the math) and writes it into ``dw`` in place. The first call
with a given parameter set builds the kernel (and caches it, see :mod:`dsl.runtime.kernel_cache`);
later calls only run it.

``param`` (a sequence of at least 17 integers, the seed's ``long long param[]``)
----------------------------------------------------------------------------------
=========  ======================================================================
param[0]   batch of x (``input_batch``)
param[1]   in_h
param[2]   in_w
param[3]   in_c (divisible by group)
param[4]   batch of dy: must equal param[0] (the seed's example sets them equal)
param[5]   out_h: any value >= 1 such that some tap ``ih*stride_h - pad_u + kh*dilation_h``
           lands in ``[0, out_h)``; taps outside are dropped (the example's out_h = in_h with a
           4x4 kernel is a cropped output), dy rows no tap reaches are ignored
param[6]   out_w, likewise
param[7]   out_c (divisible by group)
param[8]   kernel_h
param[9]   kernel_w
param[10]  stride_h (>= 1)
param[11]  stride_w (>= 1)
param[12]  pad_u (>= 0): rows cropped from the top of the full transposed-conv output
param[13]  pad_l (>= 0): columns cropped from the left
param[14]  dilation_h (>= 1)
param[15]  dilation_w (>= 1)
param[16]  group
param[17]  the im2row workspace address: unused here (the kernel needs no workspace); it may
           be absent or hold any value
=========  ======================================================================

Arrays
------
dy : ``(param[4], out_h, out_w, out_c)`` NHWC, x : ``(param[0], in_h, in_w, in_c)`` NHWC, and
dw : ``[group, out_c/group * k_h * k_w, in_c/group]`` (per group OHWI). Each may have any shape
holding the right number of elements (flat buffers are fine); elements are taken in C order.
``fp_`` takes float32, ``hp_`` float16 (accumulated in float32, result rounded to float16).

Cores
-----
``core_mask`` bit ``i`` is the ``i``-th core this process may run on
(:func:`targets.machine_cores`); the shared-storage call runs on ``popcount(core_mask)``
threads: its kernel is built for a target with that many cores, and TVM's runtime thread pool
is set to that many threads for the call (``runtime.config_threadpool``) on a helper thread
whose pool this module owns, then put back to TVM's default (a pool already at that count is
used as it is: reconfiguring costs the next launch 0.3-0.4 ms). A mask of 0, a negative mask or a
bit at or beyond ``machine_cores()`` is an error. The private-storage call runs on the calling
thread only: its kernel has no parallel loop. Partial sums are split by shape alone, so every
core count gives bit-identical results.

Errors
------
Every check runs before anything is built or written: a :class:`dsl.DslError` names the
``param[i]`` at fault (or the array), and ``dw`` is left untouched.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import targets
from dsl.errors import E_DTYPE, E_RANGE, E_SHAPE, E_TYPE, E_VALUE, check_int, check_ndarray, fail
from dsl.ops.deconv_grad_filter import FIELDS, DeconvGeometry, check_geometry

PARAM_LEN = 17  # param[17], the workspace, is optional
PARAM_NAMES = {f: f"param[{i}]" for i, f in enumerate(FIELDS)}
STATS = {"threads": None}  # TVM runtime threads of the last call (for tests / diagnostics)

_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()
_RUN_LOCK = threading.Lock()


# Geometries of params already checked, by their first PARAM_LEN values (plain ints only):
# a call repeats its param and the checks cost more than a 1 ms kernel can hide. And the
# kernel cache's key per (geometry, dtype, cores, target, int64 threshold) (see _kernel).
_GEOMETRIES: dict[tuple, DeconvGeometry] = {}
_KEYS: dict[tuple, str] = {}
MEMO_MAX = 256


def _remembered(memo: dict, key, make):
    """``memo[key]``, made by ``make()`` the first time (the memo emptied at MEMO_MAX)."""
    value = memo.get(key)
    if value is None:
        value = make()
        if len(memo) >= MEMO_MAX:
            memo.clear()
        memo[key] = value
    return value


def parse_param(param) -> DeconvGeometry:
    """Check ``param`` (see the module docstring) and return the geometry."""
    key = _memo_key(param)
    if key is None:
        return _check_param(param)
    return _remembered(_GEOMETRIES, key, lambda: _check_param(param))


def _memo_key(param) -> tuple | None:
    if type(param) not in (list, tuple) or len(param) < PARAM_LEN:
        return None
    head = tuple(param[:PARAM_LEN])
    return head if all(type(v) is int for v in head) else None


def _check_param(param) -> DeconvGeometry:
    if isinstance(param, np.ndarray):
        if param.ndim != 1 or not np.issubdtype(param.dtype, np.integer):
            raise fail(E_TYPE, "param", f"ndarray {param.dtype} {param.shape}",
                       "must be a 1-D integer array (the seed's long long param[])")
        param = param.tolist()
    if isinstance(param, (str, bytes)) or not hasattr(param, "__len__") or not hasattr(
            param, "__getitem__"):
        raise fail(E_TYPE, "param", param, f"must be a sequence of at least {PARAM_LEN} ints")
    if len(param) < PARAM_LEN:
        raise fail(E_SHAPE, "param", len(param),
                   f"must hold at least {PARAM_LEN} integers (param[0..16]); got {len(param)}")
    return check_geometry({f: param[i] for i, f in enumerate(FIELDS)}, PARAM_NAMES)


def _array(name: str, a: object, count: int, dtype: str, rule: str) -> np.ndarray:
    check_ndarray(name, a)
    if str(a.dtype) != dtype:
        raise fail(E_DTYPE, f"{name}.dtype", str(a.dtype), f"must be {dtype}")
    if a.size != count:
        raise fail(E_SHAPE, f"{name}.size", a.size, f"must be {rule} = {count}")
    return a


def core_count(core_mask: object) -> int:
    """Cores selected by ``core_mask`` (its popcount), checked against this machine."""
    avail = targets.machine_cores()
    mask = check_int("core_mask", core_mask, lo=1, code=E_RANGE)
    if mask >> avail:
        raise fail(E_RANGE, "core_mask", bin(mask),
                   f"selects a core beyond the {avail} this process may run on "
                   f"(bits 0..{avail - 1})")
    return bin(mask).count("1")


def kernel_for(geo: DeconvGeometry, dtype: str, cores: int):
    """The built (cached) :class:`dsl.Kernel` that runs ``geo`` in ``dtype`` on ``cores``
    cores: ``kernel(dy, x) -> dw`` with dw shaped ``(group, OCg, k_h, k_w, ICg)``."""
    from tvm import te

    from dsl.ops.deconv_grad_filter import deconv_grad_filter
    from dsl.runtime.kernel_cache import get_kernel

    def make():
        dy = te.placeholder(geo.dy_shape, dtype, name="dy")
        x = te.placeholder(geo.x_shape, dtype, name="x")
        dw = deconv_grad_filter(dy, x, kernel=(geo.kernel_h, geo.kernel_w),
                                stride=(geo.stride_h, geo.stride_w),
                                pad=(geo.pad_u, geo.pad_l),
                                dilation=(geo.dilation_h, geo.dilation_w), group=geo.group)
        return [dy, x], [dw]

    tgt = targets.current().with_cores(cores)
    return get_kernel(_signature(geo, dtype), make, prefix="deconvgradfilter", target=tgt)


def _signature(geo: DeconvGeometry, dtype: str) -> dict:
    return {"op": "deconvgradfilter", "geometry": geo.as_json(), "dtype": dtype}


def _kernel(geo: DeconvGeometry, dtype: str, cores: int):
    """:func:`kernel_for`, with the kernel cache's key for these arguments remembered: a
    repeated call skips hashing the signature (the cache itself still answers)."""
    from dsl.runtime import kernel_cache, schedule

    tgt = targets.current()
    key = _remembered(_KEYS, (geo, dtype, cores, tgt, schedule.INT64_INDEX_FROM),
                      lambda: kernel_cache.signature_key(_signature(geo, dtype),
                                                         tgt.with_cores(cores)))
    return kernel_cache.cached(key) or kernel_for(geo, dtype, cores)


@contextlib.contextmanager
def _unbound():
    """TVM pins its pool threads (and the thread configuring it) to cores unless
    ``TVM_BIND_THREADS`` says otherwise; on a shared machine we leave placement to the OS."""
    old = os.environ.get("TVM_BIND_THREADS")
    if old is None:
        os.environ["TVM_BIND_THREADS"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TVM_BIND_THREADS", None)


def _configure(threads: int) -> None:
    """Set the calling thread's TVM pool (and TVM's process-wide concurrency) to ``threads``;
    0 restores TVM's default (``TVM_NUM_THREADS``, else half the hardware threads)."""
    import tvm

    config = tvm.get_global_func("runtime.config_threadpool")
    with _unbound():
        if threads:
            # mode 1 (kBig); the CPU list only sets the maximum concurrency to its length
            config(1, threads, [str(i) for i in range(threads)])
        else:
            config(1, 0)


_CALLER = threading.local()


def _caller_pool_threads() -> int:
    """Threads of the calling thread's own TVM pool. The first call from a thread creates
    the pool, unpinned, as TVM would for any kernel that thread runs."""
    import tvm

    if getattr(_CALLER, "has_pool", False):
        return tvm.runtime.num_threads()
    with _unbound():
        n = tvm.runtime.num_threads()
    _CALLER.has_pool = True
    return n


def _init_pool_thread() -> None:
    # the pool is created on first use with as many workers as the concurrency then in force:
    # create it with every core so later calls can use any number up to that
    _configure(targets.machine_cores())
    _configure(0)


def _executor() -> ThreadPoolExecutor:
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dsl-deconv",
                                           initializer=_init_pool_thread)
        return _EXECUTOR


def _run_threads(threads: int, fn):
    if _caller_pool_threads() == threads:  # no hand-over to the helper thread needed
        STATS["threads"] = threads
        return fn()

    def job():
        import tvm

        # reconfiguring restarts the pool's workers and the next launch pays for waking them
        # (0.3-0.4 ms on a 3.5 ms kernel), so a pool already at that count is used as it is
        reconfigure = tvm.runtime.num_threads() != threads
        if reconfigure:
            _configure(threads)
        try:
            STATS["threads"] = tvm.runtime.num_threads()
            return fn()
        finally:
            if reconfigure:
                _configure(0)

    with _RUN_LOCK:
        return _executor().submit(job).result()


def _deconv_grad_filter(dtype: str, dy, x, dw, param, cores: int | None, core_mask) -> None:
    geo = parse_param(param)
    pn = PARAM_NAMES
    _array("dy", dy, math.prod(geo.dy_shape), dtype,
           f"{pn['dy_batch']}*{pn['out_h']}*{pn['out_w']}*{pn['out_c']}")
    _array("x", x, math.prod(geo.x_shape), dtype,
           f"{pn['batch']}*{pn['in_h']}*{pn['in_w']}*{pn['in_c']}")
    _array("dw", dw, math.prod(geo.dw_shape), dtype,
           f"{pn['group']} * ({pn['out_c']}/{pn['group']})*{pn['kernel_h']}*{pn['kernel_w']}"
           f" * ({pn['in_c']}/{pn['group']})")
    if not dw.flags.writeable:
        raise fail(E_VALUE, "dw", "read-only array", "must be writeable (written in place)")
    if cores is None:
        cores = core_count(core_mask)
    kernel = _kernel(geo, dtype, cores)
    args = [_tvm_view(dy, geo.dy_shape, copy=True), _tvm_view(x, geo.x_shape, copy=True)]
    aliased = np.may_share_memory(dw, dy) or np.may_share_memory(dw, x)
    out = None if aliased else _tvm_view(dw, geo.dw_shape, copy=False)
    args.append(out if out is not None else _tvm_empty(geo.dw_shape, dtype))
    if cores == 1:  # no parallel loop in the kernel: runs on the calling thread
        STATS["threads"] = 1
        kernel.func(*args)
    else:
        _run_threads(cores, lambda: kernel.func(*args))
    if out is None:  # dw not shareable with TVM (strided, overlapping an input)
        np.copyto(dw, args[2].numpy().reshape(dw.shape))


def _tvm_view(a: np.ndarray, shape, *, copy: bool):
    """``a`` as a TVM tensor of ``shape`` sharing its memory when TVM accepts it (C-contiguous
    and writeable: the kernels assume only element alignment); else an aligned copy, or None
    when ``copy`` is False."""
    import tvm
    import tvm_ffi

    if a.flags.c_contiguous:
        try:  # tvm_ffi's, not tvm.runtime.from_dlpack, which insists on 64-byte alignment
            return tvm_ffi.from_dlpack(a.reshape(shape))
        except (BufferError, ValueError, TypeError, RuntimeError):
            pass  # e.g. a read-only array cannot be exported through DLPack
    if not copy:
        return None
    return tvm.runtime.tensor(np.ascontiguousarray(a).reshape(shape))


def _tvm_empty(shape, dtype: str):
    import tvm

    return tvm.runtime.empty(shape, dtype, tvm.cpu())


def fp_deconv_grad_filter_s(dy_data, x_data, dw_data, param, core_mask) -> None:
    """float32 DeconvGradFilter on ``popcount(core_mask)`` cores; writes ``dw_data``.

    ``dw[g, oc, kh, kw, ic] = sum_{b, ih, iw} dy[b, ih*sh - pad_u + kh*dh,
    iw*sw - pad_l + kw*dw, g*OCg + oc] * x[b, ih, iw, g*ICg + ic]`` (dy zero outside).

    Parameters
    ----------
    dy_data : numpy.ndarray, float32
        NHWC ``(param[4], param[5], param[6], param[7])``, or any shape of that size.
    x_data : numpy.ndarray, float32
        NHWC ``(param[0], param[1], param[2], param[3])``, or any shape of that size.
    dw_data : numpy.ndarray, float32, writeable
        ``[group, out_c/group*k_h*k_w, in_c/group]`` (or any shape of that size), overwritten.
    param : sequence of >= 17 int
        See the module docstring.
    core_mask : int
        Cores to use (bit i = core i); at least one bit, none beyond this machine's cores.
    """
    _deconv_grad_filter("float32", dy_data, x_data, dw_data, param, None, core_mask)


def hp_deconv_grad_filter_s(dy_data, x_data, dw_data, param, core_mask) -> None:
    """float16 DeconvGradFilter on ``popcount(core_mask)`` cores (float32 accumulation, the
    result rounded to float16). Arguments as :func:`fp_deconv_grad_filter_s`, float16."""
    _deconv_grad_filter("float16", dy_data, x_data, dw_data, param, None, core_mask)


def fp_deconv_grad_filter_p(dy_data, x_data, dw_data, param) -> None:
    """float32 DeconvGradFilter on the calling thread (one core). Arguments as
    :func:`fp_deconv_grad_filter_s` without ``core_mask``."""
    _deconv_grad_filter("float32", dy_data, x_data, dw_data, param, 1, None)


def hp_deconv_grad_filter_p(dy_data, x_data, dw_data, param) -> None:
    """float16 DeconvGradFilter on the calling thread (one core), float32 accumulation.
    Arguments as :func:`fp_deconv_grad_filter_s` (float16) without ``core_mask``."""
    _deconv_grad_filter("float16", dy_data, x_data, dw_data, param, 1, None)


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data is 64-byte aligned (whole cache lines).
    The calls above hand any C-contiguous writeable array to the kernel without copying; this
    one also starts on a cache line."""
    shape = tuple(int(d) for d in np.atleast_1d(shape))
    dt = np.dtype(dtype)
    n = math.prod(shape) * dt.itemsize
    raw = np.empty(n + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + n].view(dt).reshape(shape)


__all__ = ["aligned_empty", "fp_deconv_grad_filter_p", "fp_deconv_grad_filter_s",
           "hp_deconv_grad_filter_p", "hp_deconv_grad_filter_s", "kernel_for", "parse_param"]
