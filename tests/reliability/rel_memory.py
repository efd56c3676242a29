"""Child process for the resource test: ``python rel_memory.py KERNELS RUNS MODE``.

Builds, loads, runs and drops KERNELS distinct kernels in one process (MODE ``direct``:
dsl.build + dsl.load; ``cache``: dsl.kernel_cache, bounded by DSL_KERNEL_CACHE_MAX), then runs
one kernel RUNS times, and prints RSS samples (MiB, from /proc/self/statm) as JSON.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile

import numpy as np

import dsl
from dsl import kernel_cache
from dsl import tvm as dtvm


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def graph(i: int):
    h, w = 3 + i % 10, 3 + i // 10  # distinct small shapes -> distinct kernels, similar cost
    dy = dtvm.placeholder((1, 1, h, w, 16), name="out_backprop", dtype="float32")
    fz = dtvm.placeholder((9, 1, 16, 16), name="filters", dtype="float32")
    dx = dsl.conv2d_backprop_input(fz, dy, (16, 16, 3, 3), (1, 16, h, w),
                                   {"padding": [1, 1, 1, 1], "res_dtype": "float32"})
    return [fz, dy], [dx]


def main(kernels: int, runs: int, mode: str) -> None:
    root = tempfile.mkdtemp()
    os.environ["DSL_CACHE_DIR"] = root
    samples = []
    for i in range(kernels):
        if mode == "cache":
            kernel = kernel_cache.get_kernel({"rel_mem": i}, lambda i=i: graph(i), prefix="m")
        else:
            ins, outs = graph(i)
            dsl.build(dsl.auto_schedule(outs), {"name": f"m{i}", "tensor_list": [*ins, *outs],
                                                "kernel_meta_parent_dir": root})
            kernel = dsl.load(f"m{i}", root)
        args = [np.ones(t["shape"], t["dtype"]) for t in kernel.inputs]
        kernel(*args)
        del kernel, args
        gc.collect()
        samples.append(rss_mib())
    with open("/proc/self/maps") as f:
        mapped = len({line.split()[-1] for line in f if root in line})
    ins, outs = graph(0)
    dsl.build(dsl.auto_schedule(outs), {"name": "hot", "tensor_list": [*ins, *outs],
                                        "kernel_meta_parent_dir": root})
    kernel = dsl.load("hot", root)
    args = [np.ones(t["shape"], t["dtype"]) for t in kernel.inputs]
    out = np.empty(kernel.outputs[0]["shape"], kernel.outputs[0]["dtype"])
    run_samples = []
    for j in range(runs):
        kernel(*args) if j % 2 else kernel(*args, out)  # both the allocating and given paths
        if j in (runs // 10, runs - 1):
            gc.collect()
            run_samples.append(rss_mib())
    print(json.dumps({"build_rss": samples, "mapped_libraries": mapped,
                      "run_rss": run_samples}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
