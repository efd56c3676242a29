"""Time kernels exported by ``python -m dsl export`` on this machine against its PyTorch.

Standalone: needs numpy, TVM's runtime (``TVM_USE_RUNTIME_LIB=1`` with the runtime-only Python
tree is enough) and, for the peer and the check, PyTorch. Nothing from ``dsl`` is imported, so
it runs where only the exported directory and this file were copied::

    TVM_USE_RUNTIME_LIB=1 python remote_run.py EXPORT_DIR --threads 1,16 [--roof GFLOPS]

Ours and PyTorch run in separate worker processes per thread count (neither runtime's idle
workers then steal the other's cores); each time is the median of ``--repeat`` samples. Every
row's result is checked against PyTorch's at full size before it is reported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _median_seconds(fn, repeat: int) -> float:
    fn()
    fn()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.05:
        fn()
        n += 1
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def _kernels(manifest: dict, threads: int) -> list[dict]:
    """The kernels built for ``threads`` cores (else for the nearest core count)."""
    counts = sorted({k["cores"] for k in manifest["kernels"]})
    cores = min(counts, key=lambda c: (abs(c - threads), -c))
    return [k for k in manifest["kernels"] if k["cores"] == cores]


def worker_ours(root: Path, threads: int, repeat: int) -> list[dict]:
    import tvm

    rows = []
    for k in _kernels(json.loads((root / "manifest.json").read_text()), threads):
        data = np.load(root / k["data"])
        mod = tvm.runtime.load_module(str(root / f"{k['name']}.so"))
        func = mod[k["name"]]
        args = [tvm.runtime.tensor(data[f"arr_{i}"]) for i in range(k["inputs"])]
        args.append(tvm.runtime.tensor(np.zeros(k["out_shape"], k["out_dtype"])))
        seconds = _median_seconds(lambda: func(*args), repeat)  # noqa: B023
        out = args[-1].numpy().ravel()[data["unpack_index"]]
        np.save(root / f"result_{k['name']}_t{threads}.npy", out)
        rows.append({"name": k["name"], "seconds": seconds})
    return rows


def _torch_call(torch, k: dict, data):
    layer = k["layer"]
    kw = {"stride": layer["stride"], "padding": layer["pad"], "dilation": layer["dil"],
          "groups": layer["groups"]}
    dy = torch.from_numpy(data["grad_output"])
    if k["kind"] == "dx":
        w = torch.from_numpy(data["weight"])
        size = (layer["n"], layer["cin"], layer["hw"], layer["hw"])
        return lambda: torch.nn.grad.conv2d_input(size, w, dy, **kw)
    x = torch.from_numpy(data["input"])
    w_shape = (layer["cout"], layer["cin"] // layer["groups"], layer["k"], layer["k"])
    return lambda: torch.nn.grad.conv2d_weight(x, w_shape, dy, **kw)


def worker_torch(root: Path, threads: int, repeat: int) -> list[dict]:
    import torch

    torch.set_num_threads(threads)
    rows = []
    for k in _kernels(json.loads((root / "manifest.json").read_text()), threads):
        call = _torch_call(torch, k, np.load(root / k["data"]))
        seconds = _median_seconds(call, repeat)
        ref = call().numpy().astype(np.float64)
        ours = np.load(root / f"result_{k['name']}_t{threads}.npy").reshape(ref.shape)
        err = float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))
        rows.append({"name": k["name"], "seconds": seconds, "rel_err": err})
    return rows


def _spawn(root: Path, role: str, threads: int, repeat: int) -> list[dict]:
    env = {**os.environ, "TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "TVM_THREAD_POOL_SPIN_COUNT": "0", "OMP_WAIT_POLICY": "PASSIVE"}
    out = subprocess.run([sys.executable, __file__, str(root), "--worker", role, "--threads",
                          str(threads), "--repeat", str(repeat)], env=env, capture_output=True,
                         text=True, timeout=3000, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{role} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(root: Path, thread_counts: list[int], repeat: int, roof: float | None) -> dict:
    manifest = json.loads((root / "manifest.json").read_text())
    flops = {k["name"]: k["flops"] for k in manifest["kernels"]}
    table = []
    for t in thread_counts:
        ours = {r["name"]: r for r in _spawn(root, "ours", t, repeat)}
        peer = {r["name"]: r for r in _spawn(root, "torch", t, repeat)}
        for name, r in ours.items():
            g_ours = flops[name] / r["seconds"] / 1e9
            g_peer = flops[name] / peer[name]["seconds"] / 1e9
            row = {"threads": t, "kernel": name, "ours_gflops": g_ours,
                   "torch_gflops": g_peer, "ratio": g_ours / g_peer,
                   "rel_err": peer[name]["rel_err"]}
            if roof:
                row["pct_roof"] = 100 * g_ours / (roof * t)
                row["torch_pct_roof"] = 100 * g_peer / (roof * t)
            table.append(row)
            pct = f" {row['pct_roof']:5.1f}% / {row['torch_pct_roof']:5.1f}%" if roof else ""
            bad = "  WRONG RESULT" if not row["rel_err"] <= 1e-3 else ""
            print(f"t={t:3d} {name:40s} ours {g_ours:8.1f} torch {g_peer:8.1f} GFLOP/s "
                  f"ratio {row['ratio']:5.2f}{pct} err {row['rel_err']:.1e}{bad}", flush=True)
        ratios = [r["ratio"] for r in table if r["threads"] == t]
        print(f"t={t}: geomean ours/torch {math.exp(statistics.fmean(map(math.log, ratios))):.2f}"
              f", min {min(ratios):.2f}", flush=True)
    return {"target": manifest["target"], "rows": table}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root", type=Path)
    p.add_argument("--threads", default="1")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--roof", type=float, default=None, help="fp32 GFLOP/s of one core")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--worker", choices=["ours", "torch"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        fn = worker_ours if args.worker == "ours" else worker_torch
        print(json.dumps(fn(args.root, int(args.threads), args.repeat)))
        return 0
    result = report(args.root, [int(t) for t in args.threads.split(",")], args.repeat, args.roof)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    bad = [r for r in result["rows"] if not r["rel_err"] <= 1e-3]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
