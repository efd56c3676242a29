"""``python -m dsl COMMAND``: examples (the main job), bench, tune, peak.

Each command lives in its own module with a ``main(argv) -> int``; this file only dispatches.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "examples": ("dsl.cli.examples", "build, run and verify every example kernel"),
    "bench": ("dsl.cli.bench.runner", "benchmark suite: GFLOP/s vs PyTorch side by side"),
    "tune": ("dsl.tuning.tune", "meta-schedule tuning into the tuning database"),
    "export": ("dsl.cli.export", "cross-compile benchmark kernels to time on another machine"),
    "peak": ("dsl.cli.peak", "measure and cache this machine's fp32/bf16/int8 roof"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m dsl {" + ",".join(COMMANDS) + "} [options]\n")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:10s} {text}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
