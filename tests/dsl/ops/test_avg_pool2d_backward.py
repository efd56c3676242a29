"""avg_pool2d backward (seed 004) through built kernels, against the float64 scatter-form
reference and PyTorch autograd; the 5HD variant; the checks; the build-once cache."""

import numpy as np
import pytest

import dsl
import dsl.api.aclnn
import targets
from dsl import kernel_cache
from dsl.ops.avg_pool2d_backward import PoolAxis, avg_pool2d_backward_5hd

from helpers import HAVE_TORCH, assert_close, nc1hwc0_to_nchw, nchw_to_5hd, rand
from reference import avg_pool2d_backward as ref_pool_dx
from reference import avg_pool2d_out_size

# (self shape, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
CASES = [
    ((2, 3, 5, 6), [1], [1], [0], False, True, 0),
    ((1, 3, 7, 9), [2], [], [0], False, True, 0),  # stride [] = kernel; odd sizes
    ((2, 3, 9, 8), [3], [2], [1], False, True, 0),
    ((2, 3, 9, 8), [3], [2], [1], False, False, 0),
    ((1, 2, 8, 11), [3], [1, 2], [1, 0], False, False, 0),  # sH != sW, pH != pW
    ((1, 2, 9, 10), [2, 4], [3, 1], [1, 2], False, True, 0),  # kH != kW, stride 3
    ((1, 2, 11, 11), [5], [3], [2], True, True, 0),  # ceil adds a window past H + p
    ((1, 2, 11, 10), [5], [3], [2], True, False, 0),
    ((1, 2, 7, 7), [2], [2], [1], True, True, 0),  # ceil window would start in the padding
    ((1, 2, 4, 6), [4], [3], [2], True, False, 0),  # ... likewise (H), kept window (W)
    ((1, 3, 9, 9), [3], [1], [1], False, True, 3),
    ((1, 3, 6, 7), [3, 2], [2, 1], [1, 1], True, False, -2),
    ((1, 2, 9, 8), [7], [1], [3], False, False, 0),
    ((1, 2, 13, 12), [7], [3], [2], True, True, 0),
    ((1, 2, 10, 9), [6], [3], [3], False, True, 0),  # even kernel, pad = kernel / 2
    ((1, 2, 11, 9), [2], [3], [0], False, True, 0),  # stride > kernel: uncovered inputs
    ((3, 10, 7), [3], [2], [1], True, False, 0),  # 3-D (C, H, W)
    ((1, 2, 7, 7), [7], [1], [0], False, True, 0),  # global-like: one window
    ((1, 2, 7, 8), [6, 7], [1], [1, 2], True, False, 0),  # fewer windows than candidates
    ((1, 2, 5, 5), [4], [2], [2], True, False, 5),
    ((2, 1, 21, 19), [3], [1], [1], False, False, 0),  # W > vector lanes, prime
    ((1, 1, 3, 67), [3], [1], [1], False, False, 0),  # W prime > 4 vectors: LLVM's lanes
]


def cid(c):
    shape, k, s, p, ceil, cip, div = c
    return "x{}_k{}_s{}_p{}{}{}{}".format("x".join(map(str, shape)), "".join(map(str, k)),
                                          "".join(map(str, s)) or "k", "".join(map(str, p)),
                                          "_ceil" if ceil else "", "_cip" if cip else "",
                                          f"_div{div}" if div else "")


def pairs(c):
    _, k, s, p, *_ = c
    k2 = tuple(k * 2 if len(k) == 1 else k)
    s2 = k2 if not s else tuple(s * 2 if len(s) == 1 else s)
    return k2, s2, tuple(p * 2 if len(p) == 1 else p)


def dy_shape(c):
    shape, _, _, _, ceil, _, _ = c
    (kh, kw), (sh, sw), (ph, pw) = pairs(c)
    return (*shape[:-2], avg_pool2d_out_size(shape[-2], kh, sh, ph, ceil),
            avg_pool2d_out_size(shape[-1], kw, sw, pw, ceil))


def data(c, dtype, seed=0):
    dy = rand(np.random.default_rng(seed), dy_shape(c), dtype)
    return dy, np.zeros(c[0], dtype=dy.dtype)


def reference(c, dy):
    shape, _, _, _, ceil, cip, div = c
    return ref_pool_dx(dy, shape, *pairs(c), ceil, cip, div)


def run(c, dtype, **kw):
    dy, x = data(c, dtype)
    out = dsl.aclnn.avg_pool2d_backward(dy, x, *c[1:], **kw)
    assert out.shape == x.shape and out.dtype == x.dtype
    return out, dy


@pytest.mark.parametrize("c", CASES, ids=cid)
def test_matches_reference(c):
    out, dy = run(c, "float32")
    assert_close(out, reference(c, dy), "float32", cid(c))


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch not installed")
@pytest.mark.parametrize("c", CASES, ids=cid)
def test_matches_torch(c):
    import torch

    shape, k, s, p, ceil, cip, div = c
    x = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.avg_pool2d(x, k, s or None, p, ceil, cip, div or None)
    assert tuple(y.shape) == dy_shape(c), "output-size rule differs from PyTorch"
    out, dy = run(c, "float32")
    y.backward(torch.tensor(dy, dtype=torch.float64))
    assert_close(out, x.grad.numpy(), "float32", "torch " + cid(c))


@pytest.mark.parametrize("n_in,k,s,p,ceil,expect", [
    (11, 5, 3, 2, False, 4), (11, 5, 3, 2, True, 5),  # ceil adds a window
    (7, 2, 2, 1, False, 4), (7, 2, 2, 1, True, 4),  # ... which would start in the padding
    (4, 4, 3, 2, True, 2), (6, 3, 2, 1, True, 4), (7, 7, 1, 0, True, 1), (5, 1, 1, 0, False, 5),
])
def test_output_size_rule(n_in, k, s, p, ceil, expect):
    assert avg_pool2d_out_size(n_in, k, s, p, ceil) == expect
    assert PoolAxis.out_size(n_in, k, s, p, ceil) == expect


def test_enumeration_finds_exactly_the_covering_windows():
    """The gather's candidate set, evaluated on ints, against every window's extent."""
    for n_in in range(1, 10):
        for k in range(1, 8):
            for s in range(1, 4):
                for p in range(k // 2 + 1):
                    for ceil in (False, True):
                        n_out = PoolAxis.out_size(n_in, k, s, p, ceil)
                        if n_out < 1:
                            continue
                        ax = PoolAxis(n_in, n_out, k, s, p)
                        for i in range(n_in):
                            want = {o for o in range(n_out) if o * s <= i + p < o * s + k}
                            got = set()
                            for j in range(ax.n_taps):
                                row, conds = ax.tap(i, j)
                                assert 0 <= row < ax.padded_size
                                o = row - ax.pad_before
                                if all(conds) and 0 <= o < n_out:
                                    got.add(o)
                            assert got == want, (n_in, k, s, p, ceil, i)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("c", [CASES[2], CASES[7], CASES[11]], ids=cid)
def test_half_dtypes(c, dtype):
    out, dy = run(c, dtype)
    assert str(out.dtype) == dtype
    assert_close(out, reference(c, dy), dtype, cid(c))


def kernel_5hd(c, dtype):
    def make():
        from tvm import te

        dy5 = te.placeholder(nchw_to_5hd(np.zeros(dy_shape(c), np.float32)).shape, dtype,
                             name="grad_output")
        x5 = te.placeholder(nchw_to_5hd(np.zeros(c[0], np.float32)).shape, dtype, name="self")
        return [dy5], [avg_pool2d_backward_5hd(dy5, x5, *c[1:])]

    return kernel_cache.get_kernel({"t": "pool5hd", "c": c, "dtype": dtype}, make,
                                   prefix="t_pool5hd")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("c", [((2, 20, 9, 8), [3], [2], [1], False, True, 0),
                               ((1, 20, 11, 10), [5], [3], [2], True, False, 0),
                               ((1, 20, 5, 5), [5], [1], [0], False, True, 0)], ids=cid)
def test_5hd(c, dtype):
    dy, _ = data(c, dtype)
    out5 = kernel_5hd(c, dtype)(nchw_to_5hd(dy))
    assert str(out5.dtype) == dtype and out5.shape[-1] == 16
    flat = np.moveaxis(out5, -1, 2).reshape(out5.shape[0], -1, *out5.shape[2:4])
    assert not flat[:, c[0][1]:].astype(np.float32).any(), "pad channels must stay zero"
    assert_close(nc1hwc0_to_nchw(out5, c[0][1]), reference(c, dy), dtype, cid(c))


def test_stages_named_and_tagged():
    from tvm import te

    from dsl.runtime.schedule import walk

    full = {"avg_pool2d_backward", "avg_pool2d_backward.acc", "avg_pool2d_backward.scale"}
    for dtype, stride, tags in (
            ("float16", [1], full),
            ("float32", [2], full),  # W phases need their own accumulator
            ("float32", [2, 1], {"avg_pool2d_backward", "avg_pool2d_backward.scale"})):
        c = ((1, 2, 9, 8), [3], stride, [1], False, True, 0)
        dy = te.placeholder(dy_shape(c), dtype, name="grad_output")
        x = te.placeholder((1, 2, 9, 8), dtype, name="self")
        dx = dsl.avg_pool2d_backward(dy, x, [3], stride, [1], False, True, 0)
        _, computes = walk([dx])
        assert {op.tag for op in computes} == tags
        assert all(op.name.startswith("grad_") for op in computes)
        assert dsl.auto_schedule(dx).rule_name.endswith("schedule_avg_pool2d_backward")


@pytest.mark.parametrize("name", ["x86-avx2", "x86-64"])
def test_other_targets(name):
    tgt = targets.get(name)
    if not targets.runnable(tgt):
        pytest.skip(f"{name} cannot run here")
    c = CASES[5]
    dy, x = data(c, "float32")
    out = dsl.aclnn.avg_pool2d_backward(dy, x, *c[1:], target=name)
    assert_close(out, reference(c, dy), "float32", name)


def test_second_call_does_not_build():
    c = ((1, 2, 6, 5), [2], [2], [0], False, True, 0)
    dy, x = data(c, "float32")
    first = dsl.aclnn.avg_pool2d_backward(dy, x, *c[1:])
    builds, hits = kernel_cache.STATS["builds"], kernel_cache.STATS["hits"]
    # the same operator spelled differently (stride [] vs [2, 2], kernel [2] vs [2, 2]) and a
    # different cube_math_type, which does not change the float32 arithmetic
    again = dsl.aclnn.avg_pool2d_backward(dy * 2, x, [2, 2], [2, 2], [0, 0], False, True, 0,
                                          cube_math_type=3)
    assert kernel_cache.STATS["builds"] == builds and kernel_cache.STATS["hits"] == hits + 1
    np.testing.assert_array_equal(again, first * 2)


F32 = np.float32


def _arr(shape, dtype=F32):
    if dtype == "bfloat16":
        import ml_dtypes

        dtype = ml_dtypes.bfloat16
    return np.zeros(shape, dtype)


OK = dict(dy=(1, 2, 4, 4), x=(1, 2, 8, 8), args=([3], [2], [1], False, True, 0))
BAD = [  # (name, changes, code, param fragment)
    ("kernel0", {"args": ([0], [2], [1], False, True, 0)}, "E60011", "kernel_size"),
    ("kernel_len3", {"args": ([3, 3, 3], [2], [1], False, True, 0)}, "E60003", "kernel_size"),
    ("kernel_float", {"args": ([3.0], [2], [1], False, True, 0)}, "E60005", "kernel_size"),
    ("stride0", {"args": ([3], [0], [1], False, True, 0)}, "E60011", "stride"),
    ("stride_len3", {"args": ([3], [2, 2, 2], [1], False, True, 0)}, "E60003", "stride"),
    ("pad_over_half", {"args": ([3], [2], [2], False, True, 0)}, "E60011", "padding"),
    ("pad_negative", {"args": ([3], [2], [-1], False, True, 0)}, "E60011", "padding"),
    ("pad_empty", {"args": ([3], [2], [], False, True, 0)}, "E60003", "padding"),
    ("ceil_int", {"args": ([3], [2], [1], 1, True, 0)}, "E60005", "ceil_mode"),
    ("cip_str", {"args": ([3], [2], [1], False, "yes", 0)}, "E60005", "count_include_pad"),
    ("divisor_float", {"args": ([3], [2], [1], False, True, 1.5)}, "E60005", "divisor"),
    ("divisor_bool", {"args": ([3], [2], [1], False, True, True)}, "E60005", "divisor"),
    ("cube4", {"cube": 4}, "E60011", "cube_math_type"),
    ("cube_neg", {"cube": -1}, "E60011", "cube_math_type"),
    ("fp16_bf16_cube2", {"dtype": "bfloat16", "cube": 2}, "E60012", "cube_math_type"),
    ("hf32_fp16", {"dtype": "float16", "cube": 3}, "E60012", "cube_math_type"),
    ("int32", {"dtype": np.int32}, "E60006", "self.dtype"),
    ("dtype_mismatch", {"dy_dtype": np.float16}, "E65002", "grad_output.dtype"),
    ("rank2", {"x": (8, 8), "dy": (4, 4)}, "E60003", "self.shape"),
    ("empty", {"x": (1, 0, 8, 8)}, "E60003", "self.shape"),
    ("too_small", {"x": (1, 2, 2, 2), "args": ([5], [1], [0], False, True, 0)}, "E60025",
     "self.shape"),
    ("dy_spatial", {"dy": (1, 2, 4, 5)}, "E60024", "grad_output.shape"),
    ("dy_channels", {"dy": (1, 3, 4, 4)}, "E60002", "grad_output.shape"),
    ("dy_batch", {"dy": (2, 2, 4, 4)}, "E60003", "grad_output.shape"),
    ("dy_rank", {"dy": (2, 4, 4)}, "E60003", "grad_output.shape"),
    ("not_array", {"dy": "list"}, "E60005", "grad_output"),
]


@pytest.mark.parametrize("name,changes,code,param", BAD, ids=[b[0] for b in BAD])
def test_bad_calls_refused_before_building(name, changes, code, param):
    p = {**OK, **changes}
    dtype = p.get("dtype", F32)
    dy = [[0.0]] if p["dy"] == "list" else _arr(p["dy"], p.get("dy_dtype", dtype))
    x = _arr(p["x"], dtype)
    builds = kernel_cache.STATS["builds"]
    with pytest.raises(dsl.DslError) as e:
        dsl.aclnn.avg_pool2d_backward(dy, x, *p["args"], p.get("cube", 0))
    assert e.value.code == code and param in e.value.param, str(e.value)
    assert kernel_cache.STATS["builds"] == builds


def test_cube_math_types_accepted():
    c = CASES[2]
    dy, x = data(c, "float32")
    outs = [dsl.aclnn.avg_pool2d_backward(dy, x, *c[1:], m) for m in range(4)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    dy16, x16 = data(c, "float16")
    dsl.aclnn.avg_pool2d_backward(dy16, x16, *c[1:], 2)  # USE_FP16 is fine for float16


def test_5hd_and_te_checks():
    from tvm import te

    dy = te.placeholder((1, 1, 4, 4, 8), "float32", name="grad_output")
    x = te.placeholder((1, 1, 8, 8, 8), "float32", name="self")
    with pytest.raises(dsl.DslError) as e:
        avg_pool2d_backward_5hd(dy, x, [3], [2], [1], False, True, 0)
    assert e.value.code == "E60003"
    dy = te.placeholder((1, 4097, 1, 1, 16), "float32", name="grad_output")
    x = te.placeholder((1, 4097, 1, 1, 16), "float32", name="self")
    # C1 > 4096 (over the seed's 65535 channels, a device limit) builds: any C computes
    assert avg_pool2d_backward_5hd(dy, x, [1], [1], [0], False, True, 0).shape[1] == 4097
    with pytest.raises(dsl.DslError) as e:
        dsl.avg_pool2d_backward(np.zeros((1, 1, 4, 4)), x, [3], [2], [1], False, True, 0)
    assert e.value.code == "E60005" and e.value.param == "grad_output"
