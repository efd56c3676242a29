"""``python -m dsl bench --plot``: the picture of ours vs PyTorch (needs matplotlib)."""

import pytest

from dsl import bench
from dsl.cli.bench import Prepared, Workload, runner
from dsl.cli.bench.plot import peak_gflops

pytest.importorskip("matplotlib")
PNG = b"\x89PNG\r\n\x1a\n"


def test_peak_estimate():
    # 4 threads of 256-bit FMA at 2.5 GHz: 4 * 8 lanes * 2 flops * 2 pipes * 2.5
    assert peak_gflops(256, 4, ghz=2.5) == pytest.approx(320.0)


def test_bench_plot_writes_a_png(tmp_path, capsys):
    """Two fake rows (one with a peer, one without) and a failed one: all drawn or skipped."""
    def boom():
        raise RuntimeError("no")

    added = [Workload("plotsmoke", "a", "dx", 1e6,
                      lambda: Prepared(lambda: sum(range(100)), lambda: sum(range(300)), 0.0)),
             Workload("plotsmoke", "b", "pool_dx", 1e6,
                      lambda: Prepared(lambda: None, None, 0.0)),
             Workload("plotsmoke", "c", "dw", 1e6, boom)]
    bench.WORKLOADS.extend(added)
    try:
        path = tmp_path / "sub" / "bench.png"
        rc = runner.main(["--suite", "plotsmoke", "--repeat", "1", "--min-time", "0.001",
                          "--plot", str(path)])
    finally:
        for w in added:
            bench.WORKLOADS.remove(w)
    assert rc == 1  # the failed row still fails the run
    assert path.read_bytes()[:8] == PNG
    assert 1000 < path.stat().st_size < 200_000
    assert f"wrote {path}" in capsys.readouterr().out
