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
