"""``python -m dsl bench --suite user`` at tiny sizes: every workload builds, runs, and agrees
with its peers (PyTorch, else numpy; numpy and the plain operator are timed peers too)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dsl.cli.bench import user

from helpers import HAVE_TORCH

TINY = user.workloads("tiny")


@pytest.mark.parametrize("workload", TINY, ids=lambda w: w.name)
def test_user_workload_matches_its_peers(workload):
    prep = workload.setup()
    assert prep.info["size"] == "tiny"
    prep.ours()
    for fn in prep.peers.values():  # every extra peer runs (numpy, the plain operator)
        fn()
    if prep.peer is None:  # the cube rows check against PyTorch only
        assert not HAVE_TORCH
        pytest.skip("needs PyTorch as the reference")
    err = prep.verify()
    assert err is not None and err <= prep.tolerance
    if HAVE_TORCH and workload.kind not in ("dx_ep", "dw_ep", "dx_pro"):
        assert "numpy" in prep.peers


def test_check_catches_a_wrong_result():
    """The check is live: a peer that disagrees with our kernel fails the row."""
    import dataclasses

    spec = next(s for s in user.specs() if s.name == "matmul_1024")

    def make(d):
        case = spec.make(d)
        right = case.numpy_fn
        return dataclasses.replace(case, torch_fn=None, numpy_fn=lambda: right() + 1.0)

    prep = user.prepare(dataclasses.replace(spec, make=make), "tiny")
    with pytest.raises(ValueError, match="wrong result"):
        prep.verify()


def test_rates_use_full_sizes_and_memory_rows_report_bytes():
    rows = {w.name: w for w in user.workloads()}
    assert rows["matmul_1024"].flops == 2.0 * 1024 ** 3 and rows["matmul_1024"].bytes == 0
    assert rows["exp_mul_add_2p24"].bytes == 3 * 4 * 2 ** 24
    assert rows["softmax_8192x4096"].bytes == 2 * 4 * 8192 * 4096
    assert {w.name for w in user.workloads("tiny")} == set(rows)


def test_runner_prints_gbps_rows_and_extra_peers(tmp_path, capsys, monkeypatch):
    from dsl.cli.bench import runner

    monkeypatch.setenv("DSL_BENCH_USER_SIZE", "tiny")
    path = tmp_path / "user.json"
    rc = runner.main(["--suite", "user", "--filter", "exp_mul_add|matmul_1024", "--repeat", "1",
                      "--min-time", "0.001", "--settle", "0", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = {r["name"]: r for r in json.loads(path.read_text())["rows"]}
    chain, mm = rows["exp_mul_add_2p24"], rows["matmul_1024"]
    assert chain["unit"] == "GB/s" and chain["ours_gbps"] > 0 and mm["unit"] == "GFLOP/s"
    assert np.isclose(chain["ours_gbps"], chain["bytes"] / chain["ours_s"] / 1e9)
    assert "[GB/s]" in out
    if "memory roof unavailable" not in out:  # GB/s rows: % of the measured copy bandwidth
        assert chain["roof"] == "memory" and chain["roof_pct"] > 0 and mm["roof"] == "fp32"
        assert "% roof of GB/s rows: memory bandwidth" in out
    if HAVE_TORCH:
        assert set(chain["others_ratio"]) == {"numpy"} and "numpy" in out


@pytest.mark.parametrize("size", ["tiny", "full"])
def test_no_stage_of_the_suite_falls_to_a_fallback(size, monkeypatch):
    """Issue #20's goal: every stage of every user-suite kernel gets a real rule: none is left
    to the generic last resort, and none of a fused row is left beside the operator by
    fusion's "not inlinable" fallback. Scheduling only (no build), so full sizes are cheap."""
    import dsl

    monkeypatch.setattr(user, "_plain", lambda *a, **k: None)  # the plain peer's build
    for spec in user.specs():
        case = spec.make(spec.dims[size])
        why = dsl.explain(dsl.auto_schedule(case.outputs))
        assert why.fell_to_generic() == [], f"{spec.name}:\n{why}"
        stuck = [s for s, r, w in why.stages if r == "fusion" and "not inlinable" in w]
        assert not stuck, f"{spec.name}:\n{why}"
