"""``python -m dsl``: dispatch, --version, unknown commands, the name the help uses."""

import subprocess
import sys
from pathlib import Path

import pytest

from dsl import __main__ as entry
from dsl._version import __version__
from dsl.cli import common

ROOT = Path(__file__).resolve().parents[3]


def test_unknown_command_says_so_and_lists_the_commands(capsys):
    assert entry.main(["nosuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'nosuch'" in err
    for name in entry.COMMANDS:
        assert f"  {name}\n" in err + "\n"


def test_unknown_option_before_the_command(capsys):
    assert entry.main(["--frobnicate"]) == 2
    assert "unknown option '--frobnicate'" in capsys.readouterr().err


def test_no_command_prints_usage_and_fails(capsys):
    assert entry.main([]) == 2
    err = capsys.readouterr().err
    assert "usage: python -m dsl COMMAND" in err and "clean" in err and "show" in err


def test_help_lists_every_command(capsys):
    assert entry.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in entry.COMMANDS)


def test_version_comes_from_the_version_module(capsys):
    assert entry.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"convbwd-dsl {__version__}"


def test_version_as_a_module_in_a_fresh_interpreter():
    proc = subprocess.run([sys.executable, "-m", "dsl", "--version"], cwd=ROOT, text=True,
                          capture_output=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"convbwd-dsl {__version__}"


@pytest.mark.parametrize(("argv0", "prog"), [
    ("/usr/local/bin/dsl", "dsl"),                         # the console script
    (str(ROOT / "dsl" / "__main__.py"), "python -m dsl"),  # python -m dsl
])
def test_help_names_the_program_as_it_was_started(argv0, prog, monkeypatch, capsys):
    monkeypatch.setattr(common, "PROG", common.PROG)  # restored afterwards
    monkeypatch.setattr(sys, "argv", [argv0, "clean", "--help"])
    with pytest.raises(SystemExit) as exc:
        entry.main()
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {prog} clean")
    monkeypatch.setattr(sys, "argv", [argv0, "nosuch"])
    assert entry.main() == 2
    assert capsys.readouterr().err.startswith(f"{prog}: error: unknown command")


def test_console_script_is_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'dsl = "dsl.__main__:main"' in text
    assert '"tqdm' in text.split("[project.optional-dependencies]")[0]  # a main dependency
