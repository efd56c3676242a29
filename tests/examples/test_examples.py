"""Every example runs and passes its own check (the README's main job, one example each)."""

from pathlib import Path

import pytest

from dsl.cli.examples import discover, run_example

EXAMPLES = discover(Path(__file__).resolve().parents[2] / "examples")


def test_examples_exist():
    names = {p.stem for p in EXAMPLES}
    assert {"conv2d_backprop_input_seed", "conv2d_backprop_filter_seed", "grouped_resnext",
            "depthwise"} <= names


# train_cnn trains for 50 steps twice: tests/examples/test_train_cnn.py runs a short version
@pytest.mark.parametrize("path", [p for p in EXAMPLES if p.stem != "train_cnn"],
                         ids=lambda p: p.stem)
def test_example_runs_and_checks(path, tmp_path):
    result = run_example(path, str(tmp_path))
    assert result["error"] < 1e-5
    assert list((tmp_path / "kernel_meta").glob("*.so")), "the example built no kernel"


SEEDS = {"conv2d_backprop_input_seed": ("001_44cbca796d9ae6e9.txt", "out_backprop_shape ="),
         "conv2d_backprop_filter_seed": ("003_07b7f1a66a5f5f73.txt", "out_backprop_shape =")}


@pytest.mark.parametrize("stem", sorted(SEEDS))
def test_seed_examples_differ_only_in_imports(stem):
    """The ported seed code is the seed's own code, token for token, after its imports (the
    seed text flattens 001's example onto one line, so whitespace is ignored)."""
    seed_dir = Path(__file__).resolve().parents[3] / "shared" / "seeds"
    if not seed_dir.is_dir():
        pytest.skip("../shared/seeds not beside the repo")
    fname, first = SEEDS[stem]
    seed = (seed_dir / fname).read_text()
    body = "".join(seed[seed.index(first):].split())
    ported = "".join((EXAMPLES[0].parent / f"{stem}.py").read_text().split())
    assert body in ported.replace(",}", "}").replace(",)", ")") or body in ported
