"""Every public path keeps working in a fresh interpreter, right after a plain ``import dsl``
(README.md writes them so; the modules behind them moved when ``dsl/`` was grouped by role)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Attribute paths reached after ``import dsl`` alone (no ``import dsl.aclnn`` first).
ATTRIBUTES = [
    "dsl.conv2d_backprop_input", "dsl.conv2d_backprop_filter", "dsl.convolution_backward",
    "dsl.avg_pool2d_backward", "dsl.deconv_grad_filter", "dsl.aclnn.convolution_backward",
    "dsl.aclnn.avg_pool2d_backward", "dsl.deconvgradfilter.fp_deconv_grad_filter_s",
    "dsl.deconvgradfilter.fp_deconv_grad_filter_p", "dsl.deconvgradfilter.hp_deconv_grad_filter_s",
    "dsl.deconvgradfilter.hp_deconv_grad_filter_p", "dsl.layout.nchw_to_5hd",
    "dsl.layout.nc1hwc0_to_nchw", "dsl.layout.weight_to_fracz", "dsl.layout.fracz_to_weight",
    "dsl.calculate_group", "dsl.auto_schedule", "dsl.build", "dsl.load", "dsl.tune",
    "dsl.target", "dsl.DslError", "dsl.__version__",
]

# Statements as README.md and the TBE ports write them, plus every module's old path.
STATEMENTS = [
    "from dsl import tvm; tvm.placeholder((2, 3), name='x', dtype='float32')",
    "from dsl.compute import cube_util; assert cube_util.ceil(5, 2) == 3",
    "from dsl.deconvgradfilter import fp_deconv_grad_filter_s",
    "import dsl.aclnn; dsl.aclnn.avg_pool2d_backward",
    "import dsl.layout, dsl.group, dsl.conv_geometry, dsl.para_dict",
    "import dsl.build, dsl.kernel, dsl.kernel_cache, dsl.atomic, dsl.schedule",
    "import dsl.tune, dsl.tuning_db, dsl.bench, dsl.examples_runner",
    "from dsl.conv2d_backprop_input import conv2d_backprop_input",
    "from dsl.convolution_backward import convolution_backward",
]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("path", ATTRIBUTES)
def test_attribute_after_plain_import(path):
    r = _run(f"import dsl\nobj = {path}\nassert obj is not None")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("statement", STATEMENTS)
def test_statement_in_fresh_interpreter(statement):
    r = _run(statement)
    assert r.returncode == 0, r.stderr


def test_old_module_path_is_the_same_module_and_functions_stay_functions():
    r = _run("import dsl, inspect\n"
             "import dsl.build, dsl.tune, dsl.conv2d_backprop_input\n"
             "import dsl.layout as old; import dsl.ops.layout as new\n"
             "assert old is new\n"
             "assert inspect.isfunction(dsl.build) and inspect.isfunction(dsl.tune)\n"
             "assert inspect.isfunction(dsl.conv2d_backprop_input)\n")
    assert r.returncode == 0, r.stderr
