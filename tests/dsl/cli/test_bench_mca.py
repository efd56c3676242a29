"""``python -m dsl bench --mca``: llvm-mca's prediction next to the achieved FLOP/cycle.

The FLOP-per-cycle arithmetic is checked on a hand-written AT&T loop; the column on one tiny
real kernel (skipped without llvm-mca or a model for the host's -mcpu); the skip reason with
llvm-mca hidden. No rate is asserted."""

import json

import pytest

import dsl.cli.bench as bench
from dsl.cli.bench import Prepared, Workload, fresh_build, mca, runner
from targets import mca as tmca
from targets import roof

FMA = roof.Roof("float32", 2, (0, 1), "avx2", "vfmadd231ps", 12, 200.0, 100.0, 2.5, 32,
                198.4, 190.0, 0.99, 0.2, 5, "znver3")

# 4 ymm FMAs (8 lanes, 2 FLOP each = 64 FLOP) and 1 xmm FMA (4 lanes = 8 FLOP) per iteration
LOOP = """\
kernel:
\tpushq %rbp
.LBB0_2:
\tvbroadcastss (%rsi,%rax,4), %ymm4
\tvfmadd231ps (%rdi), %ymm4, %ymm0
\tvfmadd231ps 32(%rdi), %ymm4, %ymm1
\tvfmadd231ps 64(%rdi), %ymm4, %ymm2
\tvfmadd231ps 96(%rdi), %ymm4, %ymm3
\tvfmadd231ps %xmm5, %xmm6, %xmm7
\taddq $128, %rdi
\tincq %rax
\tcmpq %rax, %rcx
\tjne .LBB0_2
\tretq
"""


def test_flop_per_cycle_arithmetic(monkeypatch):
    loop, src = mca.best_loop(["no loop here", LOOP])
    assert src == LOOP and loop[0] == ".LBB0_2:" and tmca.fma_flops(loop) == 72
    pred = tmca.Prediction("znver3", 4.0, 3.5, 2.0, "llvm-mca")
    monkeypatch.setattr(tmca, "predict", lambda block, mcpu: pred)
    rep = mca.row_report([LOOP], "znver3", gflops=40.0, threads=2, ghz=2.5, bound=32)
    assert rep["flops_per_iter"] == 72 and rep["cycles_per_iter"] == 4.0
    assert rep["predicted_flops_per_cycle"] == pytest.approx(72 / 4.0)
    assert rep["achieved_flops_per_cycle"] == pytest.approx(40.0 / 2 / 2.5)  # 8 FLOP/cycle
    assert rep["predicted_pct_bound"] == pytest.approx(100 * 18 / 32)
    assert rep["achieved_pct_bound"] == pytest.approx(100 * 8 / 32)
    assert "18.0 ach 8.0 (56%/25% bound)" in mca.cell({"mca": rep})


def test_no_fma_loop_is_reported():
    rep = mca.row_report(["\tretq\n"], "znver3", 1.0, 1, 2.0, 32)
    assert rep["prediction"] is None and "FMA" in rep["reason"]


def _tiny_gemm():
    """A tiny fp32 matmul built through fresh_build (so --mca captures its assembly)."""
    import numpy as np
    from tvm import te

    n = 64
    a = te.placeholder((n, n), name="a")
    b = te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c",
                   tag="matmul")

    def setup():
        kernel, seconds = fresh_build([c], [a, b], "bench_mca_tiny")
        x, y = np.ones((n, n), "float32"), np.ones((n, n), "float32")
        out = np.zeros((n, n), "float32")
        return Prepared(lambda: kernel(x, y, out), None, seconds, {})

    return Workload("mcatest", "tiny_gemm", "matmul", 2.0 * n ** 3, setup)


@pytest.fixture
def tiny_suite(monkeypatch):
    monkeypatch.setattr(roof, "measured_peak", lambda dtype, threads: FMA)
    w = _tiny_gemm()
    bench.WORKLOADS.append(w)
    yield w
    bench.WORKLOADS.remove(w)


def _run(tmp_path, capsys):
    path = tmp_path / "mca.json"
    rc = runner.main(["--suite", "mcatest", "--mca", "--no-peer", "--repeat", "1",
                      "--min-time", "0.001", "--threads", "1", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    return out, json.loads(path.read_text())["rows"][0]


def test_mca_column_on_a_tiny_kernel(tiny_suite, tmp_path, capsys):
    import targets

    out, row = _run(tmp_path, capsys)
    assert "asm" not in row  # the assembly stays out of --json
    rep = row["mca"]
    assert rep["mcpu"] == targets.current().mcpu
    assert rep["achieved_flops_per_cycle"] == pytest.approx(row["ours_gflops"] / 1 / 2.5)
    line = next(ln for ln in out.splitlines() if ln.startswith("mcatest/tiny_gemm"))
    assert "  mca " in line
    if rep["prediction"] is None:
        pytest.skip(f"llvm-mca cannot answer here: {rep['reason']}")
    assert rep["flops_per_iter"] > 0 and rep["cycles_per_iter"] > 0
    assert rep["predicted_flops_per_cycle"] == pytest.approx(
        rep["flops_per_iter"] / rep["cycles_per_iter"])
    assert "pred" in line and "bound)" in line


def test_mca_absent_skips_with_the_reason(tiny_suite, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tmca.shutil, "which", lambda name: None)
    out, row = _run(tmp_path, capsys)
    assert row["mca"]["prediction"] is None
    assert "not installed" in row["mca"]["reason"]
    assert out.count("# llvm-mca skipped: llvm-mca is not installed") == 1
    line = next(ln for ln in out.splitlines() if ln.startswith("mcatest/tiny_gemm"))
    assert "  mca -" in line and row["ours_gflops"] > 0  # the row itself still ran


def test_without_mca_nothing_is_captured(tiny_suite, tmp_path, capsys, monkeypatch):
    called = []
    monkeypatch.setattr(bench, "_assembly", lambda *a: called.append(a) or "")
    rc = runner.main(["--suite", "mcatest", "--no-peer", "--repeat", "1", "--min-time",
                      "0.001", "--threads", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and not called and " mca " not in out


def test_a_kernel_with_tile_products_is_not_predicted():
    """llvm-mca has no model of the AMX unit: a kernel whose assembly holds tile products gets
    no prediction (its vector loops are not its hot loop), and says why."""
    amx_asm = LOOP.replace("\tretq\n", "\ttdpbf16ps %tmm6, %tmm4, %tmm0\n\tretq\n")
    rep = mca.row_report([amx_asm], "sapphirerapids", 500.0, 1, 2.5, 64)
    assert rep["prediction"] is None and "AMX" in rep["reason"]
    assert mca.row_report([LOOP], "znver3", 1.0, 1, 2.0, 32).get("reason") != rep["reason"]
