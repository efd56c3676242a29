"""Old import paths of modules that moved when ``dsl/`` was grouped by role.

``import dsl.layout`` and ``from dsl.compute import cube_util`` keep working: each old name
resolves to the module at its new home (the same module object, not a copy).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "dsl.conv_geometry": "dsl.ops.conv_geometry",
    "dsl.group": "dsl.ops.group",
    "dsl.layout": "dsl.ops.layout",
    "dsl.para_dict": "dsl.ops.para_dict",
    "dsl.conv2d_backprop_input": "dsl.ops.conv2d_backprop_input",
    "dsl.conv2d_backprop_filter": "dsl.ops.conv2d_backprop_filter",
    "dsl.convolution_backward": "dsl.ops.convolution_backward",
    "dsl.avg_pool2d_backward": "dsl.ops.avg_pool2d_backward",
    "dsl.deconv_grad_filter": "dsl.ops.deconv_grad_filter",
    "dsl.build": "dsl.runtime.build",
    "dsl.kernel": "dsl.runtime.kernel",
    "dsl.kernel_cache": "dsl.runtime.kernel_cache",
    "dsl.atomic": "dsl.runtime.atomic",
    "dsl.schedule": "dsl.runtime.schedule",
    "dsl.tune": "dsl.tuning.tune",
    "dsl.tuning_db": "dsl.tuning.database",
    "dsl.aclnn": "dsl.api.aclnn",
    "dsl.aclnn.convolution": "dsl.api.aclnn.convolution",
    "dsl.aclnn.avg_pool": "dsl.api.aclnn.avg_pool",
    "dsl.deconvgradfilter": "dsl.api.deconvgradfilter",
    "dsl.bench": "dsl.cli.bench",
    "dsl.examples_runner": "dsl.cli.examples",
    "dsl.tvm": "dsl.compat.tvm",
    "dsl.compute": "dsl.compat.compute",
    "dsl.compute.cube_util": "dsl.compat.cube_util",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module name to its new module.

    ``exec_module`` swaps the new module into ``sys.modules[old]``; the import system returns
    whatever that slot holds, so the caller gets the real module, whose own ``__spec__`` and
    ``__name__`` stay untouched.
    """

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        sys.modules[module.__spec__.name] = importlib.import_module(MOVED[module.__spec__.name])


def install(preloaded: bool = True) -> None:
    """Register the finder; with ``preloaded``, also point every old name whose new module is
    already imported at it, so ``import dsl.build`` never replaces the *function*
    ``dsl.build`` by the module (the import system sets a package attribute per submodule it
    loads, and ``dsl.build``, ``dsl.tune`` ... are functions)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
    if preloaded:
        for old, new in MOVED.items():
            if new in sys.modules and old not in sys.modules:
                sys.modules[old] = sys.modules[new]
