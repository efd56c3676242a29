"""``python -m dsl bench``: time every registered workload against its PyTorch peer.

Ours and the peer are timed alternately in the same process (sample after sample), so load
from other processes hits both alike; each reported time is the median of ``--repeat`` samples,
and each sample runs enough iterations to last ``--min-time`` seconds. The ratio is the median
over rounds of the peer's time over ours in the same round (:func:`paired_ratio`).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time

from dsl.runtime.timing import alternating_samples, paired_ratio


def _parse(argv):
    from dsl.cli import output
    from dsl.cli.common import add_selection_args, prog

    p = argparse.ArgumentParser(prog=prog("bench"),
                                description="GFLOP/s of our kernels next to PyTorch's")
    add_selection_args(p)
    p.add_argument("--repeat", type=int, default=7, help="timed samples per side (median)")
    p.add_argument("--min-time", type=float, default=0.03,
                   help="seconds one sample lasts at least (more iterations per sample)")
    p.add_argument("--threads", type=thread_counts, default=None, metavar="N[,N...]",
                   help="threads for ours and the peer (default: the target's cores); "
                        "several (1,2,16) run every workload at each count in this run, "
                        "one row per count, geomeans per count")
    p.add_argument("--target", default=None, help="target name (default: host)")
    p.add_argument("--dtype", default=None,
                   choices=("float32", "float16", "bfloat16", "int8"),
                   help="input dtype of our kernels (the peer runs float32); bfloat16 and "
                        "int8 rows are held to this machine's bf16 and int8 roofs; int8: the "
                        "conv2d suite's dx rows (int32 results)")
    p.add_argument("--settle", type=float, default=0.03,
                   help="seconds to sleep before each sample, then until the other "
                        "sides' spinning worker threads (TVM pool, OpenMP, OpenBLAS) park")
    output.add_json_arg(p)
    p.add_argument("--no-peer", action="store_true", help="skip PyTorch")
    p.add_argument("--mca", action="store_true",
                   help="also llvm-mca's cycles/iteration of each kernel's hot FMA loop on the "
                        "target's -mcpu: predicted vs achieved FLOP/cycle/core")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw ours vs PyTorch GFLOP/s per workload (needs matplotlib)")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    return args


def thread_counts(text: str) -> list[int]:
    """``"1,2,16"`` -> ``[1, 2, 16]`` (the order given, duplicates dropped); each >= 1."""
    try:
        counts = [int(part) for part in str(text).split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: thread counts, integers >= 1, comma-separated (1 or 1,2,16)")
    return list(dict.fromkeys(counts))


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
    """Iterations per sample so that one sample lasts about ``min_time`` seconds, from warm
    calls: the first call after a pause can take several times a warm one (idle cores
    clock up again; PyTorch's first conv after 30 ms of sleep took 7-13 ms instead of 1.2),
    and a count fitted to it would leave each sample a handful of calls, most of them cold."""
    _warm_up(fn)
    n, t0 = 0, time.perf_counter()
    while n < 3 or time.perf_counter() - t0 < min_time / 2:
        fn()
        n += 1
    one = max((time.perf_counter() - t0) / n, 1e-7)
    return max(1, min(10000, int(math.ceil(min_time / one))))


# After ``--settle`` the process's other threads must have gone quiet: less than this share
# of one core's time spent by them over a QUIET_WINDOW-second window. OpenBLAS (numpy's
# matmul) spins its workers about 2^28 cycles (~60 ms) after a call, longer than any settle
# worth waiting on every sample, and a kernel timed beside them runs at half speed.
QUIET_SHARE = 0.05
QUIET_WINDOW = 0.005
QUIET_MAX_WAIT = 1.0


def settle_quietly(seconds: float) -> float:
    """Sleep ``seconds``, then until no other thread of this process is burning CPU (each
    window's process CPU time, which a sleeping main thread adds nothing to, under
    :data:`QUIET_SHARE`), at most :data:`QUIET_MAX_WAIT` more. Returns the seconds waited."""
    t0 = time.perf_counter()
    time.sleep(seconds)
    while time.perf_counter() - t0 < seconds + QUIET_MAX_WAIT:
        cpu = time.process_time()
        time.sleep(QUIET_WINDOW)
        if time.process_time() - cpu < QUIET_SHARE * QUIET_WINDOW:
            break
    return time.perf_counter() - t0


# Untimed calls at the start of every sample, after the settle: the cores idled through it,
# and a kernel's first few calls after such a pause ran 1.5-2.5x a warm call on the
# development VM (ours and PyTorch's alike), which is not the steady state a row reports.
WARMUP_SECONDS = 0.02


def _warm_up(fn) -> None:
    t0 = time.perf_counter()
    fn()
    while time.perf_counter() - t0 < WARMUP_SECONDS:
        fn()


def _sample(fn, iters: int, settle: float = 0.0) -> float:
    if settle > 0:
        settle_quietly(settle)
        _warm_up(fn)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def sample_alternating(fns, repeat: int, min_time: float,
                       settle: float = 0.0) -> list[list[float]]:
    """Seconds per call of each function in each of ``repeat`` rounds, sampled in turn (one
    sample of each per round) so that load from other processes hits all of them alike."""
    for fn in fns:
        fn()  # warm caches, thread pools and lazy initialisation on every side
    iters = [_calibrate(fn, min_time) for fn in fns]
    return alternating_samples(
        [lambda fn=fn, n=n: _sample(fn, n, settle) for fn, n in zip(fns, iters)], repeat)


def measure_alternating(fns, repeat: int, min_time: float,
                        settle: float = 0.0) -> list[float]:
    """Median seconds per call of each function (:func:`sample_alternating`)."""
    return [statistics.median(s) for s in sample_alternating(fns, repeat, min_time, settle)]


def measure(prep, repeat: int, min_time: float, use_peer: bool,
            settle: float = 0.0) -> tuple[float, float | None, dict, dict, dict]:
    """Median seconds per iteration of ours, of the peer and of each further peer
    (``prep.peers``), sampled alternately; each peer's :func:`paired_ratio` to ours
    (``"peer"`` for the peer); every side's seconds per call, round by round."""
    peer = prep.peer if use_peer else None
    others = dict(prep.peers) if use_peer else {}
    names = (["peer"] if peer is not None else []) + list(others)
    fns = [prep.ours] + ([peer] if peer is not None else []) + list(others.values())
    samples = sample_alternating(fns, repeat, min_time, settle)
    times = [statistics.median(s) for s in samples]
    ratios = {name: paired_ratio(s, samples[0]) for name, s in zip(names, samples[1:])}
    extra = dict(zip(others, times[len(times) - len(others):]))
    return (times[0], (times[1] if peer is not None else None), extra, ratios,
            dict(zip(["ours", *names], samples)))


# TVM's pool spins this many sched_yield rounds before parking a worker: about 7 ms on the
# Zen 5 development VM, as long as libgomp's default spin (GOMP_SPINCOUNT 300000, measured 7
# ms there); TVM's own default, 300000, spins about 110 ms.
TVM_SPIN_COUNT = 20000


def fair_thread_env(cores: int) -> None:
    """Set both runtimes' thread settings for side-by-side timing (before either pool starts).

    TVM sizes its thread pool once, when it first starts it, from TVM_NUM_THREADS; unset, it
    takes half the logical CPUs (it assumes SMT), so ours would run on fewer threads than the
    peer is given. Each side runs as its users run it: idle workers spin briefly after a
    parallel region, then park (libgomp's default; TVM's spin cut from ~110 ms to about as
    long, :data:`TVM_SPIN_COUNT`), and the ``--settle`` sleep before every sample outlasts
    both spins, so neither side's workers steal the cores while the other is timed. Parking
    at once instead (spin 0, ``OMP_WAIT_POLICY=PASSIVE``) makes every parallel region of a
    call wake its workers, which on a VM cost ours (4-6 regions per dw call) up to 0.4 ms of
    a 0.5 ms kernel for the first ~60 calls after a pause.
    """
    os.environ.setdefault("TVM_NUM_THREADS", str(cores))
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(TVM_SPIN_COUNT))


def geomean(values) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def _fmt(v, spec: str, width: int) -> str:
    return f"{v:{width}{spec}}" if v is not None else f"{'-':>{width}}"


HEAD = (f"{'workload':<42s} {'kind':<8s} {'ours GF/s':>10s} {'torch GF/s':>10s} "
        f"{'ratio':>7s} {'ours ms':>9s} {'torch ms':>9s} {'build s':>8s}")


def head(sweep: bool = False) -> str:
    """The table's column names; a thread sweep adds a ``thr`` column after ``kind``."""
    return HEAD.replace(f"{'kind':<8s} ", f"{'kind':<8s} {'thr':>4s} ") if sweep else HEAD


def format_row(r: dict, sweep: bool = False) -> str:
    lead = f"{r['suite'] + '/' + r['name']:<42s} {r['kind']:<8s} " + (
        f"{r.get('threads', 0):>4d} " if sweep else "")
    if r.get("error"):
        return f"{lead}FAILED: {r['error']}"

    def ms(seconds):
        return seconds * 1e3 if seconds is not None else None

    gb = r.get("unit") == "GB/s"  # a memory-bound row: the rate columns hold GB/s
    ours, peer = (r["ours_gbps"], r["peer_gbps"]) if gb else (r["ours_gflops"], r["peer_gflops"])
    others = "".join(f"  {k} {_fmt(v, '.2f', 0)}x" for k, v in r.get("others_ratio", {}).items())
    return (f"{lead}{_fmt(ours, '.1f', 10)} {_fmt(peer, '.1f', 10)} "
            f"{_fmt(r['ratio'], '.2f', 7)} {_fmt(ms(r['ours_s']), '.3f', 9)} "
            f"{_fmt(ms(r['peer_s']), '.3f', 9)} {_fmt(r['build_s'], '.2f', 8)}"
            + (f" {_fmt(r['roof_pct'], '.1f', 6)}%" if "roof_pct" in r else "")
            + f"{'  [GB/s]' if gb else ''}{others}{mca_cell(r)}")


def mca_cell(r: dict) -> str:
    from dsl.cli.bench import mca

    return mca.cell(r)


def run(workloads, *, repeat=7, min_time=0.03, use_peer=True, settle=0.03,
        out=None, counts=None, target=None, keep_asm=False) -> list[dict]:
    """Set up and time each workload, reporting progress on ``out`` (default stderr);
    returns one dict per row. ``counts`` (a thread sweep): each workload runs at each count
    in turn, under ``target.with_cores(count)`` with TVM's pool set to that many threads,
    one row each (``row["threads"]``). ``keep_asm``: each row's ``asm`` holds the assembly
    of the kernels its setup built (``bench --mca``; compiled after the timed build)."""
    import targets
    from dsl.progress import Steps

    rows = []
    jobs = [(w, n) for w in workloads for n in (counts or [None])]
    with Steps(len(jobs), "[bench]", unit="workload", stream=out) as steps:
        for w, n in jobs:
            if n is None:
                rows.append(_run_one(w, repeat, min_time, use_peer, settle, keep_asm))
            else:
                set_pool(n)
                with targets.use((target or targets.current()).with_cores(n)):
                    rows.append({**_run_one(w, repeat, min_time, use_peer, settle, keep_asm),
                                 "threads": n})
            steps.update(1, progress_text(rows[-1]))
    if counts:
        set_pool(0)  # back to TVM's default (TVM_NUM_THREADS) for whatever runs next
    return rows


_POOL = {"size": 0}  # the largest pool set_pool has created in this process


def set_pool(threads: int) -> None:
    """This thread's TVM pool to ``threads`` workers (``runtime.config_threadpool``; 0: TVM's
    default, ``TVM_NUM_THREADS``).

    TVM creates the pool once, as large as the concurrency then in force, and never grows it:
    the first call makes it as large as the machine. ``TVM_BIND_THREADS=0`` while it is set
    (unless already set): pinned, the calling thread and a worker can land on one core.
    """
    import tvm

    import targets

    config = tvm.get_global_func("runtime.config_threadpool", allow_missing=True)
    if config is None:
        return
    old = os.environ.get("TVM_BIND_THREADS")
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    try:
        if threads > _POOL["size"]:
            cores = max(targets.machine_cores(), threads)
            config(1, cores, [str(i) for i in range(cores)])
            _POOL["size"] = cores
        if threads:
            config(1, threads, [str(i) for i in range(threads)])
        else:
            config(1, 0)
    finally:
        if old is None:
            os.environ.pop("TVM_BIND_THREADS", None)


def progress_text(row: dict) -> str:
    """What one finished workload's progress line says."""
    from dsl.cli.output import cell

    what = f"{row['suite']}/{row['name']} {row['kind']}"
    if row.get("error"):
        return f"{what}: FAILED"
    return (f"{what}: build {cell(row['build_s'], '.2f')} s, ours "
            f"{cell(row['ours_gflops'], '.1f')} GFLOP/s")


def _run_one(w, repeat, min_time, use_peer, settle, keep_asm=False) -> dict:
    """Set up, check and time one workload; a failure becomes the row's ``error``."""
    import contextlib

    from dsl.cli.bench import mca

    row = {"suite": w.suite, "name": w.name, "kind": w.kind, "flops": w.flops}
    try:
        with mca.capture() if keep_asm else contextlib.nullcontext() as asms:
            prep = w.setup()
        if keep_asm:
            row["asm"] = asms
        ours, peer, others, ratios, samples = measure(prep, repeat, min_time, use_peer,
                                                      settle)
        err = prep.verify() if use_peer else None
        nbytes = getattr(w, "bytes", 0.0)
        row.update(unit="GB/s" if nbytes else "GFLOP/s", bytes=nbytes,
                   ours_gbps=nbytes / ours / 1e9 if nbytes else None,
                   peer_gbps=nbytes / peer / 1e9 if nbytes and peer else None,
                   others_s=others, others_ratio={k: ratios[k] for k in others})
        row.update(check_err=err, ours_s=ours, peer_s=peer, build_s=prep.build_seconds,
                   samples=samples,
                   load_avg=round(os.getloadavg()[0], 2),
                   ours_gflops=w.flops / ours / 1e9,
                   peer_gflops=w.flops / peer / 1e9 if peer else None,
                   ratio=ratios.get("peer"), info=dict(prep.info), error=None)
    except Exception as exc:  # noqa: BLE001 - one broken workload must not stop the rest
        row.update(ours_s=None, peer_s=None, build_s=None, ours_gflops=None, check_err=None,
                   peer_gflops=None, ratio=None, info={},
                   error=f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
    return row


# Below this share of the summed roof, the roof loop's wall-time rate is printed too: on a lent
# 16-vCPU VM all 16 threads at once reached 1387 of the 2302 GFLOP/s they issued one by one.
WALL_SHARE = 0.9


def add_roof(rows, threads: int, out=None) -> None:
    """Give each row ``roof_pct`` (and ``roof``, the roof's name): a GFLOP/s row's rate as a
    share of this machine's fp32 roof on ``threads`` threads
    (``targets.roof.measured_peak``), a GB/s row's as a share of the memory bandwidth of
    ``copy`` (read + write bytes, ``targets.roof.measured_bandwidth``) on ``threads``; both
    measured once per machine and cached. Prints which roof each kind of row uses. Rows stay
    as they are where a roof cannot be measured here."""
    from targets import roof

    out = out or sys.stdout
    # int8 and bf16 kernels (bench --dtype) are held to this machine's dot-product roofs
    kind = os.environ.get("DSL_BENCH_DTYPE", "float32")
    kind = kind if kind in ("int8", "bfloat16") else "float32"
    name = {"int8": "int8", "bfloat16": "bf16", "float32": "fp32"}[kind]
    try:
        peak = roof.measured_peak(kind, threads)
        print(f"# % roof of GFLOP/s rows: {name} roof {peak.gflops:.1f} GFLOP/s on {threads} "
              f"thread(s) ({peak.gflops_per_core:.1f} per core at {peak.ghz:.2f} GHz; "
              f"python -m dsl peak; {roof.cache_file()})", file=out)
        if peak.gflops_wall < WALL_SHARE * peak.gflops:
            print(f"#   all {threads} threads at once reached {peak.gflops_wall:.1f} GFLOP/s "
                  f"(the slowest thread's wall time): a statically split kernel gets at most "
                  f"that here, {100 * peak.gflops_wall / peak.gflops:.0f}% of the roof",
                  file=out)
        _set_roof(rows, "GFLOP/s", "ours_gflops", peak.gflops, name)
    except roof.RoofError as err:
        print(f"# {name} roof unavailable: {err}", file=out)
    if not any(r.get("ours_gbps") and r.get("unit") == "GB/s" for r in rows):
        return  # no memory-bound row: the bandwidth is not measured for nothing
    try:
        copy = roof.measured_bandwidth("copy", threads)
        read = roof.measured_bandwidth("read", threads)
    except roof.RoofError as err:
        print(f"# memory roof unavailable: {err}", file=out)
        return
    print(f"# % roof of GB/s rows: memory bandwidth {copy.gbps:.1f} GB/s on {threads} "
          f"thread(s), copy b = 3a counting read + write bytes as the rows do (read alone "
          f"{read.gbps:.1f} GB/s; python -m dsl peak)", file=out)
    _set_roof(rows, "GB/s", "ours_gbps", copy.gbps, "memory")


def _set_roof(rows, unit: str, key: str, value: float, name: str) -> None:
    for r in rows:
        if r.get(key) and r.get("unit", "GFLOP/s") == unit:
            r["roof_pct"], r["roof"] = 100 * r[key] / value, name


def _summary_key(r: dict, sweep: bool) -> str:
    return f"{r['suite']}/{r['kind']}" + (f"@{r['threads']}" if sweep else "")


def summary(rows, sweep: bool = False) -> dict:
    """Per suite and kind ("conv2d/dx"; in a thread sweep per count too, "conv2d/dx@2"):
    geometric mean of ratios, worst ratio, median build seconds. Suites stay apart: their
    workloads answer different questions."""
    out = {}
    for key in dict.fromkeys(_summary_key(r, sweep) for r in rows):
        sel = [r for r in rows if _summary_key(r, sweep) == key and not r.get("error")]
        ratios = [r["ratio"] for r in sel if r["ratio"]]
        builds = [r["build_s"] for r in sel if r["build_s"] is not None]
        out[key] = {"geomean_ratio": geomean(ratios),
                     "min_ratio": min(ratios) if ratios else None,
                     "geomean_ours_gflops": geomean(r["ours_gflops"] for r in sel),
                     "geomean_ours_gbps": geomean(r.get("ours_gbps") for r in sel),
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
        dtype = args.dtype or os.environ.get("DSL_BENCH_DTYPE", "float32")
        selected = [w for w in selected if w.dtypes is None or dtype in w.dtypes]
        if not selected:
            raise UsageError(f"no selected workload runs with --dtype {dtype} (int8: the "
                             "conv2d suite's dx rows)", [])
    except UsageError as exc:
        return exc.report("bench")
    target = target_get(args.target or "host")
    counts, sweep = args.threads, bool(args.threads and len(args.threads) > 1)
    if counts:
        target = target.with_cores(max(counts))
    fair_thread_env(target.cores)
    table = sys.stderr if output.json_to_stdout(args.json) else sys.stdout
    try:
        import torch
        peer_version = None if args.no_peer else torch.__version__
    except ImportError:
        peer_version = None
    info = machine(target, target.cores, peer_version)
    if counts:
        set_pool(max(counts))  # TVM's pool never grows: create it large enough first
        set_pool(counts[0])  # the header's pool size is the first count's
        info.update(thread_counts=counts, tvm_threads=_pool_threads())
    threads = ",".join(map(str, counts)) if sweep else target.cores
    print(f"# {info['cpu']}, {info['machine_cores']} cores; {threads} threads "
          f"(TVM pool {info['tvm_threads']}); "
          f"target {target.name} ({info['mcpu']}, {target.vector_bits}-bit); "
          f"tvm {info['tvm']}; torch {peer_version or 'absent'}; load {info['load_avg']}; "
          f"median of {args.repeat} alternating samples", file=table)
    with targets.use(target):
        rows = run(selected, repeat=args.repeat, min_time=args.min_time,
                   use_peer=peer_version is not None, settle=args.settle, counts=counts,
                   target=target, keep_asm=args.mca)
    summ = summary(rows, sweep)
    for n in counts or [target.cores]:
        add_roof([r for r in rows if r.get("threads", n) == n], n, out=table)
    if args.mca:
        from dsl.cli.bench import mca

        mca.add_mca(rows, lambda r: r.get("threads", target.cores), target,
                    lambda r: r.get("asm", []), out=table)
    for r in rows:
        r.pop("asm", None)  # the assembly stays out of --json
    if table is sys.stdout:
        print_table(rows, summ, sweep)
    output.write_json({"machine": info, "repeat": args.repeat, "min_time": args.min_time,
                       "settle": args.settle, "argv": list(argv or []),
                       "rows": rows, "summary": summ}, args.json)
    if args.plot:
        from dsl.cli.bench.plot import plot_rows

        print(f"wrote {plot_rows(rows, args.plot, info)}", file=table)
    return 1 if any(r.get("error") for r in rows) else 0


def _pool_threads() -> int | None:
    import tvm

    pool = tvm.get_global_func("runtime.NumThreads", allow_missing=True)
    return int(pool()) if pool is not None else None


def print_table(rows, summ, sweep: bool = False) -> None:
    """The results table and the per-suite/kind summary lines (per thread count in a sweep:
    ``user/softmax@2``), on stdout."""
    print()
    print(head(sweep) + (f" {'% roof':>7s}" if any("roof_pct" in r for r in rows) else ""))
    for r in rows:
        print(format_row(r, sweep))
    print()
    for kind, s in summ.items():
        rate = (f"{_fmt(s['geomean_ours_gbps'], '.1f', 7)} GB/s   " if s.get("geomean_ours_gbps")
                else f"{_fmt(s['geomean_ours_gflops'], '.1f', 7)} GFLOP/s")
        print(f"{kind:<16s} geomean ours/torch {_fmt(s['geomean_ratio'], '.2f', 6)}  "
              f"min {_fmt(s['min_ratio'], '.2f', 5)}  geomean ours {rate}  "
              f"median build {_fmt(s['median_build_s'], '.2f', 5)} s  ({s['rows']} rows)")
