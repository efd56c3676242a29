"""The aclnn two-phase operators as build-then-run numpy calls.

``aclnnXxxGetWorkspaceSize`` + ``aclnnXxx`` map to one call here: the first call with a given
signature builds (and caches, see :mod:`dsl.runtime.kernel_cache`) the kernel, later calls just
run it.
"""

from __future__ import annotations


def __getattr__(name: str):
    # Lazy, so importing dsl.aclnn costs nothing until an operator is used. The modules are
    # not named after the functions: importing a submodule would shadow the function.
    import importlib

    modules = {"convolution_backward": "dsl.api.aclnn.convolution",
               "convolution_backward_kernel": "dsl.api.aclnn.convolution",
               "avg_pool2d_backward": "dsl.api.aclnn.avg_pool",
               "avg_pool2d_backward_kernel": "dsl.api.aclnn.avg_pool"}
    if name in modules:
        return getattr(importlib.import_module(modules[name]), name)
    raise AttributeError(f"module 'dsl.api.aclnn' has no attribute {name!r}")
