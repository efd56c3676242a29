"""Concurrent and interrupted builds of one kernel_name, in real processes.

Beyond tests/dsl/runtime/test_build.py (three identical builders): builders of two *different*
kernels under one name racing with readers, SIGKILL at random moments of a build loop, a kill
between the two renames of a publish, a kill while holding the lock, and stale files left
behind. ``RELIABILITY_FULL=1`` runs more kills and builders.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from rel_builder import build, check_kernel
from rel_strategies import FULL

import dsl
from dsl.errors import E_FILE

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("rel_builder.py")
NAME = "race_k"
N_KILLS = 40 if FULL else 4
N_BUILDERS = 16 if FULL else 4


def _spawn(*args) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # own session: a kill takes the compiler / linker children of export_library with it
    return subprocess.Popen([sys.executable, str(SCRIPT), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _kill(p: subprocess.Popen) -> None:
    assert p.poll() is None, f"the child died before the kill: {p.stderr.read()}"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(30)


TMP_RE = r"\.{name}\.\d+\.\w+\.(so|json)\.tmp"


def _state(parent: Path) -> str:
    """Classify what a killed build left: 'valid' (a complete pair, checked numerically) or
    'incomplete' (a .so without its .json: load refuses it). A .so and .json that do not belong
    together must never be on disk."""
    assert sorted(os.listdir(parent)) == ["kernel_meta"], os.listdir(parent)
    names = set(os.listdir(parent / "kernel_meta"))
    pair = {f"{NAME}.so", f"{NAME}.json"}
    stray = {n for n in names - pair - {f".{NAME}.lock"}
             if not re.fullmatch(TMP_RE.format(name=NAME), n)}
    assert not stray, stray
    if pair <= names:
        check_kernel(str(parent), NAME)  # raises if the two files do not belong together
        return "valid"
    assert f"{NAME}.json" not in names, "a .json without its .so"
    with pytest.raises(dsl.DslError) as info:  # refused with the project's error
        dsl.load(NAME, parent)
    assert info.value.code == E_FILE and "build it first" in str(info.value)
    return "incomplete" if names & pair else "none"


def _assert_clean_pair(parent: Path) -> str:
    variant = check_kernel(str(parent), NAME)
    assert sorted(os.listdir(parent / "kernel_meta")) == sorted(
        [f"{NAME}.so", f"{NAME}.json", f".{NAME}.lock"])
    return variant


def test_sigkill_at_random_points_of_a_build(tmp_path):
    rng = random.Random(None if FULL else 20261121)
    build(str(tmp_path), NAME, "A")  # an old complete pair the kills must not damage
    outcomes = Counter()
    for _ in range(N_KILLS):
        p = _spawn("loop", tmp_path, NAME)
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        time.sleep(rng.uniform(0.0, 1.2))
        _kill(p)
        left = os.listdir(tmp_path / "kernel_meta")
        outcomes["killed mid-write"] += any(n.endswith(".tmp") for n in left)
        outcomes[_state(tmp_path)] += 1
        # the next build needs no manual cleanup and sweeps the dead builder's temporaries
        build(str(tmp_path), NAME, rng.choice("AB"))
        _assert_clean_pair(tmp_path)
    assert set(outcomes) <= {"valid", "incomplete", "killed mid-write"}, outcomes
    print(f"\nSIGKILL runs: {N_KILLS}, states left: {dict(outcomes)}")  # README figures


def test_kill_between_the_two_renames_leaves_no_mismatched_pair(tmp_path):
    build(str(tmp_path), NAME, "A")
    p = _spawn("kill-between-renames", tmp_path, NAME, "B")
    p.wait(120)
    assert p.returncode == -signal.SIGKILL, p.stderr.read()
    # B's .so without a .json: never B's code beside A's .json; load reports "not built"
    assert _state(tmp_path) == "incomplete"
    build(str(tmp_path), NAME, "B")
    assert _assert_clean_pair(tmp_path) == "B"


def test_kill_while_holding_the_lock_leaves_no_stale_lock(tmp_path):
    build(str(tmp_path), NAME, "A")
    p = _spawn("hold-lock", tmp_path, NAME)
    assert p.stdout.readline().strip() == "locked", p.stderr.read()
    _kill(p)
    # a fresh process builds (and so takes the same lock) well within the timeout
    q = _spawn("once", tmp_path, NAME, "B")
    assert q.wait(120) == 0, q.stderr.read()
    assert _assert_clean_pair(tmp_path) == "B"


def test_stale_lock_file_and_dead_temporaries_are_harmless(tmp_path):
    meta = tmp_path / "kernel_meta"
    meta.mkdir()
    (meta / f".{NAME}.lock").write_bytes(b"\0garbage from a crashed run")
    dead_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # cannot be alive
    dead = [meta / f".{NAME}.{dead_pid}.x1.so.tmp", meta / f".{NAME}.{dead_pid}.x2.json.tmp"]
    live = meta / f".{NAME}.{os.getpid()}.x3.so.tmp"  # a live builder's file: must be kept
    for f in (*dead, live):
        f.write_bytes(b"partial")
    build(str(tmp_path), NAME, "A")
    assert not any(f.exists() for f in dead) and live.exists()
    live.unlink()
    assert _assert_clean_pair(tmp_path) == "A"


def test_many_builders_of_two_kernels_under_one_name_with_readers(tmp_path):
    go, stop = tmp_path / "go", tmp_path / "stop"
    parent = tmp_path / "p"
    parent.mkdir()
    builders = [_spawn("wait-go", parent, NAME, "AB"[i % 2], 2, go) for i in range(N_BUILDERS)]
    readers = [_spawn("read-loop", parent, NAME, go, stop) for _ in range(2)]
    for p in builders + readers:
        assert p.stdout.readline().strip() == "waiting", p.stderr.read()
    go.touch()
    for p in builders:
        assert p.wait(600) == 0, p.stderr.read()
    stop.touch()
    counts = Counter()
    for p in readers:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        counts.update(json.loads(out.strip().splitlines()[-1]))
    # readers saw either nothing yet or a complete, numerically correct kernel: never a torn
    # pair, a TVM error or a wrong answer
    assert counts["other_error"] == 0 and counts["ok"] > 0, counts
    _assert_clean_pair(parent)
    print(f"\nconcurrent builders: {N_BUILDERS} x 2 builds, reads: {dict(counts)}")
