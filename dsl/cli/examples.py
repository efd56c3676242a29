"""``python -m dsl examples``: build, run and verify every example, printing results and times.

Each ``examples/*.py`` has a ``main(kernel_meta_parent_dir=None)`` that builds its kernels,
runs them on random data, checks the result (raising on failure) and returns a dict with
``build_s``, ``run_s`` and ``error``, or ``{"skipped": reason}`` when an optional dependency
(torch, scikit-learn) is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import traceback
from pathlib import Path


def examples_dir(explicit: str | None = None) -> Path:
    if explicit:
        return Path(explicit)
    here = Path.cwd() / "examples"
    if here.is_dir():
        return here
    return Path(__file__).resolve().parents[2] / "examples"  # the repository's


def discover(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


def load_example(path: Path):
    spec = importlib.util.spec_from_file_location(f"dsl_example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(path: Path, parent_dir: str | None) -> dict:
    t0 = time.perf_counter()
    result = load_example(path).main(kernel_meta_parent_dir=parent_dir)
    result["total_s"] = time.perf_counter() - t0
    return result


def main(argv: list[str] | None = None) -> int:
    from dsl.cli import output
    from dsl.cli.common import UsageError, prog

    ap = argparse.ArgumentParser(prog=prog("examples"), description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="folder of example scripts (default: ./examples)")
    ap.add_argument("--kernel-meta-parent-dir", default=None,
                    help="where kernel_meta/ goes (default: the working directory)")
    ap.add_argument("names", nargs="*", help="run only these examples (file stems)")
    output.add_json_arg(ap)
    args = ap.parse_args(argv)

    folder = examples_dir(args.dir)
    paths = discover(folder)
    unknown = [n for n in args.names if n not in {p.stem for p in paths}]
    if not paths or unknown:
        what = f"unknown example {', '.join(map(repr, unknown))}" if unknown else \
            f"no example scripts in {folder}"
        return UsageError(what, [p.stem for p in paths]).report("examples")
    if args.names:
        paths = [p for p in paths if p.stem in args.names]
    rows = run_all(paths, args.kernel_meta_parent_dir, quiet=output.json_to_stdout(args.json))
    failures = sum(1 for r in rows if not r["ok"])
    output.write_json({"examples": rows, "passed": len(rows) - failures, "failed": failures},
                      args.json)
    return 1 if failures else 0


def run_all(paths, parent_dir: str | None, quiet: bool = False) -> list[dict]:
    """Run each example, printing its table row as it finishes (on stderr when ``quiet``:
    stdout then carries JSON only); returns one dict per example."""
    import targets
    from dsl.progress import Steps

    out = sys.stderr if quiet else sys.stdout
    tgt = targets.current()
    print(f"target {tgt.name} ({tgt.llvm.get('mcpu')}, {tgt.cores} cores); kernel_meta in "
          f"{os.path.abspath(parent_dir or os.getcwd())}/kernel_meta", file=out)
    print(f"{'example':32s} {'build s':>8s} {'run ms':>8s} {'check err':>10s}  result",
          file=out, flush=True)
    rows = []
    with Steps(len(paths), "[examples]", unit="example") as steps:
        for path in paths:
            row = {"example": path.stem, "ok": False, "build_s": None, "run_s": None,
                   "check_err": None}
            try:
                r = run_example(path, parent_dir)
                if "skipped" in r:
                    row.update(ok=True, skipped=r["skipped"])
                    line = f"{path.stem:32s} {'':8s} {'':8s} {'':10s}  skipped: {r['skipped']}"
                else:
                    row.update(ok=True, build_s=r["build_s"], run_s=r["run_s"],
                               check_err=r["error"])
                    line = (f"{path.stem:32s} {r['build_s']:8.3f} {r['run_s'] * 1e3:8.3f} "
                            f"{r['error']:10.2e}  ok")
            except Exception:  # noqa: BLE001 - report every failing example, fail at the end
                line = f"{path.stem:32s} {'':8s} {'':8s} {'':10s}  FAILED"
                traceback.print_exc()
            rows.append(row)
            if out is sys.stderr:
                steps.note(line)  # above the progress bar
            else:
                print(line, file=out, flush=True)
            steps.update(1, f"{path.stem} {'ok' if row['ok'] else 'FAILED'}")
    failures = sum(1 for r in rows if not r["ok"])
    print(f"{len(rows) - failures} passed, {failures} failed", file=out)
    return rows
