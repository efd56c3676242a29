"""Results as a table by default, JSON with ``--json FILE`` / ``--json -``; progress lines."""

import io
import json

import pytest

from dsl.cli import output
from dsl.cli import tune as tune_cli
from dsl.cli.bench import WORKLOADS, Prepared, Workload, runner
from dsl.progress import Steps
from dsl.tuning.tune import TuneResult


@pytest.fixture
def one_workload():
    w = Workload("clitest", "instant", "dx", 1e6, lambda: Prepared(lambda: None, None, 0.0))
    WORKLOADS.append(w)
    yield w
    WORKLOADS.remove(w)


def test_table_aligns_text_left_and_numbers_right():
    text = output.format_table(("name", "GF/s"), [("a", output.cell(1.5, ".1f")),
                                                  ("longer", output.cell(None, ".1f"))])
    assert text.splitlines() == ["name    GF/s", "a        1.5", "longer     -"]


def test_cell():
    assert output.cell(None) == "-" and output.cell(float("nan"), ".2f") == "-"
    assert output.cell(2.0, ".2f") == "2.00" and output.cell("x", ".2f") == "x"


def test_json_dash_is_json_only_on_stdout(capsys):
    output.write_json({"rows": [1, None]}, "-")
    out, err = capsys.readouterr()
    assert json.loads(out) == {"rows": [1, None]} and err == ""


def test_json_file_is_written_and_announced(tmp_path, capsys):
    path = tmp_path / "r.json"
    output.write_json({"a": tmp_path}, str(path))  # a Path is written as its text
    assert json.loads(path.read_text()) == {"a": str(tmp_path)}
    assert f"wrote {path}" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_table_by_default_json_with_dash(command, one_workload, capsys):
    argv = (["--suite", "clitest", "--no-peer", "--repeat", "1", "--min-time", "0.0001"]
            if command == "bench" else ["--bench", "--suite", "clitest", "--repeat", "1"])
    main = runner.main if command == "bench" else tune_cli.main
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "clitest/instant" in table and "{" not in table  # a table, no raw dict
    with pytest.raises(json.JSONDecodeError):
        json.loads(table)
    assert main([*argv, "--json", "-"]) == 0
    out, err = capsys.readouterr()
    (row,) = json.loads(out)["rows"]  # stdout is exactly one JSON document
    assert row["kind"] == "dx"
    assert "1/1 workload" in err  # progress stays on stderr


def test_tune_example_table_and_rows():
    r = TuneResult("k", "w", "/db", trials=4, seconds=1.25, flops=2e9, default_seconds=1.0,
                   tuned_seconds=0.5, accepted="rid")
    table = tune_cli.format_table([r]).splitlines()
    assert table[0].split() == ["kernel", "trials", "tune", "s", "default", "GF/s", "tuned",
                                "GF/s", "uses"]
    assert table[1].split() == ["k", "4", "1.2", "2.00", "4.00", "tuned"]
    row = tune_cli.result_row(r)
    assert row["default_gflops"] == 2.0 and row["tuned_gflops"] == 4.0 and row["uses"] == "tuned"
    json.dumps(row)


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_off_a_terminal_is_one_whole_line_per_step():
    stream = io.StringIO()
    with Steps(3, "[x]", unit="trial", stream=stream) as steps:
        steps.update(2, "best 1.0")
        steps.note("a note")
        steps.update(1, "best 2.0")
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines[0].startswith("[x] 2/3 trials  best 1.0  ETA ")
    assert lines[1] == "a note"
    assert lines[2].startswith("[x] 3/3 trials  best 2.0  ETA 00:00")


def test_progress_on_a_terminal_is_a_tqdm_bar():
    stream = _Tty()
    with Steps(2, "[x]", unit="trial", stream=stream) as steps:
        steps.update(2, "best 1.0")
    text = stream.getvalue()
    assert "\r" in text and "2/2" in text and "best 1.0" in text


def test_progress_disabled_prints_nothing():
    stream = io.StringIO()
    with Steps(2, "[x]", stream=stream, enabled=False) as steps:
        steps.update(2)
        steps.note("n")
    assert stream.getvalue() == ""


def test_examples_json_to_stdout(tmp_path, capsys):
    from dsl.cli import examples

    rc = examples.main(["conv2d_backprop_input_seed", "--kernel-meta-parent-dir", str(tmp_path),
                        "--json", "-"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    data = json.loads(out)
    (row,) = data["examples"]
    assert row["example"] == "conv2d_backprop_input_seed" and row["ok"] is True
    assert data["passed"] == 1 and data["failed"] == 0
    assert "conv2d_backprop_input_seed" in err and "1 passed" in err  # the table went aside
