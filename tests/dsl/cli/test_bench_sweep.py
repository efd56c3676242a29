"""``python -m dsl bench --threads 1,2,N`` (a thread sweep in one run), the memory roof of
GB/s rows and ``--suite ops``. Fake workloads (no kernels) and fake roofs: nothing here is
timed against anything, and no rate is asserted."""

import json

import pytest

from dsl import bench
from dsl.cli.bench import Prepared, Workload, runner
from targets import bandwidth, roof

FMA = roof.Roof("float32", 2, (0, 1), "avx2", "vfmadd231ps", 12, 200.0, 100.0, 3.1, 32,
                198.4, 190.0, 0.99, 0.2, 5, "znver3")


def _bw(kind, threads):
    return bandwidth.Bandwidth(kind, threads, 10.0 * threads, 10.0, 512 << 20, 0.05, 5, 1.0,
                               33 << 20, 384.0 * threads, 8, 256, "znver3")


@pytest.fixture
def fake_roofs(monkeypatch):
    seen = []

    def peak(dtype, threads):
        seen.append(("fp32", threads))
        return FMA

    def memory(kind, threads):
        seen.append((kind, threads))
        return _bw(kind, threads)

    monkeypatch.setattr(roof, "measured_peak", peak)
    monkeypatch.setattr(roof, "measured_bandwidth", memory)
    return seen


@pytest.fixture
def sweep_suite():
    """A compute row and a memory-bound row, recording the thread count each ran under."""
    import targets

    ran = []

    def setup():
        ran.append(targets.current().cores)
        return Prepared(lambda: None, None, 0.0, {})

    added = [Workload("sweep", "fake_gemm", "matmul", 2e6, setup),
             Workload("sweep", "fake_norm", "norm", 0.0, setup, bytes=4e6)]
    bench.WORKLOADS.extend(added)
    yield ran
    for w in added:
        bench.WORKLOADS.remove(w)


@pytest.mark.parametrize("text,counts", [("2", [2]), ("1,2,16", [1, 2, 16]),
                                         ("2,1,2", [2, 1])])
def test_thread_counts_parse(text, counts):
    assert runner._parse(["--threads", text]).threads == counts


@pytest.mark.parametrize("text", ["0", "a", "1,,2", "-1", "1.5", ""])
def test_thread_counts_refuse(text, capsys):
    with pytest.raises(SystemExit) as info:
        runner._parse(["--threads", text])
    assert info.value.code == 2 and "--threads" in capsys.readouterr().err


def test_sweep_runs_each_workload_at_each_count(sweep_suite, fake_roofs, tmp_path, capsys):
    path = tmp_path / "sweep.json"
    rc = runner.main(["--suite", "sweep", "--threads", "1,2", "--no-peer", "--repeat", "1",
                      "--min-time", "0.001", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert sweep_suite == [1, 2, 1, 2]  # workload outer, count inner, under that many cores
    data = json.loads(path.read_text())
    assert [(r["name"], r["threads"]) for r in data["rows"]] == [
        ("fake_gemm", 1), ("fake_gemm", 2), ("fake_norm", 1), ("fake_norm", 2)]
    assert set(data["summary"]) == {"sweep/matmul@1", "sweep/matmul@2", "sweep/norm@1",
                                    "sweep/norm@2"}
    assert data["machine"]["thread_counts"] == [1, 2]
    # % roof: compute rows of the fp32 roof, GB/s rows of the copy bandwidth, per count
    by = {(r["name"], r["threads"]): r for r in data["rows"]}
    assert by[("fake_gemm", 1)]["roof"] == "fp32" and by[("fake_norm", 2)]["roof"] == "memory"
    assert by[("fake_norm", 2)]["roof_pct"] == pytest.approx(
        100 * by[("fake_norm", 2)]["ours_gbps"] / 20.0)
    assert {("copy", 1), ("copy", 2), ("fp32", 1), ("fp32", 2)} <= set(fake_roofs)
    # the table: a thread column, one row per count, geomeans per count, the roofs named
    assert "1,2 threads" in out and " thr " in out
    lines = [ln for ln in out.splitlines() if ln.startswith("sweep/fake_norm")]
    assert [ln.split()[2] for ln in lines] == ["1", "2"] and lines[0].rstrip().endswith("[GB/s]")
    assert "sweep/norm@2" in out and "GB/s" in out.split("sweep/norm@2")[1].splitlines()[0]
    assert "% roof of GB/s rows: memory bandwidth 20.0 GB/s on 2 thread(s)" in out
    assert "% roof of GFLOP/s rows: fp32 roof" in out


def test_single_count_keeps_the_old_table(sweep_suite, fake_roofs, capsys):
    rc = runner.main(["--suite", "sweep", "--threads", "2", "--no-peer", "--repeat", "1",
                      "--min-time", "0.001"])
    out = capsys.readouterr().out
    assert rc == 0 and sweep_suite == [2, 2]
    assert " thr " not in out and "; 2 threads (TVM pool 2)" in out
    assert "sweep/norm " in out and "sweep/norm@" not in out
    row = next(ln for ln in out.splitlines() if ln.startswith("sweep/fake_norm"))
    assert row.split()[1] == "norm" and "%" in row  # GB/s rows now carry a % of roof


def test_memory_roof_unavailable_leaves_rows_alone(capsys, monkeypatch):
    monkeypatch.setattr(roof, "measured_peak", lambda dtype, threads: FMA)

    def refuse(kind, threads):
        raise roof.RoofError("no tvm")

    monkeypatch.setattr(roof, "measured_bandwidth", refuse)
    rows = [{"suite": "s", "name": "n", "kind": "norm", "unit": "GB/s", "ours_gbps": 5.0,
             "ours_gflops": 0.0}]
    runner.add_roof(rows, 1)
    assert "roof_pct" not in rows[0] and "memory roof unavailable" in capsys.readouterr().out


def test_no_memory_row_measures_no_bandwidth(fake_roofs):
    rows = [{"suite": "s", "name": "g", "kind": "dx", "ours_gflops": 50.0}]
    runner.add_roof(rows, 2)
    assert rows[0]["roof_pct"] == 25.0 and fake_roofs == [("fp32", 2)]


def test_suite_ops_is_the_operator_suites(capsys):
    from dsl.cli.bench import ALIASES, expand_suites
    from dsl.cli.common import select_workloads

    assert ALIASES["ops"] == ("convnd", "pool", "deconv")
    assert expand_suites(["user", "ops", "pool"]) == ["user", "convnd", "pool", "deconv"]
    got = {w.suite for w in select_workloads(["ops"], "")}
    assert got == {"convnd", "pool", "deconv"}
    assert {w.suite for w in select_workloads(["ops,user"], "softmax|conv1d")} == {
        "convnd", "user"}
    with pytest.raises(SystemExit):
        runner._parse(["--help"])
    assert "ops = convnd,pool,deconv" in capsys.readouterr().out.replace("\n", " ").replace(
        "  ", " ")


@pytest.mark.parametrize("dtype,name", [("int8", "int8"), ("bfloat16", "bf16"),
                                        ("float16", "fp32")])
def test_low_precision_rows_are_held_to_their_roof(monkeypatch, capsys, dtype, name):
    """int8 and bf16 rows against the dot-product roofs; float16 (converted to fp32 FMAs)
    against the fp32 one."""
    asked = []

    def peak(kind, threads):
        asked.append(kind)
        return FMA

    monkeypatch.setattr(roof, "measured_peak", peak)
    monkeypatch.setenv("DSL_BENCH_DTYPE", dtype)
    rows = [{"unit": "GFLOP/s", "ours_gflops": 100.0}]
    runner.add_roof(rows, 2)
    assert asked == [dtype if name != "fp32" else "float32"] and rows[0]["roof"] == name
    assert rows[0]["roof_pct"] == pytest.approx(100 * 100.0 / FMA.gflops)
    assert f"{name} roof" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["dx", "dw"])
def test_bf16_rows_check_their_result(monkeypatch, kind):
    """The conv2d suite's bf16 rows on a real (1x1) layer, checked against PyTorch's float32
    result of the unrounded data (bf16 tolerance)."""
    pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    from dsl.cli.bench import conv2d

    monkeypatch.setenv("DSL_BENCH_DTYPE", "bfloat16")
    layer = next(lay for lay in conv2d.LAYERS if lay.name == "resnet50_1x1")
    prep = conv2d._dx(layer) if kind == "dx" else conv2d._dw(layer)
    assert prep.info["dtype"] == "bfloat16"
    assert prep.verify() <= prep.tolerance


def test_int8_dx_row_checks_its_result_and_refuses_dw(monkeypatch):
    """The conv2d suite's int8 dx row on a real (1x1) layer, checked against PyTorch's float32
    dx of the same integers; int8 has no dw row."""
    pytest.importorskip("torch")
    from dsl.cli.bench import conv2d

    monkeypatch.setenv("DSL_BENCH_DTYPE", "int8")
    layer = next(lay for lay in conv2d.LAYERS if lay.name == "resnet50_1x1")
    prep = conv2d._dx(layer)
    assert prep.info["dtype"] == "int8"
    assert prep.verify() <= 1e-5
    with pytest.raises(ValueError, match="no int8 dw"):
        conv2d._dw(layer)


def test_rows_for_other_dtypes_are_left_out(sweep_suite, fake_roofs, monkeypatch, capsys):
    """A row that declares its dtypes (the conv2d dw rows: no int8) is left out of a ``--dtype``
    it does not take instead of failing; selecting only such rows is a usage error."""
    only_fp = Workload("sweep", "fake_fp_only", "dw", 2e6,
                       lambda: Prepared(lambda: None, None, 0.0, {}), dtypes=("float32",))
    bench.WORKLOADS.append(only_fp)
    monkeypatch.setenv("DSL_BENCH_DTYPE", "float32")  # restored after: main sets it
    try:
        rc = runner.main(["--suite", "sweep", "--dtype", "int8", "--no-peer", "--repeat", "1",
                          "--min-time", "0", "--settle", "0"])
        out = capsys.readouterr().out
        assert rc == 0 and "fake_gemm" in out and "fake_fp_only" not in out
        rc = runner.main(["--suite", "sweep", "--filter", "fake_fp_only", "--dtype", "int8",
                          "--no-peer", "--repeat", "1"])
        assert rc == 2 and "no selected workload runs with --dtype int8" in \
            capsys.readouterr().err
    finally:
        bench.WORKLOADS.remove(only_fp)
