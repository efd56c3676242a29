"""The convnd suite: ``convolution_backward`` on 1-D, 3-D, transposed and grouped layers vs
PyTorch.

Each layer registers a ``dx`` row (grad_input only) and a ``dw`` row (grad_weight only). Ours
is the kernel ``dsl.convolution_backward`` builds for that output mask with its default x86
schedule, on the plain NCL / NCDHW / NCHW arrays (nothing converted inside the timed call); the
peer is ``torch.ops.aten.convolution_backward`` with the same mask, float32, as many threads as
our target uses.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from dsl.cli.bench import Prepared, Workload, fresh_build, register, rel_err, tolerance, torch_peer

SUITE = "convnd"


@dataclass(frozen=True)
class Layer:
    """A forward (transposed) convolution; tuples hold one entry per spatial axis."""

    name: str
    n: int
    cin: int
    cout: int
    size: tuple[int, ...]
    k: int
    stride: int
    pad: int
    groups: int = 1
    transposed: bool = False
    opad: int = 0

    @property
    def nd(self) -> int:
        return len(self.size)

    @property
    def out(self) -> tuple[int, ...]:
        k, s, p = self.k, self.stride, self.pad
        if self.transposed:
            return tuple((i - 1) * s - 2 * p + k - 1 + self.opad + 1 for i in self.size)
        return tuple((i + 2 * p - k) // s + 1 for i in self.size)

    @property
    def w_shape(self) -> tuple[int, ...]:
        first, second = (self.cin, self.cout) if self.transposed else (self.cout, self.cin)
        return (first, second // self.groups, *(self.k,) * self.nd)

    @property
    def flops(self) -> float:
        """Twice the multiply-adds of the forward; dx and dw do as many."""
        positions = math.prod(self.size if self.transposed else self.out)
        return 2.0 * self.n * self.cout * (self.cin // self.groups) * self.k ** self.nd \
            * positions

    def args(self) -> tuple:
        nd = self.nd
        return ([self.cout], [self.stride] * nd, [self.pad] * nd, [1] * nd, self.transposed,
                [self.opad] * nd, self.groups)


LAYERS = [
    Layer("conv1d_c256_l1024_k3", 8, 256, 256, (1024,), 3, 1, 1),
    Layer("conv3d_c64_16x28x28_k3", 1, 64, 64, (16, 28, 28), 3, 1, 1),
    Layer("conv_transpose2d_up2_c128_c64_28", 2, 128, 64, (28, 28), 4, 2, 1, transposed=True),
    # examples/train_cnn.py's grouped layer: 2 input and 4 output channels per group
    Layer("grouped_conv2d_g4_c8_c16_8", 256, 8, 16, (8, 8), 3, 1, 1, groups=4),
    # MobileNet's depthwise layers as dsl.pytorch runs them (NCHW, one channel per group)
    Layer("depthwise_c64_56_k3", 8, 64, 64, (56, 56), 3, 1, 1, groups=64),
    Layer("depthwise_c144_56_k3s2", 8, 144, 144, (56, 56), 3, 2, 1, groups=144),
    Layer("depthwise_c192_28_k3s2", 8, 192, 192, (28, 28), 3, 2, 1, groups=192),
]


def _setup(layer: Layer, kind: str, dtype: str) -> Prepared:
    import tvm
    from tvm import te

    import targets
    from dsl.ops.convolution_backward import convolution_backward
    from dsl.runtime.schedule import walk

    tgt = targets.current()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((layer.n, layer.cin, *layer.size), dtype=np.float32)
    w = rng.standard_normal(layer.w_shape, dtype=np.float32)
    dy = rng.standard_normal((layer.n, layer.cout, *layer.out), dtype=np.float32)
    mask = [kind == "dx", kind == "dw", False]
    go_t = te.placeholder(dy.shape, name="grad_output", dtype=dtype)
    x_t = te.placeholder(x.shape, name="input", dtype=dtype)
    w_t = te.placeholder(w.shape, name="weight", dtype=dtype)
    outs = [t for t in convolution_backward(go_t, x_t, w_t, *layer.args(), mask) if
            t is not None]
    inputs, _ = walk(outs)  # the placeholders this gradient reads
    arrays = {"grad_output": dy, "input": x, "weight": w}
    kernel, seconds = fresh_build(outs, inputs, f"bench_{kind}_{layer.name}")
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(arrays[t.op.name].astype(dtype), dev) for t in inputs]
    args += [tvm.runtime.tensor(np.zeros([int(d) for d in o.shape], str(o.dtype)), dev)
             for o in outs]
    func = kernel.func

    peer = check = None
    torch = torch_peer(tgt.cores)
    if torch is not None:
        tdy, tx, tw = (torch.from_numpy(a) for a in (dy, x, w))

        def peer():
            return torch.ops.aten.convolution_backward(tdy, tx, tw, *layer.args(), mask)

        def check():
            func(*args)
            return rel_err(args[-1].numpy(), peer()[0 if kind == "dx" else 1].numpy())

    return Prepared(lambda: func(*args), peer, seconds,
                    {"rule": kernel.meta["schedule"]["rule"], "target": tgt.name,
                     "dtype": dtype}, check=check, tolerance=tolerance(dtype))


def _dtype() -> str:
    """Input dtype of our kernels (``DSL_BENCH_DTYPE``; the peer always runs float32)."""
    return os.environ.get("DSL_BENCH_DTYPE", "float32")


for _layer in LAYERS:
    for _kind in ("dx", "dw"):
        register(Workload(SUITE, _layer.name, _kind, _layer.flops,
                          lambda _l=_layer, _k=_kind: _setup(_l, _k, _dtype())))
