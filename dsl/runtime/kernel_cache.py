"""Build-once kernel cache for the numpy-level APIs (``dsl.aclnn``, ``dsl.deconvgradfilter``).

A call signature (operator, shapes, dtypes, parameters) maps to one built kernel:

* in memory, per process: the second call with the same signature neither schedules nor
  compiles;
* on disk, under :func:`cache_root` (``$DSL_CACHE_DIR``, else ``$XDG_CACHE_HOME/dsl`` or
  ``~/.cache/dsl``): a new process schedules the compute and reuses the ``.so`` when the cache
  key of :func:`dsl.build.build` (scheduled TIR, target, versions) still matches, so a changed
  schedule or TVM never reuses a stale library.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import targets

# Least recently used first. Bounded so a process that meets many signatures (a sweep, a
# fuzzer) keeps memory bounded: an evicted kernel's library is unloaded once no caller holds
# it, and the next call with that signature reloads it from disk without compiling.
_MEMORY: OrderedDict[str, object] = OrderedDict()
_max = os.environ.get("DSL_KERNEL_CACHE_MAX", "")
MAX_KERNELS = int(_max) if _max.isdigit() else 256  # a malformed value must not break import
_LOCK = threading.Lock()
STATS = {"hits": 0, "builds": 0}
LOG = logging.getLogger("dsl")


def cache_root() -> Path:
    env = os.environ.get("DSL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsl"


def signature_key(signature: dict, target: targets.CpuTarget) -> str:
    from dsl.runtime import schedule
    from dsl.runtime.build import versions

    key = {"sig": signature, "target": target.as_json(), "versions": versions()}
    if schedule.INT64_INDEX_FROM != 2**31:
        # forced int64 indexing (tests lower the threshold) builds another library; the
        # default is left out of the key so existing caches stay valid
        key["int64_index_from"] = schedule.INT64_INDEX_FROM
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def get_kernel(signature: dict, make: Callable[[], tuple[list, list]], *, prefix: str,
               target: targets.CpuTarget | str | None = None):
    """The kernel for ``signature``, building it with ``make() -> (inputs, outputs)`` (TE
    tensors) the first time. ``prefix`` names the files (``<prefix>_<hash>.so``)."""
    from dsl.runtime.build import build
    from dsl.runtime.kernel import load
    from dsl.runtime.schedule import auto_schedule
    from dsl.runtime.target import get as target_get

    tgt = target_get(target) if target is not None else targets.current()
    key = signature_key(signature, tgt)
    with _LOCK:
        kernel = _hit(key)
        if kernel is not None:
            return kernel
        start = time.perf_counter()
        inputs, outputs = make()
        sch = auto_schedule(outputs, target=tgt)
        name = f"{prefix}_{key[:24]}"
        root = cache_root()
        build(sch, {"name": name, "tensor_list": [*inputs, *outputs],
                    "kernel_meta_parent_dir": str(root)})
        kernel = load(name, root)
        LOG.info("kernel %s ready for %s in %.2f s (%s)", name, signature.get("op"),
                 time.perf_counter() - start, root / "kernel_meta")
        STATS["builds"] += 1
        _MEMORY[key] = kernel
        while len(_MEMORY) > max(1, MAX_KERNELS):
            _MEMORY.popitem(last=False)
        return kernel


def cached(key: str):
    """The in-process kernel under ``key`` (:func:`signature_key`), or None."""
    with _LOCK:
        return _hit(key)


def _hit(key: str):
    """A lookup in the in-process cache, counted and made most recent (``_LOCK`` held)."""
    kernel = _MEMORY.get(key)
    if kernel is not None:
        STATS["hits"] += 1
        _MEMORY.move_to_end(key)
    return kernel


def clear_memory() -> None:
    """Forget the in-process kernels (the disk cache stays)."""
    with _LOCK:
        _MEMORY.clear()
