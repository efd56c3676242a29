"""``python -m dsl show``: a built kernel's metadata, threads and assembly; TIR by rebuilding."""

import json
import shutil
from pathlib import Path

import pytest

import dsl
from dsl.cli import show

from helpers import seed_dx

ROOT = Path(__file__).resolve().parents[3]
NAME = "show_test_dx"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One small dx kernel (1x16x7x7, 1x1 filter) in a kernel_meta/ of its own."""
    parent = tmp_path_factory.mktemp("show")
    w, dy, dx = seed_dx()
    dsl.build(dsl.auto_schedule(dx), {"name": NAME, "tensor_list": [w, dy, dx],
                                      "kernel_meta_parent_dir": str(parent)})
    return parent


def test_lists_and_describes_a_kernel(built, capsys):
    assert show.main(["--dir", str(built)]) == 0
    assert capsys.readouterr().out.split() == [NAME]
    assert show.main([NAME, "--dir", str(built)]) == 0
    out = capsys.readouterr().out
    assert "conv2d_backprop_input" in out and "output dx [1, 1, 7, 7, 16] float32" in out
    assert "schedules." in out  # the rule that scheduled it
    assert "threads" in out and "TVM_NUM_THREADS=" in out


def test_json_has_the_metadata_and_threads(built, capsys):
    assert show.main([NAME, "--dir", str(built), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["meta"]["name"] == NAME and data["meta"]["op"] == "conv2d_backprop_input"
    assert isinstance(data["threads"]["parallel"], bool)
    assert data["threads"]["pool_threads"] >= 1


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) missing")
def test_asm_of_the_built_library(built, capsys):
    assert show.main([NAME, "--dir", str(built), "--asm"]) == 0
    out = capsys.readouterr().out
    assert f"<__tvm_ffi_{NAME}>:" in out and "ret" in out
    assert "<register_tm_clones>:" not in out  # C runtime stubs are left out


def test_unknown_kernel_lists_the_built_ones(built, capsys):
    assert show.main(["nosuch", "--dir", str(built)]) == 2
    err = capsys.readouterr().err
    assert "no kernel 'nosuch'" in err and f"  {NAME}\n" in err


def test_tir_needs_a_rebuild(built, capsys):
    assert show.main([NAME, "--dir", str(built), "--tir"]) == 2
    assert "--example" in capsys.readouterr().err


def test_tir_and_asm_by_rebuilding_an_example(capsys):
    example = str(ROOT / "examples" / "conv2d_backprop_input_seed.py")
    assert show.main(["--example", example, "--tir"]) == 0
    out = capsys.readouterr().out
    assert "(tir) ----" in out and "T.prim_func" in out and "{'kernel'" not in out
    assert show.main(["--example", example, "nosuch", "--asm"]) == 2
    assert "builds no kernel 'nosuch'" in capsys.readouterr().err
