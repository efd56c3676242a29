"""``python -m dsl scaling``: how busy the benchmark kernels keep 8-128 cores, without them.

Builds every selected benchmark kernel for each ``--cores`` count (the host's facts, that
many cores: what a user's server would build) and reads its loop nests with the static model
of :mod:`dsl.runtime.scaling`: the share of the cores' time its stages can fill (1.0: every
stage splits evenly; a serial stage or too few tasks lowers it). Where a share falls below
``--min`` the row names the stage that loses the most::

    python -m dsl scaling --suite conv2d --cores 16,64
    python -m dsl scaling --filter dcgan --cores 8,16,32,64,128 --min 0.8

Nothing is timed: each workload's setup runs its kernel once on this machine (any core
count runs correctly on any machine), so a row costs about one build per count. Memory
bandwidth, caches and the cost of starting parallel regions are left out (see the model);
the benchmark measures those on the machine itself.
"""

from __future__ import annotations

import argparse
import contextlib


def _parse(argv):
    from dsl.cli import output
    from dsl.cli.common import add_selection_args, prog

    p = argparse.ArgumentParser(prog=prog("scaling"),
                                description="predicted share of N cores each benchmark "
                                            "kernel keeps busy (static model)")
    add_selection_args(p)
    p.add_argument("--cores", default="8,16,32,64,128", metavar="N[,N...]",
                   help="core counts to build for (default: 8,16,32,64,128)")
    p.add_argument("--min", type=float, default=0.75, metavar="SHARE",
                   help="rows below this share name their limiting stage (default 0.75)")
    output.add_json_arg(p)
    return p.parse_args(argv)


def core_counts(text: str) -> list[int]:
    from dsl.cli.common import UsageError

    parts = [t.strip() for t in text.split(",") if t.strip()]
    if not parts or not all(t.isdigit() and int(t) >= 1 for t in parts):
        raise UsageError(f"--cores {text!r}: a comma-separated list of core counts >= 1 "
                         f"(e.g. 8,16,64)")
    return sorted({int(t) for t in parts})


@contextlib.contextmanager
def lowered_kernels():
    """Collect ``(lowered IRModule, cores)`` of every kernel :func:`dsl.runtime.build.build`
    compiles inside the block (the list it yields fills as they are built)."""
    from dsl.runtime import build as _build

    mods, busy = [], []

    def observe(sch, config):
        if busy or not config.get("need_build", True):
            return  # our own lowering below, or a caller's
        busy.append(True)
        try:
            mods.append((_build.build(sch, {**config, "need_build": False}),
                         sch.target.cores))
        finally:
            busy.pop()

    with _build.observe_builds(observe):
        yield mods


def predict_workload(workload, cores: int):
    """The :class:`dsl.runtime.scaling.Prediction` of each kernel ``workload``'s setup
    builds for a host of ``cores`` cores (not of those it builds for this machine's cores to
    run, where it may not run more)."""
    import targets
    from dsl.runtime.scaling import predict

    with lowered_kernels() as mods, targets.use(targets.current().with_cores(cores)):
        workload.setup()
    return [predict(m, cores) for m, built_for in mods if built_for == cores]


def _limit_text(pred) -> str:
    stage = pred.limiting()
    if stage is None:
        return ""
    how = f"{stage.tasks} tasks" if stage.tasks else "serial"
    return f"{stage.name} ({how}, {100 * stage.work / pred.work:.0f}% of the work)"


def _row(workload, counts, min_share, steps) -> dict:
    from dsl.cli.common import workload_id

    shares, launches, limit = {}, {}, ""
    for n in counts:
        preds = predict_workload(workload, n)
        steps.update(1, f"{workload_id(workload)} @{n}")
        if not preds:
            continue
        worst = min(preds, key=lambda p: p.share)
        shares[n] = worst.share
        launches[n] = sum(p.launches for p in preds)
        if worst.share < min_share:
            limit = f"@{n}: {_limit_text(worst)}"
    return {"workload": workload_id(workload), "shares": shares, "launches": launches,
            "limited_by": limit}


def main(argv=None) -> int:
    from dsl.cli import output
    from dsl.cli.bench import runner
    from dsl.cli.common import UsageError, select_workloads
    from dsl.progress import Steps

    args = _parse(argv)
    try:
        counts = core_counts(args.cores)
        workloads = select_workloads(args.suite, args.filter)
    except UsageError as exc:
        return exc.report("scaling")
    runner.fair_thread_env(1)
    rows = []
    with Steps(len(workloads) * len(counts), "[scaling]", unit="build") as steps:
        for w in workloads:
            rows.append(_row(w, counts, args.min, steps))
    if not output.json_to_stdout(args.json):
        header = ("workload", *(f"{n} cores" for n in counts), "launches",
                  f"below {args.min:g}")
        table = [(r["workload"], *(f"{r['shares'][n]:.2f}" if n in r["shares"] else "-"
                                   for n in counts),
                  "/".join(str(r["launches"][n]) for n in counts if n in r["launches"]),
                  r["limited_by"]) for r in rows]
        print(output.format_table(header, table))
        print("# share of N cores x the kernel's time its stages fill (static model: "
              "dsl/runtime/scaling.py), the worst kernel of each row; launches: parallel "
              "regions one call of the row's kernels starts, at each core count")
    output.write_json({"cores": counts, "rows": rows}, args.json)
    return 0
