"""``--suite`` / ``--filter`` select the same workloads in ``bench`` and ``tune --bench``."""

import json

import pytest

from dsl.cli import common
from dsl.cli import tune as tune_cli
from dsl.cli.bench import WORKLOADS, Prepared, Workload, runner


def _instant():
    return Prepared(lambda: None, None, 0.0)


NAMES = [("alpha_3x3", "dx"), ("alpha_3x3", "dw"), ("beta_1x1", "dx"), ("gamma_5x5_s2", "dw")]


@pytest.fixture
def fake_suite():
    """Four instant workloads (no kernel built) in a suite of their own."""
    added = [Workload("clitest", name, kind, 1e6, _instant) for name, kind in NAMES]
    WORKLOADS.extend(added)
    yield added
    for w in added:
        WORKLOADS.remove(w)


def _bench_ids(pattern, capsys) -> list[str]:
    rc = runner.main(["--suite", "clitest", "--filter", pattern, "--no-peer", "--repeat", "1",
                      "--min-time", "0.0001", "--settle", "0", "--json", "-"])
    out = capsys.readouterr().out
    assert rc == 0
    return [f"{r['suite']}/{r['name']}/{r['kind']}" for r in json.loads(out)["rows"]]


def _tune_ids(pattern, capsys) -> list[str]:
    # no workload builds a kernel, so nothing is searched: only the selection and the timing
    rc = tune_cli.main(["--bench", "--suite", "clitest", "--filter", pattern, "--repeat", "1",
                        "--json", "-"])
    out = capsys.readouterr().out
    assert rc == 0
    return [f"{r['suite']}/{r['workload']}/{r['kind']}" for r in json.loads(out)["rows"]]


@pytest.mark.parametrize(("pattern", "expected"), [
    ("alpha", ["alpha_3x3/dx", "alpha_3x3/dw"]),       # a plain substring
    ("/dw$", ["alpha_3x3/dw", "gamma_5x5_s2/dw"]),      # the kind, anchored
    ("^clitest/(beta|gamma)", ["beta_1x1/dx", "gamma_5x5_s2/dw"]),
    ("", [f"{n}/{k}" for n, k in NAMES]),               # empty: everything
])
def test_bench_and_tune_select_the_same_workloads(fake_suite, pattern, expected, capsys):
    want = [f"clitest/{e}" for e in expected]
    assert _bench_ids(pattern, capsys) == want
    assert _tune_ids(pattern, capsys) == want
    assert [common.workload_id(w) for w in tune_cli.bench_workloads(["clitest"], pattern)] \
        == want


def test_suites_may_be_repeated_or_comma_separated(fake_suite):
    assert common.split_list(["clitest,pool", "conv2d"]) == ["clitest", "pool", "conv2d"]


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_unknown_suite_is_named_with_the_valid_ones(command, fake_suite, capsys):
    main = runner.main if command == "bench" else tune_cli.main
    argv = ["--suite", "nosuch"] if command == "bench" else ["--bench", "--suite", "nosuch"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"dsl {command}: error: unknown suite 'nosuch'" in err
    assert "  conv2d\n" in err and "  clitest\n" in err


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_a_filter_matching_nothing_lists_the_workloads(command, fake_suite, capsys):
    main = runner.main if command == "bench" else tune_cli.main
    argv = ["--suite", "clitest", "--filter", "zzz"]
    assert main(argv if command == "bench" else ["--bench", *argv]) == 2
    err = capsys.readouterr().err
    assert "matches --filter 'zzz'" in err and "  clitest/beta_1x1/dx" in err


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_a_bad_regular_expression_is_a_usage_error(command, fake_suite, capsys):
    main = runner.main if command == "bench" else tune_cli.main
    argv = ["--suite", "clitest", "--filter", "(unclosed"]
    assert main(argv if command == "bench" else ["--bench", *argv]) == 2
    assert "is not a regular expression" in capsys.readouterr().err


def test_unknown_target_lists_the_targets(fake_suite, capsys):
    assert runner.main(["--suite", "clitest", "--target", "z80"]) == 2
    err = capsys.readouterr().err
    assert "unknown target 'z80'" in err and "  x86-avx2\n" in err


def test_unknown_example_lists_the_examples(capsys):
    from dsl.cli import examples

    assert examples.main(["no_such_example"]) == 2
    err = capsys.readouterr().err
    assert "unknown example 'no_such_example'" in err and "  depthwise\n" in err
