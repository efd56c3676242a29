"""Property-based correctness of the operators built on the core, through their numpy APIs:
aclnn avg_pool2d_backward and the DeconvGradFilter ``param[]`` call, against the float64
references of tests/reference.py. Small budgets: every example may compile a kernel.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from rel_strategies import budget

from helpers import assert_close, rand
from reference import avg_pool2d_backward as ref_avg_pool
from reference import avg_pool2d_out_size
from reference import deconv_grad_filter as ref_deconv


@st.composite
def pool_configs(draw):
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p = tuple(draw(st.integers(0, kk // 2)) for kk in k)
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    ceil = draw(st.booleans())
    out = tuple(avg_pool2d_out_size(n, kk, ss, pp, ceil) for n, kk, ss, pp in
                zip((h, w), k, s, p))
    assume(min(out) >= 1)
    return {"k": k, "s": s, "p": p, "ceil": ceil, "x": (draw(st.integers(1, 2)),
                                                         draw(st.integers(1, 20)), h, w),
            "out": out, "cip": draw(st.booleans()),
            "div": draw(st.sampled_from([0, 0, 0, 3, -2]))}


@settings(max_examples=budget(8, 150))
@given(c=pool_configs(), dtype=st.sampled_from(["float32", "float16"]), seed=st.integers(0, 99))
def test_aclnn_avg_pool2d_backward_matches_reference(c, dtype, seed):
    from dsl import aclnn

    dy = rand(np.random.default_rng(seed), (*c["x"][:2], *c["out"]), dtype)
    x = np.zeros(c["x"], dtype)
    out = aclnn.avg_pool2d_backward(dy, x, list(c["k"]), list(c["s"]), list(c["p"]), c["ceil"],
                                    c["cip"], c["div"])
    ref = ref_avg_pool(dy, c["x"], c["k"], c["s"], c["p"], c["ceil"], c["cip"], c["div"])
    assert out.shape == x.shape and out.dtype == x.dtype
    assert_close(out, ref, dtype, str(c))


@st.composite
def deconv_params(draw):
    group = draw(st.sampled_from([1, 1, 2, 3]))
    icg, ocg = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pu, pl = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    in_h, in_w = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    out_h, out_w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    b = draw(st.integers(1, 2))
    # at least one tap must land inside dy along each axis (else the call is refused)
    for n_in, n_out, k, s, p, d in ((in_h, out_h, kh, sh, pu, dh), (in_w, out_w, kw, sw, pl, dw)):
        assume(any(0 <= i * s - p + t * d < n_out for i in range(n_in) for t in range(k)))
    return [b, in_h, in_w, icg * group, b, out_h, out_w, ocg * group, kh, kw, sh, sw, pu, pl,
            dh, dw, group]


@settings(max_examples=budget(8, 150))
@given(p=deconv_params(), half=st.booleans(), private=st.booleans(), seed=st.integers(0, 99))
def test_deconvgradfilter_matches_reference(p, half, private, seed):
    from dsl import deconvgradfilter as m

    dtype = "float16" if half else "float32"
    rng = np.random.default_rng(seed)
    dy = rand(rng, (p[4], p[5], p[6], p[7]), dtype)
    x = rand(rng, (p[0], p[1], p[2], p[3]), dtype)
    group = p[16]
    dw = np.full(group * (p[7] // group) * p[8] * p[9] * (p[3] // group), np.nan, dtype)
    if private:
        (m.hp_deconv_grad_filter_p if half else m.fp_deconv_grad_filter_p)(dy, x, dw, p)
    else:
        (m.hp_deconv_grad_filter_s if half else m.fp_deconv_grad_filter_s)(dy, x, dw, p, 1)
    ref = ref_deconv(dy, x, (p[8], p[9]), (p[10], p[11]), (p[12], p[13]), (p[14], p[15]),
                     group)
    assert_close(dw.reshape(ref.shape), ref, dtype, str(p))
