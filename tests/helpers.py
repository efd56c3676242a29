"""Test helpers: random data, tolerances, and kernels built once per signature."""

from __future__ import annotations

import numpy as np

import dsl
from dsl import kernel_cache
from dsl.ops.layout import nc1hwc0_to_nchw, nchw_to_5hd, weight_to_fracz

# Max |out - ref| / max(1, max|ref|) allowed per output dtype. Inputs are drawn exactly
# representable in the input dtype, so the error is the fp32 accumulation (~1e-6 relative)
# plus the final rounding to the output dtype.
TOL = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:  # pragma: no cover - depends on the machine
    HAVE_TORCH = False


def rand(rng, shape, dtype):
    """Values exactly representable in ``dtype`` (so the reference sees the same numbers)."""
    a = rng.uniform(-1, 1, size=shape).astype(np.float32)
    if dtype == "bfloat16":
        import ml_dtypes
        return a.astype(ml_dtypes.bfloat16)
    return a.astype(dtype)


def assert_close(out, ref, out_dtype, what=""):
    out = np.asarray(out, np.float64)
    err = np.abs(out - ref).max() if out.size else 0.0
    scale = max(1.0, np.abs(ref).max() if ref.size else 0.0)
    assert out.shape == ref.shape, (what, out.shape, ref.shape)
    assert err / scale <= TOL[out_dtype], f"{what}: max err {err:.3g} (scale {scale:.3g})"
    return err / scale


def assert_nonfinite_positions(out, ref, what=""):
    """``out`` has NaN, +inf and -inf exactly where ``ref`` has them; returns ``out`` as
    float64 and the mask of ``ref``'s finite positions, for the caller's own comparison."""
    out = np.asarray(out, np.float64)
    for name, pred in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        bad = np.argwhere(pred(out) != pred(ref))
        assert not bad.size, f"{what}: {name} differs from the reference at {bad[:5].tolist()}"
    return out, np.isfinite(ref)


def case_id(c):
    return "n{}_ci{}_co{}_{}x{}_k{}x{}_s{}_p{}_d{}_g{}".format(
        c["n"], c["cin"], c["cout"], c["h"], c["w"], c["kh"], c["kw"],
        "".join(map(str, c["stride"])), "".join(map(str, c["pads"])),
        "".join(map(str, c["dil"])), c["groups"])


def out_hw(c):
    ho = (c["h"] + c["pads"][0] + c["pads"][1] - ((c["kh"] - 1) * c["dil"][0] + 1)) \
        // c["stride"][0] + 1
    wo = (c["w"] + c["pads"][2] + c["pads"][3] - ((c["kw"] - 1) * c["dil"][1] + 1)) \
        // c["stride"][1] + 1
    return ho, wo


def para(c, **extra):
    return {"strides": list(c["stride"]), "padding": list(c["pads"]),
            "dilations": [1, 1, *c["dil"]], **extra}


def dx_kernel(c, dtype, res_dtype, target=None, layout_for=None):
    """The dx kernel of case ``c``, built for ``target`` (host); ``layout_for``: the target
    whose facts lay the compute out (default: the one in force), so a dot-product layout is
    checked on a host without the instruction too."""
    import targets

    ho, wo = out_hw(c)
    c1y = -(-c["cout"] // 16)
    w_sizes = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    fz_shape = dsl.layout.GroupLayout.from_weight(w_sizes, c["groups"]).fracz_shape

    def make():
        from tvm import te
        dy = te.placeholder((c["n"], c1y, ho, wo, 16), name="out_backprop", dtype=dtype)
        w = te.placeholder(fz_shape, name="filters", dtype=dtype)
        with targets.use(layout_for or targets.current()):
            dx = dsl.conv2d_backprop_input(w, dy, w_sizes,
                                           (c["n"], c["cin"], c["h"], c["w"]),
                                           para(c, res_dtype=res_dtype))
        return [w, dy], [dx]

    sig = {"op": "dx", "case": c, "dtype": dtype, "res": res_dtype, "layout_for": layout_for}
    return kernel_cache.get_kernel(sig, make, prefix="t_dx", target=target)


def dw_kernel(c, dtype, res_dtype, target=None, layout_for=None):
    """The dw kernel of case ``c`` (``layout_for``: as for :func:`dx_kernel`)."""
    import targets

    ho, wo = out_hw(c)
    w_sizes = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])

    def make():
        from tvm import te
        x = te.placeholder((c["n"], -(-c["cin"] // 16), c["h"], c["w"], 16), name="fmap",
                           dtype=dtype)
        dy = te.placeholder((c["n"], -(-c["cout"] // 16), ho, wo, 16), name="out_backprop",
                            dtype=dtype)
        with targets.use(layout_for or targets.current()):
            dw = dsl.conv2d_backprop_filter(x, dy, w_sizes,
                                            para(c, res_dtype=res_dtype, groups=c["groups"]))
        return [x, dy], [dw]

    sig = {"op": "dw", "case": c, "dtype": dtype, "res": res_dtype, "layout_for": layout_for}
    return kernel_cache.get_kernel(sig, make, prefix="t_dw", target=target)


def dx_data(c, dtype, seed=0):
    rng = np.random.default_rng(seed)
    ho, wo = out_hw(c)
    dy = rand(rng, (c["n"], c["cout"], ho, wo), dtype)
    w = rand(rng, (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"]), dtype)
    return dy, w


def dw_data(c, dtype, seed=0):
    rng = np.random.default_rng(seed)
    ho, wo = out_hw(c)
    x = rand(rng, (c["n"], c["cin"], c["h"], c["w"]), dtype)
    dy = rand(rng, (c["n"], c["cout"], ho, wo), dtype)
    return x, dy


__all__ = ["nc1hwc0_to_nchw", "nchw_to_5hd", "weight_to_fracz"]


def seed_dx():
    """The seed example's kernel: dx of a 1x1 conv, 16 -> 16 channels, 7x7 (w, dy, dx)."""
    from tvm import te

    w_sizes = (16, 16, 1, 1)
    fz = dsl.layout.GroupLayout.from_weight(w_sizes, 1).fracz_shape
    dy = te.placeholder((1, 1, 7, 7, 16), name="out_backprop", dtype="float16")
    w = te.placeholder(fz, name="filters", dtype="float16")
    dx = dsl.conv2d_backprop_input(w, dy, w_sizes, (1, 16, 7, 7),
                                   {"strides": [1, 1], "padding": [0, 0, 0, 0],
                                    "dilations": [1, 1, 1, 1], "res_dtype": "float32"})
    return w, dy, dx


def host_with(l1d_kib: int, cores: int):
    """The host target's facts with another L1d and core count (targets are data),
    registered under its own name so that ``load`` accepts the kernels built for it: a small
    L1d forces the cache-blocked rules' chunks on small test layers."""
    from dataclasses import replace

    import targets

    tgt = replace(targets.get("host"), name=f"host-l1d{l1d_kib}-c{cores}", l1d_kib=l1d_kib,
                  cores=cores)
    targets.register(tgt)
    return tgt
