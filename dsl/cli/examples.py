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
    return Path(__file__).resolve().parents[1] / "examples"


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
    ap = argparse.ArgumentParser(prog="python -m dsl examples", description=__doc__)
    ap.add_argument("--dir", help="folder of example scripts (default: ./examples)")
    ap.add_argument("--kernel-meta-parent-dir", default=None,
                    help="where kernel_meta/ goes (default: the working directory)")
    ap.add_argument("names", nargs="*", help="run only these examples (file stems)")
    args = ap.parse_args(argv)
    import targets

    paths = discover(examples_dir(args.dir))
    if args.names:
        paths = [p for p in paths if p.stem in args.names]
    if not paths:
        print("no examples found", file=sys.stderr)
        return 2
    tgt = targets.current()
    print(f"target {tgt.name} ({tgt.llvm.get('mcpu')}, {tgt.cores} cores); kernel_meta in "
          f"{os.path.abspath(args.kernel_meta_parent_dir or os.getcwd())}/kernel_meta")
    print(f"{'example':32s} {'build s':>8s} {'run ms':>8s} {'check err':>10s}  result")
    failures = 0
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {path.stem} ...", end="\r", flush=True, file=sys.stderr)
        try:
            r = run_example(path, args.kernel_meta_parent_dir)
            if "skipped" in r:
                print(f"{path.stem:32s} {'':8s} {'':8s} {'':10s}  skipped: {r['skipped']}")
                continue
            print(f"{path.stem:32s} {r['build_s']:8.3f} {r['run_s'] * 1e3:8.3f} "
                  f"{r['error']:10.2e}  ok")
        except Exception:  # noqa: BLE001 - report every failing example, then fail at the end
            failures += 1
            print(f"{path.stem:32s} {'':8s} {'':8s} {'':10s}  FAILED")
            traceback.print_exc()
    print(f"{len(paths) - failures} passed, {failures} failed")
    return 1 if failures else 0
