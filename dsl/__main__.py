"""``python -m dsl COMMAND`` (or ``dsl COMMAND``, the console script): examples (the main job),
bench, tune, show, clean, peak, export, scaling.

Each command lives in its own module with a ``main(argv) -> int``; this file only dispatches.
A command is one entry of :data:`COMMANDS` (a plain dict: add a line to add a command).
"""

from __future__ import annotations

import importlib
import os
import sys

COMMANDS = {
    "examples": ("dsl.cli.examples", "build, run and verify every example kernel"),
    "bench": ("dsl.cli.bench.runner", "benchmark suite: GFLOP/s vs PyTorch side by side"),
    "tune": ("dsl.cli.tune", "meta-schedule tuning into the tuning database"),
    "show": ("dsl.cli.show", "a built kernel: its metadata, threads, assembly or TIR"),
    "clean": ("dsl.cli.clean", "empty the kernel cache (tuning database, kernel_meta/ on request)"),
    "peak": ("dsl.cli.peak", "measure and cache this machine's fp32/bf16/int8 roof"),
    "export": ("dsl.cli.export", "cross-compile benchmark kernels to time on another machine"),
    "scaling": ("dsl.cli.scaling", "how busy benchmark kernels keep 8-128 cores (static model)"),
}


def _prog_name(argv0: str) -> str:
    """``dsl`` when started as the console script, ``python -m dsl`` as a module."""
    name = os.path.basename(argv0 or "")
    if not name or name in ("__main__.py", "-c", "-m") or name.endswith(".py"):
        return "python -m dsl"
    return name


def usage(prog: str) -> str:
    lines = [f"usage: {prog} COMMAND [options]   ({prog} COMMAND --help for a command's options)",
             f"       {prog} --version", "", "commands:"]
    lines += [f"  {name:10s} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


# Commands that time our kernels beside numpy / PyTorch in one process.
TIMING_COMMANDS = ("bench", "tune")


def _park_blas_threads() -> None:
    """Start this command again with OpenBLAS's idle threads parking at once.

    numpy's OpenBLAS workers spin for 2^28 cycles (~0.1 s) after each call, so a kernel timed
    right after a numpy call shares the cores with them (a 1024^3 matmul read 84 instead of
    167 GFLOP/s on 2 cores). OpenBLAS reads OPENBLAS_THREAD_TIMEOUT once, when numpy is
    first imported, which ``import dsl`` has already done here: hence the fresh process.
    """
    if os.environ.get("OPENBLAS_THREAD_TIMEOUT"):
        return
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"  # 2^4 cycles: the smallest OpenBLAS takes
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "dsl", *sys.argv[1:]])


def main(argv: list[str] | None = None) -> int:
    from dsl.cli import common

    if argv is None:
        common.PROG = _prog_name(sys.argv[0])
        if sys.argv[1:2] and sys.argv[1] in TIMING_COMMANDS:
            _park_blas_threads()
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = common.PROG
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(prog), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from dsl._version import __version__

        print(f"convbwd-dsl {__version__}")
        return 0
    if argv[0] not in COMMANDS:
        what = "option" if argv[0].startswith("-") else "command"
        return common.UsageError(f"unknown {what} {argv[0]!r}", list(COMMANDS)).report()
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
