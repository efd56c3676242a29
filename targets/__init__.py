"""CPU targets the project builds for, as data: one microarchitecture's facts per entry.

Each entry is a :class:`CpuTarget`: the TVM target dict plus what a schedule needs to size its
tiles and what the benchmark needs to know the roof: vector width and lanes per dtype, the FMA
units and their width, the vector register count, cache sizes per core, cores and the ISA
extensions. Adding a target is adding a row to the table in ``targets/cpu.py``; schedules read
these numbers and never test a target's name.

``current()`` is the target in force: the innermost ``with use(...)`` block, else ``host``.

This package depends on nothing in ``dsl``: an unknown name raises :class:`UnknownTarget`
(a ``ValueError``), which the ``dsl`` entry points turn into their ``DslError``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

# Bits of one element, for lanes(); an unknown dtype counts as 32 bits.
# cycles between two tile products on one core's AMX unit (Sapphire Rapids: 16 rows of a
# 16 x 16 tile; the bound flops_per_cycle holds AMX roofs to)
AMX_TILE_CYCLES = 16
# input dtype -> the AMX extension whose tile products take it (besides amx_tile)
AMX_FEATURES = {"bfloat16": "amx_bf16", "int8": "amx_int8"}
DTYPE_BITS = {"int8": 8, "uint8": 8, "int16": 16, "float16": 16, "bfloat16": 16,
              "int32": 32, "float32": 32, "int64": 64, "float64": 64}


class UnknownTarget(ValueError):
    """A target name that is not in the table.

    Attributes
    ----------
    param, value, rule : str, object, str
        The parameter (``"target"``), the offending value and what it must be, in the shape
        of ``dsl.errors.DslError`` so callers in ``dsl`` can re-raise it as one.
    """

    def __init__(self, value: object, valid: list[str]):
        self.param, self.value = "target", value
        self.rule = f"must be one of {', '.join(valid)}"
        super().__init__(f"target={value!r}: {self.rule}")


@dataclass(frozen=True)
class CpuTarget:
    """One CPU target: a TVM target plus the facts of its microarchitecture.

    Attributes
    ----------
    name : str
        Registry key (``"x86-avx512"``, ``"znver4"``).
    family : str
        Schedule family: schedules are registered per (compute tag, family).
    llvm : dict
        TVM target attributes other than ``num-cores`` (``{"kind": "llvm", "mcpu": ...}``).
    vector_bits : int
        Width of one SIMD register the code uses; fp32 lanes = vector_bits // 32.
    cores : int
        Threads a kernel may use (this machine's cores by default).
    l1d_kib, l2_kib, l3_kib : int
        Data cache per core, in KiB. L3 is the core's share of its shared L3 (size of the
        L3 slice / CCX divided by the cores sharing it), the figure a tile may plan on.
    vector_regs : int
        Architectural vector registers (16 for SSE / AVX2, 32 with AVX-512).
    fma_units : int
        FMA pipes per core (0: no FMA; a separate add and multiply pipe are assumed).
    fma_bits : int
        Datapath width of one FMA pipe. Zen 4 runs a 512-bit FMA as two 256-bit halves, so
        its ``fma_bits`` is 256 while ``vector_bits`` is 512.
    fma_latency : int
        Cycles from an FMA's inputs to its result: ``fma_latency * fma_units`` independent
        accumulators keep every FMA pipe busy.
    isa : frozenset of str
        ISA extensions, spelled as ``/proc/cpuinfo`` flags (``avx2``, ``fma``, ``avx512f``,
        ``avx512_vnni``, ``avx512_bf16``, ``amx_tile`` ...): the code built for this target
        may use all of them, so a machine runs it only if it has them all.
    uarch : str
        Microarchitecture the facts describe (``"znver3"``; ``"generic"`` for the portable
        entries).
    """

    name: str
    family: str
    llvm: dict = field(hash=False)
    vector_bits: int
    cores: int
    l1d_kib: int = 32
    l2_kib: int = 1024
    l3_kib: int = 2048
    vector_regs: int = 16
    fma_units: int = 2
    fma_bits: int = 256
    fma_latency: int = 4
    isa: frozenset = frozenset()
    uarch: str = "generic"

    def lanes(self, dtype: str = "float32") -> int:
        """Elements of ``dtype`` in one vector register."""
        return max(1, self.vector_bits // DTYPE_BITS.get(dtype, 32))

    @property
    def mcpu(self) -> str:
        return self.llvm.get("mcpu", "x86-64")

    def has(self, *features: str) -> bool:
        """True if the target has every ISA extension named (cpuinfo spelling)."""
        return set(features) <= self.isa

    def has_tiles(self, dtype: str) -> bool:
        """True if the target multiplies ``dtype`` (bfloat16, int8) in AMX tiles."""
        feature = AMX_FEATURES.get(dtype)
        return feature is not None and self.has("amx_tile", feature)

    def dot_depth(self, dtype: str) -> int:
        """Reduction elements that one 32-bit lane of the target's 512-bit dot-product
        instruction sums for inputs of ``dtype``: 4 for int8 with AVX-512 VNNI (``vpdpbusd``,
        unsigned x signed bytes into int32), 2 for bfloat16 with AVX512-BF16 (``vdpbf16ps``,
        pairs into fp32); 1 (a plain multiply-add) otherwise."""
        if self.vector_bits < 512:
            return 1
        if dtype == "int8" and self.has("avx512_vnni"):
            return 4
        if dtype == "bfloat16" and self.has("avx512_bf16"):
            return 2
        return 1

    def fma_chains(self) -> int:
        """Independent accumulators needed to keep every FMA pipe busy (latency x pipes)."""
        return max(1, self.fma_latency * max(1, self.fma_units))

    def flops_per_cycle(self, dtype: str = "float32") -> int:
        """Per core, the most arithmetic operations the vector units can issue per cycle.

        fp32: ``fma_units * fma_bits / 32 * 2`` (a multiply and an add per lane per FMA);
        without FMA, four add-or-multiply pipes of ``vector_bits`` (Zen has two of each;
        Intel cores two): an SSE2-only target runs on all of them, so the bound takes the
        widest. ``bfloat16``:
        ``vdpbf16ps`` does two multiply-adds per fp32 lane (x2 of fp32), ``int8``:
        ``vpdpbusd`` four per int32 lane (x4), both bounded as if issued on every FMA pipe;
        with AMX the tile unit's instead: a ``tdpbf16ps`` (16 x 16 x 32 multiply-adds) or
        ``tdpbusd`` (16 x 16 x 64) issues every 16 cycles (:data:`AMX_TILE_CYCLES`).
        0 where the ISA has no such instruction.
        """
        lanes32 = (self.fma_bits if self.fma_units else self.vector_bits) // 32
        fp32 = self.fma_units * lanes32 * 2 if self.fma_units else 4 * lanes32
        if dtype == "float32":
            return fp32
        if dtype == "bfloat16":
            if self.has_tiles(dtype):
                return 16 * 16 * 32 * 2 // AMX_TILE_CYCLES
            return 2 * fp32 if self.has("avx512_bf16") else 0
        if dtype == "int8":
            if self.has_tiles(dtype):
                return 16 * 16 * 64 * 2 // AMX_TILE_CYCLES
            return 4 * fp32 if self.isa & {"avx512_vnni", "avx_vnni"} else 0
        raise ValueError(f"no roof for dtype {dtype!r}: float32, bfloat16 or int8")

    def tvm_target(self):
        import tvm

        return tvm.target.Target({**self.llvm, "num-cores": self.cores})

    def as_json(self) -> dict:
        """The identity of the built code (cache keys, kernel_meta): every fact a schedule
        reads (two hosts of one LLVM name with other cache sizes get other tiles)."""
        return {"name": self.name, "family": self.family, "llvm": dict(self.llvm),
                "vector_bits": self.vector_bits, "cores": self.cores,
                "l1d_kib": self.l1d_kib, "l2_kib": self.l2_kib, "l3_kib": self.l3_kib,
                "vector_regs": self.vector_regs, "fma_units": self.fma_units,
                "fma_bits": self.fma_bits, "fma_latency": self.fma_latency,
                "isa": sorted(self.isa)}

    def facts(self) -> dict:
        """Every fact, as plain JSON (for reports and ``python -m dsl peak``)."""
        return {**self.as_json(), "uarch": self.uarch,
                "flops_per_cycle": {d: self.flops_per_cycle(d)
                                    for d in ("float32", "bfloat16", "int8")}}

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
    """Look a target up by name (a :class:`CpuTarget` passes through).

    Raises
    ------
    UnknownTarget
        ``name`` is not a registered target.
    """
    if isinstance(name, CpuTarget):
        return name
    _load_builtin()
    if not isinstance(name, str) or name not in _REGISTRY:
        raise UnknownTarget(name, sorted(_REGISTRY))
    return _REGISTRY[name]


def runnable(target: CpuTarget) -> bool:
    """True if this machine can execute code built for ``target`` (it has every ISA
    extension the target lists; where the CPU flags cannot be read, only ``host`` and
    SSE2-only code are assumed to run)."""
    from targets.cpu import host_features

    flags = host_features()
    if not flags:
        return target.name == "host" or target.isa <= {"sse", "sse2"}
    return target.isa <= flags


def target_features(target: CpuTarget) -> tuple[str, ...]:
    """The ISA extensions a machine needs to run ``target``'s code (sorted)."""
    return tuple(sorted(target.isa))


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
