"""A kernel DSL for convolution-backward operators on open Apache TVM, run on the CPU.

A TBE script ports by changing its import lines::

    from dsl import tvm          # was: from tbe import tvm
    import dsl                   # was: from tbe import dsl

Public API: the operators (:func:`conv2d_backprop_input`, :func:`conv2d_backprop_filter`), the
layouts (:mod:`dsl.layout`), ``group_dict`` (:func:`calculate_group`), and the workflow
:func:`auto_schedule` -> :func:`build` -> :func:`load`. Targets live in the ``targets`` package
(``with dsl.target("x86-avx2"): ...``), schedules in the ``schedules`` package.
"""

from __future__ import annotations

__version__ = "0.1.0"

import os as _os  # noqa: E402

import targets as _targets  # noqa: E402

# TVM sizes its thread pool once, from TVM_NUM_THREADS, when a kernel first runs; unset, it
# assumes SMT and takes half the logical CPUs, which on this kind of machine is one core of two.
_os.environ.setdefault("TVM_NUM_THREADS", str(_targets.machine_cores()))

from dsl.avg_pool2d_backward import avg_pool2d_backward  # noqa: E402
from dsl.build import build  # noqa: E402
from dsl.conv2d_backprop_filter import conv2d_backprop_filter  # noqa: E402
from dsl.conv2d_backprop_input import conv2d_backprop_input  # noqa: E402
from dsl.convolution_backward import convolution_backward  # noqa: E402
from dsl.deconv_grad_filter import deconv_grad_filter  # noqa: E402
from dsl.errors import DslError  # noqa: E402
from dsl.group import calculate_group  # noqa: E402
from dsl.kernel import Kernel, load  # noqa: E402
from dsl.schedule import Schedule, auto_schedule  # noqa: E402
from dsl.tune import tune  # noqa: E402
from targets import use as target  # noqa: E402

__all__ = ["DslError", "Kernel", "Schedule", "auto_schedule", "avg_pool2d_backward", "build",
           "calculate_group", "conv2d_backprop_filter", "conv2d_backprop_input",
           "convolution_backward", "deconv_grad_filter", "load", "target", "tune"]
