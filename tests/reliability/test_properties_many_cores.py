"""Property-based correctness of the schedules only a many-core server gets: kernels built for
3 to 128 cores, run on this machine, against the float64 references.

A 2-core build never makes what larger core counts choose (dx rows cut into parts, conv2d dw
reduction chunks, DeconvGradFilter taps and row tiles as tasks, partial sums), and no
many-core machine runs the tests; a kernel built for any core count runs here on the cores
there are, so these choices are checked where they are made. DeconvGradFilter is also held
to its promise of results bit-identical to the 1-core kernel's.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from rel_strategies import budget, conv_configs

import targets
from dsl import kernel_cache, layout

from helpers import assert_close, dw_data, dw_kernel, dx_data, dx_kernel, rand
from reference import conv2d_backprop_filter as ref_dw
from reference import conv2d_backprop_input as ref_dx
from reference import deconv_grad_filter as ref_deconv

# counts between and beyond the powers of two, where the splits differ
CORES = st.sampled_from([3, 12, 24, 48, 64, 96, 128])


def _many(cores: int):
    return targets.current().with_cores(cores)


@settings(max_examples=budget(6, 200))
@given(c=conv_configs(max_ch=64, max_hw=14), cores=CORES, seed=st.integers(0, 2**16))
def test_dx_built_for_many_cores_matches_reference(c, cores, seed):
    dy, w = dx_data(c, "float32", seed)
    out5 = dx_kernel(c, "float32", "float32", target=_many(cores))(
        layout.weight_to_fracz(w, c["groups"]), layout.nchw_to_5hd(dy))
    ref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"], c["dil"],
                 c["groups"])
    assert_close(layout.nc1hwc0_to_nchw(out5, c["cin"]), ref, "float32", f"{cores} cores {c}")


@settings(max_examples=budget(6, 200))
@given(c=conv_configs(max_ch=64, max_hw=14), cores=CORES, seed=st.integers(0, 2**16))
def test_dw_built_for_many_cores_matches_reference(c, cores, seed):
    x, dy = dw_data(c, "float32", seed)
    w_shape = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    fz = dw_kernel(c, "float32", "float32", target=_many(cores))(
        layout.nchw_to_5hd(x), layout.nchw_to_5hd(dy))
    ref = ref_dw(x, dy, w_shape, c["stride"], c["pads"], c["dil"], c["groups"])
    assert_close(layout.fracz_to_weight(fz, w_shape, c["groups"]), ref, "float32",
                 f"{cores} cores {c}")


@st.composite
def deconv_layers(draw):
    """A DeconvGradFilter layer wide enough for its register tiles to become tasks (up to 70
    output and 40 input channels a group), with a stride-phase dy."""
    g = draw(st.sampled_from([1, 1, 2, 4]))
    icg, ocg = draw(st.integers(1, 40)), draw(st.integers(1, 70))
    k, s = draw(st.integers(1, 4)), draw(st.integers(1, 2))
    ih, iw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    p = draw(st.integers(0, k - 1))
    oh, ow = (ih - 1) * s + k - 2 * p, (iw - 1) * s + k - 2 * p
    assume(oh >= 1 and ow >= 1)
    return {"b": draw(st.integers(1, 3)), "in": (ih, iw, icg * g), "out": (oh, ow, ocg * g),
            "k": (k, k), "s": (s, s), "p": (p, p), "d": (1, 1), "g": g}


def _deconv_kernel(c, target):
    def make():
        from tvm import te

        from dsl.ops.deconv_grad_filter import deconv_grad_filter
        dy = te.placeholder((c["b"], *c["out"]), "float32", name="dy")
        x = te.placeholder((c["b"], *c["in"]), "float32", name="x")
        dw = deconv_grad_filter(dy, x, kernel=c["k"], stride=c["s"], pad=c["p"], group=c["g"])
        return [dy, x], [dw]

    return kernel_cache.get_kernel({"op": "rel_deconv_dw", "case": c}, make,
                                   prefix="rel_deconv_dw", target=target)


@settings(max_examples=budget(6, 200))
@given(c=deconv_layers(), cores=CORES, seed=st.integers(0, 2**16))
def test_deconv_grad_filter_built_for_many_cores_is_bit_identical(c, cores, seed):
    rng = np.random.default_rng(seed)
    dy, x = rand(rng, (c["b"], *c["out"]), "float32"), rand(rng, (c["b"], *c["in"]), "float32")
    one = _deconv_kernel(c, _many(1))(dy, x)
    many = _deconv_kernel(c, _many(cores))(dy, x)
    assert np.array_equal(one, many), f"{cores} cores {c}"
    assert_close(many, ref_deconv(dy, x, c["k"], c["s"], c["p"], c["d"], c["g"]), "float32",
                 f"{cores} cores {c}")
