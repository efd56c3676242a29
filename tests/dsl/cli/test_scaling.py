"""``python -m dsl scaling``: benchmark kernels built for other core counts and read by the
static model; the DeconvGradFilter row reads the kernel built for the asked cores, not the
one this machine runs."""

import json

from dsl.cli import scaling


def _rows(capsys, *argv):
    assert scaling.main([*argv, "--json", "-"]) == 0
    return json.loads(capsys.readouterr().out)["rows"]


def test_global_avgpool_row_at_two_core_counts(capsys):
    (row,) = _rows(capsys, "--filter", "avgpool_global", "--cores", "4,1")
    assert row["workload"] == "pool/avgpool_global_7x7_7x7x2048/pool_dx"
    assert set(row["shares"]) == {"1", "4"}
    assert row["shares"]["1"] == 1.0
    assert 0.25 <= row["shares"]["4"] <= 1.0


def test_deconv_row_reads_the_kernel_of_the_asked_cores(capsys):
    """On this machine the row runs a kernel of at most its cores (2 tasks here would fill
    1/32 of 64 cores); asked for 64, the model reads the 64-core kernel (at least 32 tasks)."""
    (row,) = _rows(capsys, "--filter", "dcgan", "--cores", "64", "--min", "1.01")
    assert row["shares"]["64"] >= 0.5
    assert row["limited_by"].startswith("@64: ")


def test_bad_core_counts_are_a_usage_error(capsys):
    assert scaling.main(["--cores", "0,16", "--filter", "avgpool_global"]) == 2
    assert "--cores '0,16'" in capsys.readouterr().err
