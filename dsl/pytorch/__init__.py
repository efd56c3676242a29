"""Train PyTorch models on this project's backward kernels (needs ``torch``).

``import dsl`` does not import torch; ``import dsl.pytorch`` (or ``dsl.pytorch`` after
``import dsl``) does, and registers the ``dsl::`` operators (:mod:`dsl.pytorch.ops`)::

    import dsl.pytorch
    model = dsl.pytorch.convert(model)      # Conv1d/2d/3d, ConvTranspose1d/2d/3d, AvgPool2d
    loss = model(x).sum(); loss.backward()  # the backward runs dsl kernels

``convert`` swaps supported layers in place (:mod:`dsl.pytorch.modules`); the operators can also
be called directly: ``dsl.pytorch.convolution(...)``, ``dsl.pytorch.avg_pool2d(...)``, or
``torch.ops.dsl.<name>`` (also under ``torch.compile(fullgraph=True)``). ``STATS`` counts the
backward kernel calls.
"""

from __future__ import annotations

from dsl.pytorch.modules import CONVERTED, convert, converted_layers, unsupported
from dsl.pytorch.ops import (
    STATS,
    avg_pool2d,
    avg_pool2d_backward,
    convolution,
    convolution_backward,
)

__all__ = ["CONVERTED", "STATS", "avg_pool2d", "avg_pool2d_backward", "convert",
           "converted_layers", "convolution", "convolution_backward", "unsupported"]
