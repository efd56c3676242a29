"""The pool suite: avg_pool2d backward (seed 004) against PyTorch.

Two layers: the ResNet-style 3x3 stride-2 pad-1 pooling on 112x112x64, and the global-like
7x7 pooling on the 7x7x2048 head. Ours runs the kernel built with its default schedule on NCHW
(the layout PyTorch uses, so both sides read and write the same tensors; 5HD is the
``DSL_BENCH_POOL_LAYOUT=NC1HWC0`` variant); the peer is ``torch.ops.aten.avg_pool2d_backward``
on NCHW float32 with as many threads as our target uses.

FLOPs: one add per (dy element x window element), ``N*C*Ho*Wo*kH*kW``, plus one division per
dy element, ``N*C*Ho*Wo``. It counts the scatter definition's work; the gather-form kernel does
the same adds (plus zero adds where a stride does not divide the kernel).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from dsl.cli.bench import Prepared, Workload, fresh_build, register, rel_err, tolerance, torch_peer

SUITE = "pool"


@dataclass(frozen=True)
class PoolLayer:
    """A forward avg_pool2d in NCHW terms; ``hw`` is the square input size."""

    name: str
    n: int
    c: int
    hw: int
    k: int
    stride: int
    pad: int
    ceil_mode: bool = False
    count_include_pad: bool = True

    @property
    def out(self) -> int:
        from dsl.ops.avg_pool2d_backward import PoolAxis

        return PoolAxis.out_size(self.hw, self.k, self.stride, self.pad, self.ceil_mode)

    @property
    def flops(self) -> float:
        dy = self.n * self.c * self.out * self.out
        return float(dy * self.k * self.k + dy)

    def args(self) -> tuple:
        return ([self.k], [self.stride], [self.pad], self.ceil_mode, self.count_include_pad, 0)


LAYERS = [
    PoolLayer("avgpool_3x3_s2_p1_112x112x64", 1, 64, 112, 3, 2, 1),
    PoolLayer("avgpool_global_7x7_7x7x2048", 1, 2048, 7, 7, 1, 0),
]


def _setup(layer: PoolLayer, dtype: str, layout: str) -> Prepared:
    import tvm
    from tvm import te

    import targets
    from dsl.ops.avg_pool2d_backward import avg_pool2d_backward, avg_pool2d_backward_5hd
    from dsl.ops.layout import nc1hwc0_to_nchw, nchw_to_5hd

    tgt = targets.current()
    rng = np.random.default_rng(0)
    x_shape = (layer.n, layer.c, layer.hw, layer.hw)
    dy = rng.standard_normal((layer.n, layer.c, layer.out, layer.out), dtype=np.float32)
    five = layout == "NC1HWC0"
    dy_ours = nchw_to_5hd(dy) if five else dy
    x_ours = nchw_to_5hd(np.zeros(x_shape, np.float32)).shape if five else x_shape
    dy_t = te.placeholder(dy_ours.shape, name="grad_output", dtype=dtype)
    x_t = te.placeholder(x_ours, name="self", dtype=dtype)
    op = avg_pool2d_backward_5hd if five else avg_pool2d_backward
    dx_t = op(dy_t, x_t, *layer.args())
    kernel, seconds = fresh_build([dx_t], [dy_t], f"bench_pool_dx_{layer.name}")
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(dy_ours.astype(dtype), dev),
            tvm.runtime.tensor(np.zeros(x_ours, dtype), dev)]

    peer = check = None
    torch = torch_peer(tgt.cores)
    if torch is not None:
        tdy, tx = torch.from_numpy(dy), torch.zeros(x_shape)
        kernel_size, stride, padding = [layer.k] * 2, [layer.stride] * 2, [layer.pad] * 2

        def peer():
            return torch.ops.aten.avg_pool2d_backward(tdy, tx, kernel_size, stride, padding,
                                                      layer.ceil_mode,
                                                      layer.count_include_pad, None)

        def check():
            func(*args)
            ours = args[-1].numpy()
            return rel_err(nc1hwc0_to_nchw(ours, layer.c) if five else ours, peer().numpy())

    func = kernel.func
    return Prepared(lambda: func(*args), peer, seconds,
                    {"rule": kernel.meta["schedule"]["rule"], "target": tgt.name,
                     "dtype": dtype, "layout": layout}, check=check,
                    tolerance=tolerance(dtype))


def _dtype() -> str:
    """Input dtype of our kernels (``DSL_BENCH_DTYPE``; the peer always runs float32)."""
    return os.environ.get("DSL_BENCH_DTYPE", "float32")


def _layout() -> str:
    return os.environ.get("DSL_BENCH_POOL_LAYOUT", "NCHW")


for _layer in LAYERS:
    register(Workload(SUITE, _layer.name, "pool_dx", _layer.flops,
                      lambda _l=_layer: _setup(_l, _dtype(), _layout())))
