"""The built-in x86-64 targets: one row of microarchitecture facts each; ``host`` is detected.

The table (``UARCH``) holds, per LLVM CPU name, the facts a schedule and the roof need. The
public entries are its rows under their LLVM names (``znver4``, ``sapphirerapids`` ...) plus
three portable ones kept for their users: ``x86-64`` (SSE2 only), ``x86-avx2`` (Haswell:
AVX2 + FMA) and ``x86-avx512`` (Skylake-SP's AVX-512). Sources: the vendors' optimisation
manuals and uops.info; a row says per core what one core has (L3: its share of the L3 slice
or CCX it sits in).

FMA width is its own fact: Zen 4 decodes a 512-bit FMA into two 256-bit halves on its two
256-bit FMA pipes, so it issues 32 fp32 FLOP per cycle like Zen 3, while Zen 5 and Intel's
server cores with two 512-bit FMA pipes issue 64. (Some Skylake-SP / Cascade Lake Silver,
Bronze and Gold 5xxx parts have one 512-bit FMA pipe: 32. The row describes the two-pipe
parts, so it bounds both.)

``host`` starts from the row of the machine's LLVM CPU name (``cascadelake`` and other close
relatives map to a row with the same FMA facts; an unknown name starts from the portable row
its flags allow), then takes the ISA extensions from ``/proc/cpuinfo`` and the private cache
sizes from ``/sys/devices/system/cpu/cpu0/cache``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace

from targets import CpuTarget, machine_cores, register

# ISA extension sets, in /proc/cpuinfo spelling ("pni" is SSE3, "abm" is LZCNT, "bmi1" BMI).
SSE2 = frozenset({"sse", "sse2"})
X86_V2 = SSE2 | {"pni", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16"}
HASWELL = X86_V2 | {"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm"}
ZEN3 = HASWELL | {"sse4a", "sha_ni", "vaes", "vpclmulqdq"}
AVX512 = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})
SKYLAKE_SP = HASWELL | AVX512
AVX512_ICL = AVX512 | {"avx512_vnni", "avx512ifma", "avx512vbmi", "avx512_vbmi2",
                       "avx512_bitalg", "avx512_vpopcntdq", "gfni", "vaes", "vpclmulqdq"}
ICELAKE_SP = HASWELL | AVX512_ICL | {"sha_ni"}
ZEN4 = ZEN3 | AVX512_ICL | {"avx512_bf16"}
ZEN5 = ZEN4 | {"avx_vnni", "avx512_vp2intersect"}
SAPPHIRE = ICELAKE_SP | {"avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16",
                         "amx_int8"}

# Every extension a target may list; host keeps the ones of these its flags show.
KNOWN_ISA = SSE2 | X86_V2 | HASWELL | ZEN5 | SAPPHIRE

# name: (LLVM mcpu, vector_bits, vector_regs, fma_units, fma_bits, fma_latency,
#        l1d_kib, l2_kib, l3_kib per core, isa)
UARCH = {
    # portable: SSE2 has no FMA (up to 2 add + 2 multiply pipes of 128 bits: 16 FLOP/cycle)
    "x86-64": ("x86-64", 128, 16, 0, 128, 4, 32, 256, 2048, SSE2),
    "haswell": ("haswell", 256, 16, 2, 256, 5, 32, 256, 2560, HASWELL),
    "znver3": ("znver3", 256, 16, 2, 256, 4, 32, 512, 4096, ZEN3),
    "znver4": ("znver4", 512, 32, 2, 256, 4, 32, 1024, 4096, ZEN4),
    "znver5": ("znver5", 512, 32, 2, 512, 4, 48, 1024, 4096, ZEN5),
    "skylake-avx512": ("skylake-avx512", 512, 32, 2, 512, 4, 32, 1024, 1408, SKYLAKE_SP),
    "icelake-server": ("icelake-server", 512, 32, 2, 512, 4, 48, 1280, 1536, ICELAKE_SP),
    "sapphirerapids": ("sapphirerapids", 512, 32, 2, 512, 4, 48, 2048, 1920, SAPPHIRE),
}

# LLVM host names whose FMA facts equal a row's (caches and ISA come from the machine).
LLVM_ALIASES = {"znver2": "znver3", "cascadelake": "skylake-avx512",
                "cooperlake": "skylake-avx512", "emeraldrapids": "sapphirerapids",
                "graniterapids": "sapphirerapids", "skylake": "haswell",
                "broadwell": "haswell"}

# Public entries: every row under its own name, plus the portable names users already write.
PORTABLE = {"x86-64": "x86-64", "x86-avx2": "haswell", "x86-avx512": "skylake-avx512"}


def from_row(name: str, row: str, cores: int) -> CpuTarget:
    """The target ``name`` with the facts of table row ``row``."""
    mcpu, bits, regs, units, fbits, lat, l1, l2, l3, isa = UARCH[row]
    return CpuTarget(name, "x86", {"kind": "llvm", "mcpu": mcpu}, bits, cores, l1d_kib=l1,
                     l2_kib=l2, l3_kib=l3, vector_regs=regs, fma_units=units, fma_bits=fbits,
                     fma_latency=lat, isa=frozenset(isa), uarch=row)


@functools.lru_cache(maxsize=1)
def host_features() -> frozenset[str]:
    """This machine's CPU flags (``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:  # pragma: no cover
        pass
    return frozenset()


def _read(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read().strip()


def _kib(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1, "M": 1024, "G": 1024 * 1024}.get(text[-1:], 0)
    return int(text[:-1]) * scale if scale else int(text) // 1024


def _cpu_count(cpulist: str) -> int:
    """CPUs in a sysfs list such as ``0-3,8``."""
    count = 0
    for part in cpulist.strip().split(","):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1 if lo else 0
    return count


def host_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, int]:
    """``{"l1d": KiB, "l2": KiB, "l3": KiB per sharing CPU}`` from sysfs; missing levels
    are left out (a container without /sys gets ``{}``)."""
    out: dict[str, int] = {}
    try:
        entries = sorted(e for e in os.listdir(root) if e.startswith("index"))
    except OSError:
        return out
    for entry in entries:
        try:
            info = {k: _read(os.path.join(root, entry, k))
                    for k in ("level", "type", "size", "shared_cpu_list")}
        except OSError:
            continue
        if info["type"] == "Instruction":
            continue
        key = "l1d" if info["level"] == "1" else f"l{info['level']}"
        size = _kib(info["size"])
        out[key] = size // max(1, _cpu_count(info["shared_cpu_list"])) if key == "l3" else size
    return out


def llvm_host_cpu() -> str | None:
    """LLVM's name for this CPU (``znver3``), None where TVM's compiler is not installed
    (a runtime-only deployment: then the row comes from the CPU flags)."""
    try:
        import tvm

        return str(tvm.target.codegen.llvm_get_system_cpu())
    except Exception:  # noqa: BLE001 - ImportError, or a runtime-only TVM without LLVM
        return None


def _base_row(cpu: str, flags: frozenset[str]) -> str:
    """The table row to start ``host`` from: its LLVM name, an alias, else by flags."""
    if cpu in UARCH:
        return cpu
    if cpu in LLVM_ALIASES:
        return LLVM_ALIASES[cpu]
    return row_by_flags(flags)


def row_by_flags(flags: frozenset[str]) -> str:
    """The row whose ISA is the largest subset of ``flags`` (Zen rows need AMD's ``sse4a``,
    so vendors do not mix), unless a portable row allows wider vectors."""
    fits = [r for r, row in UARCH.items() if row[-1] <= flags]
    best = max(fits, key=lambda r: len(UARCH[r][-1]), default="x86-64")
    portable = PORTABLE["x86-avx512" if "avx512f" in flags else
                        "x86-avx2" if {"avx2", "fma"} <= flags else "x86-64"]
    return best if UARCH[best][1] >= UARCH[portable][1] else portable


def detect_host(cpu: str | None = None, flags: frozenset[str] | None = None,
                caches: dict[str, int] | None = None) -> CpuTarget:
    """The ``host`` target: LLVM's CPU name, the machine's flags and cache sizes (each
    argument overrides what is read from this machine, for tests)."""
    flags = host_features() if flags is None else frozenset(flags)
    if cpu is None:
        cpu = llvm_host_cpu() or UARCH[row_by_flags(flags)][0]
    caches = host_caches() if caches is None else caches
    row = _base_row(cpu, flags)
    base = from_row("host", row, machine_cores())
    bits = 512 if "avx512f" in flags else 256 if "avx2" in flags else 128
    # L3: a VM shows its few CPUs sharing the whole L3; a known row knows the real sharing.
    l3 = base.l3_kib if row == cpu or cpu in LLVM_ALIASES else caches.get("l3", base.l3_kib)
    return replace(base, llvm={"kind": "llvm", "mcpu": cpu}, vector_bits=bits,
                   vector_regs=32 if bits == 512 else 16,
                   isa=(flags & KNOWN_ISA) if flags else base.isa,
                   l1d_kib=caches.get("l1d", base.l1d_kib),
                   l2_kib=caches.get("l2", base.l2_kib), l3_kib=l3)


def _register_builtin() -> None:
    cores = machine_cores()
    for row in UARCH:
        if row != "haswell":  # public as "x86-avx2"
            register(from_row(row, row, cores))
    for name, row in PORTABLE.items():
        register(from_row(name, row, cores))
    register(detect_host())


_register_builtin()
