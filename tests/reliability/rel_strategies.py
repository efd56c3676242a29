"""Hypothesis strategies for valid calls of the core operators, and the profile budgets.

Configurations use the dict of ``tests/cases.py`` so ``helpers.dx_kernel`` / ``dw_kernel`` build
(and cache by signature) the kernels, and a failing example pastes straight into a regression
test as ``C(...)``.
"""

from __future__ import annotations

import os

from hypothesis import strategies as st

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
FULL = os.environ.get("RELIABILITY_FULL", "") not in ("", "0")


def budget(ci: int, deep: int) -> int:
    """Examples for one property: ``ci`` in the CI profile, ``deep`` on demand."""
    return deep if PROFILE == "deep" else ci


@st.composite
def conv_configs(draw, max_ch: int = 40, max_hw: int = 12):
    """A valid grouped / strided / dilated / padded 2-D convolution, small enough to run fast.

    Groups come first so channel counts are multiples of them; spatial sizes are drawn so the
    dilated kernel fits the padded input (the only geometric validity rule).
    """
    groups = draw(st.sampled_from([1, 1, 1, 2, 3, 4, 8]))
    cin_g = draw(st.integers(1, max(1, max_ch // groups)))
    cout_g = draw(st.integers(1, max(1, max_ch // groups)))
    if groups > 1 and draw(st.booleans()):
        cin_g = 1  # depthwise (multiplier cout_g)
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pads = tuple(draw(st.integers(0, 3)) for _ in range(4))
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    lo_h, lo_w = max(1, span_h - pads[0] - pads[1]), max(1, span_w - pads[2] - pads[3])
    h = draw(st.integers(lo_h, max(lo_h, max_hw)))  # a big dilated kernel may need > max_hw
    w = draw(st.integers(lo_w, max(lo_w, max_hw)))
    return {"n": draw(st.integers(1, 2)), "cin": cin_g * groups, "cout": cout_g * groups,
            "h": h, "w": w, "kh": kh, "kw": kw, "stride": (sh, sw), "pads": pads,
            "dil": (dh, dw), "groups": groups}


dtypes = st.sampled_from(["float16", "float32"])


@st.composite
def weight_shapes(draw, max_ch: int = 48):
    """``(W[Cout, Cin/groups, KH, KW] shape, groups)`` for the FracZ packers."""
    groups = draw(st.integers(1, 24))
    cin_g = draw(st.integers(1, max(1, max_ch // groups)))
    cout_g = draw(st.integers(1, max(1, max_ch // groups)))
    return (cout_g * groups, cin_g, draw(st.integers(1, 3)), draw(st.integers(1, 3))), groups
