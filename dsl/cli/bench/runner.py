"""``python -m dsl bench``: time every registered workload against its PyTorch peer.

Ours and the peer are timed alternately in the same process (sample after sample), so load
from other processes hits both alike; each reported time is the median of ``--repeat`` samples,
and each sample runs enough iterations to last ``--min-time`` seconds.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time

from dsl.runtime.timing import alternating_medians


def _parse(argv):
    from dsl.cli import output
    from dsl.cli.common import add_selection_args, prog

    p = argparse.ArgumentParser(prog=prog("bench"),
                                description="GFLOP/s of our kernels next to PyTorch's")
    add_selection_args(p)
    p.add_argument("--repeat", type=int, default=7, help="timed samples per side (median)")
    p.add_argument("--min-time", type=float, default=0.03,
                   help="seconds one sample lasts at least (more iterations per sample)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for ours and the peer (default: the target's cores)")
    p.add_argument("--target", default=None, help="target name (default: host)")
    p.add_argument("--dtype", default=None, choices=("float32", "float16"),
                   help="input dtype of our kernels (the peer runs float32)")
    p.add_argument("--settle", type=float, default=0.02,
                   help="seconds to sleep before each sample, so the other side's spinning "
                        "worker threads (TVM pool, OpenMP) park first")
    output.add_json_arg(p)
    p.add_argument("--no-peer", action="store_true", help="skip PyTorch")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw ours vs PyTorch GFLOP/s per workload (needs matplotlib)")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    return args


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(target, threads: int, peer_version: str | None) -> dict:
    import tvm

    pool = tvm.get_global_func("runtime.NumThreads", allow_missing=True)
    return {"cpu": _cpu_model(), "machine_cores": os.cpu_count(), "threads": threads,
            "tvm_threads": int(pool()) if pool is not None else None,
            "load_avg": round(os.getloadavg()[0], 2),
            "target": target.name, "mcpu": target.llvm.get("mcpu"),
            "vector_bits": target.vector_bits, "tvm": tvm.__version__,
            "torch": peer_version, "python": platform.python_version()}


def _calibrate(fn, min_time: float) -> int:
    """Iterations per sample so that one sample lasts about ``min_time`` seconds."""
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    return max(1, min(10000, int(math.ceil(min_time / one))))


def _sample(fn, iters: int, settle: float = 0.0) -> float:
    if settle > 0:
        time.sleep(settle)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def measure_alternating(fns, repeat: int, min_time: float,
                        settle: float = 0.0) -> list[float]:
    """Median seconds per call of each function, sampled in turn (one sample of each per
    round) so that load from other processes hits all of them alike."""
    for fn in fns:
        fn()  # warm caches, thread pools and lazy initialisation on every side
    iters = [_calibrate(fn, min_time) for fn in fns]
    return alternating_medians(
        [lambda fn=fn, n=n: _sample(fn, n, settle) for fn, n in zip(fns, iters)], repeat)


def measure(prep, repeat: int, min_time: float, use_peer: bool,
            settle: float = 0.0) -> tuple[float, float | None, dict]:
    """Median seconds per iteration of ours, of the peer and of each further peer
    (``prep.peers``), sampled alternately."""
    peer = prep.peer if use_peer else None
    others = dict(prep.peers) if use_peer else {}
    fns = [prep.ours] + ([peer] if peer is not None else []) + list(others.values())
    times = measure_alternating(fns, repeat, min_time, settle)
    extra = dict(zip(others, times[len(times) - len(others):]))
    return times[0], (times[1] if peer is not None else None), extra


def fair_thread_env(cores: int) -> None:
    """Set both runtimes' thread settings for side-by-side timing (before either pool starts).

    TVM sizes its thread pool once, when it first starts it, from TVM_NUM_THREADS; unset, it
    takes half the logical CPUs (it assumes SMT), so ours would run on fewer threads than the
    peer is given. Idle worker threads of either runtime must not spin while the other side
    is timed: TVM's pool and PyTorch's OpenMP both busy-wait after a parallel region by
    default, which steals the other's cores; both park at once here.
    """
    os.environ.setdefault("TVM_NUM_THREADS", str(cores))
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def geomean(values) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def _fmt(v, spec: str, width: int) -> str:
    return f"{v:{width}{spec}}" if v is not None else f"{'-':>{width}}"


HEAD = (f"{'workload':<42s} {'kind':<8s} {'ours GF/s':>10s} {'torch GF/s':>10s} "
        f"{'ratio':>7s} {'ours ms':>9s} {'torch ms':>9s} {'build s':>8s}")


def format_row(r: dict) -> str:
    if r.get("error"):
        return f"{r['suite'] + '/' + r['name']:<42s} {r['kind']:<8s} FAILED: {r['error']}"

    def ms(seconds):
        return seconds * 1e3 if seconds is not None else None

    gb = r.get("unit") == "GB/s"  # a memory-bound row: the rate columns hold GB/s
    ours, peer = (r["ours_gbps"], r["peer_gbps"]) if gb else (r["ours_gflops"], r["peer_gflops"])
    others = "".join(f"  {k} {_fmt(v, '.2f', 0)}x" for k, v in r.get("others_ratio", {}).items())
    return (f"{r['suite'] + '/' + r['name']:<42s} {r['kind']:<8s} "
            f"{_fmt(ours, '.1f', 10)} {_fmt(peer, '.1f', 10)} "
            f"{_fmt(r['ratio'], '.2f', 7)} {_fmt(ms(r['ours_s']), '.3f', 9)} "
            f"{_fmt(ms(r['peer_s']), '.3f', 9)} {_fmt(r['build_s'], '.2f', 8)}"
            + (f" {_fmt(r['roof_pct'], '.1f', 6)}%" if "roof_pct" in r else "")
            + f"{'  [GB/s]' if gb else ''}{others}")


def run(workloads, *, repeat=7, min_time=0.03, use_peer=True, settle=0.02,
        out=None) -> list[dict]:
    """Set up and time each workload, reporting progress on ``out`` (default stderr);
    returns one dict per row."""
    from dsl.progress import Steps

    rows = []
    with Steps(len(workloads), "[bench]", unit="workload", stream=out) as steps:
        for w in workloads:
            rows.append(_run_one(w, repeat, min_time, use_peer, settle))
            steps.update(1, progress_text(rows[-1]))
    return rows


def progress_text(row: dict) -> str:
    """What one finished workload's progress line says."""
    from dsl.cli.output import cell

    what = f"{row['suite']}/{row['name']} {row['kind']}"
    if row.get("error"):
        return f"{what}: FAILED"
    return (f"{what}: build {cell(row['build_s'], '.2f')} s, ours "
            f"{cell(row['ours_gflops'], '.1f')} GFLOP/s")


def _run_one(w, repeat, min_time, use_peer, settle) -> dict:
    """Set up, check and time one workload; a failure becomes the row's ``error``."""
    row = {"suite": w.suite, "name": w.name, "kind": w.kind, "flops": w.flops}
    try:
        prep = w.setup()
        ours, peer, others = measure(prep, repeat, min_time, use_peer, settle)
        err = prep.verify() if use_peer else None
        nbytes = getattr(w, "bytes", 0.0)
        row.update(unit="GB/s" if nbytes else "GFLOP/s", bytes=nbytes,
                   ours_gbps=nbytes / ours / 1e9 if nbytes else None,
                   peer_gbps=nbytes / peer / 1e9 if nbytes and peer else None,
                   others_s=others, others_ratio={k: v / ours for k, v in others.items()})
        row.update(check_err=err, ours_s=ours, peer_s=peer, build_s=prep.build_seconds,
                   load_avg=round(os.getloadavg()[0], 2),
                   ours_gflops=w.flops / ours / 1e9,
                   peer_gflops=w.flops / peer / 1e9 if peer else None,
                   ratio=peer / ours if peer else None, info=dict(prep.info), error=None)
    except Exception as exc:  # noqa: BLE001 - one broken workload must not stop the rest
        row.update(ours_s=None, peer_s=None, build_s=None, ours_gflops=None, check_err=None,
                   peer_gflops=None, ratio=None, info={},
                   error=f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
    return row


def add_roof(rows, threads: int, out=None) -> None:
    """Give each GFLOP/s row ``roof_pct``: its rate as a share of this machine's fp32 roof on
    ``threads`` threads (``targets.roof.measured_peak``: measured once per machine, cached),
    and print that roof. Rows stay as they are when the roof cannot be measured here."""
    from targets import roof

    out = out or sys.stdout
    try:
        peak = roof.measured_peak("float32", threads)
    except roof.RoofError as err:
        print(f"# fp32 roof unavailable: {err}", file=out)
        return
    print(f"# fp32 roof {peak.gflops:.1f} GFLOP/s on {threads} thread(s) "
          f"({peak.gflops_per_core:.1f} per core at {peak.ghz:.2f} GHz; "
          f"python -m dsl peak; {roof.cache_file()})", file=out)
    for r in rows:
        if r.get("ours_gflops") and r.get("unit", "GFLOP/s") == "GFLOP/s":
            r["roof_pct"] = 100 * r["ours_gflops"] / peak.gflops


def summary(rows) -> dict:
    """Per suite and kind ("conv2d/dx"): geometric mean of ratios, worst ratio, median build
    seconds. Suites stay apart: their workloads answer different questions."""
    out = {}
    for key in dict.fromkeys(f"{r['suite']}/{r['kind']}" for r in rows):
        sel = [r for r in rows if f"{r['suite']}/{r['kind']}" == key and not r.get("error")]
        ratios = [r["ratio"] for r in sel if r["ratio"]]
        builds = [r["build_s"] for r in sel if r["build_s"] is not None]
        out[key] = {"geomean_ratio": geomean(ratios),
                     "min_ratio": min(ratios) if ratios else None,
                     "geomean_ours_gflops": geomean(r["ours_gflops"] for r in sel),
                     "median_build_s": statistics.median(builds) if builds else None,
                     "rows": len(sel)}
    return out


def main(argv=None) -> int:
    args = _parse(list(argv or []))
    if args.dtype:
        os.environ["DSL_BENCH_DTYPE"] = args.dtype

    import targets
    from dsl.cli import output
    from dsl.cli.common import UsageError, select_workloads
    from dsl.runtime.target import get as target_get

    try:
        if args.target and args.target not in targets.names():
            raise UsageError(f"unknown target {args.target!r}", targets.names())
        selected = select_workloads(args.suite, args.filter)
    except UsageError as exc:
        return exc.report("bench")
    target = target_get(args.target or "host")
    if args.threads is not None:
        target = target.with_cores(args.threads)
    fair_thread_env(target.cores)
    table = sys.stderr if output.json_to_stdout(args.json) else sys.stdout
    try:
        import torch
        peer_version = None if args.no_peer else torch.__version__
    except ImportError:
        peer_version = None
    info = machine(target, target.cores, peer_version)
    print(f"# {info['cpu']}, {info['machine_cores']} cores; {target.cores} threads "
          f"(TVM pool {info['tvm_threads']}); "
          f"target {target.name} ({info['mcpu']}, {target.vector_bits}-bit); "
          f"tvm {info['tvm']}; torch {peer_version or 'absent'}; load {info['load_avg']}; "
          f"median of {args.repeat} alternating samples", file=table)
    with targets.use(target):
        rows = run(selected, repeat=args.repeat, min_time=args.min_time,
                   use_peer=peer_version is not None, settle=args.settle)
    summ = summary(rows)
    add_roof(rows, target.cores, out=table)
    if table is sys.stdout:
        print_table(rows, summ)
    output.write_json({"machine": info, "repeat": args.repeat, "min_time": args.min_time,
                       "settle": args.settle, "argv": list(argv or []),
                       "rows": rows, "summary": summ}, args.json)
    if args.plot:
        from dsl.cli.bench.plot import plot_rows

        print(f"wrote {plot_rows(rows, args.plot, info)}", file=table)
    return 1 if any(r.get("error") for r in rows) else 0


def print_table(rows, summ) -> None:
    """The results table and the per-suite/kind summary lines, on stdout."""
    print()
    print(HEAD + (f" {'% roof':>7s}" if any("roof_pct" in r for r in rows) else ""))
    for r in rows:
        print(format_row(r))
    print()
    for kind, s in summ.items():
        print(f"{kind:<16s} geomean ours/torch {_fmt(s['geomean_ratio'], '.2f', 6)}  "
              f"min {_fmt(s['min_ratio'], '.2f', 5)}  "
              f"geomean ours {_fmt(s['geomean_ours_gflops'], '.1f', 7)} GFLOP/s  "
              f"median build {_fmt(s['median_build_s'], '.2f', 5)} s  ({s['rows']} rows)")
