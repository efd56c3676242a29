"""The built-in x86-64 targets. One entry each; ``host`` is detected from LLVM.

All four run on an AVX-512 machine, so the tests build and check every one of them there.
"""

from __future__ import annotations

import functools

from targets import CpuTarget, machine_cores, register

# Features a machine needs to run each target's code (checked before running in tests).
REQUIRED_FEATURES = {
    "x86-64": (),
    "x86-avx2": ("avx2", "fma"),
    "x86-avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
}


@functools.lru_cache(maxsize=1)
def host_features() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:  # pragma: no cover
        pass
    return frozenset()


def _host() -> CpuTarget:
    import tvm

    cpu = tvm.target.codegen.llvm_get_system_cpu()
    feats = host_features()
    if "avx512f" in feats:
        bits = 512
    elif "avx2" in feats or "avx" in feats:
        bits = 256
    else:
        bits = 128
    return CpuTarget("host", "x86", {"kind": "llvm", "mcpu": cpu}, bits, machine_cores(),
                     l1d_kib=32, l2_kib=1024)


for _t in (
    CpuTarget("x86-64", "x86", {"kind": "llvm", "mcpu": "x86-64"}, 128, machine_cores()),
    CpuTarget("x86-avx2", "x86", {"kind": "llvm", "mcpu": "haswell"}, 256, machine_cores()),
    CpuTarget("x86-avx512", "x86", {"kind": "llvm", "mcpu": "skylake-avx512"}, 512,
              machine_cores(), l2_kib=1024),
):
    register(_t)
register(_host())
