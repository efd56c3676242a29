"""Benchmark workloads, registered by suite; ``dsl.bench.runner`` times and reports them.

A workload module (``dsl/bench/conv2d.py``, ``pool.py``, ...) calls :func:`register` for each
workload. ``setup()`` builds our kernel(s) and prepares data and returns a :class:`Prepared`
whose ``ours`` / ``peer`` run one iteration each (``peer`` is None when PyTorch is absent).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Prepared:
    """A ready-to-time workload: callables that each run one iteration."""

    ours: Callable[[], object]
    peer: Callable[[], object] | None
    build_seconds: float
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
    """One benchmark row. ``kind`` is the column it reports ("dx", "dw", "pool_dx", ...)."""

    suite: str
    name: str
    kind: str
    flops: float
    setup: Callable[[], Prepared]


WORKLOADS: list[Workload] = []
SUITES = ("conv2d", "convnd", "pool", "deconv")


def register(workload: Workload) -> Workload:
    WORKLOADS.append(workload)
    return workload


def load_suites(names=SUITES) -> list[Workload]:
    """Import the suite modules (each registers its workloads) and return the workloads."""
    import importlib

    for name in names:
        try:
            importlib.import_module(f"dsl.bench.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"dsl.bench.{name}":
                raise
    return [w for w in WORKLOADS if w.suite in names]
