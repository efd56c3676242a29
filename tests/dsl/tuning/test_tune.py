"""``dsl.tune``: real (tiny) meta-schedule searches, locally and through TVM's RPC tracker.

Each search measures a handful of candidates of the seed example's 1x16x7x7 dx kernel; the
real tuning runs are benchmarks (``python -m dsl tune --bench``).
"""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import dsl
from dsl import tuning_db
from dsl.cli.tune import main as tune_main

from helpers import nc1hwc0_to_nchw, nchw_to_5hd, seed_dx, weight_to_fracz
from reference import conv2d_backprop_input as ref_dx


def _have_extras() -> bool:
    try:
        import cloudpickle  # noqa: F401
        import psutil  # noqa: F401
        import xgboost  # noqa: F401
    except ImportError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _have_extras(),
                                reason="tuning extras (psutil, cloudpickle, xgboost) missing")

ROOT = Path(__file__).resolve().parents[3]
FAST = {"number": 1, "repeat": 1, "min_repeat_ms": 0, "max_workers": 1}


@pytest.fixture
def db(tmp_path, monkeypatch):
    root = tmp_path / "tuning"
    monkeypatch.setenv(tuning_db.ENV, str(root))
    return root


def check_dx(kernel):
    rng = np.random.default_rng(3)
    dy = rng.uniform(-1, 1, (1, 16, 7, 7)).astype("float16")
    w = rng.uniform(-1, 1, (16, 16, 1, 1)).astype("float16")
    out = nc1hwc0_to_nchw(kernel(weight_to_fracz(w, 1), nchw_to_5hd(dy)), 16)
    ref = ref_dx(dy, w, (1, 16, 7, 7), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    np.testing.assert_allclose(out, ref, atol=2e-5 * max(1.0, np.abs(ref).max()))


def test_tune_then_build_uses_the_decision_and_resumes(db, tmp_path, capfd):
    w, dy, dx = seed_dx()
    r = dsl.tune(dx, trials=4, seed=0, **FAST)
    err = capfd.readouterr().err
    assert "4/4 trials" in err and "GFLOP/s" in err and "ETA" in err  # the progress bar
    assert "builds use the" in err  # the summary
    assert (r.trials, r.records, r.error, r.interrupted) == (4, 4, None, False)
    assert r.default_seconds > 0 and r.flops > 0

    store = tuning_db.WorkloadStore(db, dsl.auto_schedule(dx).target, r.workload)
    assert str(store.dir) == r.database
    lines = tuning_db.read_lines(store.records_path)
    assert len(lines) == 4 and all(line["seed"] == 0 for line in lines)
    assert any(line["seconds"] for line in lines)  # candidates were really measured

    sch = dsl.auto_schedule(dx)
    meta = dsl.build(sch, {"name": "tuned_dx", "tensor_list": [w, dy, dx],
                           "kernel_meta_parent_dir": str(tmp_path)})
    if r.accepted:  # the head-to-head found a faster, numerically equal candidate
        assert r.tuned_seconds < r.default_seconds
        s = meta["schedule"]
        assert s["source"] == "tuned" and s["record"]["id"] == r.accepted
        assert s["record"]["seed"] == 0 and s["trace"] and s["run_seconds"] > 0
        assert s["record"]["default_seconds"] == r.default_seconds
    else:  # never slower than the default: the default stays
        assert meta["schedule"]["source"] == "default"
    check_dx(dsl.load("tuned_dx", tmp_path))

    # Resume: the 4 records count toward trials=4, so no new search runs.
    r2 = dsl.tune(dx, trials=4, seed=0, progress=False, **FAST)
    assert (r2.trials, r2.records) == (0, 4)
    assert r2.default_seconds > 0  # the head-to-head still ran on the stored records


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Bounded, generous waits on real conditions: a fresh clone's first run under load spends most
# of a minute importing TVM (no bytecode cache yet) in each new process.
START_WAIT = 300.0


def _wait_for(condition, what: str, proc: subprocess.Popen, log: Path) -> object:
    """Poll ``condition()`` until it returns a truthy value; fail (with the log) when ``proc``
    dies or START_WAIT seconds pass."""
    deadline = time.monotonic() + START_WAIT
    while True:
        value = condition()
        if value:
            return value
        assert proc.poll() is None, f"{what}: process exited\n{log.read_text()}"
        assert time.monotonic() < deadline, f"{what}: not after {START_WAIT} s\n{log.read_text()}"
        time.sleep(0.3)


def _bound_port(log: Path) -> int | None:
    """The port the tracker bound (it logs "bind to HOST:PORT")."""
    import re

    m = re.search(r"bind to 127\.0\.0\.1:(\d+)", log.read_text())
    return int(m.group(1)) if m else None


@pytest.fixture
def rpc(tmp_path):
    """A TVM RPC tracker and one server on 127.0.0.1 (killed, with their children, at the
    end). Each binds the first free port of a range and the tracker's is read from its log:
    a port picked in advance can be taken by another process before the tracker binds it."""
    pytest.importorskip("tornado")  # the tracker's event loop
    key = "dsl-test"
    paths = [tmp_path / "tracker.log", tmp_path / "server.log"]
    logs = [open(p, "w") for p in paths]
    base = _free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
         "--port", str(base), "--port-end", str(base + 500)],
        stdout=logs[0], stderr=subprocess.STDOUT, start_new_session=True)]
    try:
        from dsl.tuning.meta_schedule import check_tracker

        port = _wait_for(lambda: _bound_port(paths[0]), "tracker bind", procs[0], paths[0])
        sport = _free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}",
             "--key", key, "--host", "127.0.0.1", "--port", str(sport),
             "--port-end", str(sport + 500)],
            stdout=logs[1], stderr=subprocess.STDOUT, start_new_session=True))

        def registered():
            try:
                check_tracker("127.0.0.1", port, key, wait=0)
                return True
            except (dsl.DslError, OSError, RuntimeError):  # not registered / tracker busy
                return False

        _wait_for(registered, "rpc server registration", procs[1], paths[1])
        yield f"127.0.0.1:{port}", key, paths[1]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        for f in logs:
            f.close()


@pytest.fixture
def patient_tune(monkeypatch):
    """The CLI's tune calls with a 10-minute build / measurement time-out instead of 60 s: a
    candidate's first build starts a worker process that imports TVM, which a loaded machine
    with no bytecode cache can take most of a minute to do."""
    import functools

    cli = sys.modules[tune_main.__module__]
    monkeypatch.setattr(cli, "tune", functools.partial(cli.tune, timeout=600.0))


def test_cli_tunes_an_example_through_the_rpc_tracker(db, rpc, patient_tune, capsys):
    tracker, key, server_log = rpc
    example = ROOT / "examples" / "conv2d_backprop_input_seed.py"
    rc = tune_main(["--example", str(example), "--trials", "2", "--seed", "1",
                    "--rpc-key", key, "--tracker", tracker])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "conv2d_backprop_input_dx_1_1_7_7_16" in out  # the example's kernel, in the table
    (records,) = db.glob("*/*[0-9a-f].jsonl")
    lines = tuning_db.read_lines(records)
    assert len(lines) == 2 and any(line["seconds"] for line in lines)
    assert "load_module" in server_log.read_text()  # measured on the RPC server


def test_unreachable_tracker_fails_fast(db):
    _, _, dx = seed_dx()
    t0 = time.perf_counter()
    with pytest.raises(dsl.DslError, match="not reachable"):
        dsl.tune(dx, trials=2, rpc_key="k", tracker=f"127.0.0.1:{_free_port()}", **FAST)
    assert time.perf_counter() - t0 < 30


def test_ctrl_c_keeps_records(db, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import faulthandler, signal, sys
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it is, if it hangs
        sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests" / "dsl" / "tuning")!r}]
        from helpers import seed_dx
        from test_tune import FAST
        import dsl
        try:
            dsl.tune(seed_dx()[2], trials=64, trials_per_iter=2, seed=0, **FAST)
        except KeyboardInterrupt:
            print("INTERRUPTED")
            sys.exit(130)
        print("FINISHED")
    """))
    env = {**os.environ, tuning_db.ENV: str(db), "PYTHONPATH": str(ROOT / "tests")}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        # bounded waits: a loaded machine may take minutes to measure the first batch
        deadline = time.monotonic() + 600
        while not [p for p in db.glob("*/*[0-9a-f].jsonl") if p.read_bytes().count(b"\n")]:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()  # reading its output must not wait for 64 trials
                pytest.fail(f"no record measured (rc {proc.poll()}): "
                            f"{proc.communicate(timeout=60)[1][-2000:]}")
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        # the batch being measured finishes first: on a loaded machine a batch has taken
        # minutes (a full-suite run saw ~30 s per trial), so the bound matches the first one
        try:
            out, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # its threads' stacks, to stderr
            time.sleep(5)
            proc.kill()
            out, err = proc.communicate(timeout=60)
            pytest.fail(f"still running 600 s after Ctrl-C; its stderr ends:\n{err[-6000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "INTERRUPTED" in out, (out, err)
    assert "stopping after the current batch" in err and "records kept" in err
    assert "search failed" not in err, err  # a stop is not an error
    (records,) = db.glob("*/*[0-9a-f].jsonl")
    lines = tuning_db.read_lines(records)
    # the measured batches are kept; the rest never ran (64 trials leave room for the signal
    # to land mid-run even when batches are fast)
    assert 2 <= len(lines) < 64


def test_bench_kernels_are_recorded(db):
    from dsl import bench
    from dsl.cli.tune import kernels_of_workload

    def setup():
        w, dy, dx = seed_dx()
        for name in ("a", "b"):  # two builds of one workload: one kernel to tune
            dsl.build(dsl.auto_schedule(dx), {"name": f"bench_{name}",
                                              "tensor_list": [w, dy, dx]})
        return bench.Prepared(lambda: None, None, 0.0)

    workload = bench.Workload("tune-test", "seed_dx", "dx", 2.0 * 16 * 16 * 49, setup)
    kernels, prepared = kernels_of_workload(workload)
    assert len(kernels) == 1 and kernels[0][1] == "bench_a"
    assert kernels[0][0].override is None  # tuned from the default schedule's workload
    assert isinstance(prepared, bench.Prepared)


def test_cli_tunes_bench_workloads_and_times_default_tuned_and_peer(db, tmp_path, patient_tune,
                                                                     monkeypatch, capsys):
    import json

    from dsl import bench
    from dsl.cli import tune as tune_cli
    calls = {"ours": 0, "peer": 0}

    def setup():
        w, dy, dx = seed_dx()
        dsl.build(dsl.auto_schedule(dx), {"name": "bench_seed_dx", "tensor_list": [w, dy, dx]})
        kernel = dsl.load("bench_seed_dx")
        rng = np.random.default_rng(0)
        w_np = rng.standard_normal((16, 16, 1, 1)).astype(np.float16)
        dy_np = rng.standard_normal((1, 16, 7, 7)).astype(np.float16)
        args = (weight_to_fracz(w_np, 1), nchw_to_5hd(dy_np))
        expected = ref_dx(dy_np, w_np, (1, 16, 7, 7), (1, 1), (0, 0, 0, 0), (1, 1), 1)

        def ours():
            calls["ours"] += 1
            return nc1hwc0_to_nchw(kernel(*args), 16)

        def peer():
            calls["peer"] += 1
            return expected

        return bench.Prepared(ours, peer, 0.0,
                              check=lambda: bench.rel_err(ours(), expected), tolerance=2e-3)

    workload = bench.Workload("tune-test", "seed_dx", "dx", 2.0 * 16 * 16 * 49, setup)
    monkeypatch.setattr(tune_cli, "bench_workloads", lambda suites, name: [workload])
    out_json = tmp_path / "tune.json"
    rc = tune_main(["--bench", "--trials", "2", "--seed", "3", "--repeat", "2",
                    "--json", str(out_json)])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    (row,) = json.loads(out_json.read_text())["rows"]
    assert row["workload"] == "seed_dx" and row["trials"] == 2
    assert row["default"] > 0 and row["tuned"] > 0 and row["pytorch"] > 0
    assert row["uses"] in ("tuned", "default")
    assert "geomean tuned/PyTorch" in out and "geomean default/PyTorch" in out
    assert calls["peer"] >= 2  # timed side by side, not skipped
