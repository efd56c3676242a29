"""``convert(model)``: run a model's convolution and average-pooling backward on dsl kernels.

Each supported layer keeps its object, parameters, buffers, hooks and ``state_dict`` keys; only
its class changes, to a subclass whose ``forward`` calls ``torch.ops.dsl.convolution`` /
``torch.ops.dsl.avg_pool2d`` (PyTorch's forward, this project's backward). So ``deepcopy``,
``model.to(dtype)``, pickling and loading state dicts work as before.
"""

from __future__ import annotations

import warnings

from torch import nn

from dsl.pytorch import ops


def _same_padding(m) -> list[int] | None:
    """``padding='same'`` as symmetric per-axis padding, None when it needs an uneven split
    (PyTorch then pads one side more; the dsl operator pads both sides equally)."""
    total = [d * (k - 1) for d, k in zip(m.dilation, m.kernel_size)]
    return None if any(t % 2 for t in total) else [t // 2 for t in total]


def _padding(m) -> list[int] | None:
    if m.padding == "valid":
        return [0] * len(m.kernel_size)
    if m.padding == "same":
        return _same_padding(m)
    return list(m.padding)


class _DslConv:
    """Forward of a converted ``nn.Conv1d/2d/3d``."""

    def forward(self, input):  # noqa: A002
        return ops.convolution(input, self.weight, self.bias, list(self.stride),
                               _padding(self), list(self.dilation), False,
                               [0] * len(self.kernel_size), self.groups)


class _DslConvTranspose:
    """Forward of a converted ``nn.ConvTranspose1d/2d/3d`` (``output_size`` as PyTorch)."""

    def forward(self, input, output_size=None):  # noqa: A002
        nd = len(self.kernel_size)
        opad = self._output_padding(input, output_size, self.stride, self.padding,
                                    self.kernel_size, nd, self.dilation)
        return ops.convolution(input, self.weight, self.bias, list(self.stride),
                               list(self.padding), list(self.dilation), True, list(opad),
                               self.groups)


class _DslAvgPool2d:
    """Forward of a converted ``nn.AvgPool2d``."""

    def forward(self, input):  # noqa: A002
        def pair(v):
            return [v, v] if isinstance(v, int) else list(v)

        stride = [] if self.stride is None else pair(self.stride)
        return ops.avg_pool2d(input, pair(self.kernel_size), stride, pair(self.padding),
                              bool(self.ceil_mode), bool(self.count_include_pad),
                              self.divisor_override)


class DslConv1d(_DslConv, nn.Conv1d):
    pass


class DslConv2d(_DslConv, nn.Conv2d):
    pass


class DslConv3d(_DslConv, nn.Conv3d):
    pass


class DslConvTranspose1d(_DslConvTranspose, nn.ConvTranspose1d):
    pass


class DslConvTranspose2d(_DslConvTranspose, nn.ConvTranspose2d):
    pass


class DslConvTranspose3d(_DslConvTranspose, nn.ConvTranspose3d):
    pass


class DslAvgPool2d(_DslAvgPool2d, nn.AvgPool2d):
    pass


CONVERTED = {nn.Conv1d: DslConv1d, nn.Conv2d: DslConv2d, nn.Conv3d: DslConv3d,
             nn.ConvTranspose1d: DslConvTranspose1d, nn.ConvTranspose2d: DslConvTranspose2d,
             nn.ConvTranspose3d: DslConvTranspose3d, nn.AvgPool2d: DslAvgPool2d}


def unsupported(m: nn.Module) -> str | None:
    """Why ``m`` (of a convertible class) stays native, or None when it converts."""
    if isinstance(m, nn.AvgPool2d):
        if m.divisor_override is not None and not isinstance(m.divisor_override, int):
            return f"divisor_override={m.divisor_override!r} (not an int)"
        return None
    if m.padding_mode != "zeros":
        return f"padding_mode={m.padding_mode!r} (only 'zeros')"
    if isinstance(m.padding, str) and _padding(m) is None:
        return "padding='same' with an even effective kernel (needs uneven padding)"
    return None


def convert(model: nn.Module) -> nn.Module:
    """Swap, in place, every supported layer of ``model`` for its dsl-backward version.

    Converted: ``nn.Conv1d/2d/3d``, ``nn.ConvTranspose1d/2d/3d`` and ``nn.AvgPool2d`` (exact
    classes, not subclasses, whose ``forward`` may differ). Layers whose configuration the
    operators do not cover (``padding_mode`` other than ``'zeros'``, ``padding='same'`` that
    needs uneven padding) stay native and are listed in one ``UserWarning``.

    Parameters
    ----------
    model : torch.nn.Module
        Converted in place (``model`` itself may be a layer).

    Returns
    -------
    torch.nn.Module
        ``model``, for chaining. Parameters, buffers and ``state_dict`` keys are unchanged.
    """
    if not isinstance(model, nn.Module):
        from dsl.errors import E_TYPE, fail

        raise fail(E_TYPE, "model", type(model).__name__, "must be a torch.nn.Module")
    skipped = []
    for name, m in model.named_modules():
        cls = CONVERTED.get(type(m))
        if cls is None:
            continue
        why = unsupported(m)
        if why is None:
            m.__class__ = cls
        else:
            skipped.append(f"{name or '<model>'} ({type(m).__name__}): {why}")
    if skipped:
        warnings.warn("dsl.pytorch.convert left these layers native: " + "; ".join(skipped),
                      UserWarning, stacklevel=2)
    return model


def converted_layers(model: nn.Module) -> list[str]:
    """Names of the layers of ``model`` that run dsl kernels in their backward."""
    return [n for n, m in model.named_modules() if type(m) in CONVERTED.values()]


__all__ = ["CONVERTED", "convert", "converted_layers", "unsupported"]
