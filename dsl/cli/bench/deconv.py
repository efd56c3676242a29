"""The deconv suite: DeconvGradFilter (dw of an NHWC transposed convolution) against PyTorch.

Ours is the seed interface, ``fp_deconv_grad_filter_s`` (``hp_`` with ``--dtype float16``),
called with a core mask of the target's cores on 64-byte-aligned NHWC buffers (so the call
shares them with the kernel instead of copying); the time includes the parameter checks, the
kernel-cache lookup and the thread-pool setup of every call. The peer is the weight gradient
PyTorch's autograd computes for ``conv_transpose2d`` -- ``aten.convolution_backward`` with
``transposed=True`` and only the weight output requested -- on NCHW float32 tensors with
``torch.set_num_threads`` = our cores.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from dsl.cli.bench import Prepared, Workload, register, rel_err, tolerance, torch_peer

SUITE = "deconv"
KIND = "deconv_dw"


@dataclass(frozen=True)
class Layer:
    """A transposed conv: x ``(n, hw, hw, cin)`` -> y ``(n, out, out, cout)``, symmetric pad
    (the crop PyTorch's ``padding`` applies on both sides)."""

    name: str
    n: int
    cin: int
    cout: int
    hw: int
    k: int
    stride: int
    pad: int
    groups: int

    @property
    def out(self) -> int:
        return (self.hw - 1) * self.stride - 2 * self.pad + self.k

    def param(self) -> list[int]:
        n, s, p = self.n, self.stride, self.pad
        return [n, self.hw, self.hw, self.cin, n, self.out, self.out, self.cout, self.k, self.k,
                s, s, p, p, 1, 1, self.groups, 0]

    @property
    def flops(self) -> float:
        return 2.0 * self.n * self.hw * self.hw * self.k * self.k * self.cin \
            * (self.cout // self.groups)


LAYERS = [
    Layer("dcgan_up_28to56_c64_k4s2", 8, 64, 64, 28, 4, 2, 1, 1),
    Layer("grouped_g8_14to28_c256_k4s2", 8, 256, 256, 14, 4, 2, 1, 8),
]


def _dtype() -> str:
    return os.environ.get("DSL_BENCH_DTYPE", "float32")


def _setup(layer: Layer, dtype: str) -> Prepared:
    import targets
    from dsl.api import deconvgradfilter as api

    tgt = targets.current()
    cores = max(1, min(tgt.cores, targets.machine_cores()))
    mask = (1 << cores) - 1
    call = api.hp_deconv_grad_filter_s if dtype == "float16" else api.fp_deconv_grad_filter_s
    param = layer.param()
    geo = api.parse_param(param)
    rng = np.random.default_rng(0)
    x = api.aligned_empty(geo.x_shape, dtype)
    dy = api.aligned_empty(geo.dy_shape, dtype)
    dw = api.aligned_empty((geo.group, geo.ocg * geo.kernel_h * geo.kernel_w, geo.icg), dtype)
    x[...] = rng.standard_normal(geo.x_shape)
    dy[...] = rng.standard_normal(geo.dy_shape)

    old = os.environ.get("DSL_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="dsl-bench-") as tmp:
        os.environ["DSL_CACHE_DIR"] = tmp  # a fresh build, not a reused .so
        try:
            t0 = time.perf_counter()
            call(dy, x, dw, param, mask)
            seconds = time.perf_counter() - t0
            if tgt.cores > cores:  # a target of more cores than this machine's (``python
                api.kernel_for(geo, dtype, tgt.cores)  # -m dsl scaling``): built, not run
        finally:
            if old is None:
                os.environ.pop("DSL_CACHE_DIR", None)
            else:
                os.environ["DSL_CACHE_DIR"] = old

    meta = api.kernel_for(geo, dtype, cores).meta  # built above: a memory-cache hit
    info = {"target": tgt.name, "dtype": dtype, "cores": cores,
            "rule": meta["schedule"]["rule"], "kernel": meta["name"]}
    peer = check = None
    torch = torch_peer(cores)
    if torch is not None:
        tx = torch.from_numpy(np.asarray(x, np.float32)).permute(0, 3, 1, 2).contiguous()
        tdy = torch.from_numpy(np.asarray(dy, np.float32)).permute(0, 3, 1, 2).contiguous()
        w = torch.zeros(layer.cin, layer.cout // layer.groups, layer.k, layer.k)
        s, p = [layer.stride] * 2, [layer.pad] * 2

        def peer():
            return torch.ops.aten.convolution_backward(
                tdy, tx, w, None, s, p, [1, 1], True, [0, 0], layer.groups,
                [False, True, False])[1]

        def check():
            call(dy, x, dw, param, mask)
            gw = peer().numpy().reshape(geo.group, geo.icg, geo.ocg, layer.k, layer.k)
            return rel_err(dw, gw.transpose(0, 2, 3, 4, 1).reshape(dw.shape))

    return Prepared(lambda: call(dy, x, dw, param, mask), peer, seconds, info, check=check,
                    tolerance=tolerance(dtype))


for _layer in LAYERS:
    register(Workload(SUITE, _layer.name, KIND, _layer.flops,
                      lambda _l=_layer: _setup(_l, _dtype())))
