"""Build a user-written TE graph with the default schedule, run it, and say which rule ran.

Used by ``tests/schedules/test_patterns_*.py``: the graphs carry no operator tag, so they take
the pattern rules (``schedules.patterns``) through ``schedules.generic.schedule_generic``.
"""

from __future__ import annotations

import numpy as np

# relative error (to max |ref|, at least 1) allowed per output dtype: fp16 keeps ~11 bits and
# fp16 sums of a few hundred terms round at every step
TOL = {"float32": 2e-5, "float16": 1e-2}


def rand(shape, dtype, rng, low=-1.0, high=1.0):
    return rng.uniform(low, high, size=shape).astype(dtype)


def build_run(outs, ins, arrays, target=None):
    """``(outputs as numpy, dsl.explain(...))`` of the graph ``ins -> outs``."""
    import tvm

    import dsl

    outs = list(outs)
    sch = dsl.auto_schedule(outs, target=target)
    assert sch.rule_name == "schedules.generic.schedule_generic"
    tensors = [*ins, *outs]
    why = dsl.explain(sch, tensors)
    lib = tvm.compile(sch.s_tir(tensors).mod, target=sch.target.tvm_target())
    dev = tvm.cpu()
    res = [tvm.runtime.tensor(np.zeros([int(d) for d in t.shape], str(t.dtype)), dev)
           for t in outs]
    lib["main"](*[tvm.runtime.tensor(a, dev) for a in arrays], *res)
    return [r.numpy() for r in res], why


def check(out, ref, dtype, what=""):
    out = np.asarray(out, np.float64)
    assert out.shape == ref.shape, (what, out.shape, ref.shape)
    scale = max(1.0, float(np.abs(ref).max()) if ref.size else 0.0)
    err = float(np.abs(out - ref).max()) if ref.size else 0.0
    assert err / scale <= TOL[dtype], f"{what}: max err {err:.3g} (scale {scale:.3g})"


def softmax_graph(x, shape, dtype):
    """Softmax over the last axis of ``x``, written as a user would (max, exp, sum, divide)."""
    from tvm import te

    lead = shape[:-1]
    k = te.reduce_axis((0, shape[-1]), name="k")
    mx = te.compute(lead, lambda *i: te.max(x(*i, k), axis=k), name="mx")
    e = te.compute(shape, lambda *i: te.exp(x(*i) - mx(*i[:-1])), name="e")
    k2 = te.reduce_axis((0, shape[-1]), name="k2")
    s = te.compute(lead, lambda *i: te.sum(e(*i, k2), axis=k2), name="s")
    return te.compute(shape, lambda *i: e(*i) / s(*i[:-1]), name="y")


def norm_graph(x, shape, dtype, rms: bool):
    """``(gamma, y)``: layer-norm (or RMS-norm) over the last axis of ``x``, scaled by ``gamma``."""
    from tvm import te

    n = shape[-1]
    lead = shape[:-1]
    gamma = te.placeholder((n,), name="gamma", dtype=dtype)
    k = te.reduce_axis((0, n), name="k")
    if rms:
        ss = te.compute(lead, lambda *i: te.sum(x(*i, k) * x(*i, k), axis=k), name="ss")
        y = te.compute(shape, lambda *i: x(*i) / te.sqrt(ss(*i[:-1]) / n + 1e-5) * gamma(i[-1]),
                       name="y")
        return gamma, y
    s = te.compute(lead, lambda *i: te.sum(x(*i, k), axis=k), name="s")
    mean = te.compute(lead, lambda *i: s(*i) / n, name="mean")
    d = te.compute(shape, lambda *i: x(*i) - mean(*i[:-1]), name="d")
    k2 = te.reduce_axis((0, n), name="k2")
    var = te.compute(lead, lambda *i: te.sum(d(*i, k2) * d(*i, k2), axis=k2), name="var")
    y = te.compute(shape, lambda *i: d(*i) / te.sqrt(var(*i[:-1]) / n + 1e-5) * gamma(i[-1]),
                   name="y")
    return gamma, y


def norm_reference(xn, gn, rms: bool):
    """float64 reference of :func:`norm_graph` (eps 1e-5)."""
    x64, g64 = xn.astype(np.float64), gn.astype(np.float64)
    if rms:
        return x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * g64
    d = x64 - x64.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * g64
