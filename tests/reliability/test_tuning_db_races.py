"""The tuning database under concurrent writers, SIGKILLed writers and corrupt files.

Exercises :mod:`dsl.tuning.database` through its public functions only (append_line / read_lines,
and auto_schedule's look-up), with real processes.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

from rel_strategies import FULL

from dsl import tuning_db

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("rel_dbwriter.py")
WRITERS, LINES = (12, 40) if FULL else (4, 15)
KILLS = 30 if FULL else 4


def _spawn(*args) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, str(SCRIPT), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _whole(lines: list[dict]) -> list[dict]:
    for d in lines:  # a spliced line could still parse; its checksum would not match
        assert hashlib.sha256(d["payload"].encode()).hexdigest() == d["sha"], d["tag"]
    return lines


def test_concurrent_appenders_never_interleave(tmp_path):
    path = tmp_path / "db" / "w.jsonl"
    procs = [_spawn("append", path, f"w{k}", LINES) for k in range(WRITERS)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "waiting", p.stderr.read()
        path.parent.mkdir(parents=True, exist_ok=True)
        Path(str(path) + ".go").touch()
        for p in procs:
            assert p.wait(300) == 0, p.stderr.read()
    finally:  # a failed assertion must not leave writers behind
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not one corrupt line
        got = _whole(tuning_db.read_lines(path))
    assert sorted((d["tag"], d["i"]) for d in got) == sorted(
        (f"w{k}", i) for k in range(WRITERS) for i in range(LINES))
    print(f"\ntuning db: {WRITERS} concurrent writers x {LINES} lines, all intact")


def test_sigkilled_appenders_lose_at_most_their_last_line(tmp_path):
    rng = random.Random(None if FULL else 7)
    path = tmp_path / "db" / "k.jsonl"
    written = 0
    for k in range(KILLS):
        p = _spawn("forever", path, f"k{k}")
        try:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
            time.sleep(rng.uniform(0.05, 0.6))
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tuning_db.TuningDbWarning)  # the cut line
            got = _whole(tuning_db.read_lines(path))
        mine = sorted(d["i"] for d in got if d["tag"] == f"k{k}")
        assert mine == list(range(len(mine))), "a complete line was lost or duplicated"
        written += len(mine)
        # a fresh writer continues on a new line, without cleanup and without waiting
        tuning_db.append_line(path, {"format": tuning_db.FORMAT, "kind": "probe", "k": k,
                                     "payload": "", "sha": hashlib.sha256(b"").hexdigest(),
                                     "tag": "probe", "i": k})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tuning_db.TuningDbWarning)
        got = tuning_db.read_lines(path)
    assert sorted(d["k"] for d in got if d.get("kind") == "probe") == list(range(KILLS))
    print(f"\ntuning db: {KILLS} SIGKILLed writers, {written} complete lines kept")


def test_corrupt_database_never_breaks_auto_schedule(tmp_path, monkeypatch):
    """Garbage in every database file: auto_schedule warns and keeps the default schedule."""
    import dsl
    from dsl import tvm as dtvm

    monkeypatch.setenv(tuning_db.ENV, str(tmp_path))
    dy = dtvm.placeholder((1, 1, 5, 5, 16), name="out_backprop", dtype="float32")
    w = dtvm.placeholder((9, 1, 16, 16), name="filters", dtype="float32")
    dx = dsl.conv2d_backprop_input(w, dy, (16, 16, 3, 3), (1, 16, 5, 5),
                                   {"padding": [1, 1, 1, 1], "res_dtype": "float32"})
    sch = dsl.auto_schedule(dx)
    store = tuning_db.store_for(tuning_db.normalize(sch.prim_func()), sch.target)
    store.dir.mkdir(parents=True)
    bomb = "[" * 100_000 + "]" * 100_000
    for content in (b"\xff\xfe garbage", bomb.encode(), b'{"format": 1, "kind": "accept", '
                    b'"id": "x", "trace": [1, 2]}\n', b'{"format": 1, "kind": "accept"'):
        store.decisions_path.write_bytes(content)
        store.workload_path.write_bytes(content)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            again = dsl.auto_schedule(dx)
        assert again.override is None, content[:40]
