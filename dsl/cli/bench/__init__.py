"""Benchmark workloads, registered by suite; ``dsl.bench.runner`` times and reports them.

A workload module (``dsl/bench/conv2d.py``, ``pool.py``, ...) calls :func:`register` for each
workload. ``setup()`` builds our kernel(s) and prepares data and returns a :class:`Prepared`
whose ``ours`` / ``peer`` run one iteration each (``peer`` is None when PyTorch is absent) and
whose optional ``check`` compares our result with the peer's at the benchmark's full size.
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
    # Optional: runs ours once and returns max |ours - expected| / max |expected| (expected:
    # the peer's result); the runner fails the row above ``tolerance``, so a fast wrong kernel
    # never reaches the table.
    check: Callable[[], float] | None = None
    tolerance: float = 1e-3
    # Further peers timed in the same alternating rounds (``{"numpy": fn, "plain dx": fn}``);
    # the row reports each one's seconds and ratio next to the main peer's.
    peers: dict = field(default_factory=dict)

    def verify(self) -> float | None:
        """Run ``check``: the relative error, or None when there is no check or no peer.

        Raises ValueError above ``tolerance`` (NaN included).
        """
        if self.check is None or self.peer is None:
            return None
        err = self.check()
        if not err <= self.tolerance:
            raise ValueError(f"wrong result: relative error {err:.3g} vs the peer "
                             f"(tolerance {self.tolerance:g})")
        return err


@dataclass(frozen=True)
class Workload:
    """One benchmark row. ``kind`` is the column it reports ("dx", "dw", "pool_dx", ...).

    ``bytes`` (> 0 for a memory-bound row: the bytes one iteration must read and write at
    least) makes the row report GB/s instead of GFLOP/s. ``dtypes``: the ``bench --dtype``
    values the row runs with (None: every one); the others leave it out.
    """

    suite: str
    name: str
    kind: str
    flops: float
    setup: Callable[[], Prepared]
    bytes: float = 0.0
    dtypes: tuple[str, ...] | None = None


def rel_err(ours, expected) -> float:
    """``max |ours - expected| / max |expected|``, the measure every ``Prepared.check`` uses."""
    import numpy as np

    ours, expected = np.asarray(ours, np.float64), np.asarray(expected, np.float64)
    return float(np.abs(ours - expected).max() / max(np.abs(expected).max(), 1e-30))


def tolerance(dtype: str) -> float:
    """Check tolerance vs a float32 peer: fp32 sums of up to ~10^4 products agree to ~1e-5;
    fp16 inputs are rounded (2^-11) before our fp32 accumulation, the peer's are not; int8
    results are exact, the peer's fp32 sums of the same integers round past 2^24."""
    return {"float32": 1e-3, "int8": 1e-5}.get(dtype, 1e-2)


def fresh_build(outputs, inputs, name: str):
    """Build with the default schedule into a throw-away ``kernel_meta`` (so nothing is
    reused and the build time is real); returns ``(kernel, build seconds)``. The loaded
    library stays mapped after the directory goes."""
    import tempfile
    import time

    from dsl.runtime.build import build
    from dsl.runtime.kernel import load
    from dsl.runtime.schedule import auto_schedule

    with tempfile.TemporaryDirectory(prefix="dsl-bench-") as tmp:
        t0 = time.perf_counter()
        sch = auto_schedule(outputs)
        config = {"name": name, "tensor_list": [*inputs, *outputs],
                  "kernel_meta_parent_dir": tmp}
        build(sch, config)
        seconds = time.perf_counter() - t0
        if ASM_SINK is not None:  # bench --mca: after the timed build, asm only
            try:
                ASM_SINK.append(_assembly(sch, config))
            except Exception:  # noqa: BLE001 - no assembly: the row reports no FMA loop
                ASM_SINK.append("")
        return load(name, tmp), seconds


# ``bench --mca`` sets this to a list (``dsl.cli.bench.mca.capture``): each fresh_build then
# appends its kernel's assembly. None (the default): nothing extra is compiled.
ASM_SINK: list | None = None


def _assembly(sch, config) -> str:
    """AT&T assembly of the kernel ``build(sch, config)`` made: the same lowered module
    (``need_build=False``) compiled again for the same target, never exported."""
    from dsl.runtime.build import build, compile_module

    mod = build(sch, {**config, "need_build": False})
    return compile_module(mod, sch.target.tvm_target()).mod.inspect_source("asm")


def torch_peer(threads: int):
    """PyTorch with ``threads`` intra-op threads, or None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    return torch


WORKLOADS: list[Workload] = []
SUITES = ("conv2d", "convnd", "pool", "deconv", "user")
# Names that stand for several suites: ``--suite ops`` is every aclnn and DSP operator suite
# (conv1d/3d/transposed, avg-pool backward, DeconvGradFilter), issue #19's "ops".
ALIASES = {"ops": ("convnd", "pool", "deconv")}


def expand_suites(names) -> list[str]:
    """Suite names with every alias replaced by its suites (order kept, duplicates dropped)."""
    return list(dict.fromkeys(n for name in names for n in ALIASES.get(name, (name,))))


def register(workload: Workload) -> Workload:
    WORKLOADS.append(workload)
    return workload


def load_suites(names=SUITES) -> list[Workload]:
    """Import the suite modules (each registers its workloads) and return the workloads."""
    import importlib

    for name in names:
        try:
            importlib.import_module(f"dsl.cli.bench.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"dsl.cli.bench.{name}":
                raise
    return [w for w in WORKLOADS if w.suite in names]
