"""Resource use: many distinct kernels in one process, and one kernel run many times.

Measured in a fresh child process (``rel_memory.py``) so the numbers are not disturbed by the
rest of the suite. CI builds 48 kernels per mode; ``RELIABILITY_FULL=1`` builds the 200 of the
issue. The 10,000 runs are the same in both.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from rel_strategies import FULL

ROOT = Path(__file__).resolve().parents[2]
# 48: the heap's one-off growth (malloc's arenas, LLVM's caches) can spread over the builds
# after the first third (about 0.3 MiB a build for 15 builds, then flat for the next 36, seen
# on an Emerald Rapids VM after dx's tap order changed); 24 kernels left it the median step.
KERNELS = 200 if FULL else 48
RUNS = 10_000
# A kernel whose library stayed mapped adds its pages and dlopen state on *every* build, so a
# leak shows in the typical (median) step between builds. One-off steps (malloc growing an arena,
# TVM starting its worker threads, LLVM filling a cache) can land anywhere after warm-up and are
# several MiB each (an 11 MiB step was seen on a Zen 3 machine), so the total growth bound is
# loose and the per-build bound tight.
STEP_MIB = 0.25
GROWTH_MIB = 24 + KERNELS * 64 / 1024
RUN_GROWTH_MIB = 1.0
CACHE_MAX = 16  # the child's DSL_KERNEL_CACHE_MAX: eviction must release libraries


def _measure(mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DSL_KERNEL_CACHE_MAX": str(CACHE_MAX)}
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("rel_memory.py")),
                          str(KERNELS), str(RUNS), mode], env=env, capture_output=True,
                         text=True, timeout=1800, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["direct", "cache"])
def test_memory_stays_bounded(mode):
    m = _measure(mode)
    rss = m["build_rss"]
    warm = KERNELS // 3  # TVM and LLVM fill their caches on the first builds
    early, late = statistics.median(rss[warm:warm + 5]), statistics.median(rss[-5:])
    run_growth = m["run_rss"][-1] - m["run_rss"][0]
    print(f"\n{mode}: {KERNELS} kernels, RSS {rss[0]:.1f} -> {early:.1f} -> {late:.1f} MiB "
          f"(max {max(rss):.1f}), libraries still mapped: {m['mapped_libraries']}; {RUNS} runs: "
          f"RSS {m['run_rss'][0]:.1f} -> {m['run_rss'][-1]:.1f} MiB")
    # dropped kernels are unloaded; the cache keeps at most its bound
    assert m["mapped_libraries"] <= (0 if mode == "direct" else CACHE_MAX)
    steps = [b - a for a, b in zip(rss[warm:], rss[warm + 1:])]
    assert statistics.median(steps) <= STEP_MIB, steps
    assert late - early <= GROWTH_MIB
    assert run_growth <= RUN_GROWTH_MIB
