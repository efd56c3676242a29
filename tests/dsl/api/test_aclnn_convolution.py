"""dsl.api.aclnn.convolution_backward (seed 002) on numpy arrays: against the float64 reference,
against ``torch.ops.aten.convolution_backward``, cube_math_type rounding, dtypes, masks, empty
inputs and the build-once cache."""

import numpy as np
import pytest

import dsl
import dsl.api.aclnn
from dsl import kernel_cache

from aclnn_helpers import ALL, call, data, geometry, gid, padding_arg, reference
from helpers import HAVE_TORCH, TOL, assert_close
from reference import round_hf32

G = geometry
CASES = [
    G(1, 2, 5, 6, 11, 3, 1, 1),                                  # 1-D plain
    G(1, 1, 4, 6, 13, 3, 2, 0, 2, groups=2),                     # 1-D grouped, stride, dil
    G(1, 2, 6, 6, 12, 4, 3, 2, groups=6),                        # 1-D depthwise, stride 3
    G(1, 2, 5, 3, 6, 3, 2, 1, transposed=True, opad=1),          # 1-D transposed
    G(1, 1, 4, 4, 7, 3, 2, 0, 2, groups=4, transposed=True, opad=1),  # 1-D T depthwise
    G(2, 1, 3, 5, (7, 8), (3, 2), (2, 1), (1, 0), (1, 2)),       # 2-D mixed per-axis params
    G(2, 2, 6, 6, 9, 3, 2, 2, 2, groups=3),                      # 2-D gcd(stride, dil) > 1
    G(2, 1, 4, 8, 7, 3, 2, 1, groups=4),                         # 2-D depthwise multiplier 2
    G(2, 1, 3, 4, (6, 7), 3, 2, [(0, 2), (1, 0)]),               # 2-D 4-value padding
    G(2, 2, 4, 6, (4, 5), 3, (2, 3), 1, groups=2, transposed=True, opad=(1, 2)),  # 2-D T grp
    G(2, 1, 6, 6, 5, 3, 2, 1, groups=6, transposed=True, opad=1),  # 2-D T depthwise
    G(2, 1, 3, 2, (4, 3), (3, 2), 2, [(1, 0), (0, 1)], transposed=True, opad=(1, 0)),  # T pad4
    G(3, 1, 3, 4, (5, 6, 5), 3, 2, 1),                           # 3-D plain stride 2
    G(3, 2, 4, 4, 5, (2, 3, 2), 1, (1, 0, 1), (2, 1, 2), groups=2),  # 3-D grouped dilated
    G(3, 1, 4, 3, (3, 4, 3), 3, 2, 1, transposed=True, opad=1),  # 3-D transposed
    G(3, 1, 4, 4, 4, 2, (1, 2, 2), 0, groups=4, transposed=True, opad=(0, 1, 1)),  # 3-D T dw
    # wide channels: the schedule's vector split (1-2 registers) and row blocking engage
    G(1, 2, 32, 48, 40, 3, 2, 1),                                # 1-D wide, stride 2
    G(2, 1, 32, 32, 6, 3, 1, 1, groups=2),                       # 2-D wide grouped
    G(2, 1, 32, 16, (6, 8), 3, 2, 1, transposed=True, opad=1),   # 2-D wide transposed
    G(3, 1, 16, 16, (4, 6, 8), 3, (1, 2, 1), 1, groups=16),      # 3-D wide depthwise
    G(1, 2, 6, 4, 5, 3, 3, 1, 2, groups=2, transposed=True, opad=2),  # 1-D T grouped, dil
    G(3, 1, 4, 6, (3, 3, 4), 2, 2, 0, groups=2, transposed=True, opad=1),  # 3-D T grouped
]


# grouped layers with few channels per group (Cin/g, Cout/g in {1..4}): the expanded packs
# y_rep / x_rep (dsl.ops.convolution_backward, "Expanded packs"), every geometry they meet
GROUPED = [
    G(2, 2, 8, 16, 8, 3, 1, 1, groups=4),                        # the example layer, small N
    G(1, 3, 6, 4, 13, 3, 2, 1, groups=2),                        # 1-D cin_g 3 cout_g 2 s2
    G(1, 2, 9, 12, 17, 3, 1, 2, 2, groups=3),                    # 1-D dil 2, cin_g 3 cout_g 4
    G(2, 2, 12, 9, (7, 9), 3, 1, [(0, 2), (1, 0)], 2, groups=3),  # asym pad, dil 2
    G(2, 3, 12, 12, (9, 7), 3, 2, 1, 2, groups=4),               # stride 2 and dil 2
    G(2, 1, 16, 8, (5, 11), (3, 2), (2, 1), 1, groups=4),        # cin_g 4 cout_g 2, mixed s
    G(2, 2, 4, 8, 7, 3, 1, 1, groups=4),                         # depthwise multiplier 2
    G(2, 2, 8, 4, 7, 3, 1, 1, groups=4),                         # cin_g 2 cout_g 1
    G(3, 2, 4, 8, (5, 6, 5), 3, 2, 1, groups=2),                 # 3-D stride 2
    G(3, 1, 9, 6, (4, 5, 3), 2, 1, (1, 0, 1), 2, groups=3),      # 3-D dilated
    G(1, 2, 8, 6, 9, 4, 2, 1, 2, groups=2, transposed=True, opad=1),  # 1-D T, dil 2
    G(2, 2, 6, 12, (5, 6), 3, 2, 1, groups=3, transposed=True, opad=1),  # 2-D T
    G(2, 1, 12, 8, (4, 5), 3, 2, [(1, 0), (0, 2)], groups=4, transposed=True, opad=(1, 0)),
    G(3, 1, 6, 4, (3, 4, 3), 3, 2, 1, groups=2, transposed=True, opad=1),  # 3-D T
    # around the gates: plain packs, lanes split inside a group (Cin/g 12 -> 6 or 12 lanes)
    G(2, 2, 24, 16, (6, 7), 3, 1, 1, groups=2),                  # cin_g 12, cout_g 8
    G(1, 2, 6, 16, 11, 3, 1, 1, groups=2),                       # dw: Cy lanes, one x per 8
]


def check_all(c, out, ref, dtypes, mask=ALL):
    go, x, w = dtypes
    gi_dt = go if go == x else "float32"
    gw_dt = go if go == w else "float32"
    for i, (o, r, dt, shape) in enumerate(zip(out, ref, (gi_dt, gw_dt, go),
                                              (c["x"], c["w"], (c["cout"],)))):
        if not mask[i]:
            assert o is None
            continue
        assert o.shape == shape and str(o.dtype) == dt, (i, o.shape, o.dtype)
        assert_close(o, r, dt, f"{gid(c)} output {i}")


def check_against_torch(c, out, dy, x, w):
    """PyTorch's float64 convolution_backward on the same data agrees with ``out``."""
    import torch

    t = [torch.tensor(a, dtype=torch.float64) for a in (dy, x, w)]
    peer = torch.ops.aten.convolution_backward(
        *t, [c["cout"]], list(c["stride"]), padding_arg(c), list(c["dil"]), c["transposed"],
        list(c["opad"]), c["groups"], [True, True, True])
    for o, p in zip(out, peer):
        assert_close(o, p.numpy(), "float32", f"torch {gid(c)}")


@pytest.mark.parametrize("c", CASES, ids=gid)
def test_matches_reference_and_torch(c):
    dy, x, w = data(c)
    out = call(c, dy, x, w)
    check_all(c, out, reference(c, dy, x, w), ("float32",) * 3)
    if not HAVE_TORCH or not all(a == b for a, b in c["pads"]):
        return
    check_against_torch(c, out, dy, x, w)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("c", GROUPED, ids=gid)
def test_grouped_few_channels_per_group(c, dtype):
    dy, x, w = data(c, (dtype,) * 3, seed=5)
    out = call(c, dy, x, w)
    check_all(c, out, reference(c, dy, x, w), (dtype,) * 3)
    if not HAVE_TORCH or not all(a == b for a, b in c["pads"]) or dtype != "float32":
        return
    check_against_torch(c, out, dy, x, w)


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, False)],
                         ids=["dx", "dw"])
@pytest.mark.parametrize("c", [GROUPED[0], GROUPED[11]], ids=gid)
def test_grouped_few_channels_one_gradient(c, mask):
    """One gradient alone: its expanded pack without the other gradient's plain pack."""
    dy, x, w = data(c, seed=6)
    check_all(c, call(c, dy, x, w, mask=mask), reference(c, dy, x, w), ("float32",) * 3,
              mask)


@pytest.mark.parametrize("c", [G(2, 3, 8, 12, (61, 59), 3, 1, 1, groups=4),
                               G(2, 3, 24, 24, (61, 59), 3, 2, 1, groups=24)], ids=gid)
def test_grouped_dw_in_batch_chunks(c):
    """Images over half an L2 each: grad_weight with Y channels in lanes (expanded, and exact
    depthwise) sums the batch in chunks (rfactor)."""
    dy, x, w = data(c, seed=8)
    check_all(c, call(c, dy, x, w), reference(c, dy, x, w), ("float32",) * 3)


MASKS = [(True, False, False), (False, True, False), (False, False, True),
         (True, True, False), (False, True, True), (True, False, True)]


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "".join("TF"[not v] for v in m))
@pytest.mark.parametrize("c", [CASES[1], CASES[9], CASES[15]], ids=gid)
def test_output_mask(c, mask):
    dy, x, w = data(c, seed=1)
    out = call(c, dy, x, w, mask=mask)
    check_all(c, out, reference(c, dy, x, w), ("float32",) * 3, mask)


def test_all_false_mask_builds_nothing(monkeypatch):
    c = CASES[0]
    dy, x, w = data(c)
    monkeypatch.setattr(kernel_cache, "get_kernel", _boom)
    assert call(c, dy, x, w, mask=(False, False, False)) == (None, None, None)


DTYPE_CASES = [
    (CASES[0], ("float16",) * 3),
    (CASES[9], ("bfloat16",) * 3),
    (CASES[12], ("bfloat16",) * 3),
    (CASES[6], ("float32", "float16", "bfloat16")),   # mixed: gi, gw promote to float32
    (CASES[3], ("float16", "float16", "float32")),    # gi float16, gw float32
]


@pytest.mark.parametrize("c,dtypes", DTYPE_CASES, ids=lambda v: "-".join(v) if
                         isinstance(v, tuple) else gid(v))
def test_dtypes_and_promotion(c, dtypes):
    dy, x, w = data(c, dtypes)
    out = call(c, dy, x, w)
    check_all(c, out, reference(c, dy, x, w), dtypes)


# --- cube_math_type -------------------------------------------------------------------------

def _full_mantissa(rng, shape):
    """float32 values whose low 13 mantissa bits are random (HF32 / fp16 rounding shows)."""
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


def _rounded(a, how):
    a = np.asarray(a)
    if how == "hf32" and a.dtype == np.float32:
        return round_hf32(a)
    if how == "float16" and str(a.dtype) in ("float32", "bfloat16"):
        return a.astype(np.float32).astype(np.float16)
    return a


@pytest.mark.parametrize("cmt,how", [(1, "hf32"), (2, "float16"), (3, "hf32")],
                         ids=["ALLOW_FP32_DOWN", "USE_FP16", "USE_HF32"])
@pytest.mark.parametrize("c", [CASES[6], CASES[3]], ids=gid)
def test_cube_math_type_rounds_operands(c, cmt, how):
    rng = np.random.default_rng(7)
    dy, x, w = (_full_mantissa(rng, c[k]) for k in ("dy", "x", "w"))
    keep = call(c, dy, x, w, cmt=0)
    out = call(c, dy, x, w, cmt=cmt)
    exact = reference(c, dy, x, w)
    pred = reference(c, *(_rounded(a, how) for a in (dy, x, w)))
    tol = TOL["float32"]
    for i in range(2):
        # matches the math on rounded operands to fp32 accumulation accuracy ...
        assert_close(out[i], pred[i], "float32", f"mode {cmt} output {i}")
        # ... and the rounding moved it far more than that from the exact result, as predicted
        scale = max(1.0, np.abs(exact[i]).max())
        moved = np.abs(pred[i] - exact[i]).max() / scale
        assert moved > 5 * tol, f"test data too coarse: rounding moves only {moved:.2g}"
        seen = np.abs(out[i].astype(np.float64) - exact[i]).max() / scale
        assert 0.5 * moved < seen < 2 * moved, (i, seen, moved)
        assert np.abs(keep[i] - out[i]).max() / scale > 5 * tol
    np.testing.assert_array_equal(out[2], keep[2])  # grad_bias is never rounded


def test_hf32_and_fp16_modes_leave_narrow_dtypes_alone():
    c = CASES[0]
    dy, x, w = data(c, ("float16",) * 3)
    keep = call(c, dy, x, w, cmt=0)
    for cmt in (1, 2, 3):
        for a, b in zip(keep, call(c, dy, x, w, cmt=cmt)):
            np.testing.assert_array_equal(a, b)
    # bfloat16 is untouched by the HF32 modes, but rounded to float16 by USE_FP16
    c = CASES[5]
    dy, x, w = data(c, ("bfloat16",) * 3)
    keep = call(c, dy, x, w, cmt=0)
    for a, b in zip(keep, call(c, dy, x, w, cmt=3)):
        np.testing.assert_array_equal(a.astype(np.float32), b.astype(np.float32))
    import ml_dtypes

    rng = np.random.default_rng(3)
    tiny = (rng.uniform(-1, 1, c["dy"]) * 2.0 ** -22).astype(ml_dtypes.bfloat16)
    # ~2e-7: normal in bfloat16, subnormal in float16 (step 2**-24), so USE_FP16 loses bits
    got = call(c, tiny, x, w, mask=(True, False, False), cmt=2)[0].astype(np.float64)
    pred = reference(c, _rounded(tiny, "float16"), x, w)[0]
    exact = reference(c, tiny, x, w)[0]
    scale = np.abs(exact).max()
    assert np.abs(got - pred).max() / scale < 2 * TOL["bfloat16"]
    assert np.abs(pred - exact).max() / scale > 4 * TOL["bfloat16"]
    assert np.abs(got - exact).max() / scale > 2 * TOL["bfloat16"]
    huge = np.full(c["dy"], 1e5, ml_dtypes.bfloat16)  # beyond float16's 65504: inf
    assert np.isfinite(call(c, huge, x, w, mask=(True, False, False), cmt=0)[0]).all()
    assert not np.isfinite(call(c, huge, x, w, mask=(True, False, False), cmt=2)[0]).all()


def test_hf32_rounding_rule_bitwise():
    """A 1x1 identity convolution exposes the operand rounding bit for bit."""
    one = np.float32(1.0)
    eps = np.float32(2.0 ** -11)  # half an HF32 ulp at 1.0: ties go to even
    vals = np.array([one + eps, one + 3 * eps, one + eps + np.float32(2.0 ** -20), -(one + eps),
                     np.float32(3.4028235e38), np.float32(1e-40), np.inf, -np.inf, np.nan,
                     np.float32(0.1), np.float32(1e-30), np.float32(65504.5)], np.float32)
    c = geometry(1, 1, 1, 1, len(vals), 1)
    dy = vals.reshape(1, 1, -1)
    x = np.zeros(c["x"], np.float32)
    w = np.ones(c["w"], np.float32)
    gi = call(c, dy, x, w, mask=(True, False, False), cmt=3)[0].ravel()
    np.testing.assert_array_equal(gi.view(np.uint32), round_hf32(vals).view(np.uint32))
    assert gi[0] == 1.0 and gi[1] == one + 4 * eps and gi[2] == one + 2 * eps  # ties to even
    assert gi[3] == -1.0 and np.isinf(gi[4]) and np.isnan(gi[8])


# --- empty inputs, the cache ----------------------------------------------------------------

def _boom(*args, **kwargs):
    raise AssertionError("must not build or schedule")


@pytest.mark.parametrize("nd,transposed,x_shape,w_shape,dy_shape", [
    (2, False, (0, 4, 5, 5), (6, 4, 3, 3), (0, 6, 3, 3)),      # N = 0
    (2, False, (2, 0, 5, 5), (6, 0, 3, 3), (2, 6, 3, 3)),      # C = 0
    (1, True, (2, 0, 5), (0, 3, 3), (2, 3, 7)),                # transposed, C = 0
    (3, True, (0, 2, 2, 2, 2), (2, 3, 1, 1, 1), (0, 3, 2, 2, 2)),  # transposed, N = 0
], ids=["N0", "C0", "T_C0", "T_N0"])
def test_empty_input_needs_no_kernel(monkeypatch, nd, transposed, x_shape, w_shape, dy_shape):
    monkeypatch.setattr(kernel_cache, "get_kernel", _boom)
    rng = np.random.default_rng(0)
    dy = rng.uniform(-1, 1, dy_shape).astype(np.float32)
    x = np.zeros(x_shape, np.float32)
    w = rng.uniform(-1, 1, w_shape).astype(np.float32)
    cout = dy_shape[1]
    gi, gw, gb = dsl.aclnn.convolution_backward(dy, x, w, [cout], [1] * nd, [0] * nd,
                                                [1] * nd, transposed, [0] * nd, 1, [True] * 3)
    assert gi.shape == x_shape and gw.shape == w_shape and gb.shape == (cout,)
    assert not gi.any() and not gw.any()
    np.testing.assert_allclose(gb, dy.sum(axis=(0, *range(2, dy.ndim))), rtol=1e-6)
    if HAVE_TORCH and 0 not in w_shape:  # PyTorch refuses an empty weight
        import torch

        t = [torch.from_numpy(a) for a in (dy, x, w)]
        peer = torch.ops.aten.convolution_backward(*t, [cout], [1] * nd, [0] * nd, [1] * nd,
                                                   transposed, [0] * nd, 1, [True] * 3)
        # PyTorch agrees on grad_input / grad_weight; for C = 0 it also zeroes grad_bias, but
        # the forward is then y = bias broadcast over a non-empty grad_output, so we keep the
        # math (grad_bias = sum of grad_output), checked above.
        checked = (gi, gw, gb) if x_shape[0] == 0 else (gi, gw)
        for o, p in zip(checked, peer):
            np.testing.assert_allclose(o, p.numpy(), atol=1e-5)


def test_second_call_neither_schedules_nor_compiles(monkeypatch):
    c = geometry(1, 1, 3, 5, 9, 3, 2, 1, groups=1)  # a signature no other test uses
    dy, x, w = data(c)
    before = dict(kernel_cache.STATS)
    first = call(c, dy, x, w, mask=(True, True, False), cmt=1)
    assert kernel_cache.STATS["builds"] == before["builds"] + 1
    import sys

    monkeypatch.setattr(sys.modules["dsl.runtime.schedule"], "auto_schedule", _boom)
    monkeypatch.setattr(sys.modules["dsl.runtime.build"], "build", _boom)
    second = call(c, dy, x, w, mask=(True, True, False), cmt=1)
    assert kernel_cache.STATS["builds"] == before["builds"] + 1
    assert kernel_cache.STATS["hits"] == before["hits"] + 1
    for a, b in zip(first, second):
        assert (a is None and b is None) or np.array_equal(a, b)
    with pytest.raises(AssertionError, match="must not build"):  # another signature builds
        call(c, dy, x, w, mask=(True, True, False), cmt=0)


def test_bad_arrays_refused_before_building(monkeypatch):
    monkeypatch.setattr(kernel_cache, "get_kernel", _boom)
    c = CASES[0]
    dy, x, w = data(c)
    with pytest.raises(dsl.DslError) as e:
        call(c, dy.tolist(), x, w)
    assert e.value.code == "E60005" and e.value.param == "grad_output"
    with pytest.raises(dsl.DslError) as e:
        call(c, dy, x.astype(np.int32), w)
    assert e.value.code == "E60006" and e.value.param == "input.dtype"
    with pytest.raises(dsl.DslError) as e:
        call(c, dy[:, :, :-1], x, w)
    assert e.value.code == "E60024" and "grad_output" in e.value.param


# --- grad_weight alone on dense layers whose X fills the lanes: dy read in place ------------

DW = (False, True, False)
WIDE_DENSE = [
    G(1, 2, 32, 48, 40, 3, 2, 1),                                 # 1-D stride 2
    G(2, 2, 17, 19, (7, 9), 3, 1, [(0, 2), (1, 0)], 2),           # prime Cx, asym pad, dil 2
    G(3, 2, 16, 20, (4, 5, 7), 3, (2, 1, 1), 1, (1, 2, 1)),       # 3-D, mixed stride and dil
    G(2, 2, 24, 16, (5, 6), 3, 2, 1, transposed=True, opad=1),    # transposed: Y is the input
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("c", WIDE_DENSE, ids=gid)
def test_dense_grad_weight_alone(c, dtype):
    """float32 / float64 read Y in place (``Plan.dw_y_in_place``); the narrower dtypes go
    through y_pack, which converts them; both against the float64 reference."""
    dy, x, w = data(c, (dtype,) * 3, seed=8)
    check_all(c, call(c, dy, x, w, mask=DW), reference(c, dy, x, w), (dtype,) * 3, DW)


@pytest.mark.parametrize("c", WIDE_DENSE[1:3], ids=gid)
def test_dense_grad_weight_alone_rounds_in_the_pack(c):
    """USE_HF32 rounds Y: grad_weight then reads it through y_pack, not in place."""
    rng = np.random.default_rng(9)
    dy, x, w = (_full_mantissa(rng, c[k]) for k in ("dy", "x", "w"))
    out = call(c, dy, x, w, mask=DW, cmt=3)[1]
    pred = reference(c, *(_rounded(a, "hf32") for a in (dy, x, w)))[1]
    assert_close(out, pred, "float32", f"{gid(c)} USE_HF32 grad_weight")
