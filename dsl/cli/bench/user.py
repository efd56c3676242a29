"""The user suite: kernels a user writes in TE or TBE's vector DSL, and epilogues / prologues a
user fuses onto the shipped operators, each against numpy and PyTorch in the same run.

Every kernel here is written the way a user writes it: plain ``te.compute`` (named, *untagged*:
users do not tag their stages, so the pattern rules must recognise what a stage is) or the
vector DSL (``dsl.vexp``, ``dsl.reduce_sum`` ...), then ``auto_schedule`` -> ``build`` with the
default schedule, no tuning. Rows:

* compute-bound (GFLOP/s): matmul 1024^3, batched matmul 16x256^3, GEMM + bias + GELU, an NCHW
  conv2d forward with its own padding stage (strided, grouped, depthwise too), a strided
  conv2d's input gradient over a zero-inserted dy; ``conv2d_backprop_input`` + residual +
  ReLU-gradient mask, ``conv2d_backprop_filter`` * scale cast to fp16, and a scale + fp16 cast
  prologue of dy before ``conv2d_backprop_input`` (each also timed against the plain shipped
  operator, the "plain" peer: a fused stage should cost nothing);
* memory-bound (GB/s: the bytes one call must read and write at least): softmax over rows of
  1024 and 4096 (the larger exceeds L2 and L3), layer-norm, RMS-norm, an exp/mul/add chain over
  2^24 elements, a pixel shuffle, a batch-norm gradient's per-channel sums.

The main peer is PyTorch (numpy when PyTorch is absent); numpy (and the plain operator) are
further peers. Every row is checked against the main peer at full size. ``DSL_BENCH_USER_SIZE=
tiny`` (or :func:`workloads` ``("tiny")``) runs the same kernels at tiny sizes, for tests.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dsl.cli.bench import Prepared, Workload, fresh_build, register, rel_err, torch_peer

SUITE = "user"
F32 = 4  # bytes


@dataclass
class Case:
    """One user kernel: its TE graph, input data, and the peers computing the same result."""

    inputs: list
    outputs: list
    arrays: list  # numpy inputs, in ``inputs`` order
    torch_fn: Callable | None  # torch_fn(torch) -> a callable returning the torch result
    numpy_fn: Callable[[], np.ndarray] | None
    to_peer: Callable[[np.ndarray], np.ndarray] = lambda a: a  # ours -> the peer's layout
    extra: dict = field(default_factory=dict)  # further peers timed alongside ({"plain": fn})
    tolerance: float = 1e-3


@dataclass(frozen=True)
class Spec:
    name: str
    kind: str
    dims: dict  # {"full": {...}, "tiny": {...}}
    make: Callable[[dict], Case]
    flops: Callable[[dict], float]
    bytes: Callable[[dict], float] = lambda d: 0.0


def _size() -> str:
    return os.environ.get("DSL_BENCH_USER_SIZE", "full")


def _data(shape, seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * scale)


def prepare(spec: Spec, size: str) -> Prepared:
    """Build our kernel for ``spec`` at ``size`` and wire the peers and the full-size check."""
    import tvm

    import targets

    case = spec.make(spec.dims[size])
    kernel, seconds = fresh_build(case.outputs, case.inputs, f"bench_user_{spec.name}")
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in case.arrays] + [
        tvm.runtime.tensor(np.zeros([int(d) for d in t.shape], str(t.dtype)), dev)
        for t in case.outputs]
    func = kernel.func
    torch = torch_peer(targets.current().cores)
    peer = case.torch_fn(torch) if torch is not None and case.torch_fn else case.numpy_fn
    peers = dict(case.extra)
    if peer is not case.numpy_fn and case.numpy_fn is not None:
        peers = {"numpy": case.numpy_fn, **peers}

    def result(x):
        return x.numpy() if hasattr(x, "numpy") else np.asarray(x)

    def check():
        func(*args)
        ours = case.to_peer(args[-1].numpy()).astype(np.float64)
        return max(rel_err(ours, result(p())) for p in [peer, *(
            [case.numpy_fn] if case.numpy_fn is not None else [])])

    return Prepared(lambda: func(*args), peer, seconds,
                    {"rule": kernel.meta["schedule"]["rule"], "target": targets.current().name,
                     "dtype": "float32", "size": size}, check=check,
                    tolerance=case.tolerance, peers=peers)


# --- contractions -------------------------------------------------------------------------


def _torch_matmul(x, y):
    def torch_fn(torch):
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        return lambda: torch.matmul(tx, ty)

    return torch_fn


def _matmul(d) -> Case:
    from tvm import te

    m, n, k = d["m"], d["n"], d["k"]
    a, b = te.placeholder((m, k), name="a"), te.placeholder((k, n), name="b")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="matmul")
    x, y = _data((m, k), 1), _data((k, n), 2)
    return Case([a, b], [c], [x, y], _torch_matmul(x, y), lambda: x @ y)


def _bmm(d) -> Case:
    from tvm import te

    bs, m, n, k = d["b"], d["m"], d["n"], d["k"]
    a, b = te.placeholder((bs, m, k), name="a"), te.placeholder((bs, k, n), name="b")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((bs, m, n), lambda p, i, j: te.sum(a[p, i, r] * b[p, r, j], axis=r),
                   name="batch_matmul")
    x, y = _data((bs, m, k), 3), _data((bs, k, n), 4)
    return Case([a, b], [c], [x, y], _torch_matmul(x, y), lambda: np.matmul(x, y))


def _gelu_np(v):
    return 0.5 * v * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


def _gemm_bias_gelu(d) -> Case:
    from tvm import te

    m, n, k = d["m"], d["n"], d["k"]
    a, b = te.placeholder((m, k), name="a"), te.placeholder((k, n), name="b")
    bias = te.placeholder((n,), name="bias")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="gemm")
    s = math.sqrt(2 / math.pi)

    def gelu(i, j):
        v = c[i, j] + bias[j]
        return 0.5 * v * (1.0 + te.tanh(s * (v + 0.044715 * v * v * v)))

    y = te.compute((m, n), gelu, name="bias_gelu")
    xa, xb, xbias = _data((m, k), 5), _data((k, n), 6), _data((n,), 7)

    def torch_fn(torch):
        ta, tb, tbias = (torch.from_numpy(v) for v in (xa, xb, xbias))
        return lambda: torch.nn.functional.gelu(torch.addmm(tbias, ta, tb), approximate="tanh")

    return Case([a, b, bias], [y], [xa, xb, xbias], torch_fn,
                lambda: _gelu_np(xa @ xb + xbias))


def _nchw_pad(x, p: int):
    """``x`` (NCHW) zero-padded by ``p`` on each side of H and W, as a user writes it."""
    from tvm import te

    n, c, h, w = (int(d) for d in x.shape)
    return te.compute((n, c, h + 2 * p, w + 2 * p), lambda b, ci, i, j: te.if_then_else(
        te.all(i >= p, i < h + p, j >= p, j < w + p), x[b, ci, i - p, j - p], 0.0),
        name="pad")


def _conv2d_fwd(d) -> Case:
    from tvm import te

    n, c, k, hw, ks, p = d["n"], d["c"], d["k"], d["hw"], d["ks"], d["pad"]
    st, g = d.get("stride", 1), d.get("groups", 1)
    cg, kg = c // g, k // g
    out = _conv_out(d)
    x = te.placeholder((n, c, hw, hw), name="x")
    w = te.placeholder((k, cg, ks, ks), name="w")
    xp = _nchw_pad(x, p)
    rc, ry, rx = (te.reduce_axis((0, e), name=nm) for e, nm in ((cg, "rc"), (ks, "ry"),
                                                                (ks, "rx")))

    def channel(co, rc):  # the input channel output channel co reads (its group's rc-th)
        return co // kg * cg + rc if g > 1 else rc

    y = te.compute((n, k, out, out), lambda b, co, h, v: te.sum(
        xp[b, channel(co, rc), h * st + ry, v * st + rx] * w[co, rc, ry, rx],
        axis=[rc, ry, rx]), name="conv2d")
    xv, wv = _data((n, c, hw, hw), 8), _data((k, cg, ks, ks), 9)

    def numpy_fn():
        win = np.lib.stride_tricks.sliding_window_view(
            np.pad(xv, ((0, 0), (0, 0), (p, p), (p, p))), (ks, ks), axis=(2, 3))
        win = win[:, :, ::st, ::st]
        return np.concatenate([np.tensordot(win[:, i * cg:(i + 1) * cg], wv[i * kg:(i + 1) * kg],
                                            axes=([1, 4, 5], [1, 2, 3])) for i in range(g)],
                              axis=-1).transpose(0, 3, 1, 2)

    def torch_fn(torch):
        tx, tw = torch.from_numpy(xv), torch.from_numpy(wv)
        return lambda: torch.nn.functional.conv2d(tx, tw, stride=st, padding=p, groups=g)

    return Case([x, w], [y], [xv, wv], torch_fn, numpy_fn)


def _grouped_nhwc_fwd(d) -> Case:
    """A grouped NHWC conv2d as a user writes it (weights ``[ks, ks, c / groups, k]``): the
    output channels innermost, read by the input by group."""
    from tvm import te

    n, c, k, hw, ks, p, g = d["n"], d["c"], d["k"], d["hw"], d["ks"], d["pad"], d["groups"]
    cg, kg = c // g, k // g
    out = _conv_out(d)
    x = te.placeholder((n, hw, hw, c), name="x")
    w = te.placeholder((ks, ks, cg, k), name="w")
    xp = te.compute((n, hw + 2 * p, hw + 2 * p, c), lambda b, i, j, ci: te.if_then_else(
        te.all(i >= p, i < hw + p, j >= p, j < hw + p), x[b, i - p, j - p, ci], 0.0),
        name="pad")
    ry, rx, rc = (te.reduce_axis((0, e), name=nm) for e, nm in ((ks, "ry"), (ks, "rx"),
                                                                (cg, "rc")))
    y = te.compute((n, out, out, k), lambda b, i, j, o: te.sum(
        xp[b, i + ry, j + rx, o // kg * cg + rc] * w[ry, rx, rc, o], axis=[ry, rx, rc]),
        name="conv2d_nhwc")
    xv, wv = _data((n, hw, hw, c), 16), _data((ks, ks, cg, k), 17)

    def numpy_fn():
        win = np.lib.stride_tricks.sliding_window_view(
            np.pad(xv, ((0, 0), (p, p), (p, p), (0, 0))), (ks, ks), axis=(1, 2))
        return np.concatenate([np.einsum("nhwcij,ijco->nhwo", win[..., i * cg:(i + 1) * cg,
                                                                  :, :],
                                         wv[..., i * kg:(i + 1) * kg]) for i in range(g)],
                              axis=-1)

    def torch_fn(torch):
        tx = torch.from_numpy(xv).permute(0, 3, 1, 2)
        tw = torch.from_numpy(wv).permute(3, 2, 0, 1)
        return lambda: torch.nn.functional.conv2d(tx, tw, padding=p, groups=g).permute(
            0, 2, 3, 1)

    return Case([x, w], [y], [xv, wv], torch_fn, numpy_fn)


def _depthwise_fwd(d) -> Case:
    """A depthwise NCHW conv2d (one channel a group) as a user writes it: a window sum."""
    from tvm import te

    n, c, hw, ks, p = d["n"], d["c"], d["hw"], d["ks"], d["pad"]
    out = hw + 2 * p - ks + 1
    x = te.placeholder((n, c, hw, hw), name="x")
    w = te.placeholder((c, 1, ks, ks), name="w")
    xp = _nchw_pad(x, p)
    ry, rx = te.reduce_axis((0, ks), name="ry"), te.reduce_axis((0, ks), name="rx")
    y = te.compute((n, c, out, out), lambda b, ci, h, v: te.sum(
        xp[b, ci, h + ry, v + rx] * w[ci, 0, ry, rx], axis=[ry, rx]), name="depthwise")
    xv, wv = _data((n, c, hw, hw), 10), _data((c, 1, ks, ks), 11)

    def numpy_fn():
        win = np.lib.stride_tricks.sliding_window_view(
            np.pad(xv, ((0, 0), (0, 0), (p, p), (p, p))), (ks, ks), axis=(2, 3))
        return np.einsum("nchwij,cij->nchw", win, wv[:, 0])

    def torch_fn(torch):
        tx, tw = torch.from_numpy(xv), torch.from_numpy(wv)
        return lambda: torch.nn.functional.conv2d(tx, tw, padding=p, groups=c)

    return Case([x, w], [y], [xv, wv], torch_fn, numpy_fn)


def _depthwise_nhwc(d) -> Case:
    """A depthwise NHWC conv2d as a user writes it (MobileNet in channels-last): ``y[b, h, v,
    c] = sum_{ry, rx} xp[b, s h + ry, s v + rx, c] * w[ry, rx, c]``; PyTorch's peer runs
    the same memory (a channels-last view)."""
    from tvm import te

    n, c, hw, ks, p, st = d["n"], d["c"], d["hw"], d["ks"], d["pad"], d["stride"]
    out = _conv_out(d)
    x = te.placeholder((n, hw, hw, c), name="x")
    w = te.placeholder((ks, ks, c), name="w")
    xp = te.compute((n, hw + 2 * p, hw + 2 * p, c), lambda b, i, j, ci: te.if_then_else(
        te.all(i >= p, i < hw + p, j >= p, j < hw + p), x[b, i - p, j - p, ci], 0.0),
        name="pad")
    ry, rx = te.reduce_axis((0, ks), name="ry"), te.reduce_axis((0, ks), name="rx")
    y = te.compute((n, out, out, c), lambda b, h, v, ci: te.sum(
        xp[b, st * h + ry, st * v + rx, ci] * w[ry, rx, ci], axis=[ry, rx]), name="depthwise")
    xv, wv = _data((n, hw, hw, c), 14), _data((ks, ks, c), 15)

    def numpy_fn():
        win = np.lib.stride_tricks.sliding_window_view(
            np.pad(xv, ((0, 0), (p, p), (p, p), (0, 0))), (ks, ks), axis=(1, 2))
        return np.einsum("nhwcij,ijc->nhwc", win[:, ::st, ::st], wv)

    def torch_fn(torch):
        tx = torch.from_numpy(xv).permute(0, 3, 1, 2)
        tw = torch.from_numpy(wv).permute(2, 0, 1)[:, None]
        return lambda: torch.nn.functional.conv2d(tx, tw, stride=st, padding=p,
                                                  groups=c).permute(0, 2, 3, 1)

    return Case([x, w], [y], [xv, wv], torch_fn, numpy_fn)


def _strided_dx(d) -> Case:
    """The input gradient of a strided NCHW conv2d as a user (or topi's conv2d_transpose)
    writes it: dy zero-inserted and padded in one stage, convolved with the flipped weights
    (the stride phases split apart by :mod:`schedules.patterns.phases`)."""
    from tvm import te

    n, c, k, hw, ks, p, st = (d[key] for key in ("n", "c", "k", "hw", "ks", "pad", "stride"))
    out = _conv_out(d)
    dy = te.placeholder((n, k, out, out), name="dy")
    w = te.placeholder((k, c, ks, ks), name="w")
    q, size = ks - 1 - p, hw + ks - 1
    last = q + st * (out - 1)
    dil = te.compute((n, k, size, size), lambda b, o, i, j: te.if_then_else(te.all(
        i >= q, i <= last, j >= q, j <= last, (i - q) % st == 0, (j - q) % st == 0),
        dy[b, o, (i - q) // st, (j - q) // st], 0.0), name="dy_dilated")
    rk, ry, rx = (te.reduce_axis((0, e), name=nm) for e, nm in ((k, "rk"), (ks, "ry"),
                                                                (ks, "rx")))
    dx = te.compute((n, c, hw, hw), lambda b, ci, i, j: te.sum(
        dil[b, rk, i + ry, j + rx] * w[rk, ci, ks - 1 - ry, ks - 1 - rx], axis=[rk, ry, rx]),
        name="dx")
    dyv, wv = _data((n, k, out, out), 18), _data((k, c, ks, ks), 19)

    def numpy_fn():
        canvas = np.zeros((n, c, st * (out - 1) + ks, st * (out - 1) + ks), np.float32)
        for i in range(ks):
            for j in range(ks):
                canvas[:, :, i:i + st * (out - 1) + 1:st, j:j + st * (out - 1) + 1:st] += \
                    np.einsum("nkhw,kc->nchw", dyv, wv[:, :, i, j])
        return canvas[:, :, p:p + hw, p:p + hw]

    def torch_fn(torch):
        tdy, tw = torch.from_numpy(dyv), torch.from_numpy(wv)
        return lambda: torch.nn.grad.conv2d_input((n, c, hw, hw), tw, tdy, stride=st, padding=p)

    return Case([dy, w], [dx], [dyv, wv], torch_fn, numpy_fn)


def _nchw_dw(d) -> Case:
    """The weight gradient of an NCHW conv2d as a user writes it: ``dw[o, i, ry, rx] = sum
    dy[n, o, h, w] * xpad[n, i, h * s + ry, w * s + rx]`` (the tile's positions along the
    input channels, :func:`schedules.patterns.contraction._positions_axis`)."""
    from tvm import te

    n, c, k, hw, ks, p = d["n"], d["c"], d["k"], d["hw"], d["ks"], d["pad"]
    st, out = d.get("stride", 1), _conv_out(d)
    dy = te.placeholder((n, k, out, out), name="dy")
    x = te.placeholder((n, c, hw, hw), name="x")
    xp = _nchw_pad(x, p)
    rb, rh, rw = (te.reduce_axis((0, e), name=nm) for e, nm in ((n, "rb"), (out, "rh"),
                                                                (out, "rw")))
    dw = te.compute((k, c, ks, ks), lambda o, i, ry, rx: te.sum(
        dy[rb, o, rh, rw] * xp[rb, i, rh * st + ry, rw * st + rx], axis=[rb, rh, rw]),
        name="dw")
    dyv, xv = _data((n, k, out, out), 20), _data((n, c, hw, hw), 21)

    def numpy_fn():
        win = np.lib.stride_tricks.sliding_window_view(
            np.pad(xv, ((0, 0), (0, 0), (p, p), (p, p))), (ks, ks), axis=(2, 3))
        return np.tensordot(dyv, win[:, :, ::st, ::st], axes=([0, 2, 3], [0, 2, 3]))

    def torch_fn(torch):
        tdy, tx = torch.from_numpy(dyv), torch.from_numpy(xv)
        return lambda: torch.nn.grad.conv2d_weight(tx, (k, c, ks, ks), tdy, stride=st,
                                                   padding=p)

    return Case([dy, x], [dw], [dyv, xv], torch_fn, numpy_fn)


def _conv_out(d) -> int:
    return (d["hw"] + 2 * d["pad"] - d["ks"]) // d.get("stride", 1) + 1


def _conv_flops(d) -> float:
    return 2.0 * d["n"] * d["k"] * d["c"] // d.get("groups", 1) * d["ks"] ** 2 * _conv_out(d) ** 2


# --- memory-bound rows (vector DSL and plain TE) -------------------------------------------


def _softmax(d) -> Case:
    from dsl.compat import tvm
    from dsl.ops import vector as vec

    rows, cols = d["rows"], d["cols"]
    x = tvm.placeholder((rows, cols), name="x", dtype="float32")
    m = vec.broadcast(vec.reduce_max(x, -1, keepdims=True), (rows, cols))
    e = vec.vexp(vec.vsub(x, m))
    y = vec.vdiv(e, vec.broadcast(vec.reduce_sum(e, -1, keepdims=True), (rows, cols)))
    xv = _data((rows, cols), 10, 3.0)

    def numpy_fn():
        ev = np.exp(xv - xv.max(-1, keepdims=True))
        return ev / ev.sum(-1, keepdims=True)

    def torch_fn(torch):
        tx = torch.from_numpy(xv)
        return lambda: torch.softmax(tx, -1)

    return Case([x], [y], [xv], torch_fn, numpy_fn)


def _softmax_channels(d) -> Case:
    """A softmax over the channels of NCHW (a segmentation head's classes) in TBE's vector
    DSL: the reductions kept with ``keepdims`` and broadcast back."""
    from dsl.compat import tvm
    from dsl.ops import vector as vec

    shape = (d["n"], d["c"], d["hw"], d["hw"])
    x = tvm.placeholder(shape, name="x", dtype="float32")
    m = vec.broadcast(vec.reduce_max(x, 1, keepdims=True), shape)
    e = vec.vexp(vec.vsub(x, m))
    y = vec.vdiv(e, vec.broadcast(vec.reduce_sum(e, 1, keepdims=True), shape))
    xv = _data(shape, 12, 3.0)

    def numpy_fn():
        ev = np.exp(xv - xv.max(1, keepdims=True))
        return ev / ev.sum(1, keepdims=True)

    def torch_fn(torch):
        tx = torch.from_numpy(xv)
        return lambda: torch.softmax(tx, 1)

    return Case([x], [y], [xv], torch_fn, numpy_fn)


def _layer_norm(d) -> Case:
    from tvm import te

    rows, cols, eps = d["rows"], d["cols"], 1e-5
    x = te.placeholder((rows, cols), name="x")
    g, b = te.placeholder((cols,), name="gamma"), te.placeholder((cols,), name="beta")
    r1, r2 = te.reduce_axis((0, cols), name="r1"), te.reduce_axis((0, cols), name="r2")
    s = te.compute((rows,), lambda i: te.sum(x[i, r1], axis=r1), name="row_sum")
    mean = te.compute((rows,), lambda i: s[i] / cols, name="mean")
    var = te.compute((rows,), lambda i: te.sum((x[i, r2] - mean[i]) * (x[i, r2] - mean[i]),
                                               axis=r2), name="sq_dev")
    y = te.compute((rows, cols), lambda i, j: (x[i, j] - mean[i]) * te.rsqrt(
        var[i] / cols + eps) * g[j] + b[j], name="layer_norm")
    xv, gv, bv = _data((rows, cols), 11, 2.0) + 1.0, _data((cols,), 12), _data((cols,), 13)

    def numpy_fn():
        mu = xv.mean(-1, keepdims=True)
        return (xv - mu) / np.sqrt(((xv - mu) ** 2).mean(-1, keepdims=True) + eps) * gv + bv

    def torch_fn(torch):
        tx, tg, tb = (torch.from_numpy(v) for v in (xv, gv, bv))
        return lambda: torch.nn.functional.layer_norm(tx, (cols,), tg, tb, eps)

    return Case([x, g, b], [y], [xv, gv, bv], torch_fn, numpy_fn)


def _rms_norm(d) -> Case:
    from tvm import te

    rows, cols, eps = d["rows"], d["cols"], 1e-6
    x, w = te.placeholder((rows, cols), name="x"), te.placeholder((cols,), name="weight")
    r = te.reduce_axis((0, cols), name="r")
    ss = te.compute((rows,), lambda i: te.sum(x[i, r] * x[i, r], axis=r), name="sum_sq")
    y = te.compute((rows, cols), lambda i, j: x[i, j] * te.rsqrt(ss[i] / cols + eps) * w[j],
                   name="rms_norm")
    xv, wv = _data((rows, cols), 14), _data((cols,), 15)

    def numpy_fn():
        return xv / np.sqrt((xv * xv).mean(-1, keepdims=True) + eps) * wv

    def torch_fn(torch):
        tx, tw = torch.from_numpy(xv), torch.from_numpy(wv)
        return lambda: torch.nn.functional.rms_norm(tx, (cols,), tw, eps)

    return Case([x, w], [y], [xv, wv], torch_fn, numpy_fn)


def _pixel_shuffle(d) -> Case:
    """A pixel shuffle (depth to space) as a user writes it: one gather stage."""
    from tvm import te

    n, c, hw, r = d["n"], d["c"], d["hw"], d["r"]
    x = te.placeholder((n, c * r * r, hw, hw), name="x")
    y = te.compute((n, c, hw * r, hw * r), lambda b, ci, i, j: x[
        b, ci * r * r + i % r * r + j % r, i // r, j // r], name="pixel_shuffle")
    xv = _data((n, c * r * r, hw, hw), 20)

    def numpy_fn():
        return xv.reshape(n, c, r, r, hw, hw).transpose(0, 1, 4, 2, 5, 3).reshape(
            n, c, hw * r, hw * r)

    def torch_fn(torch):
        tx = torch.from_numpy(xv)
        return lambda: torch.nn.functional.pixel_shuffle(tx, r).contiguous()

    return Case([x], [y], [xv], torch_fn, numpy_fn)


def _nhwc_to_nchw(d) -> Case:
    """NHWC -> NCHW as a user writes it, ``y[n, c, h, w] = x[n, h, w, c]``: a transpose of
    each image's pixels by channels (patterns.transpose)."""
    from tvm import te

    n, c, hw = d["n"], d["c"], d["hw"]
    x = te.placeholder((n, hw, hw, c), name="x")
    y = te.compute((n, c, hw, hw), lambda b, ci, i, j: x[b, i, j, ci], name="to_nchw")
    xv = _data((n, hw, hw, c), 21)

    def numpy_fn():
        return np.ascontiguousarray(xv.transpose(0, 3, 1, 2))

    def torch_fn(torch):
        tx = torch.from_numpy(xv)
        return lambda: tx.permute(0, 3, 1, 2).contiguous()

    return Case([x], [y], [xv], torch_fn, numpy_fn)


def _channel_sums(d) -> Case:
    """A batch-norm gradient's per-channel sum over NCHW, ``sum_{n, h, w} dy * x``."""
    from tvm import te

    n, c, hw = d["n"], d["c"], d["hw"]
    x = te.placeholder((n, c, hw, hw), name="x")
    dy = te.placeholder((n, c, hw, hw), name="dy")
    b, i, j = (te.reduce_axis((0, e), name=nm) for e, nm in ((n, "b"), (hw, "i"), (hw, "j")))
    y = te.compute((c,), lambda ci: te.sum(dy[b, ci, i, j] * x[b, ci, i, j], axis=[b, i, j]),
                   name="dgamma")
    xv, dyv = _data((n, c, hw, hw), 21), _data((n, c, hw, hw), 22)

    def torch_fn(torch):
        tx, tdy = torch.from_numpy(xv), torch.from_numpy(dyv)
        return lambda: (tdy * tx).sum(dim=(0, 2, 3))

    return Case([x, dy], [y], [xv, dyv], torch_fn,
                lambda: (dyv.astype(np.float64) * xv).sum(axis=(0, 2, 3)))


def _batch_norm_dx(d) -> Case:
    """A batch-norm backward's input gradient over NCHW as users write it (training mode, the
    saved mean and inverse deviation as inputs): two per-channel sums, then ``dx = g * r *
    (dy - s1 / M - (x - mu) * r**2 * s2 / M)`` with ``M = n * h * w``."""
    from tvm import te

    n, c, hw = d["n"], d["c"], d["hw"]
    shape, m = (n, c, hw, hw), float(n * hw * hw)
    x, dy = te.placeholder(shape, name="x"), te.placeholder(shape, name="dy")
    g, mu, rs = (te.placeholder((c,), name=nm) for nm in ("gamma", "mean", "rstd"))
    axes = [[te.reduce_axis((0, e), name=f"{nm}{k}") for e, nm in ((n, "b"), (hw, "i"),
                                                                    (hw, "j"))]
            for k in (1, 2)]
    (b1, i1, j1), (b2, i2, j2) = axes
    s1 = te.compute((c,), lambda ci: te.sum(dy[b1, ci, i1, j1], axis=axes[0]), name="s1")
    s2 = te.compute((c,), lambda ci: te.sum(
        dy[b2, ci, i2, j2] * (x[b2, ci, i2, j2] - mu[ci]), axis=axes[1]), name="s2")
    dx = te.compute(shape, lambda b, ci, i, j: g[ci] * rs[ci] * (
        dy[b, ci, i, j] - s1[ci] / m - (x[b, ci, i, j] - mu[ci]) * rs[ci] * rs[ci] * s2[ci] / m),
        name="dx")
    xv, dyv, gv = _data(shape, 25), _data(shape, 26), _data((c,), 27)
    muv = xv.mean(axis=(0, 2, 3)).astype(np.float32)
    rsv = (1.0 / np.sqrt(xv.var(axis=(0, 2, 3)) + 1e-5)).astype(np.float32)

    def numpy_fn():
        x64, dy64 = xv.astype(np.float64), dyv.astype(np.float64)
        mu64, r64 = muv[None, :, None, None].astype(np.float64), rsv[None, :, None, None]
        xhat = (x64 - mu64) * r64
        return gv[None, :, None, None] * r64 * (dy64 - dy64.mean(axis=(0, 2, 3), keepdims=True)
                                               - xhat * (dy64 * xhat).mean(axis=(0, 2, 3),
                                                                           keepdims=True))

    def torch_fn(torch):
        tx, tdy, tg, tmu, trs = (torch.from_numpy(a) for a in (xv, dyv, gv, muv, rsv))
        return lambda: torch.ops.aten.native_batch_norm_backward(
            tdy, tx, tg, None, None, tmu, trs, True, 1e-5, [True, False, False])[0]

    return Case([x, dy, g, mu, rs], [dx], [xv, dyv, gv, muv, rsv], torch_fn, numpy_fn)


def _max_pool_dx(d) -> Case:
    """A max pool's input gradient as users write it: each input position gathers, over
    the windows that hold it, ``dy`` where it equals the window's maximum ``y`` (split
    into stride phases by :mod:`schedules.patterns.phases`)."""
    from tvm import te

    n, c, hw, ks, p, st = (d[key] for key in ("n", "c", "hw", "ks", "pad", "stride"))
    out = _conv_out(d)
    x = te.placeholder((n, c, hw, hw), name="x")
    y = te.placeholder((n, c, out, out), name="y")
    dy = te.placeholder((n, c, out, out), name="dy")
    ry, rx = te.reduce_axis((0, ks), name="ry"), te.reduce_axis((0, ks), name="rx")

    def body(b, ci, i, j):
        hh, ww = i + p - ry, j + p - rx
        ok = te.all(hh % st == 0, ww % st == 0, hh >= 0, ww >= 0, hh // st < out,
                    ww // st < out)
        hit = te.if_then_else(x[b, ci, i, j] == y[b, ci, hh // st, ww // st],
                              dy[b, ci, hh // st, ww // st], 0.0)
        return te.sum(te.if_then_else(ok, hit, 0.0), axis=[ry, rx])

    dx = te.compute((n, c, hw, hw), body, name="dx")
    xv, dyv = _data((n, c, hw, hw), 23), _data((n, c, out, out), 24)
    xp = np.pad(xv, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(xp, (ks, ks), axis=(2, 3))[:, :, ::st, ::st]
    yv = np.ascontiguousarray(win.max(axis=(4, 5)))

    def numpy_fn():
        grad = np.zeros_like(xp, dtype=np.float64)
        for i in range(ks):
            for j in range(ks):
                hit = xp[:, :, i:i + st * (out - 1) + 1:st, j:j + st * (out - 1) + 1:st] == yv
                grad[:, :, i:i + st * (out - 1) + 1:st, j:j + st * (out - 1) + 1:st] += hit * dyv
        return grad[:, :, p:p + hw, p:p + hw]

    def torch_fn(torch):
        tx, tdy = torch.from_numpy(xv), torch.from_numpy(dyv)
        _, idx = torch.nn.functional.max_pool2d(tx, ks, st, p, return_indices=True)
        return lambda: torch.ops.aten.max_pool2d_with_indices_backward(
            tdy, tx, [ks, ks], [st, st], [p, p], [1, 1], False, idx)

    return Case([x, y, dy], [dx], [xv, yv, dyv], torch_fn, numpy_fn)


def _depthwise_dw(d) -> Case:
    """A depthwise conv2d's weight gradient as users write it, ``dw[c, 0, ry, rx] =
    sum_{n, i, j} dy[n, c, i, j] * xpad[n, c, i + ry, j + rx]`` (the tap-sums rule)."""
    from tvm import te

    n, c, hw, ks, p = d["n"], d["c"], d["hw"], d["ks"], d["pad"]
    out = _conv_out(d)
    x = te.placeholder((n, c, hw, hw), name="x")
    dy = te.placeholder((n, c, out, out), name="dy")
    xp = _nchw_pad(x, p)
    b, i, j = (te.reduce_axis((0, e), name=nm) for e, nm in ((n, "b"), (out, "i"), (out, "j")))
    dw = te.compute((c, 1, ks, ks), lambda ci, z, ry, rx: te.sum(
        dy[b, ci, i, j] * xp[b, ci, i + ry, j + rx], axis=[b, i, j]), name="dw")
    xv, dyv = _data((n, c, hw, hw), 25), _data((n, c, out, out), 26)

    def numpy_fn():
        xq = np.pad(xv.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
        return np.stack([np.stack([(dyv * xq[:, :, r:r + out, t:t + out]).sum(axis=(0, 2, 3))
                                   for t in range(ks)], -1) for r in range(ks)], -2)[:, None]

    def torch_fn(torch):
        tx, tdy = torch.from_numpy(xv), torch.from_numpy(dyv)
        return lambda: torch.nn.grad.conv2d_weight(tx, (c, 1, ks, ks), tdy, padding=p, groups=c)

    return Case([x, dy], [dw], [xv, dyv], torch_fn, numpy_fn)


def _elementwise_chain(d) -> Case:
    from dsl.compat import tvm
    from dsl.ops import vector as vec

    n = d["n"]
    a = tvm.placeholder((n,), name="a", dtype="float32")
    b = tvm.placeholder((n,), name="b", dtype="float32")
    y = vec.vadd(vec.vmul(vec.vexp(a), b), a)
    av, bv = _data((n,), 16), _data((n,), 17)

    def torch_fn(torch):
        ta, tb = torch.from_numpy(av), torch.from_numpy(bv)
        return lambda: torch.exp(ta) * tb + ta

    return Case([a, b], [y], [av, bv], torch_fn, lambda: np.exp(av) * bv + av)


# --- shipped operators with a user's fused epilogue / prologue ------------------------------


def _cube_data(layer, seed: int):
    """NCHW dy / x / w of a conv2d layer, and the 5HD / FracZ forms our operators take."""
    from dsl.ops.layout import nchw_to_5hd, weight_to_fracz

    ho = layer.out
    dy = _data((layer.n, layer.cout, ho, ho), seed)
    x = _data((layer.n, layer.cin, layer.hw, layer.hw), seed + 1)
    w = _data(layer.w_shape(), seed + 2)
    return dy, x, w, nchw_to_5hd(dy), nchw_to_5hd(x), weight_to_fracz(w, layer.groups)


def _dx_graph(layer, dy_t, dtype: str):
    """``conv2d_backprop_input`` of ``layer`` on ``dy_t`` (5HD), float32 result."""
    from tvm import te

    from dsl.ops.conv2d_backprop_input import conv2d_backprop_input
    from dsl.ops.group import GroupLayout

    fz = GroupLayout.from_weight(layer.w_shape(), layer.groups).fracz_shape
    w_t = te.placeholder(fz, name="filters", dtype=dtype)
    dx_t = conv2d_backprop_input(w_t, dy_t, layer.w_shape(),
                                 (layer.n, layer.cin, layer.hw, layer.hw),
                                 layer.para(res_dtype="float32"))
    return w_t, dx_t


def _plain(outputs, inputs, arrays, name):
    """A callable running the plain shipped operator (the 'plain' peer of a fused row)."""
    import tvm

    kernel, _ = fresh_build(outputs, inputs, name)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays] + [
        tvm.runtime.tensor(np.zeros([int(d) for d in t.shape], str(t.dtype)), dev)
        for t in outputs]
    return lambda: kernel.func(*args)


def _torch_args(layer):
    return {"stride": layer.stride, "padding": layer.pad, "dilation": layer.dil,
            "groups": layer.groups}


def _dx_residual_relugrad(d) -> Case:
    """``dx = conv2d_backprop_input(w, dy)``; ``out = fwd > 0 ? dx + residual : 0``."""
    from dsl.compat import tvm
    from dsl.ops import vector as vec
    from dsl.ops.layout import nc1hwc0_to_nchw, nchw_to_5hd

    layer = d["layer"]
    dy, _, w, dy5, _, wfz = _cube_data(layer, 20)
    dy_t = tvm.placeholder(dy5.shape, name="out_backprop", dtype="float32")
    w_t, dx_t = _dx_graph(layer, dy_t, "float32")
    shape5 = tuple(int(v) for v in dx_t.shape)
    res_t = tvm.placeholder(shape5, name="residual", dtype="float32")
    fwd_t = tvm.placeholder(shape5, name="fwd", dtype="float32")
    out = vec.vsel(vec.vcmp(fwd_t, 0.0, "gt"), vec.vadd(dx_t, res_t), 0.0)
    x_shape = (layer.n, layer.cin, layer.hw, layer.hw)
    res, fwd = _data(x_shape, 23), _data(x_shape, 24)
    plain = _plain([dx_t], [w_t, dy_t], [wfz, dy5], f"bench_user_plain_dx_{layer.name}")

    def torch_fn(torch):
        tdy, tw, tr, tf = (torch.from_numpy(v) for v in (dy, w, res, fwd))
        return lambda: torch.where(tf > 0, torch.nn.grad.conv2d_input(
            x_shape, tw, tdy, **_torch_args(layer)) + tr, 0.0)

    return Case([w_t, dy_t, res_t, fwd_t], [out],
                [wfz, dy5, nchw_to_5hd(res), nchw_to_5hd(fwd)], torch_fn, None,
                to_peer=lambda a: nc1hwc0_to_nchw(a, layer.cin), extra={"plain dx": plain})


def _dw_scale_fp16(d) -> Case:
    """``dw = conv2d_backprop_filter(x, dy)``; ``out = cast_to(dw * scale, float16)``."""
    from dsl.compat import tvm
    from dsl.ops import vector as vec
    from dsl.ops.conv2d_backprop_filter import conv2d_backprop_filter
    from dsl.ops.layout import fracz_to_weight

    layer, scale = d["layer"], 0.125
    dy, x, _, dy5, x5, _ = _cube_data(layer, 30)
    x_t = tvm.placeholder(x5.shape, name="fmap", dtype="float32")
    dy_t = tvm.placeholder(dy5.shape, name="out_backprop", dtype="float32")
    dw_t = conv2d_backprop_filter(x_t, dy_t, layer.w_shape(),
                                  layer.para(res_dtype="float32", groups=layer.groups))
    out = vec.cast_to(vec.vmuls(dw_t, scale), "float16")
    plain = _plain([dw_t], [x_t, dy_t], [x5, dy5], f"bench_user_plain_dw_{layer.name}")

    def torch_fn(torch):
        tx, tdy = torch.from_numpy(x), torch.from_numpy(dy)
        return lambda: (torch.nn.grad.conv2d_weight(tx, layer.w_shape(), tdy,
                                                    **_torch_args(layer)) * scale).half()

    return Case([x_t, dy_t], [out], [x5, dy5], torch_fn, None,
                to_peer=lambda a: fracz_to_weight(a, layer.w_shape(), layer.groups),
                extra={"plain dw": plain}, tolerance=1e-2)


def _dy_scale_fp16_dx(d) -> Case:
    """Prologue: ``dy16 = cast_to(dy * scale, float16)``, then ``conv2d_backprop_input``."""
    from dsl.compat import tvm
    from dsl.ops import vector as vec
    from dsl.ops.layout import nc1hwc0_to_nchw

    layer, scale = d["layer"], 0.5
    dy, _, w, dy5, _, wfz = _cube_data(layer, 40)
    dy_t = tvm.placeholder(dy5.shape, name="dy_fp32", dtype="float32")
    dy16 = vec.cast_to(vec.vmuls(dy_t, scale), "float16")
    w_t, dx_t = _dx_graph(layer, dy16, "float16")
    wfz16 = wfz.astype(np.float16)
    plain_dy = tvm.placeholder(dy5.shape, name="out_backprop", dtype="float16")
    pw_t, pdx_t = _dx_graph(layer, plain_dy, "float16")
    plain = _plain([pdx_t], [pw_t, plain_dy], [wfz16, (dy5 * scale).astype(np.float16)],
                   f"bench_user_plain_dx16_{layer.name}")

    def torch_fn(torch):
        tdy, tw = torch.from_numpy(dy), torch.from_numpy(w)
        x_shape = (layer.n, layer.cin, layer.hw, layer.hw)
        return lambda: torch.nn.grad.conv2d_input(x_shape, tw, tdy * scale,
                                                  **_torch_args(layer))

    return Case([w_t, dy_t], [dx_t], [wfz16, dy5], torch_fn, None,
                to_peer=lambda a: nc1hwc0_to_nchw(a, layer.cin),
                extra={"plain dx fp16": plain}, tolerance=1e-2)


# --- the suite ------------------------------------------------------------------------------


def _layers():
    from dsl.cli.bench.conv2d import Layer

    return {"full": {"layer": Layer("resnet50_3x3", 1, 64, 64, 56, 3, 1, 1, 1, 1)},
            "tiny": {"layer": Layer("tiny_3x3_s2", 2, 5, 7, 9, 3, 2, 1, 1, 1)}}


def _mm_flops(d):
    return 2.0 * d.get("b", 1) * d["m"] * d["n"] * d["k"]


def _rows(d, reads: int, writes: int, params: int = 0):
    return float(F32 * ((reads + writes) * d["rows"] * d["cols"] + params * d["cols"]))


def _window_flops(d) -> float:
    return 2.0 * d["n"] * d["c"] * d["hw"] ** 2 * d["ks"] ** 2


def _window_bytes(d) -> float:
    return 2.0 * F32 * d["n"] * d["c"] * d["hw"] ** 2


def _nhwc_window_flops(d) -> float:
    return 2.0 * d["n"] * d["c"] * _conv_out(d) ** 2 * d["ks"] ** 2


def _nhwc_window_bytes(d) -> float:
    return F32 * d["n"] * d["c"] * (d["hw"] ** 2 + _conv_out(d) ** 2)


def _conv_spec(name: str, full: dict, tiny: dict) -> Spec:
    """A user's NCHW conv2d forward row (:func:`_conv2d_fwd`)."""
    return Spec(name, "conv2d", {"full": full, "tiny": tiny}, _conv2d_fwd, _conv_flops)


def specs() -> list[Spec]:
    mm = {"full": {"m": 1024, "n": 1024, "k": 1024}, "tiny": {"m": 33, "n": 17, "k": 29}}
    norm = {"full": {"rows": 8192, "cols": 1024}, "tiny": {"rows": 7, "cols": 33}}
    layers = _layers()
    cube_flops = lambda d: d["layer"].flops  # noqa: E731
    return [
        Spec("matmul_1024", "matmul", mm, _matmul, _mm_flops),
        Spec("bmm_16x256", "bmm", {"full": {"b": 16, "m": 256, "n": 256, "k": 256},
                                   "tiny": {"b": 3, "m": 9, "n": 7, "k": 5}}, _bmm, _mm_flops),
        Spec("gemm_bias_gelu_1024", "gemm_ep", mm, _gemm_bias_gelu,
             lambda d: _mm_flops(d) + 12.0 * d["m"] * d["n"]),
        _conv_spec("conv2d_nchw_3x3_56x56x64",
                   {"n": 1, "c": 64, "k": 64, "hw": 56, "ks": 3, "pad": 1},
                   {"n": 2, "c": 3, "k": 5, "hw": 7, "ks": 3, "pad": 1}),
        _conv_spec("conv2d_nchw_3x3_s2_56x56x64",
                   {"n": 1, "c": 64, "k": 128, "hw": 56, "ks": 3, "pad": 1, "stride": 2},
                   {"n": 2, "c": 3, "k": 5, "hw": 9, "ks": 3, "pad": 1, "stride": 2}),
        # ResNet's stem forward: 3 input channels, its padding phase-split by the stride
        _conv_spec("conv2d_nchw_7x7_s2_224x224x3",
                   {"n": 1, "c": 3, "k": 64, "hw": 224, "ks": 7, "pad": 3, "stride": 2},
                   {"n": 2, "c": 3, "k": 16, "hw": 20, "ks": 7, "pad": 3, "stride": 2}),
        _conv_spec("conv2d_nchw_3x3_14x14x256",
                   {"n": 1, "c": 256, "k": 256, "hw": 14, "ks": 3, "pad": 1},
                   {"n": 1, "c": 17, "k": 32, "hw": 5, "ks": 3, "pad": 1}),
        # ResNet's last stage: 18% of the nominal FLOPs fall in the padding (both sides skip)
        _conv_spec("conv2d_nchw_3x3_7x7x512_b8",
                   {"n": 8, "c": 512, "k": 512, "hw": 7, "ks": 3, "pad": 1},
                   {"n": 2, "c": 9, "k": 32, "hw": 7, "ks": 3, "pad": 1}),
        _conv_spec("conv2d_nchw_5x5_31x31_24to40_b2",
                   {"n": 2, "c": 24, "k": 40, "hw": 31, "ks": 5, "pad": 2},
                   {"n": 2, "c": 5, "k": 24, "hw": 7, "ks": 5, "pad": 2}),
        _conv_spec("conv2d_nchw_3x3_g4_28x28x128",
                   {"n": 1, "c": 128, "k": 128, "hw": 28, "ks": 3, "pad": 1, "groups": 4},
                   {"n": 2, "c": 8, "k": 16, "hw": 6, "ks": 3, "pad": 1, "groups": 2}),
        # the same layer channels-last: its tile along the output channels inside one group
        Spec("conv2d_nhwc_3x3_g4_28x28x128_b8", "conv2d",
             {"full": {"n": 8, "c": 128, "k": 128, "hw": 28, "ks": 3, "pad": 1, "groups": 4},
              "tiny": {"n": 2, "c": 16, "k": 32, "hw": 6, "ks": 3, "pad": 1, "groups": 2}},
             _grouped_nhwc_fwd, _conv_flops),
        # ResNeXt's 32 groups of 4 channels: rows of 28 in quarter registers on AVX-512
        _conv_spec("conv2d_nchw_3x3_g32_28x28x128",
                   {"n": 1, "c": 128, "k": 128, "hw": 28, "ks": 3, "pad": 1, "groups": 32},
                   {"n": 2, "c": 16, "k": 16, "hw": 12, "ks": 3, "pad": 1, "groups": 4}),
        # MobileNetV2's expansion 1x1 (32 -> 192 channels, 112 x 112): a short reduction over
        # rows of whole zmm vectors, its tile along the rows (no transposing write-back)
        _conv_spec("conv2d_nchw_1x1_112x112_32to192_b2",
                   {"n": 2, "c": 32, "k": 192, "hw": 112, "ks": 1, "pad": 0},
                   {"n": 2, "c": 8, "k": 24, "hw": 16, "ks": 1, "pad": 0}),
        Spec("dx_nchw_3x3_s2_56x56x128", "conv2d_dx",
             {"full": {"n": 1, "c": 128, "k": 128, "hw": 56, "ks": 3, "pad": 1, "stride": 2},
              "tiny": {"n": 2, "c": 5, "k": 7, "hw": 9, "ks": 3, "pad": 1, "stride": 2}},
             _strided_dx, _conv_flops),
        # stride 1: dy padded and convolved with the flipped weights w[k, c, 2 - ry, 2 - rx],
        # the tile's vectors along the input channels as the forward conv2d's
        Spec("dx_nchw_3x3_s1_28x28x64_b8", "conv2d_dx",
             {"full": {"n": 8, "c": 64, "k": 64, "hw": 28, "ks": 3, "pad": 1, "stride": 1},
              "tiny": {"n": 2, "c": 20, "k": 6, "hw": 7, "ks": 3, "pad": 1, "stride": 1}},
             _strided_dx, _conv_flops),
        # a user's weight gradient: 3 taps innermost, the tile's positions along the input
        # channels and its vectors along the output channels
        Spec("dw_nchw_3x3_56x56x64_b8", "conv2d_dw",
             {"full": {"n": 8, "c": 64, "k": 64, "hw": 56, "ks": 3, "pad": 1},
              "tiny": {"n": 2, "c": 7, "k": 20, "hw": 19, "ks": 3, "pad": 1}},
             _nchw_dw, _conv_flops),
        Spec("depthwise_nchw_3x3_56x56x64", "window",
             {"full": {"n": 1, "c": 64, "hw": 56, "ks": 3, "pad": 1},
              "tiny": {"n": 2, "c": 3, "hw": 8, "ks": 3, "pad": 1}}, _depthwise_fwd,
             _window_flops, _window_bytes),
        # MobileNet's last depthwise layers: planes of 7x7, several a register tile
        Spec("depthwise_nchw_3x3_7x7x1024_b8", "window",
             {"full": {"n": 8, "c": 1024, "hw": 7, "ks": 3, "pad": 1},
              "tiny": {"n": 2, "c": 6, "hw": 7, "ks": 3, "pad": 1}}, _depthwise_fwd,
             _window_flops, _window_bytes),
        # MobileNet in channels-last: the padding inlined, 4 output columns by 2 vectors a
        # tile at stride 1, whole pixels at stride 2
        Spec("depthwise_nhwc_3x3_56x56x128_b8", "window",
             {"full": {"n": 8, "c": 128, "hw": 56, "ks": 3, "pad": 1, "stride": 1},
              "tiny": {"n": 2, "c": 48, "hw": 9, "ks": 3, "pad": 1, "stride": 1}},
             _depthwise_nhwc, _nhwc_window_flops, _nhwc_window_bytes),
        Spec("depthwise_nhwc_3x3_s2_112x112x64_b8", "window",
             {"full": {"n": 8, "c": 64, "hw": 112, "ks": 3, "pad": 1, "stride": 2},
              "tiny": {"n": 2, "c": 32, "hw": 11, "ks": 3, "pad": 1, "stride": 2}},
             _depthwise_nhwc, _nhwc_window_flops, _nhwc_window_bytes),
        Spec("softmax_4096x1024", "softmax", {"full": {"rows": 4096, "cols": 1024},
                                              "tiny": {"rows": 5, "cols": 37}}, _softmax,
             lambda d: 5.0 * d["rows"] * d["cols"], lambda d: _rows(d, 1, 1)),
        Spec("softmax_8192x4096", "softmax", {"full": {"rows": 8192, "cols": 4096},
                                              "tiny": {"rows": 3, "cols": 67}}, _softmax,
             lambda d: 5.0 * d["rows"] * d["cols"], lambda d: _rows(d, 1, 1)),
        # the classes of a segmentation head: per task a block of the 21 channels by a
        # piece of the rows (patterns.column_group)
        Spec("softmax_channels_8x21x128x128", "softmax",
             {"full": {"n": 8, "c": 21, "hw": 128}, "tiny": {"n": 2, "c": 5, "hw": 9}},
             _softmax_channels, lambda d: 5.0 * d["n"] * d["c"] * d["hw"] ** 2,
             lambda d: 2.0 * F32 * d["n"] * d["c"] * d["hw"] ** 2),
        Spec("layer_norm_8192x1024", "norm", norm, _layer_norm,
             lambda d: 8.0 * d["rows"] * d["cols"], lambda d: _rows(d, 1, 1, 2)),
        Spec("rms_norm_8192x1024", "norm", norm, _rms_norm,
             lambda d: 4.0 * d["rows"] * d["cols"], lambda d: _rows(d, 1, 1, 1)),
        Spec("bn_dgamma_8x64x56x56", "reduction",
             {"full": {"n": 8, "c": 64, "hw": 56}, "tiny": {"n": 2, "c": 3, "hw": 8}},
             _channel_sums, lambda d: 2.0 * d["n"] * d["c"] * d["hw"] ** 2,
             lambda d: 2.0 * F32 * d["n"] * d["c"] * d["hw"] ** 2),
        Spec("batch_norm_dx_8x64x56x56", "norm_dx",
             {"full": {"n": 8, "c": 64, "hw": 56}, "tiny": {"n": 2, "c": 3, "hw": 7}},
             _batch_norm_dx, lambda d: 0.0,
             lambda d: 3.0 * F32 * d["n"] * d["c"] * d["hw"] ** 2),
        Spec("max_pool_dx_3x3_s2_112x112x64", "pool_dx",
             {"full": {"n": 1, "c": 64, "hw": 112, "ks": 3, "pad": 1, "stride": 2},
              "tiny": {"n": 2, "c": 3, "hw": 9, "ks": 3, "pad": 1, "stride": 2}}, _max_pool_dx,
             lambda d: 0.0, lambda d: F32 * d["n"] * d["c"] * (2 * d["hw"] ** 2
                                                               + 2 * _conv_out(d) ** 2)),
        Spec("depthwise_dw_3x3_8x64x56x56", "dw",
             {"full": {"n": 8, "c": 64, "hw": 56, "ks": 3, "pad": 1},
              "tiny": {"n": 2, "c": 3, "hw": 8, "ks": 3, "pad": 1}}, _depthwise_dw,
             lambda d: 2.0 * d["n"] * d["c"] * d["ks"] ** 2 * _conv_out(d) ** 2,
             lambda d: 2.0 * F32 * d["n"] * d["c"] * d["hw"] ** 2),
        Spec("pixel_shuffle_r2_256x112x112", "layout",
             {"full": {"n": 1, "c": 64, "hw": 112, "r": 2},
              "tiny": {"n": 2, "c": 3, "hw": 5, "r": 2}}, _pixel_shuffle,
             lambda d: 0.0, lambda d: 2.0 * F32 * d["n"] * d["c"] * (d["hw"] * d["r"]) ** 2),
        Spec("nhwc_to_nchw_8x112x112x32", "layout",
             {"full": {"n": 8, "c": 32, "hw": 112}, "tiny": {"n": 2, "c": 12, "hw": 5}},
             _nhwc_to_nchw, lambda d: 0.0,
             lambda d: 2.0 * F32 * d["n"] * d["c"] * d["hw"] ** 2),
        Spec("exp_mul_add_2p24", "eltwise", {"full": {"n": 1 << 24}, "tiny": {"n": 1031}},
             _elementwise_chain, lambda d: 3.0 * d["n"], lambda d: 3.0 * F32 * d["n"]),
        Spec("dx_residual_relugrad_resnet50_3x3", "dx_ep", layers, _dx_residual_relugrad,
             cube_flops),
        Spec("dw_scale_fp16_resnet50_3x3", "dw_ep", layers, _dw_scale_fp16, cube_flops),
        Spec("dy_scale_fp16_dx_resnet50_3x3", "dx_pro", layers, _dy_scale_fp16_dx, cube_flops),
    ]


def workloads(size: str | None = None) -> list[Workload]:
    """The suite's workloads at ``size`` ("full", "tiny"; default ``DSL_BENCH_USER_SIZE`` or
    "full" when each is set up). Rates are counted at full size."""
    out = []
    for spec in specs():
        full = spec.dims["full"]
        out.append(Workload(SUITE, spec.name, spec.kind, spec.flops(full),
                            lambda s=spec: prepare(s, size or _size()), bytes=spec.bytes(full)))
    return out


for _w in workloads():
    register(_w)
