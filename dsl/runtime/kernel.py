"""``load``: a built kernel as a callable on numpy arrays, checked before it is trusted."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

import targets
from dsl.errors import E_FILE, E_SHAPE, E_TYPE, E_VALUE, DslError, fail
from dsl.ops.para_dict import check_kernel_name


class Kernel:
    """A loaded kernel. Call it with the inputs (and optionally the outputs) as numpy arrays.

    ``kernel(*inputs)`` allocates the outputs and returns them (one array, or a tuple);
    ``kernel(*inputs, *outputs)`` writes into the given output arrays and returns them.
    """

    def __init__(self, meta: dict, module, func):
        self.meta, self.module, self.func = meta, module, func
        self.name = meta["name"]
        self.inputs = [t for t in meta["tensors"] if t["role"] == "input"]
        self.outputs = [t for t in meta["tensors"] if t["role"] == "output"]

    def __repr__(self) -> str:
        sig = ", ".join(f"{t['name']}{tuple(t['shape'])}:{t['dtype']}" for t in self.meta[
            "tensors"])
        return f"<dsl.Kernel {self.name}({sig})>"

    def _check(self, i: int, spec: dict, a: object) -> np.ndarray:
        if not isinstance(a, np.ndarray) or isinstance(a, np.ma.MaskedArray):
            # a masked array's mask would be silently ignored: refuse it rather than guess
            raise fail(E_TYPE, f"{self.name} argument {i} ({spec['name']})", type(a).__name__,
                       "must be a plain numpy.ndarray")
        if list(a.shape) != spec["shape"] and a.size == int(np.prod(spec["shape"])) and \
                a.ndim == 1:
            a = a.reshape(spec["shape"])  # flat buffers of the right size are accepted
        if list(a.shape) != spec["shape"]:
            raise fail(E_SHAPE, f"{self.name} argument {i} ({spec['name']}).shape", a.shape,
                       f"must be {tuple(spec['shape'])}")
        if str(a.dtype) != spec["dtype"]:
            raise fail(E_TYPE, f"{self.name} argument {i} ({spec['name']}).dtype", str(a.dtype),
                       f"must be {spec['dtype']}")
        return a

    def __call__(self, *arrays):
        import tvm

        n_in, n_all = len(self.inputs), len(self.meta["tensors"])
        if len(arrays) not in (n_in, n_all):
            raise fail(E_VALUE, f"{self.name}(...)", len(arrays),
                       f"takes {n_in} inputs, or {n_all} arrays (inputs then outputs)")
        ins = [self._check(i, s, a) for i, (s, a) in enumerate(zip(self.inputs, arrays))]
        if len(arrays) == n_all:
            outs = [self._check(n_in + i, s, a) for i, (s, a) in
                    enumerate(zip(self.outputs, arrays[n_in:]))]
            for i, o in enumerate(outs):
                if not o.flags.writeable:
                    raise fail(E_VALUE, f"{self.name} output {i}", "read-only array",
                               "must be writeable")
        else:
            outs = [np.empty(s["shape"], dtype=s["dtype"]) for s in self.outputs]
        dev = tvm.cpu()
        tin = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in ins]
        tout = [tvm.runtime.tensor(np.empty(s["shape"], s["dtype"]), dev) for s in self.outputs]
        by_role = iter(tin), iter(tout)
        args = [next(by_role[0] if t["role"] == "input" else by_role[1])
                for t in self.meta["tensors"]]
        try:
            self.func(*args)
        except Exception as exc:  # noqa: BLE001 - arguments already match the .json
            raise fail(E_FILE, f"{self.name}(...)", str(exc).splitlines()[0][:200],
                       "the library refused arguments that match its .json (the .json was "
                       "edited, or the run failed, e.g. out of memory); rebuild it") from exc
        for o, t in zip(outs, tout):
            o[...] = t.numpy()
        return outs[0] if len(outs) == 1 else tuple(outs)


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
        raise fail(E_FILE, "kernel json versions", theirs,
                   f"was built by another DSL version (this is {ours['dsl']}); rebuild it")
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
        module = _load_private_copy(name, so, data)
        func = module.get_function(meta.get("function", name), query_imports=True)
    except Exception as exc:  # noqa: BLE001 - any loader failure means an unusable library
        raise fail(E_FILE, "kernel .so", str(so),
                   f"cannot be loaded ({str(exc).splitlines()[0][:200]}); rebuild it") from None
    if func is None:
        raise fail(E_FILE, "kernel .so", str(so), f"exports no function '{name}'; rebuild it")
    return Kernel(meta, module, func)


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
            return tvm_ffi.load_module(path, keep_module_alive=False)
        except Exception as exc:  # noqa: BLE001 - a full disk, a noexec mount: the next place
            last = exc
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
    raise last
