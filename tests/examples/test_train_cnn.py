"""examples/train_cnn.py, shortened: native and converted training agree step for step."""

from pathlib import Path

import pytest

from dsl.cli.examples import load_example

pytest.importorskip("torch")
pytest.importorskip("sklearn")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_cnn.py"


def test_train_cnn_short(tmp_path, capsys):
    plot = tmp_path / "loss.png"
    # kernels from the session cache (a fresh kernel_meta would rebuild all five)
    result = load_example(EXAMPLE).main(None, steps=4, plot=str(plot))
    native, ours = result["losses"]
    assert len(native) == len(ours) == 4
    assert result["error"] <= 1e-4
    assert all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(ours, native))
    assert native[-1] < native[0]  # it trains
    assert "held-out accuracy" in capsys.readouterr().out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_cnn_skips_cleanly_without_its_dependencies(monkeypatch):
    module = load_example(EXAMPLE)
    monkeypatch.setattr(module, "missing", lambda: "needs sklearn")
    assert module.main() == {"skipped": "needs sklearn"}
