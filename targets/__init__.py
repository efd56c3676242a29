"""CPU targets the project builds for, as data.

Each entry is a :class:`CpuTarget`: the TVM target dict plus the numbers its schedules need
(vector width, cores, cache sizes). Adding a target is adding an entry to ``targets/cpu.py``;
schedules read these numbers and never test a target's name.

``current()`` is the target in force: the innermost ``with use(...)`` block, else ``host``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class CpuTarget:
    """One CPU target.

    Attributes
    ----------
    name : str
        Registry key (``"x86-avx512"``).
    family : str
        Schedule family: schedules are registered per (compute tag, family).
    llvm : dict
        TVM target attributes other than ``num-cores`` (``{"kind": "llvm", "mcpu": ...}``).
    vector_bits : int
        Width of one SIMD register; fp32 lanes = vector_bits // 32.
    cores : int
        Threads a kernel may use.
    l1d_kib, l2_kib : int
        Per-core data cache sizes, for tile choices.
    """

    name: str
    family: str
    llvm: dict = field(hash=False)
    vector_bits: int
    cores: int
    l1d_kib: int = 32
    l2_kib: int = 1024

    def lanes(self, dtype: str = "float32") -> int:
        bits = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}.get(dtype, 32)
        return max(1, self.vector_bits // bits)

    def tvm_target(self):
        import tvm

        return tvm.target.Target({**self.llvm, "num-cores": self.cores})

    def as_json(self) -> dict:
        return {"name": self.name, "family": self.family, "llvm": dict(self.llvm),
                "vector_bits": self.vector_bits, "cores": self.cores}

    def with_cores(self, cores: int) -> CpuTarget:
        return replace(self, cores=cores)


def machine_cores() -> int:
    """Cores this process may run on (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


_REGISTRY: dict[str, CpuTarget] = {}


def register(target: CpuTarget) -> CpuTarget:
    _REGISTRY[target.name] = target
    return target


def names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get(name: str | CpuTarget) -> CpuTarget:
    """Look a target up by name (a :class:`CpuTarget` passes through)."""
    if isinstance(name, CpuTarget):
        return name
    _load_builtin()
    if not isinstance(name, str) or name not in _REGISTRY:
        from dsl.errors import E_VALUE, fail  # lazy: dsl imports targets

        raise fail(E_VALUE, "target", name, f"must be one of {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def runnable(target: CpuTarget) -> bool:
    """True if this machine can execute code built for ``target``."""
    from targets.cpu import host_features

    return set(target_features(target)) <= host_features()


def target_features(target: CpuTarget) -> tuple[str, ...]:
    from targets.cpu import REQUIRED_FEATURES

    return REQUIRED_FEATURES.get(target.name, ())


_CURRENT: contextvars.ContextVar[CpuTarget | None] = contextvars.ContextVar(
    "dsl_target", default=None)


def current() -> CpuTarget:
    """The target in force: innermost :func:`use` block, else ``host``."""
    return _CURRENT.get() or get("host")


@contextlib.contextmanager
def use(name: str | CpuTarget) -> Iterator[CpuTarget]:
    """``with targets.use("x86-avx2"):`` builds for that target inside the block."""
    token = _CURRENT.set(get(name))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)


def _load_builtin() -> None:
    if not _REGISTRY:
        import targets.cpu  # noqa: F401  (registers the built-in entries)
