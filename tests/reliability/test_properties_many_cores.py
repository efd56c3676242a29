"""Property-based correctness of the schedules only a many-core server gets: kernels built for
3 to 128 cores, run on this machine, against the float64 references.

A 2-core build never makes what larger core counts choose (dx rows cut into parts, conv2d dw
reduction chunks, DeconvGradFilter taps and row tiles as tasks, the partial sums of the
reductions and contractions users write), and no many-core machine runs the tests; a kernel
built for any core count runs here on the cores there are, so these choices are checked
where they are made. DeconvGradFilter is also held to its promise of results bit-identical
to the 1-core kernel's.
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


@st.composite
def channel_sums(draw):
    """A per-channel sum users write (a bias or batch-norm gradient) over NHWC or NCHW."""
    n, h, w = draw(st.integers(1, 8)), draw(st.integers(1, 40)), draw(st.integers(1, 40))
    return {"shape": (n, h, w), "c": draw(st.integers(1, 80)), "nhwc": draw(st.booleans())}


@settings(max_examples=budget(6, 200))
@given(c=channel_sums(), cores=CORES, seed=st.integers(0, 2**16))
def test_user_channel_sums_built_for_many_cores_match_reference(c, cores, seed):
    from pattern_helpers import build_run, check
    from tvm import te

    (n, h, w), ch = c["shape"], c["c"]
    shape = (n, h, w, ch) if c["nhwc"] else (n, ch, h, w)
    dy = te.placeholder(shape, name="dy")
    b, i, j = (te.reduce_axis((0, e), name=nm) for e, nm in ((n, "b"), (h, "i"), (w, "j")))
    at = (lambda k: dy[b, i, j, k]) if c["nhwc"] else (lambda k: dy[b, k, i, j])
    db = te.compute((ch,), lambda k: te.sum(at(k), axis=[b, i, j]), name="db")
    dyn = rand(np.random.default_rng(seed), shape, "float32")
    (out,), _ = build_run([db], [dy], [dyn], target=_many(cores))
    axes = (0, 1, 2) if c["nhwc"] else (0, 2, 3)
    check(out, dyn.astype(np.float64).sum(axes), "float32", f"{cores} cores {c}")


@settings(max_examples=budget(4, 100))
@given(c=st.integers(1, 72), k=st.integers(1, 72), h=st.integers(3, 40), cores=CORES,
       seed=st.integers(0, 2**16))
def test_user_nhwc_conv2d_dw_built_for_many_cores_matches_reference(c, k, h, cores, seed):
    """``dw[o, ry, rx, ci] = sum dy[b, i, j, o] * xpad[b, i + ry, j + rx, ci]`` (3 x 3, pad
    1): its tiles split into partial sums over the rows where they are too few tasks."""
    from pattern_helpers import build_run, check
    from tvm import te

    x = te.placeholder((1, h, h, c), name="x")
    dy = te.placeholder((1, h, h, k), name="dy")
    xp = te.compute((1, h + 2, h + 2, c), lambda b, i, j, ci: te.if_then_else(
        te.all(i >= 1, i <= h, j >= 1, j <= h), x[b, i - 1, j - 1, ci], 0.0), name="pad")
    b, i, j = (te.reduce_axis((0, e), name=nm) for e, nm in ((1, "b"), (h, "i"), (h, "j")))
    dw = te.compute((k, 3, 3, c), lambda o, ry, rx, ci: te.sum(
        dy[b, i, j, o] * xp[b, i + ry, j + rx, ci], axis=[b, i, j]), name="dw")
    rng = np.random.default_rng(seed)
    xn, dyn = rand(rng, (1, h, h, c), "float32"), rand(rng, (1, h, h, k), "float32")
    (out,), _ = build_run([dw], [x, dy], [xn, dyn], target=_many(cores))
    xpn = np.pad(xn.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref = np.stack([np.stack([np.einsum("bijo,bijc->oc", dyn.astype(np.float64),
                                        xpn[:, ry:ry + h, rx:rx + h]) for rx in range(3)], 1)
                    for ry in range(3)], 1)
    check(out, ref, "float32", f"{cores} cores c={c} k={k} h={h}")
