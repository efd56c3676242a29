"""``build``: compile a schedule into ``kernel_meta/<name>.so`` + ``kernel_meta/<name>.json``.

Files are published atomically: each build writes private temporary files in ``kernel_meta/``
and renames them into place under an advisory lock (``fcntl.flock``, released by the kernel
when a process dies, so a killed build leaves no stale lock). Readers therefore see either the
previous complete pair or the new one, and :func:`dsl.kernel.load` checks the ``.so`` against
the sha256 recorded in the ``.json``.

A build whose cache key (sha256 of the scheduled TIR, the target, and the DSL / TVM versions)
matches the existing ``.json`` reuses the existing ``.so`` without compiling.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from dsl.errors import E_FILE, E_TYPE, E_VALUE, fail
from dsl.para_dict import check_kernel_name
from dsl.schedule import Schedule, same_tensor, walk

CONFIG_KEYS = ("name", "tensor_list", "kernel_meta_parent_dir", "print_ir", "need_build",
               "bool_storage_as_1bit", "dummy_placeholder")
JSON_FORMAT = 1


def versions() -> dict:
    import tvm

    from dsl import __version__

    return {"dsl": __version__, "tvm": tvm.__version__, "json_format": JSON_FORMAT}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_config(sch, config) -> tuple[str, list, Path, bool, bool]:
    from tvm import te

    if not isinstance(sch, Schedule):
        raise fail(E_TYPE, "sch", type(sch).__name__,
                   "must be the Schedule returned by dsl.auto_schedule(res)")
    if not isinstance(config, dict):
        raise fail(E_TYPE, "config", config, "must be a dict with 'name' and 'tensor_list'")
    for key in config:
        if key not in CONFIG_KEYS:
            raise fail(E_VALUE, f"config['{key}']", config[key],
                       f"is not a build option; allowed: {', '.join(CONFIG_KEYS)}")
    if "name" not in config:
        raise fail(E_VALUE, "config['name']", None, "is required: the kernel's name")
    name = check_kernel_name("config['name']", config["name"])
    tensors = config.get("tensor_list")
    if not isinstance(tensors, (list, tuple)) or not all(
            isinstance(t, te.Tensor) for t in tensors):
        raise fail(E_TYPE, "config['tensor_list']", tensors,
                   "must be a list of te.Tensor: the kernel's inputs then outputs, in call order")
    tensors = list(tensors)
    placeholders, _ = walk(sch.outputs)
    for i, t in enumerate(tensors):
        if not any(same_tensor(t, u) for u in [*placeholders, *sch.outputs]):
            raise fail(E_VALUE, f"config['tensor_list'][{i}]", t.op.name,
                       "is neither an input nor an output of the scheduled computation")
    for t in [*placeholders, *sch.outputs]:
        if not any(same_tensor(t, u) for u in tensors):
            role = "output" if any(same_tensor(t, o) for o in sch.outputs) else "input"
            raise fail(E_VALUE, "config['tensor_list']", [u.op.name for u in tensors],
                       f"must include {role} '{t.op.name}'")
    parent = config.get("kernel_meta_parent_dir", None)
    if parent is None:
        parent = os.getcwd()
    if not isinstance(parent, (str, os.PathLike)) or "\x00" in str(parent):
        raise fail(E_TYPE, "config['kernel_meta_parent_dir']", parent,
                   "must be a directory path (str or os.PathLike)")
    flags = []
    for key, default in (("print_ir", False), ("need_build", True)):
        v = config.get(key, default)
        if not isinstance(v, bool):
            raise fail(E_TYPE, f"config['{key}']", v, "must be True or False")
        flags.append(v)
    return name, tensors, Path(parent) / "kernel_meta", flags[0], flags[1]


def lower(sch: Schedule, name: str, tensor_list):
    """The scheduled IRModule with its one function named ``name``."""
    import tvm

    func = sch.s_tir(tensor_list).mod["main"].with_attr("global_symbol", name)
    return tvm.IRModule({name: func})


def cache_key(mod, sch: Schedule) -> str:
    text = json.dumps({"tir": mod.script(), "target": sch.target.as_json(),
                       "versions": versions()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


@contextlib.contextmanager
def _lock(path: Path):
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _tensor_entries(sch: Schedule, tensors) -> list[dict]:
    formats = sch.op_info()["formats"]
    out = []
    for t in tensors:
        role = "output" if any(same_tensor(t, o) for o in sch.outputs) else "input"
        out.append({"name": t.op.name, "shape": [int(d) for d in t.shape], "dtype": str(t.dtype),
                    "format": formats.get(t.op.name, "ND"), "role": role})
    return out


def _existing_matches(meta_dir: Path, name: str, key: str) -> dict | None:
    so, js = meta_dir / f"{name}.so", meta_dir / f"{name}.json"
    try:
        meta = json.loads(js.read_text())
        if meta.get("cache_key") == key and so.is_file() and sha256_file(so) == meta["sha256"]:
            return meta
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def build(sch: Schedule, config: dict) -> dict | object:
    """Compile ``sch`` as TBE's ``build(sch, config)`` does.

    Parameters
    ----------
    sch : Schedule
        From :func:`dsl.auto_schedule`.
    config : dict
        ``name`` (``^[A-Za-z_][A-Za-z0-9_]*$``, <= 200 chars; the file stem and the exported
        function's name), ``tensor_list`` (inputs then outputs, the call order),
        ``kernel_meta_parent_dir`` (default: the working directory), ``print_ir`` (print the
        scheduled TIR), ``need_build`` (False: schedule and lower only, write nothing).

    Returns
    -------
    dict
        The kernel's JSON metadata (also written to ``kernel_meta/<name>.json``); with
        ``need_build=False``, the lowered ``IRModule`` instead.
    """
    name, tensors, meta_dir, print_ir, need_build = _check_config(sch, config)
    t0 = time.perf_counter()
    mod = lower(sch, name, tensors)
    if print_ir:
        print(mod.script())
    if not need_build:
        return mod
    key = cache_key(mod, sch)
    meta_dir.mkdir(parents=True, exist_ok=True)
    reused = _existing_matches(meta_dir, name, key)
    if reused is not None:
        return reused

    import tvm

    so_path, js_path = meta_dir / f"{name}.so", meta_dir / f"{name}.json"
    tmp_so = tmp_js = None
    try:
        fd, tmp_so = tempfile.mkstemp(prefix=f".{name}.", suffix=".so.tmp", dir=meta_dir)
        os.close(fd)
        tvm.compile(mod, target=sch.target.tvm_target()).export_library(tmp_so)
        digest = sha256_file(Path(tmp_so))
        info = sch.op_info()
        meta = {"name": name, "function": name, "op": info["op"], "params": info["params"],
                "tensors": _tensor_entries(sch, tensors), "target": sch.target.as_json(),
                "versions": versions(), "schedule": _schedule_meta(sch),
                "sha256": digest, "cache_key": key,
                "build_seconds": round(time.perf_counter() - t0, 4)}
        fd, tmp_js = tempfile.mkstemp(prefix=f".{name}.", suffix=".json.tmp", dir=meta_dir)
        with os.fdopen(fd, "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        with _lock(meta_dir / f".{name}.lock"):
            os.replace(tmp_so, so_path)
            tmp_so = None
            os.replace(tmp_js, js_path)
            tmp_js = None
        return meta
    except Exception as exc:
        if isinstance(exc, OSError):
            raise fail(E_FILE, "config['kernel_meta_parent_dir']", str(meta_dir.parent),
                       f"could not write the kernel files: {exc}") from exc
        raise
    finally:
        for leftover in (tmp_so, tmp_js):
            if leftover:
                with contextlib.suppress(OSError):
                    os.unlink(leftover)


def _schedule_meta(sch: Schedule) -> dict:
    meta = {"source": "default", "rule": sch.rule_name}
    meta.update(getattr(sch, "schedule_meta", None) or {})
    return meta
