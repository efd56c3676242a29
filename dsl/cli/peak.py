"""``python -m dsl peak``: this machine's arithmetic roof, measured once and cached.

Prints, per dtype (``float32``; ``bfloat16`` with ``vdpbf16ps`` and ``int8`` with
``vpdpbusd`` where the ISA has them) and thread count (default 1 and all cores), the
measured GFLOP/s (GOP/s for int8) per core and in total, the clock it ran at, the issue bound
of the FMA pipes at that clock and the share of it reached, from the loop and the facts in
:mod:`targets.roof`. A figure above the bound is refused (exit 1). ``--mca`` adds what
``llvm-mca`` predicts for the same loop on the target's ``-mcpu``.

Then the memory bandwidth (``--no-memory`` skips it) at the same thread counts: ``read`` (a
TVM kernel summing a buffer several times the caches into eight vector accumulators) and
``copy`` (STREAM's scale ``b = 3a``, read + write bytes), from :mod:`targets.bandwidth`. A
figure from a buffer the caches could hold, above what the load ports can move, or measured
while other processes had the cores, is refused (exit 1; rows printed before it stay cached).

The measuring lives in :func:`targets.roof.measured_peak` and
:func:`targets.roof.measured_bandwidths`, which the benchmark runner calls for its % of roof
(GFLOP/s rows: the fp32 roof; GB/s rows: the ``copy`` bandwidth).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

import targets
from targets import mca, roof


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dsl peak",
                                description="measure and cache this machine's roof")
    p.add_argument("--dtype", default="all",
                   help="float32, bfloat16, int8 or all (default: every one the ISA has)")
    p.add_argument("--threads", default=None,
                   help="comma-separated thread counts (default: 1 and all cores)")
    p.add_argument("--refresh", action="store_true", help="measure again, replace the cache")
    p.add_argument("--seconds", type=float, default=0.2, help="length of one timed run")
    p.add_argument("--reps", type=int, default=5, help="timed runs (the best is kept)")
    p.add_argument("--mca", action="store_true",
                   help="also print llvm-mca's prediction for the loop (target's -mcpu)")
    p.add_argument("--no-memory", action="store_true",
                   help="skip the memory bandwidth (read and copy, TVM kernels)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p.parse_args(argv)


def _thread_counts(text: str | None) -> list[int]:
    cores = targets.machine_cores()
    if not text:
        return sorted({1, cores})
    counts = []
    for part in text.split(","):
        if not part.strip().isdigit() or not 1 <= int(part) <= cores:
            print(f"peak: --threads {text!r}: each must be 1..{cores}", file=sys.stderr)
            raise SystemExit(2)
        counts.append(int(part))
    return counts


def _header(host) -> str:
    fma = (f"{host.fma_units} FMA pipes x {host.fma_bits} bits, latency {host.fma_latency}"
           if host.fma_units else "no FMA (add + multiply pipes)")
    ext = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16",
                       "amx_tile") if host.has(f)]
    return (f"# host {host.mcpu} (facts: {host.uarch}), {targets.machine_cores()} cores, "
            f"{host.vector_bits}-bit vectors, {host.vector_regs} registers; {fma} -> "
            f"{host.flops_per_cycle('float32')} fp32 FLOP/cycle/core; {', '.join(ext)}")


def _row(r: roof.Roof) -> str:
    return (f"{r.dtype:9s} {r.threads:7d} {r.gflops:9.1f} {r.gflops_per_core:9.1f} "
            f"{r.ghz:5.2f} {r.bound_gflops:9.1f} {100 * r.fraction_of_bound:6.1f}% "
            f"{r.gflops_wall:9.1f} {r.busy:5.2f}  {r.chains} x {r.mnemonic} {r.isa}")


def _mca_line(r: roof.Roof, host) -> str:
    rep = mca.roof_report(r, host)
    if rep["prediction"] is None:
        return f"#   llvm-mca: skipped ({rep['reason']})"
    note = ("  (the model issues fewer FMAs per cycle than the core did: its FMA throughput "
            "is wrong for this CPU)" if rep["achieved_over_predicted"] > 1 + roof.TOLERANCE
            else "")
    return (f"#   llvm-mca -mcpu={rep['mcpu']}: {rep['prediction'].cycles_per_iter:.2f} "
            f"cycles/iter -> {rep['predicted_flops_per_cycle']:.1f} FLOP/cycle predicted, "
            f"{rep['achieved_flops_per_cycle']:.1f} achieved "
            f"({100 * rep['achieved_over_predicted']:.0f}%){note}")


def _bw_row(b) -> str:
    what = (f"{b.accumulators} x vaddps (mem) chains" if b.kind == "read"
            else "b = 3a, read + write bytes")
    return (f"{b.kind:9s} {b.threads:7d} {b.gbps:9.1f} {b.gbps_per_core:9.1f} "
            f"{b.nbytes / 2**20:7.0f} {b.cache_bytes / 2**20:6.0f} {b.bound_gbps:7.0f} "
            f"{b.busy:5.2f}  {what} ({b.isa_bits}-bit)")


def _bandwidth_lines(counts: list[int], refresh: bool) -> tuple[list[str], list]:
    """The memory bandwidth rows (:func:`targets.roof.measured_bandwidths`); raises
    RoofError when a figure is refused."""
    found = roof.measured_bandwidths(counts, refresh=refresh)
    lines = [f"{'memory':9s} {'threads':>7s} {'GB/s':>9s} {'per core':>9s} "
             f"{'MiB':>7s} {'cache':>6s} {'bound':>7s} {'busy':>5s}  kernel (TVM)"]
    results = [found[(k, n)] for n in counts for k in ("read", "copy")]
    lines += [_bw_row(b) for b in results]
    lines.append("# memory: best of 5+ passes, wall time; MiB: the bytes one pass moves, "
                 "cache: the L2 + L3 MiB they must exceed 4x; bound: what the load ports move "
                 "at 6 GHz (both refusal rules); bench's GB/s rows use copy")
    return lines, results


def main(argv: list[str] | None = None) -> int:
    args = _parse(list(argv or []))
    host = targets.get("host")
    kinds = roof.KINDS if args.dtype == "all" else tuple(args.dtype.split(","))
    bad = [k for k in kinds if k not in roof.KINDS]
    if bad:
        print(f"peak: --dtype {bad[0]!r}: one of {', '.join(roof.KINDS)} or all",
              file=sys.stderr)
        return 2
    counts = _thread_counts(args.threads)
    results, lines = [], [_header(host), f"{'dtype':9s} {'threads':>7s} {'GFLOP/s':>9s} "
                          f"{'per core':>9s} {'GHz':>5s} {'bound':>9s} {'of bnd':>7s} "
                          f"{'wall':>9s} {'busy':>5s}  loop"]
    try:
        for kind in kinds:
            if roof.loop_isa(host, kind) is None:
                if args.dtype != "all":
                    lines.append(f"{kind:9s} not in this ISA")
                continue
            for threads in counts:
                r = roof.measured_peak(kind, threads, refresh=args.refresh,
                                       seconds=args.seconds, reps=args.reps)
                results.append(r)
                lines.append(_row(r))
                if args.mca:
                    lines.append(_mca_line(r, host))
        lines.append("# GFLOP/s: each thread's work over its own CPU time, summed (what the "
                     "cores issue); wall: all threads' work over the slowest thread's wall "
                     "time (what a statically split kernel gets; low when the machine is "
                     "shared: busy = CPU time / wall time < 1)")
        bw_lines, bws = ([], []) if args.no_memory else _bandwidth_lines(counts, args.refresh)
    except roof.RoofError as err:
        print("\n".join(lines), f"peak: refused: {err}", sep="\n", file=sys.stderr)
        return 1
    lines += [*bw_lines, f"# cached in {roof.cache_file()}"]
    if args.json:
        print(json.dumps({"host": host.facts(), "cache": str(roof.cache_file()),
                          "roofs": [asdict(r) for r in results],
                          "bandwidth": [asdict(b) for b in bws]}, indent=1))
    else:
        print("\n".join(lines))
    return 0
