"""Child process for the build race / kill tests: ``python rel_builder.py MODE PARENT NAME ...``.

Modes
-----
once VARIANT          build one variant and exit.
loop                  print "ready", then build variants A and B alternately forever (the
                      parent SIGKILLs it at a random moment).
wait-go VARIANT N GO  wait until file GO exists, then build VARIANT N times (many builders
                      released at once).
read-loop GO STOP     wait for GO, then load + run the kernel until STOP exists; print counts.
kill-between-renames  build, SIGKILLing itself right after the first rename of the publish.
hold-lock             take the kernel's build lock, print "locked", sleep (parent kills it).

Two variants of one dx kernel have different shapes, so each build really compiles and the
files of one never match the other.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

import dsl
from dsl import tvm as dtvm

VARIANTS = {"A": 5, "B": 6}  # spatial size of dx / dy


def graph(variant: str):
    s = VARIANTS[variant]
    dy = dtvm.placeholder((1, 1, s, s, 16), name="out_backprop", dtype="float32")
    w = dtvm.placeholder((9, 1, 16, 16), name="filters", dtype="float32")
    dx = dsl.conv2d_backprop_input(w, dy, (16, 16, 3, 3), (1, 16, s, s),
                                   {"padding": [1, 1, 1, 1], "res_dtype": "float32"})
    return w, dy, dx


def build(parent: str, name: str, variant: str) -> dict:
    w, dy, dx = graph(variant)
    return dsl.build(dsl.auto_schedule(dx), {"name": name, "tensor_list": [w, dy, dx],
                                             "kernel_meta_parent_dir": parent})


def check_kernel(parent: str, name: str) -> str:
    """Load ``name`` and check its answer against the float64 reference; return its variant."""
    from dsl.ops.layout import nc1hwc0_to_nchw, nchw_to_5hd, weight_to_fracz

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(here))
    from reference import conv2d_backprop_input as ref_dx

    kernel = dsl.load(name, parent)
    s = kernel.inputs[1]["shape"][2]
    variant = {v: k for k, v in VARIANTS.items()}[s]
    rng = np.random.default_rng(s)
    w = rng.uniform(-1, 1, (16, 16, 3, 3)).astype("float32")
    dy = rng.uniform(-1, 1, (1, 16, s, s)).astype("float32")
    out = nc1hwc0_to_nchw(kernel(weight_to_fracz(w), nchw_to_5hd(dy)), 16)
    ref = ref_dx(dy, w, (1, 16, s, s), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    err = np.abs(out - ref).max() / max(1.0, np.abs(ref).max())
    if err > 2e-5:
        raise AssertionError(f"kernel {name} ({variant}) is wrong: relative error {err}")
    return variant


# Every wait and loop is bounded: a test that dies before signalling must not leave us running.
LIFETIME = 600.0
_DEADLINE = time.monotonic() + LIFETIME


def _alive() -> bool:
    return time.monotonic() < _DEADLINE


def _wait(path: str) -> None:
    while not os.path.exists(path):
        if not _alive():
            raise SystemExit(f"{path} did not appear within {LIFETIME:.0f} s; giving up")
        time.sleep(0.005)


def main(argv: list[str]) -> None:
    mode, parent, name, *rest = argv
    if mode == "once":
        build(parent, name, rest[0])
    elif mode == "loop":
        print("ready", flush=True)
        i = 0
        while _alive():
            build(parent, name, "AB"[i % 2])
            i += 1
    elif mode == "wait-go":
        variant, n, go = rest[0], int(rest[1]), rest[2]
        print("waiting", flush=True)
        _wait(go)
        for _ in range(n):
            build(parent, name, variant)
    elif mode == "read-loop":
        go, stop = rest
        print("waiting", flush=True)
        _wait(go)
        counts = {"ok": 0, "missing": 0, "other_error": 0}
        while not os.path.exists(stop) and _alive():
            try:
                check_kernel(parent, name)
                counts["ok"] += 1
            except dsl.DslError as exc:
                # before the first publish there is nothing to load; anything else is a bug
                key = "missing" if "build it first" in str(exc) else "other_error"
                counts[key] += 1
                time.sleep(0.002)  # let the builders have the CPU until something is there
                if key == "other_error":
                    print(f"reader error: {exc}", file=sys.stderr, flush=True)
        print(json.dumps(counts), flush=True)
    elif mode == "kill-between-renames":
        real = os.replace
        calls = []

        def replace_then_die(src, dst, *a, **k):
            real(src, dst, *a, **k)
            calls.append(dst)
            if str(dst).endswith(".so"):
                os.kill(os.getpid(), signal.SIGKILL)

        os.replace = replace_then_die
        build(parent, name, rest[0])
    elif mode == "hold-lock":
        from pathlib import Path

        from dsl.runtime.build import _lock

        meta = Path(parent) / "kernel_meta"
        meta.mkdir(parents=True, exist_ok=True)
        with _lock(meta / f".{name}.lock"):
            print("locked", flush=True)
            time.sleep(600)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
