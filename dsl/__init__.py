"""A kernel DSL for convolution-backward operators on open Apache TVM, run on the CPU.

A TBE script ports by changing its import lines::

    from dsl import tvm          # was: from tbe import tvm
    import dsl                   # was: from tbe import dsl

Public API: the operators (:func:`conv2d_backprop_input`, :func:`conv2d_backprop_filter`,
:func:`convolution_backward`, :func:`avg_pool2d_backward`, :func:`deconv_grad_filter`), the
layouts (:mod:`dsl.layout`), TBE's vector DSL (``dsl.vadd``, ``dsl.vexp``, ``dsl.vcmp``,
``dsl.cast_to``, ``dsl.broadcast``, ``dsl.reduce_sum`` ...: :mod:`dsl.ops.vector`),
``group_dict`` (:func:`calculate_group`), the workflow
:func:`auto_schedule` -> :func:`build` -> :func:`load`, :func:`tune`, and the numpy-level
vendor APIs :mod:`dsl.aclnn` and :mod:`dsl.deconvgradfilter`. Targets live in the ``targets``
package (``with dsl.target("x86-avx2"): ...``), schedules in the ``schedules`` package.

Where things live (see ARCHITECTURE.md): ``dsl/ops`` computes, ``dsl/runtime`` schedule ->
build -> load, ``dsl/tuning`` auto-tuning, ``dsl/api`` numpy-level vendor APIs, ``dsl/cli`` the
``python -m dsl`` commands, ``dsl/compat`` the TBE import shims.
"""

from __future__ import annotations

import os as _os

import targets as _targets
from dsl._version import __version__

# TVM sizes its thread pool once, from TVM_NUM_THREADS, when a kernel first runs; unset, it
# assumes SMT and takes half the logical CPUs, which on this kind of machine is one core of two.
_os.environ.setdefault("TVM_NUM_THREADS", str(_targets.machine_cores()))

from dsl import _aliases  # noqa: E402
from dsl.api import aclnn, deconvgradfilter  # noqa: E402
from dsl.errors import DslError  # noqa: E402
from dsl.ops import layout  # noqa: E402
from dsl.ops.avg_pool2d_backward import avg_pool2d_backward  # noqa: E402
from dsl.ops.conv2d_backprop_filter import conv2d_backprop_filter  # noqa: E402
from dsl.ops.conv2d_backprop_input import conv2d_backprop_input  # noqa: E402
from dsl.ops.convolution_backward import convolution_backward  # noqa: E402
from dsl.ops.deconv_grad_filter import deconv_grad_filter  # noqa: E402
from dsl.ops.group import calculate_group  # noqa: E402
from dsl.ops.vector import *  # noqa: E402, F403 - TBE's vector DSL: dsl.vadd, dsl.reduce_sum ...
from dsl.ops.vector import __all__ as _vector_names  # noqa: E402
from dsl.runtime.build import build  # noqa: E402
from dsl.runtime.explain import Explanation, explain  # noqa: E402
from dsl.runtime.kernel import Kernel, load  # noqa: E402
from dsl.runtime.schedule import Schedule, auto_schedule  # noqa: E402
from dsl.runtime.target import use as target  # noqa: E402
from dsl.tuning.tune import tune  # noqa: E402

_aliases.install()


def __getattr__(name: str):
    # dsl.pytorch imports torch: loaded on first use, never by ``import dsl``
    if name == "pytorch":
        import importlib

        return importlib.import_module("dsl.pytorch")
    raise AttributeError(f"module 'dsl' has no attribute {name!r}")

__all__ = ["DslError", "Explanation", "Kernel", "Schedule", "__version__", "aclnn", "auto_schedule",
           "avg_pool2d_backward", "build", "calculate_group", "conv2d_backprop_filter",
           "conv2d_backprop_input", "convolution_backward", "deconv_grad_filter",
           "deconvgradfilter", "explain", "layout", "load", "target", "tune", *_vector_names]
