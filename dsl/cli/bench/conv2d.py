"""The conv2d suite: dx and dw of ten ResNet / ResNeXt / MobileNet layers against PyTorch.

Each layer registers a ``dx`` and a ``dw`` row. Ours runs the kernel built with its default
schedule on the 5HD / FracZ layouts (conversion is outside the timed call, as in a framework
that keeps tensors in those layouts); the peer is ``torch.nn.grad.conv2d_input`` /
``conv2d_weight`` on NCHW float32 with as many threads as our target uses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from dsl.cli.bench import Prepared, Workload, fresh_build, register, rel_err, tolerance, torch_peer

SUITE = "conv2d"


@dataclass(frozen=True)
class Layer:
    """A forward conv2d in NCHW terms; ``hw`` is the square input size."""

    name: str
    n: int
    cin: int
    cout: int
    hw: int
    k: int
    stride: int
    pad: int
    dil: int
    groups: int

    @property
    def out(self) -> int:
        return (self.hw + 2 * self.pad - ((self.k - 1) * self.dil + 1)) // self.stride + 1

    @property
    def flops(self) -> float:
        """Multiply-adds of the forward conv, times two; dx and dw do the same number."""
        return 2.0 * self.n * self.cout * (self.cin // self.groups) * self.k * self.k \
            * self.out * self.out

    def w_shape(self) -> tuple[int, int, int, int]:
        return (self.cout, self.cin // self.groups, self.k, self.k)

    def para(self, **extra) -> dict:
        p = self.pad
        return {"strides": [self.stride] * 2, "padding": [p, p, p, p],
                "dilations": [1, 1, self.dil, self.dil], **extra}


LAYERS = [
    Layer("resnet50_3x3", 1, 64, 64, 56, 3, 1, 1, 1, 1),
    Layer("resnet50_3x3_s2", 1, 128, 128, 56, 3, 2, 1, 1, 1),
    Layer("resnet50_1x1", 1, 256, 64, 56, 1, 1, 0, 1, 1),
    Layer("resnet50_1x1_s2_proj", 1, 256, 512, 56, 1, 2, 0, 1, 1),
    Layer("resnet50_stem_7x7_s2", 1, 3, 64, 224, 7, 2, 3, 1, 1),
    Layer("batch8_3x3", 8, 256, 256, 14, 3, 1, 1, 1, 1),
    Layer("resnext_grouped_g32", 1, 128, 128, 56, 3, 1, 1, 1, 32),
    Layer("mobilenet_dw_s1", 1, 144, 144, 56, 3, 1, 1, 1, 144),
    Layer("mobilenet_dw_s2", 1, 144, 144, 56, 3, 2, 1, 1, 144),
    Layer("dilated_d2", 1, 128, 128, 32, 3, 1, 2, 2, 1),
]




def _peer_args(layer: Layer):
    return {"stride": layer.stride, "padding": layer.pad, "dilation": layer.dil,
            "groups": layer.groups}


def _setup_dx(layer: Layer, dtype: str) -> Prepared:
    import tvm
    from tvm import te

    from dsl.ops.conv2d_backprop_input import conv2d_backprop_input
    from dsl.ops.group import GroupLayout
    from dsl.ops.layout import nchw_to_5hd, weight_to_fracz

    rng = np.random.default_rng(0)
    ho = layer.out
    dy = rng.standard_normal((layer.n, layer.cout, ho, ho), dtype=np.float32)
    w = rng.standard_normal(layer.w_shape(), dtype=np.float32)
    fz_shape = GroupLayout.from_weight(layer.w_shape(), layer.groups).fracz_shape
    dy_t = te.placeholder((layer.n, -(-layer.cout // 16), ho, ho, 16), name="out_backprop",
                          dtype=dtype)
    w_t = te.placeholder(fz_shape, name="filters", dtype=dtype)
    dx_t = conv2d_backprop_input(w_t, dy_t, layer.w_shape(),
                                 (layer.n, layer.cin, layer.hw, layer.hw),
                                 layer.para(res_dtype="float32"))
    kernel, seconds = fresh_build([dx_t], [w_t, dy_t], f"bench_dx_{layer.name}")
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(weight_to_fracz(w, layer.groups).astype(dtype), dev),
            tvm.runtime.tensor(nchw_to_5hd(dy).astype(dtype), dev),
            tvm.runtime.tensor(np.zeros([int(d) for d in dx_t.shape], "float32"), dev)]

    return _dx_prepared(layer, kernel, seconds, args, (dy, w), dtype)


def _dx_prepared(layer: Layer, kernel, seconds: float, args, dy_w, dtype: str) -> Prepared:
    """A dx row: ``kernel`` on ``args`` against PyTorch's float32 dx of the NCHW ``dy_w``
    (which also checks the result) when PyTorch is installed."""
    import targets
    from dsl.ops.layout import nc1hwc0_to_nchw

    tgt = targets.current()
    func, meta = kernel.func, kernel.meta
    torch = torch_peer(tgt.cores)
    peer = check = None
    if torch is not None:
        tdy, tw = (torch.from_numpy(a.astype(np.float32)) for a in dy_w)
        size = (layer.n, layer.cin, layer.hw, layer.hw)
        kw = _peer_args(layer)

        def peer():
            return torch.nn.grad.conv2d_input(size, tw, tdy, **kw)

        def check():
            func(*args)
            return rel_err(nc1hwc0_to_nchw(args[-1].numpy(), layer.cin), peer().numpy())

    return Prepared(lambda: func(*args), peer, seconds,
                    {"rule": meta["schedule"]["rule"], "target": tgt.name, "dtype": dtype},
                    check=check, tolerance=tolerance(dtype))


def _setup_dx_int8(layer: Layer) -> Prepared:
    """int8 dx (TBE's quantised dx: int8 dy in 5HD C0 = 32, the int8 dx FracZ, int32 result;
    ``offset_x`` 0); the peer is PyTorch's float32 dx of the same integers, which also checks
    the result (exact up to fp32 rounding of the peer's sums)."""
    import tvm
    from tvm import te

    from dsl.ops.conv2d_backprop_input import conv2d_backprop_input
    from dsl.ops.group import Int8DxLayout
    from dsl.ops.layout import nchw_to_5hd, weight_to_fracz

    rng = np.random.default_rng(0)
    ho = layer.out
    dy = rng.integers(-128, 128, (layer.n, layer.cout, ho, ho)).astype(np.int8)
    w = rng.integers(-128, 128, layer.w_shape()).astype(np.int8)
    fz_shape = Int8DxLayout.from_weight(layer.w_shape(), layer.groups).fracz_shape
    dy_t = te.placeholder((layer.n, -(-layer.cout // 32), ho, ho, 32), name="out_backprop",
                          dtype="int8")
    w_t = te.placeholder(fz_shape, name="filters", dtype="int8")
    dx_t = conv2d_backprop_input(w_t, dy_t, layer.w_shape(),
                                 (layer.n, layer.cin, layer.hw, layer.hw),
                                 layer.para(res_dtype="int32", groups=layer.groups))
    kernel, seconds = fresh_build([dx_t], [w_t, dy_t], f"bench_dx8_{layer.name}")
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(weight_to_fracz(w, layer.groups), dev),
            tvm.runtime.tensor(nchw_to_5hd(dy), dev),
            tvm.runtime.tensor(np.zeros([int(d) for d in dx_t.shape], "int32"), dev)]

    return _dx_prepared(layer, kernel, seconds, args, (dy, w), "int8")


def _setup_dw(layer: Layer, dtype: str) -> Prepared:
    import tvm
    from tvm import te

    import targets
    from dsl.ops.conv2d_backprop_filter import conv2d_backprop_filter
    from dsl.ops.group import GroupLayout
    from dsl.ops.layout import fracz_to_weight, nchw_to_5hd

    tgt = targets.current()
    rng = np.random.default_rng(0)
    ho = layer.out
    x = rng.standard_normal((layer.n, layer.cin, layer.hw, layer.hw), dtype=np.float32)
    dy = rng.standard_normal((layer.n, layer.cout, ho, ho), dtype=np.float32)
    x_t = te.placeholder((layer.n, -(-layer.cin // 16), layer.hw, layer.hw, 16), name="fmap",
                         dtype=dtype)
    dy_t = te.placeholder((layer.n, -(-layer.cout // 16), ho, ho, 16), name="out_backprop",
                          dtype=dtype)
    dw_t = conv2d_backprop_filter(x_t, dy_t, layer.w_shape(),
                                      layer.para(res_dtype="float32", groups=layer.groups))
    kernel, seconds = fresh_build([dw_t], [x_t, dy_t], f"bench_dw_{layer.name}")
    func, meta = kernel.func, kernel.meta
    dev = tvm.cpu()
    fz_shape = GroupLayout.from_weight(layer.w_shape(), layer.groups).fracz_shape
    args = [tvm.runtime.tensor(nchw_to_5hd(x).astype(dtype), dev),
            tvm.runtime.tensor(nchw_to_5hd(dy).astype(dtype), dev),
            tvm.runtime.tensor(np.zeros(fz_shape, "float32"), dev)]

    torch = torch_peer(tgt.cores)
    peer = check = None
    if torch is not None:
        tx, tdy = torch.from_numpy(x), torch.from_numpy(dy)
        kw = _peer_args(layer)

        def peer():
            return torch.nn.grad.conv2d_weight(tx, layer.w_shape(), tdy, **kw)

        def check():
            func(*args)
            ours = fracz_to_weight(args[-1].numpy(), layer.w_shape(), layer.groups)
            return rel_err(ours, peer().numpy())

    return Prepared(lambda: func(*args), peer, seconds,
                    {"rule": meta["schedule"]["rule"], "target": tgt.name, "dtype": dtype},
                    check=check, tolerance=tolerance(dtype))


def _dtype() -> str:
    """Input dtype of our kernels (``DSL_BENCH_DTYPE``; the peer always runs float32)."""
    return os.environ.get("DSL_BENCH_DTYPE", "float32")


def _dx(layer: Layer) -> Prepared:
    dtype = _dtype()
    return _setup_dx_int8(layer) if dtype == "int8" else _setup_dx(layer, dtype)


def _dw(layer: Layer) -> Prepared:
    dtype = _dtype()
    if dtype == "int8":
        raise ValueError("no int8 dw: TBE's conv2d_backprop_filter takes float16, float32 "
                         "or bfloat16")
    return _setup_dw(layer, dtype)


for _layer in LAYERS:
    register(Workload(SUITE, _layer.name, "dx", _layer.flops, lambda _l=_layer: _dx(_l)))
    register(Workload(SUITE, _layer.name, "dw", _layer.flops, lambda _l=_layer: _dw(_l),
                      dtypes=("float32", "float16", "bfloat16")))
