"""``load``: a built kernel as a callable on numpy arrays, torch or TVM tensors (zero copy),
checked before it is trusted."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import math
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

import targets
from dsl.errors import E_FILE, E_SHAPE, E_TYPE, E_VALUE, DslError, fail
from dsl.ops.para_dict import check_kernel_name

ALIGN = 64  # bytes: where the arrays a call allocates start (whole cache lines)


class Kernel:
    """A loaded kernel. Call it with numpy arrays, torch tensors or TVM tensors.

    ``kernel(*inputs)`` allocates the outputs (of the first input's kind: numpy, torch or TVM)
    and returns them (one, or a tuple); ``kernel(*inputs, *outputs)`` or
    ``kernel(*inputs, out=outputs)`` writes into the given outputs and returns them.

    Zero copy: a C-contiguous argument (at any address: the kernels assume only that elements
    are aligned to their size) passes to the generated function as is, through DLPack, and
    results are written straight into the given outputs. Only what the generated code cannot
    read in place is copied: strided or read-only arrays, torch's negative views; numpy
    bfloat16 is viewed (not copied); an output that overlaps an input is computed aside then
    copied in. Shapes, dtypes, devices and the argument count are checked before anything
    runs (:class:`dsl.DslError`). ``kernel.bind(...)`` does those checks once for a kernel
    called many times on the same memory (:meth:`bind`).
    """

    def __init__(self, meta: dict, module, func):
        self.meta, self.module, self.func = meta, module, func
        # {symbol: address} of the library's parallel-launch pointers (dsl.runtime.openmp)
        self.parallel_slots: dict[str, int] = {}
        self.name = meta["name"]
        self.inputs = [t for t in meta["tensors"] if t["role"] == "input"]
        self.outputs = [t for t in meta["tensors"] if t["role"] == "output"]
        # the kernel's argument order (inputs and outputs may interleave in the .json)
        roles = [t["role"] == "input" for t in meta["tensors"]]
        self._in_first = roles == sorted(roles, reverse=True)
        self._shapes = {id(t): tuple(t["shape"]) for t in meta["tensors"]}
        self._nbytes = {id(t): math.prod(t["shape"]) * _ITEMSIZE.get(t["dtype"], 8)
                        for t in meta["tensors"]}
        # per call, precomputed: counts, the argument order as positions in (*inputs,
        # *outputs), and the bytes each position spans (for the overlap test)
        specs = [*self.inputs, *self.outputs]
        self._n_in, self._n_out, self._n_all = len(self.inputs), len(self.outputs), len(specs)
        self._order = None if self._in_first else tuple(
            next(j for j, s in enumerate(specs) if s is t) for t in meta["tensors"])
        self._span_bytes = tuple(self._nbytes[id(s)] for s in specs)
        self._pairs = tuple((j, i) for j in range(self._n_in, self._n_all)
                            for i in range(self._n_in))  # (output, input) positions

    def __repr__(self) -> str:
        sig = ", ".join(f"{t['name']}{tuple(t['shape'])}:{t['dtype']}" for t in self.meta[
            "tensors"])
        return f"<dsl.Kernel {self.name}({sig})>"

    def __call__(self, *arrays, out=None):
        if out is None:
            if len(arrays) == self._n_in:
                return self._call_allocating(arrays)
            if len(arrays) != self._n_all:
                raise fail(E_VALUE, f"{self.name}(...)", len(arrays),
                           f"takes {self._n_in} inputs, or {self._n_all} arrays (inputs then "
                           "outputs), or inputs and out=")
            res = arrays[self._n_in:]
            if not self._run_in_place(arrays, True):
                res = self._call_checked(arrays)
            return res[0] if len(res) == 1 else tuple(res)
        tp = type(out)
        args = arrays + (out,) if self._n_out == 1 and tp is not tuple and tp is not list \
            else arrays + tuple(out)
        if len(args) != self._n_all or len(arrays) != self._n_in:
            raise fail(E_VALUE, f"{self.name}(..., out=...)", len(arrays),
                       f"takes {self._n_in} inputs and out= {self._n_out} outputs")
        if not self._run_in_place(args, True):
            self._call_checked(args)
        return out

    def bind(self, *arrays, out=None) -> BoundCall:
        """This kernel on these arrays, checked and converted once: ``run = k.bind(dy,
        out=dx)``, then every ``run()`` is the generated function on the same memory with
        nothing in Python in between (:class:`BoundCall`; a plain call spends 0.5-2 us per
        call on argument tests). For a small kernel called many times on buffers whose
        contents change between calls: preallocated workspaces, a benchmark.

        Arguments as for a call: the inputs and ``out=``, or the inputs then the outputs; the
        inputs alone allocate the outputs (``run.outputs``). Every argument must be usable in
        place: C-contiguous, writeable (numpy's DLPack export refuses read-only arrays), no
        torch negative or conjugate view, no output overlapping an input. What a plain call
        would copy is refused here (:class:`dsl.DslError` naming the argument and the fix),
        since a copy made once would go stale. The bound call keeps the arrays alive; their
        contents may change between calls, their memory must not."""
        if out is not None:
            tp = type(out)
            args = arrays + ((out,) if tp is not tuple and tp is not list else tuple(out))
            given = len(arrays)
        elif len(arrays) == self._n_in:
            kind = (_kind(arrays[0]) if arrays else None) or "numpy"
            args = arrays + tuple(_empty(s["shape"], s["dtype"], kind) for s in self.outputs)
            given = self._n_in
        else:
            args, given = arrays, self._n_in
        if len(args) != self._n_all or given != self._n_in:
            raise fail(E_VALUE, f"{self.name}.bind(...)", len(arrays),
                       f"takes {self._n_in} inputs and out= {self._n_out} outputs, or "
                       f"{self._n_all} arrays (inputs then outputs)")
        specs = (*self.inputs, *self.outputs)
        checked = [self._check(i, s, a) for i, (s, a) in enumerate(zip(specs, args))]
        views = [self._bound_view(i, s, a, kind)
                 for i, (s, (a, kind)) in enumerate(zip(specs, checked))]
        spans = [_span(v, n) for v, n in zip(views, self._span_bytes)]
        for j, i in self._pairs:
            if spans[j][0] < spans[i][1] and spans[i][0] < spans[j][1]:
                raise fail(E_VALUE, f"{self.name}.bind argument {j} ({specs[j]['name']})",
                           "overlaps an input", "a bound output must not share memory with "
                           f"input {i}; pass a separate array (a plain call computes aside)")
        if self._order is not None:
            views = [views[j] for j in self._order]
        run = BoundCall(self.func, *views)
        run.kernel, run.arrays = self, tuple(a for a, _ in checked)
        outs = run.arrays[self._n_in:]
        run.outputs = outs[0] if len(outs) == 1 else outs
        return run

    def _bound_view(self, i: int, spec: dict, a, kind: str):
        """``a`` as the generated function takes it, converted once (a TVM tensor on the
        same memory), or a DslError saying why it cannot be used in place."""
        import tvm_ffi

        if kind == "torch" and a.requires_grad:
            a = a.detach()
        if not _in_place(a, kind):
            why = {"numpy": "C-contiguous and writeable (np.ascontiguousarray, or a copy)",
                   "torch": "contiguous, not a negative or conjugate view (.contiguous() / "
                            ".resolve_neg())"}.get(kind, "contiguous")
            raise fail(E_VALUE, f"{self.name}.bind {self._where(i, spec)}", "not in place",
                       f"must be {why}: a bound call hands its memory over as is")
        if kind == "numpy":
            return _numpy_view(a)
        return tvm_ffi.from_dlpack(a) if kind == "torch" else a

    def _call_allocating(self, arrays: tuple):
        kind = _kind(arrays[0]) if arrays else "numpy"
        if kind is None:  # not an array: the checks name it
            res = self._call_checked(arrays)
        else:
            outs = tuple(_empty(s["shape"], s["dtype"], kind) for s in self.outputs)
            # fresh outputs overlap nothing
            done = self._run_in_place(arrays + outs, False)
            res = outs if done else self._call_checked(arrays + outs)
        return res[0] if len(res) == 1 else tuple(res)

    def _run_in_place(self, args: tuple, overlap_possible: bool) -> bool:
        """The fast path: hand ``args`` to the generated function as they are and return
        True, or return False, having run nothing, when :meth:`_call_checked` must take the
        call (an argument that is not a plain array, or that the function refuses).

        Sound because the function itself checks, before it computes, every fact it relies on
        (ndim, shape, dtype, compact strides, byte offset, device); what it cannot know is
        tested here: a torch negative view (its memory holds ``-x``) and an output that may
        share memory with an input (bounds only; the function's pointers are ``noalias``).
        numpy's DLPack export refuses read-only arrays. A numpy view whose elements are not
        even aligned to their size (``flags.aligned`` False, from a byte buffer) is not
        routed aside: the code declares element alignment only, so LLVM emits no instruction
        that needs more, and x86 loads and stores any address (checking the flag would cost
        every call). Plain loops: this runs every call.
        """
        numpy_only = True
        for a in args:
            tp = type(a)
            if tp is _NDARRAY:
                continue
            kind = _KINDS.get(tp) or _kind(a)
            if kind is None or (kind == "torch" and a.is_neg()):
                return False
            numpy_only = False
        if overlap_possible:
            # inline, no comprehension: this runs every call (about 0.2 us saved of 0.8)
            size = self._span_bytes
            for j, i in self._pairs:
                o, a = args[j], args[i]
                if numpy_only:
                    # arrays that own their memory (no base) are disjoint unless one object
                    if (o.base is not None or a.base is not None or o is a) \
                            and _may_share_memory(o, a):
                        return False
                    continue
                po = o.ctypes.data if type(o) is _NDARRAY else o.data_ptr()
                pa = a.ctypes.data if type(a) is _NDARRAY else a.data_ptr()
                if po < pa + size[i] and pa < po + size[j]:
                    return False
        try:
            if self._order is None:
                self.func(*args)
            else:
                self.func(*[args[j] for j in self._order])
        except Exception:  # noqa: BLE001 - refused before running: the checked path says why
            return False
        return True

    def _where(self, i: int, spec: dict) -> str:
        return f"{self.name} argument {i} ({spec['name']})"

    def _check_layout(self, i: int, spec: dict, a, shape, dtype: str):
        """Shape and dtype of any supported array; a flat array of the right size is
        reshaped (a view where the array allows one)."""
        want = self._shapes[id(spec)]
        if shape != want and len(shape) == 1 and shape[0] == math.prod(want):
            a, shape = a.reshape(want), want  # flat buffers of the right size are accepted
        if shape != want:
            raise fail(E_SHAPE, f"{self._where(i, spec)}.shape", tuple(shape),
                       f"must be {want}")
        if dtype != spec["dtype"]:
            raise fail(E_TYPE, f"{self._where(i, spec)}.dtype", dtype,
                       f"must be {spec['dtype']}")
        return a

    def _check(self, i: int, spec: dict, a: object):
        """``(array, kind)``: the checked argument and its kind ("numpy", "torch", "tvm")."""
        if isinstance(a, np.ndarray):
            if isinstance(a, np.ma.MaskedArray):
                # a masked array's mask would be silently ignored: refuse it rather than guess
                raise fail(E_TYPE, self._where(i, spec), type(a).__name__,
                           "must be a plain numpy.ndarray (not masked), a torch.Tensor or a "
                           "TVM tensor")
            return self._check_layout(i, spec, a, a.shape, _np_name(a.dtype)), "numpy"
        if type(a).__module__.startswith("torch") and hasattr(a, "data_ptr"):
            if not a.is_cpu:
                raise fail(E_TYPE, f"{self._where(i, spec)}.device", str(a.device),
                           "must be the CPU: the kernels run on the host")
            return self._check_layout(i, spec, a, tuple(a.shape), str(a.dtype)[6:]), "torch"
        import tvm_ffi

        if isinstance(a, tvm_ffi.Tensor):
            return self._check_layout(i, spec, a, tuple(a.shape), str(a.dtype)), "tvm"
        raise fail(E_TYPE, self._where(i, spec), type(a).__name__,
                   "must be a numpy.ndarray, a torch.Tensor or a TVM tensor")

    def _call_checked(self, arrays: tuple) -> list:
        """The careful path: check every argument (:class:`dsl.DslError` before anything
        runs), copy what the generated code cannot use in place, run, copy results back.
        ``arrays``: the inputs, or the inputs then the outputs. Returns the outputs."""
        n_in = self._n_in
        ins = [self._check(i, s, a) for i, (s, a) in enumerate(zip(self.inputs, arrays))]
        if len(arrays) == self._n_all:
            outs = [self._check(n_in + i, s, a) for i, (s, a) in
                    enumerate(zip(self.outputs, arrays[n_in:]))]
            for i, (o, kind) in enumerate(outs):
                if kind == "numpy" and not o.flags.writeable:
                    raise fail(E_VALUE, f"{self.name} output {i}", "read-only array",
                               "must be writeable")
        else:
            kind = ins[0][1] if ins else "numpy"
            outs = [(_empty(s["shape"], s["dtype"], kind), kind) for s in self.outputs]
        tin = [_kernel_input(a, kind) for a, kind in ins]
        spans = [_span(t, self._nbytes[id(s)]) for t, s in zip(tin, self.inputs)]
        tout, writeback = [], []
        for (o, kind), s in zip(outs, self.outputs):
            arg = _kernel_output(o, kind, spans, self._nbytes[id(s)])
            if arg is None:  # not writable in place: compute aside, copy in afterwards
                arg = _empty(o.shape, self._dtype_of(o, kind), "tvm")
                writeback.append((o, kind, arg))
            tout.append(arg)
        self._run(tin, tout)
        for o, kind, arg in writeback:
            _copy_into(o, kind, arg)
        return [o for o, _ in outs]

    @staticmethod
    def _dtype_of(o, kind: str) -> str:
        return str(o.dtype)[6:] if kind == "torch" else str(o.dtype)

    def _run(self, tin: list, tout: list) -> None:
        if self._in_first:
            args = [*tin, *tout]
        else:
            by_role = iter(tin), iter(tout)
            args = [next(by_role[0] if t["role"] == "input" else by_role[1])
                    for t in self.meta["tensors"]]
        try:
            self.func(*args)
        except Exception as exc:  # noqa: BLE001 - arguments already match the .json
            raise fail(E_FILE, f"{self.name}(...)", str(exc).splitlines()[0][:200],
                       "the library refused arguments that match its .json (the .json was "
                       "edited, or the run failed, e.g. out of memory); rebuild it") from exc


class BoundCall(functools.partial):
    """A kernel bound to its arrays by :meth:`Kernel.bind`: ``run()`` runs the generated
    function on them again (it returns None; the results are in the output arrays). A
    ``functools.partial`` of the function and its DLPack views, so a call does no work in
    Python. ``outputs`` (one array, or a tuple) and ``arrays`` (every argument, as given,
    after the flat-to-shape reshape a call also does), ``kernel`` the :class:`Kernel`."""

    def __repr__(self) -> str:
        return f"<dsl.BoundCall {self.kernel.name}>"


# --- argument conversion (zero copy where the generated code can read the memory as is) ---

_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1,
             "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8}
_NP_NAMES: dict = {}  # numpy dtype -> name: str(dtype) costs microseconds on every call


def _np_name(dtype) -> str:
    name = _NP_NAMES.get(dtype)
    if name is None:
        name = _NP_NAMES[dtype] = str(dtype)
    return name


def _span(t, nbytes: int) -> tuple[int, int]:
    """``(first byte, end byte)`` of a C-contiguous kernel argument (TVM or torch tensor)."""
    ptr = t.data_ptr()
    return ptr, ptr + nbytes


def _empty(shape, dtype: str, kind: str):
    """An uninitialised C-contiguous, 64-byte aligned array of ``kind``."""
    if kind == "torch":
        import torch

        return torch.empty(tuple(shape), dtype=getattr(torch, dtype))  # torch aligns to 64
    if kind == "tvm":
        import tvm

        return tvm.runtime.empty(tuple(shape), dtype, tvm.cpu())
    dt = _np_dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    buf = np.empty(nbytes + ALIGN, np.uint8)
    off = -buf.ctypes.data % ALIGN
    return buf[off:off + nbytes].view(dt).reshape(shape)


def _np_dtype(dtype: str) -> np.dtype:
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def _numpy_view(a: np.ndarray):
    """A C-contiguous writeable numpy array as a TVM tensor on the same memory (DLPack;
    bfloat16, which numpy cannot export, through a uint16 view retyped on the TVM side)."""
    import tvm_ffi

    if a.dtype.kind == "V" or _np_name(a.dtype) == "bfloat16":
        return tvm_ffi.from_dlpack(a.view(np.uint16))._create_view(a.shape, "bfloat16")
    return tvm_ffi.from_dlpack(a)


_may_share_memory = np.may_share_memory
_NDARRAY = np.ndarray
_KINDS: dict = {np.ndarray: "numpy"}  # type -> kind, filled as types are met (_kind)


def _kind(a) -> str | None:
    """``"numpy"`` (a plain ndarray: no masked array, no matrix), ``"torch"`` (a torch.Tensor
    or subclass), ``"tvm"`` (a TVM tensor), or None (anything else)."""
    tp = type(a)
    kind = _KINDS.get(tp)
    if kind is None and tp not in _KINDS:
        import sys

        import tvm_ffi

        torch = sys.modules.get("torch")  # a torch tensor means torch is imported already
        if torch is not None and issubclass(tp, torch.Tensor):
            kind = "torch"
        elif issubclass(tp, tvm_ffi.Tensor):
            kind = "tvm"
        _KINDS[tp] = kind
    return kind


def _in_place(a, kind: str) -> bool:
    """Whether the generated code can take ``a`` (of ``kind``) as it is: C-contiguous (any
    element-aligned address), writeable for numpy (DLPack cannot export read-only arrays),
    no torch negative or conjugate view (their memory does not hold their values)."""
    if kind == "numpy":
        return a.flags.c_contiguous and a.flags.writeable
    if kind == "torch":
        return a.is_contiguous() and not a.is_conj() and not a.is_neg()
    return a.is_contiguous()


def _kernel_input(a, kind: str):
    """``a`` as a kernel argument: itself (torch, TVM) or a TVM view (numpy) when the
    generated code can read it in place (C-contiguous; any element-aligned address), else a
    copy."""
    if kind == "numpy":
        if _in_place(a, kind):
            return _numpy_view(a)
        b = _empty(a.shape, _np_name(a.dtype), "numpy")
        np.copyto(b, a)
        return _numpy_view(b)
    if kind == "torch":
        if a.requires_grad:
            a = a.detach()
        if _in_place(a, kind):
            return a
        b = _empty(a.shape, str(a.dtype)[6:], "torch")
        b.copy_(a)
        return b
    if _in_place(a, kind):
        return a
    b = _empty(tuple(a.shape), str(a.dtype), "tvm")
    b.copyfrom(a.numpy())
    return b


def _kernel_output(o, kind: str, spans: list, nbytes: int):
    """``o`` as the kernel's output argument, or None when it must be written afterwards
    (not C-contiguous, or overlapping an input the kernel still reads)."""
    if not _in_place(o, kind):  # (a read-only numpy output was refused before)
        return None
    if kind == "numpy":
        t = _numpy_view(o)
    else:
        t = o.detach() if kind == "torch" and o.requires_grad else o
    lo, hi = _span(t, nbytes)
    for a_lo, a_hi in spans:
        if lo < a_hi and a_lo < hi:
            return None
    return t


def _copy_into(o, kind: str, tmp) -> None:
    """Write the kernel's result ``tmp`` (a TVM tensor) into the caller's ``o``: one copy,
    read through DLPack (``tmp.numpy()`` would copy it once more first)."""
    if kind == "numpy":
        if _np_name(o.dtype) == "bfloat16":  # numpy cannot import bfloat16 over DLPack
            o[...] = tmp.numpy()
        else:
            np.copyto(o, np.from_dlpack(tmp))
    elif kind == "torch":
        import torch

        with torch.no_grad():
            o.copy_(torch.from_dlpack(tmp))
    else:
        o.copyfrom(tmp)


def _check_tensor_entry(t: object) -> None:
    """One ``tensors`` entry of a kernel .json, as Kernel.__call__ will use it."""
    if not isinstance(t, dict):
        raise TypeError(f"tensor entry {t!r} is not an object")
    name, shape, dtype, role = t["name"], t["shape"], t["dtype"], t["role"]
    if not isinstance(name, str) or role not in ("input", "output"):
        raise ValueError(f"tensor entry {name!r} has role {role!r}")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"tensor {name!r} has shape {shape!r}")
    if not isinstance(dtype, str):  # not np.dtype(): bfloat16 needs ml_dtypes imported
        raise ValueError(f"tensor {name!r} has dtype {dtype!r}")


def _compatible(meta: dict) -> None:
    from dsl.runtime.build import JSON_FORMAT, versions

    ours = versions()
    theirs = meta.get("versions", {})
    if theirs.get("json_format") != JSON_FORMAT or theirs.get("dsl") != ours["dsl"]:
        # json_format 1 libraries assume 64-byte aligned arguments: calling one with the
        # element-aligned arrays this loader passes could fault
        raise fail(E_FILE, "kernel json versions", theirs,
                   f"was built by another DSL version or calling convention (this is "
                   f"{ours['dsl']}, json_format {JSON_FORMAT}); rebuild it")
    tgt = meta.get("target", {})
    try:
        entry = targets.get(tgt.get("name", ""))
    except Exception:  # noqa: BLE001 - an unknown target name is reported below
        entry = None
    if entry is None or entry.llvm != tgt.get("llvm") or not targets.runnable(entry):
        raise fail(E_FILE, "kernel json target", tgt,
                   "was built for a target this machine cannot run; rebuild it here")


def load(name: str, kernel_meta_parent_dir: str | os.PathLike | None = None) -> Kernel:
    """Load ``kernel_meta/<name>.so`` after checking it against ``kernel_meta/<name>.json``.

    Refuses (with :class:`dsl.DslError`, code E60040) a missing file, a malformed JSON, a
    ``.so`` whose sha256 differs from the JSON's, or a kernel built for another target or DSL
    version. The library returned is the one on disk now: a kernel rebuilt under ``name`` since
    an earlier ``load`` (by this or another process or thread) loads as rebuilt.
    """
    name = check_kernel_name("name", name)
    if kernel_meta_parent_dir is not None and (
            not isinstance(kernel_meta_parent_dir, (str, os.PathLike))
            or "\x00" in str(kernel_meta_parent_dir)):
        raise fail(E_TYPE, "kernel_meta_parent_dir", kernel_meta_parent_dir,
                   "must be a directory path (str or os.PathLike)")
    parent = Path(os.getcwd() if kernel_meta_parent_dir is None else kernel_meta_parent_dir)
    so, js = parent / "kernel_meta" / f"{name}.so", parent / "kernel_meta" / f"{name}.json"
    # build renames .so then .json under an exclusive flock of this file; sharing it here means
    # a load never pairs one build's .so with another's .json, nor dlopens a .so swapped after
    # it was hashed. Before the first build there is no lock file: if one appears while we read
    # unlocked, a build published meanwhile, so read again under its lock.
    lock = so.parent / f".{name}.lock"
    for _ in range(2):
        existed = os.path.lexists(lock)
        try:
            with _shared_lock(lock):
                kernel = _load_files(name, so, js)
        except DslError:
            if existed or not os.path.lexists(lock):
                raise
            continue
        if existed or not os.path.lexists(lock):
            break
    return kernel


@contextlib.contextmanager
def _shared_lock(path: Path):
    try:  # never created here: loading must work in a read-only kernel_meta/
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def _load_files(name: str, so: Path, js: Path) -> Kernel:
    for p in (so, js):
        if not p.is_file():
            raise fail(E_FILE, "name", name, f"has no {p}; build it first with dsl.build")
    try:
        meta = json.loads(js.read_text())
        tensors, digest = meta["tensors"], meta["sha256"]
        if not isinstance(tensors, list) or not isinstance(digest, str):
            raise TypeError("bad field types")
        for t in tensors:
            _check_tensor_entry(t)
        if not any(t["role"] == "output" for t in tensors):
            raise ValueError("no output tensor")
        for key in ("versions", "target"):  # _compatible reads them as dicts
            if not isinstance(meta.get(key, {}), dict):
                raise TypeError(f"'{key}' is not an object")
        if not isinstance(meta.get("function", name), str) or not isinstance(meta["name"], str):
            raise TypeError("'function' / 'name' is not a string")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: json.loads of a deeply nested file ("[[[[...") is not a ValueError
        raise fail(E_FILE, "kernel json", str(js), f"is malformed ({exc}); rebuild it") from None
    data = so.read_bytes()  # hashed and loaded from these very bytes, not the path again
    if hashlib.sha256(data).hexdigest() != digest:
        raise fail(E_FILE, "kernel .so", str(so),
                   "does not match the sha256 in its .json (modified or half-written); rebuild")
    _compatible(meta)
    try:  # a .so and .json that agree can still both be foreign: not a TVM library at all
        module, slots = _load_private_copy(name, so, data)
        func = module.get_function(meta.get("function", name), query_imports=True)
    except Exception as exc:  # noqa: BLE001 - any loader failure means an unusable library
        raise fail(E_FILE, "kernel .so", str(so),
                   f"cannot be loaded ({str(exc).splitlines()[0][:200]}); rebuild it") from None
    if func is None:
        raise fail(E_FILE, "kernel .so", str(so), f"exports no function '{name}'; rebuild it")
    kernel = Kernel(meta, module, func)
    kernel.parallel_slots = slots
    return kernel


_FALLBACK_DIR: list[str] = []
_FALLBACK_LOCK = threading.Lock()


def _fallback_dir() -> str:
    """A private directory of this process, for kernels whose kernel_meta/ is read-only."""
    with _FALLBACK_LOCK:
        if not _FALLBACK_DIR:
            import atexit
            import shutil

            _FALLBACK_DIR.append(tempfile.mkdtemp(prefix=f"dsl-load-{os.getpid()}-"))
            atexit.register(shutil.rmtree, _FALLBACK_DIR[0], True)
        return _FALLBACK_DIR[0]


def _load_private_copy(name: str, so: Path, data: bytes):
    """dlopen ``data`` (the bytes of ``so`` that were hashed) from a file of its own.

    The dynamic loader keeps one copy of a library per path: dlopen of a path that is still
    loaded returns the library already mapped, even after a rebuild renamed a new ``.so`` over
    it, so a second ``load`` of a rebuilt kernel ran the first build. Each load therefore maps
    a fresh private copy (beside the ``.so``, or in a private temporary directory when
    ``kernel_meta/`` is read-only), unlinked once mapped: what ``load`` returns is what is on
    disk now, in any thread or process, and an older Kernel keeps running its own library.
    """
    import tvm_ffi

    from dsl.runtime.atomic import tmp_prefix
    from dsl.runtime.openmp import library_slots

    last: Exception = OSError("no place to write a private copy")
    for where in (so.parent, None):
        try:
            fd, path = tempfile.mkstemp(prefix=tmp_prefix(name), suffix=".tmp.so",
                                        dir=where if where is not None else _fallback_dir())
        except OSError as exc:
            last = exc
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            # keep_module_alive=False: tvm.runtime.load_module pins every library for the life
            # of the process; a Kernel owns its module, and its function keeps the module alive
            # while anyone still holds the function.
            module = tvm_ffi.load_module(path, keep_module_alive=False)
            # while the copy still has a name: where its parallel-launch pointer lives, for
            # dsl.runtime.openmp.adopt
            return module, library_slots(path)
        except Exception as exc:  # noqa: BLE001 - a full disk, a noexec mount: the next place
            last = exc
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
    raise last
