"""Smoke test of ``python -m dsl bench`` on one tiny conv2d workload and a foreign row kind."""

import json
import statistics

import pytest

from dsl import bench
from dsl.cli.bench import Prepared, Workload, runner
from dsl.cli.bench.conv2d import Layer, _setup_dw, _setup_dx

from helpers import HAVE_TORCH

TINY = Layer("tiny_3x3_s2", 1, 16, 32, 9, 3, 2, 1, 1, 1)


@pytest.fixture
def smoke_suite():
    """Workloads in a suite of their own, removed again afterwards."""
    added = [
        Workload("smoke", TINY.name, "dx", TINY.flops, lambda: _setup_dx(TINY, "float32")),
        Workload("smoke", TINY.name, "dw", TINY.flops, lambda: _setup_dw(TINY, "float32")),
        # another engineer's row kind, without a peer: must print and summarise fine
        Workload("smoke", "fake_pool", "pool_dx", 1e6,
                 lambda: Prepared(lambda: None, None, 0.0, {})),
    ]
    bench.WORKLOADS.extend(added)
    yield added
    for w in added:
        bench.WORKLOADS.remove(w)


def test_bench_main_prints_table_and_json(smoke_suite, tmp_path, capsys):
    path = tmp_path / "bench.json"
    rc = runner.main(["--suite", "smoke", "--repeat", "2", "--min-time", "0.001",
                      "--json", str(path)])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert out.startswith("# ") and "threads" in out  # the machine header
    # progress on stderr, one whole line per workload (not a terminal here)
    assert "[bench] 1/3 workloads" in err and "[bench] 3/3 workloads" in err
    assert "\r" not in err
    data = json.loads(path.read_text())
    rows = {r["kind"]: r for r in data["rows"]}
    assert set(rows) == {"dx", "dw", "pool_dx"}
    for kind in ("dx", "dw"):
        r = rows[kind]
        assert r["error"] is None and r["ours_gflops"] > 0 and r["build_s"] > 0
        assert r["info"]["rule"].startswith("schedules.")
        if HAVE_TORCH:
            assert r["peer_gflops"] > 0
            # the median of same-round ratios, not the ratio of the two medians
            s = r["samples"]
            assert len(s["ours"]) == len(s["peer"]) == 2
            assert r["ratio"] == pytest.approx(
                statistics.median(p / o for p, o in zip(s["peer"], s["ours"])))
            assert data["summary"][f"smoke/{kind}"]["geomean_ratio"] == pytest.approx(r["ratio"])
        else:
            assert r["ratio"] is None
    assert rows["pool_dx"]["peer_gflops"] is None and rows["pool_dx"]["ratio"] is None
    assert "pool_dx" in out and "geomean" in out


def test_bench_filter_selects_nothing(smoke_suite, capsys):
    assert runner.main(["--suite", "smoke", "--filter", "no-such-workload"]) == 2


def test_bench_failure_is_reported_not_raised(smoke_suite, capsys):
    def broken():
        raise RuntimeError("boom")

    rows = runner.run([Workload("smoke", "broken", "dx", 1.0, broken)], repeat=1)
    assert rows[0]["error"] == "RuntimeError: boom"
    assert "FAILED" in runner.format_row(rows[0])


def test_geomean():
    assert runner.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert runner.geomean([]) is None


class _Clock:
    """perf_counter, process_time and sleep of a process whose other threads burn one core
    for ``busy`` seconds after the start, then park."""

    def __init__(self, busy: float):
        self.now, self.busy = 0.0, busy

    def sleep(self, s: float) -> None:
        self.now += s

    def perf_counter(self) -> float:
        return self.now

    def process_time(self) -> float:
        return min(self.now, self.busy)


@pytest.mark.parametrize("busy, waited", [(0.0, 0.035), (0.08, 0.085), (5.0, 1.03)])
def test_settle_waits_for_spinning_threads_to_park(monkeypatch, busy, waited):
    # OpenBLAS's workers spin ~60 ms after a numpy matmul: the next side timed must not run
    # beside them; a thread that never parks bounds the wait (QUIET_MAX_WAIT).
    clock = _Clock(busy)
    monkeypatch.setattr(runner, "time", clock)
    assert runner.settle_quietly(0.03) == pytest.approx(waited, abs=runner.QUIET_WINDOW)


def _cold_then_warm(clock: _Clock, cold: int, slow: float, fast: float):
    """A kernel whose first ``cold`` calls (after a pause) take ``slow`` seconds each."""
    calls = []

    def fn():
        clock.now += slow if len(calls) < cold else fast
        calls.append(clock.now)

    return fn, calls


def test_calibration_and_samples_count_warm_calls_only(monkeypatch):
    # The first call after a pause took 7-13 ms for a 1.2 ms PyTorch conv: fitted to it, a
    # 30 ms sample held 4 calls, mostly cold. Calibrate on warm calls, warm up each sample.
    clock = _Clock(0.0)
    monkeypatch.setattr(runner, "time", clock)
    fn, _ = _cold_then_warm(clock, cold=2, slow=0.010, fast=0.001)
    assert runner._calibrate(fn, 0.03) == 30
    fn, calls = _cold_then_warm(clock, cold=3, slow=0.004, fast=0.001)
    assert runner._sample(fn, 10, settle=0.03) == pytest.approx(0.001)
    assert len(calls) > 10  # the cold calls ran before the clock started
