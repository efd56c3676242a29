"""``python -m dsl tune``: tune every kernel an example script builds, or the benchmarks'.

The kernels are found by running the example (or a benchmark workload's ``setup()``) with
every ``dsl.build`` call recorded (:func:`recording_builds`); each distinct workload is then
searched by :func:`dsl.tuning.tune.tune`. ``--bench`` then times the default schedule, the
tuned one and PyTorch side by side per workload.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

import targets
from dsl.cli import output
from dsl.cli.common import UsageError, add_selection_args, prog, select_workloads
from dsl.errors import E_VALUE, DslError, fail
from dsl.progress import Steps
from dsl.runtime.schedule import Schedule
from dsl.runtime.target import get as target_get
from dsl.runtime.target import use as target_use
from dsl.tuning import database as tuning_db
from dsl.tuning.tune import DEFAULT_TRIALS, TuneResult, tune


@contextlib.contextmanager
def recording_builds():
    """Record the (Schedule, tensor_list, name) of every ``dsl.build`` call inside the block.

    The real build still runs (examples load and check what they built).
    """
    from dsl.runtime.build import observe_builds

    seen: list[tuple[Schedule, list, str | None]] = []

    def record(sch, config):
        if isinstance(sch, Schedule) and isinstance(config, dict):
            seen.append((sch, list(config.get("tensor_list") or []), config.get("name")))

    with observe_builds(record):
        yield seen


def kernels_of_example(path: str | os.PathLike) -> list[tuple[Schedule, str]]:
    """Run an example script and return the kernels it builds (deduplicated by workload)."""
    import runpy

    path = Path(path).resolve()
    if not path.is_file():
        raise fail(E_VALUE, "--example", str(path), "must be an example script (.py file)")
    old_argv, old_cwd, old_path = sys.argv, os.getcwd(), list(sys.path)
    with tempfile.TemporaryDirectory(prefix="dsl-tune-example-") as tmp:
        try:
            sys.argv = [str(path)]
            sys.path.insert(0, str(path.parent))
            os.chdir(tmp)  # the example's kernel_meta/ goes to a scratch directory
            # the script's own prints go to stderr: stdout carries the table or JSON
            with recording_builds() as seen, contextlib.redirect_stdout(sys.stderr):
                try:
                    runpy.run_path(str(path), run_name="__main__")
                except SystemExit as exc:
                    if exc.code not in (0, None):
                        raise fail(E_VALUE, "--example", str(path),
                                   f"exited with status {exc.code}") from None
        finally:
            sys.argv, sys.path[:] = old_argv, old_path
            os.chdir(old_cwd)
    return _dedup(seen, path.stem)


def bench_workloads(suites, pattern: str | None) -> list:
    """The benchmark workloads to tune: the same selection as ``python -m dsl bench``."""
    return select_workloads(suites, pattern)


def kernels_of_workload(w) -> tuple[list[tuple[Schedule, str]], object]:
    """Run a benchmark workload's ``setup()`` with builds recorded: its kernels and the
    prepared workload (built with whatever schedule the database gives)."""
    with tempfile.TemporaryDirectory(prefix="dsl-tune-bench-") as tmp:
        old_cwd = os.getcwd()
        os.chdir(tmp)
        try:
            with recording_builds() as seen:
                prepared = w.setup()
        finally:
            os.chdir(old_cwd)
    return _dedup(seen, w.name), prepared


def _dedup(seen, label: str) -> list[tuple[Schedule, str]]:
    out, keys = [], set()
    for i, (sch, _, kname) in enumerate(seen):
        base = dataclasses.replace(sch, override=None, schedule_meta=None)
        key = (tuning_db.workload_key(tuning_db.normalize(base.prim_func())),
               tuning_db.target_key(base.target))
        if key not in keys:
            keys.add(key)
            out.append((base, kname or f"{label}#{i}"))
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog("tune"),
        description="Tune every kernel an example script builds, or the benchmark suite's, "
                    "into the tuning database that later builds read.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--example", action="append", metavar="FILE",
                     help="an example script; every kernel it builds is tuned (repeatable)")
    src.add_argument("--bench", action="store_true", help="the benchmark suite's kernels")
    add_selection_args(p)
    p.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help="trials per kernel")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--target", default=None, help=f"target name ({', '.join(targets.names())})")
    p.add_argument("--database", default=None, help=f"database root (default ${tuning_db.ENV} "
                   "or ~/.cache/dsl/tuning)")
    p.add_argument("--rpc-key", default=None, help="measure on RPC servers with this key")
    p.add_argument("--tracker", default=None, help="RPC tracker host:port")
    p.add_argument("--max-workers", type=int, default=1)
    p.add_argument("--repeat", type=int, default=5,
                   help="--bench: timed samples per side after tuning (median)")
    output.add_json_arg(p)
    p.add_argument("--no-resume", action="store_true",
                   help="run --trials new trials even if records exist")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m dsl tune``: tune the kernels of an example script or of the benchmarks."""
    args = _parser().parse_args(argv)
    if args.database:
        os.environ[tuning_db.ENV] = args.database  # builds after tuning read the same database
    opts = {"seed": args.seed, "rpc_key": args.rpc_key, "tracker": args.tracker,
            "max_workers": args.max_workers, "resume": not args.no_resume}
    try:
        if args.target and args.target not in targets.names():
            raise UsageError(f"unknown target {args.target!r}", targets.names())
        with target_use(args.target) if args.target else contextlib.nullcontext():
            if args.example:
                return _tune_examples(args, opts)
            return _tune_bench(args, opts)
    except KeyboardInterrupt:
        print("\ninterrupted: every record measured so far is kept", file=sys.stderr)
        return 130
    except UsageError as exc:
        return exc.report("tune")
    except DslError as exc:  # a usage problem (tracker down, bad example): no traceback
        print(f"{prog('tune')}: {exc}", file=sys.stderr)
        return 2


def _tune_examples(args, opts) -> int:
    kernels = [k for f in args.example for k in kernels_of_example(f)]
    if not kernels:
        print("the example builds no kernel", file=sys.stderr)
        return 1
    results = [tune(sch, args.trials, args.target, args.database, name=label, **opts)
               for sch, label in kernels]
    if not output.json_to_stdout(args.json):
        print(format_table(results))
    output.write_json({"trials": args.trials, "seed": args.seed,
                       "kernels": [result_row(r) for r in results]}, args.json)
    return 0 if all(r.error is None for r in results) else 1


def _tune_bench(args, opts) -> int:
    """Tune every kernel of the selected benchmark workloads; then time the default schedule,
    the tuned one and PyTorch side by side (alternating samples, medians) per workload."""
    from dsl.cli.bench.runner import fair_thread_env

    fair_thread_env(target_get(args.target or "host").cores)
    workloads = bench_workloads(args.suite, args.filter)
    rows, ok = [], True
    with Steps(len(workloads), "[tune --bench]", unit="workload") as steps:
        for w in workloads:
            steps.note(f"[tune --bench] {w.suite}/{w.name}/{w.kind}")
            row, good = _tune_workload(w, args, opts)
            rows.append(row)
            ok = ok and good
            steps.update(1, f"{w.name} {w.kind}: default {row['default']:.1f}, tuned "
                            f"{row['tuned']:.1f} GFLOP/s")
    if not output.json_to_stdout(args.json):
        print(format_bench_table(rows))
        for key, ratio in _geomeans(rows).items():
            print(f"geomean {key}/PyTorch: {ratio:.3f}")
    output.write_json({"trials": args.trials, "seed": args.seed, "rows": rows,
                       "geomean_vs_pytorch": _geomeans(rows)}, args.json)
    return 0 if ok else 1


def _tune_workload(w, args, opts) -> tuple[dict, bool]:
    """Tune one workload's kernels and time default, tuned and PyTorch: (row, all fine)."""
    from dsl.cli.bench.runner import measure_alternating

    with _env(tuning_db.ENV, "off"):  # the default schedule, whatever is tuned
        kernels, default = kernels_of_workload(w)
    results = [tune(sch, args.trials, args.target, args.database, name=f"{w.name}:{label}",
                    **opts) for sch, label in kernels]
    ok = all(r.error is None for r in results)
    _, tuned = kernels_of_workload(w)
    try:
        tuned.verify()
    except ValueError as exc:
        print(f"{w.name} {w.kind}: the tuned kernel gives a {exc}; remove its records "
              f"from {results[0].database}", file=sys.stderr)
        ok = False
    fns = [default.ours, tuned.ours] + ([tuned.peer] if tuned.peer is not None else [])
    times = measure_alternating(fns, args.repeat, 0.03, 0.02)
    gf = [w.flops / t / 1e9 for t in times]
    return {"suite": w.suite, "workload": w.name, "kind": w.kind, "default": gf[0],
            "tuned": gf[1], "pytorch": gf[2] if len(gf) > 2 else None,
            "tune_s": sum(r.seconds for r in results),
            "trials": sum(r.trials for r in results),
            "records": sum(r.records for r in results),
            "uses": "tuned" if any(r.accepted for r in results) else "default"}, ok


def _geomeans(rows) -> dict:
    from dsl.cli.bench.runner import geomean

    out = {}
    for key in ("default", "tuned"):
        ratio = geomean([r[key] / r["pytorch"] for r in rows if r["pytorch"]])
        if ratio:
            out[key] = ratio
    return out


@contextlib.contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def result_row(r: TuneResult) -> dict:
    """One kernel's result for ``--json``: the TuneResult's fields and its GFLOP/s."""
    return {**dataclasses.asdict(r), "default_gflops": r.gflops(r.default_seconds),
            "tuned_gflops": r.gflops(r.tuned_seconds),
            "uses": "tuned" if r.accepted else "default"}


def format_table(results: list[TuneResult]) -> str:
    """The ``--example`` table: one row per tuned kernel."""
    return output.format_table(
        ("kernel", "trials", "tune s", "default GF/s", "tuned GF/s", "uses"),
        [(r.name, str(r.trials), f"{r.seconds:.1f}",
          output.cell(r.gflops(r.default_seconds), ".2f"),
          output.cell(r.gflops(r.tuned_seconds), ".2f"),
          "tuned" if r.accepted else "default") for r in results])


def format_bench_table(rows: list[dict]) -> str:
    """The ``--bench`` table: GFLOP/s of the default and tuned schedules and PyTorch."""
    return output.format_table(
        ("workload", "kind", "default GF/s", "tuned GF/s", "PyTorch GF/s", "trials",
         "tune s", "builds use"),
        [(f"{r['suite']}/{r['workload']}", r["kind"], output.cell(r["default"], ".1f"),
          output.cell(r["tuned"], ".1f"), output.cell(r["pytorch"], ".1f"), str(r["trials"]),
          f"{r['tune_s']:.0f}", r["uses"]) for r in rows])
