"""TBE's vector DSL (dsl.vadd ... dsl.reduce_sum) through built kernels, against float64 numpy
references written from the math (then rounded to the output dtype); the TBE dtype and shape
rules; composition with a cube operator's output.

Kernels combine several ops each (one build per dtype/shape family) to keep builds few.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsl
from dsl import kernel_cache
from dsl.errors import DslError

from helpers import rand

FLOATS = ["float16", "float32"]
# Odd, prime and 1-D..5-D shapes.
SHAPES = [(97,), (3, 5, 7), (2, 3, 1, 5, 7)]
# Relative tolerance of a float result computed in (at least) its own precision and rounded
# once: a few units in the last place.
RTOL = {"float16": 2e-3, "float32": 4e-6}


def build(tag, inputs, outputs):
    """The loaded kernel of ``outputs`` (auto_schedule -> build -> load), cached by ``tag``."""
    def make():
        return inputs, outputs
    return kernel_cache.get_kernel({"vector-test": tag}, make, prefix="t_vec")


def call(kernel, *arrays):
    res = kernel(*arrays)
    return res if isinstance(res, tuple) else (res,)


def close(out, ref64, dtype, what, rtol=None, atol=None):
    """``out`` equals the float64 reference rounded to ``dtype`` within a few ulps."""
    ref = ref64.astype(dtype)
    assert out.dtype == np.dtype(dtype), (what, out.dtype)
    assert out.shape == ref.shape, (what, out.shape, ref.shape)
    rtol = RTOL[dtype] if rtol is None else rtol
    atol = rtol if atol is None else atol
    np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64), rtol=rtol,
                               atol=atol, err_msg=what)


def away_from_zero(rng, shape, dtype):
    """Values in +-[0.5, 2]: safe divisors, exactly representable in ``dtype``."""
    mag = rng.uniform(0.5, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    return mag.astype(dtype)


def placeholders(shape, dtype, *names):
    from dsl import tvm

    return [tvm.placeholder(shape, name=n, dtype=dtype) for n in names]


# --- elementwise ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", FLOATS)
def test_binary_ops(dtype, shape):
    a, b = placeholders(shape, dtype, "a", "b")
    outs = [dsl.vadd(a, b), dsl.vsub(a, b), dsl.vmul(a, b), dsl.vdiv(a, b), dsl.vmax(a, b),
            dsl.vmin(a, b)]
    k = build(f"bin-{dtype}-{shape}", [a, b], outs)
    rng = np.random.default_rng(1)
    x, y = rand(rng, shape, dtype), away_from_zero(rng, shape, dtype)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    refs = [x64 + y64, x64 - y64, x64 * y64, x64 / y64, np.maximum(x64, y64),
            np.minimum(x64, y64)]
    for name, out, ref in zip(["vadd", "vsub", "vmul", "vdiv", "vmax", "vmin"],
                              call(k, x, y), refs):
        close(out, ref, dtype, name)


@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", FLOATS)
def test_unary_ops(dtype, shape):
    (a,) = placeholders(shape, dtype, "a")
    pos = dsl.vadds(dsl.vabs(a), 0.25)  # strictly positive for log / sqrt
    outs = [dsl.vabs(a), dsl.vexp(a), dsl.vlog(pos), dsl.vsqrt(pos),
            dsl.vlog(pos, impl_mode="high_precision"), dsl.vrec(a), dsl.vrelu(a)]
    k = build(f"un-{dtype}-{shape}", [a], outs)
    x = away_from_zero(np.random.default_rng(2), shape, dtype)
    x[..., 0] = -x[..., 0] if x.flat[0] > 0 else x[..., 0]  # a negative value for relu
    x64 = x.astype(np.float64)
    p64 = (np.abs(x64) + 0.25).astype(dtype).astype(np.float64)  # vadds rounds in dtype
    refs = [np.abs(x64), np.exp(x64), np.log(p64), np.sqrt(p64), np.log(p64), 1.0 / x64,
            np.maximum(x64, 0.0)]
    names = ["vabs", "vexp", "vlog", "vsqrt", "vlog_hp", "vrec", "vrelu"]
    for name, out, ref in zip(names, call(k, x), refs):
        close(out, ref, dtype, name)


@pytest.mark.parametrize("dtype", [*FLOATS, "int32"])
def test_scalar_ops_cast_scalar_to_tensor_dtype(dtype):
    shape = (5, 13)
    (a,) = placeholders(shape, dtype, "a")
    s = 3 if dtype == "int32" else 0.3  # 0.3 is inexact: cast to fp16 before it is used
    outs = [dsl.vadds(a, s), dsl.vmuls(a, s), dsl.vmaxs(a, 0), dsl.vmins(a, -s),
            dsl.vmuls(a, dsl.tvm.const(2, dtype))]
    k = build(f"scal-{dtype}", [a], outs)
    rng = np.random.default_rng(3)
    x = rng.integers(-50, 50, shape).astype(dtype) if dtype == "int32" else \
        rand(rng, shape, dtype)
    x64, s64 = x.astype(np.float64), float(np.asarray(s, dtype))
    refs = [x64 + s64, x64 * s64, np.maximum(x64, 0), np.minimum(x64, -s64), x64 * 2]
    for i, (out, ref) in enumerate(zip(call(k, x), refs)):
        if dtype == "int32":
            np.testing.assert_array_equal(out, ref.astype(np.int32), err_msg=str(i))
        else:
            close(out, ref, dtype, f"scalar op {i}")


def test_int32_binary_ops_exact():
    shape = (4, 31)
    a, b = placeholders(shape, "int32", "a", "b")
    outs = [dsl.vadd(a, b), dsl.vsub(a, b), dsl.vmul(a, b), dsl.vmax(a, b), dsl.vmin(a, b),
            dsl.vabs(a), dsl.vrelu(b)]
    k = build("bin-int32", [a, b], outs)
    rng = np.random.default_rng(4)
    x, y = (rng.integers(-1000, 1000, shape).astype(np.int32) for _ in range(2))
    refs = [x + y, x - y, x * y, np.maximum(x, y), np.minimum(x, y), np.abs(x),
            np.maximum(y, 0)]
    for i, (out, ref) in enumerate(zip(call(k, x, y), refs)):
        np.testing.assert_array_equal(out, ref, err_msg=str(i))


# --- compare and select ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_vcmp_every_operation_and_vsel(dtype):
    shape = (3, 16)
    a, b = placeholders(shape, dtype, "a", "b")
    ops = ["eq", "ne", "lt", "gt", "le", "ge"]
    cmps = [dsl.vcmp(a, b, op) for op in ops] + [dsl.vcmp(a, 0.0, "gt")]
    sels = [dsl.vsel(cmps[2], a, b), dsl.vsel(cmps[3], a, 0.5), dsl.vsel(cmps[6], -1.0, b),
            dsl.vsel(cmps[0], 1.0, 2.0)]
    k = build(f"cmp-{dtype}", [a, b], [*cmps, *sels])
    rng = np.random.default_rng(5)
    x = rng.integers(-3, 4, shape).astype(dtype)  # small integers: many equal pairs
    y = rng.integers(-3, 4, shape).astype(dtype)
    outs = call(k, x, y)
    refs = [x == y, x != y, x < y, x > y, x <= y, x >= y, x > 0]
    for op, out, ref in zip([*ops, "gt0"], outs[:7], refs):
        assert out.dtype == np.bool_, op
        np.testing.assert_array_equal(out, ref, err_msg=op)
    sel_refs = [np.where(x < y, x, y), np.where(x > y, x, 0.5), np.where(x > 0, -1.0, y)]
    for i, (out, ref) in enumerate(zip(outs[7:10], sel_refs)):
        np.testing.assert_array_equal(out, ref.astype(dtype), err_msg=f"vsel {i}")
    assert outs[10].dtype == np.float16  # two scalar branches: float16, as TBE
    np.testing.assert_array_equal(outs[10], np.where(x == y, 1.0, 2.0).astype(np.float16))


def test_vcmp_bit_mode_packs_and_vsel_reads_the_mask():
    shape = (3, 24)
    a, b = placeholders(shape, "float32", "a", "b")
    mask = dsl.vcmp(a, b, "lt", mode="bit")
    sel = dsl.vsel(mask, a, b)
    k = build("cmp-bit", [a, b], [mask, sel])
    rng = np.random.default_rng(6)
    x, y = rand(rng, shape, "float32"), rand(rng, shape, "float32")
    m, s = call(k, x, y)
    assert m.dtype == np.uint8 and m.shape == (3, 3)
    # element 8j+k is bit k of byte j (little-endian bit order)
    np.testing.assert_array_equal(m, np.packbits(x < y, axis=-1, bitorder="little"))
    np.testing.assert_array_equal(s, np.minimum(x, y))


@pytest.mark.parametrize("dtype", FLOATS)
def test_vcmpsel_defaults_and_explicit_branches(dtype):
    shape = (2, 3, 11)
    a, b, c, d = placeholders(shape, dtype, "a", "b", "c", "d")
    outs = [dsl.vcmpsel(a), dsl.vcmpsel(a, b), dsl.vcmpsel(a, 0.25, "ge"),
            dsl.vcmpsel(a, b, "ne", c, d), dsl.vcmpsel(a, b, "le", 1.0, d)]
    k = build(f"cmpsel-{dtype}", [a, b, c, d], outs)
    rng = np.random.default_rng(7)
    x = (rng.uniform(-3, 3, shape)).astype(dtype)
    y, z, w = (rand(rng, shape, dtype) for _ in range(3))
    y.flat[:5] = x.flat[:5]  # some equal pairs for 'ne' and 'le'
    refs = [np.where(x < 2.0, x, 0.0), np.where(x < y, x, y), np.where(x >= 0.25, x, 0.0),
            np.where(x != y, z, w), np.where(x <= y, 1.0, w)]
    for i, (out, ref) in enumerate(zip(call(k, x, y, z, w), refs)):
        np.testing.assert_array_equal(out, ref.astype(dtype), err_msg=f"vcmpsel {i}")


# --- casts and rounding ----------------------------------------------------------------

HALVES = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -1.2, 1.7, 3.0, -3.7, 0.0, 100.25,
                   -99.75, 126.6, -127.4, 7.5])


@pytest.mark.parametrize("dtype", FLOATS)
def test_round_floor_ceil_trunc_return_int32(dtype):
    (a,) = placeholders((2, 16), dtype, "a")
    outs = [dsl.round(a), dsl.floor(a), dsl.ceil(a), dsl.trunc(a), dsl.round(a, "float32"),
            dsl.floor(a, dtype="float16")]
    k = build(f"round-{dtype}", [a], outs)
    x = np.stack([HALVES, -HALVES]).astype(dtype)
    x64 = x.astype(np.float64)
    refs = [np.rint(x64), np.floor(x64), np.ceil(x64), np.trunc(x64)]  # rint: halves to even
    outs = call(k, x)
    for name, out, ref in zip(["round", "floor", "ceil", "trunc"], outs[:4], refs):
        assert out.dtype == np.int32, name
        np.testing.assert_array_equal(out, ref.astype(np.int32), err_msg=name)
    np.testing.assert_array_equal(outs[4], np.rint(x64).astype(np.float32))
    np.testing.assert_array_equal(outs[5], np.floor(x64).astype(np.float16))


def test_cast_to_float_conversions_and_saturation():
    shape = (16,)
    h, f = placeholders(shape, "float16", "h")[0], placeholders(shape, "float32", "f")[0]
    outs = [dsl.cast_to(h, "float32"), dsl.cast_to(f, "float16"), dsl.cast_to(h, "int32"),
            dsl.cast_to(f, "int32"), dsl.cast_to(h, "int8"), dsl.cast_to(h, "uint8"),
            dsl.cast_to(f, "int8", f1628IntegerFlag=False), dsl.cast_to(f, "float32")]
    k = build("cast-float", [h, f], outs)
    xh = (HALVES * 2).astype(np.float16)  # 253.2 etc. overflow int8 / uint8
    xf = np.array([1e10, -1e10, 3e9, -2.9e9, *HALVES[4:]], np.float32)
    xf[4] = 1 / 3  # not representable in fp16: rounds to nearest
    res = call(k, xh, xf)
    h64, f64 = xh.astype(np.float64), xf.astype(np.float64)
    np.testing.assert_array_equal(res[0], h64.astype(np.float32))
    with np.errstate(over="ignore"):  # 1e10 -> inf in fp16, as IEEE
        np.testing.assert_array_equal(res[1], xf.astype(np.float16))  # nearest-even
    np.testing.assert_array_equal(res[2], np.trunc(h64).astype(np.int32))
    np.testing.assert_array_equal(res[3], np.clip(np.trunc(f64), -2**31, 2147483520))
    np.testing.assert_array_equal(res[4], np.clip(np.trunc(h64), -128, 127))
    np.testing.assert_array_equal(res[5], np.clip(np.trunc(h64), 0, 255))
    np.testing.assert_array_equal(res[6], np.clip(np.trunc(f64), -128, 127))
    np.testing.assert_array_equal(res[7], xf)
    assert [r.dtype for r in res] == [np.dtype(d) for d in (
        "float32", "float16", "int32", "int32", "int8", "uint8", "int8", "float32")]


def test_cast_to_integer_sources_and_bool():
    shape = (2, 7)
    i32, = placeholders(shape, "int32", "i")
    i8, = placeholders(shape, "int8", "j")
    u8, = placeholders(shape, "uint8", "u")
    cmp = dsl.vcmp(dsl.cast_to(i32, "float32"), 0.0, "gt")
    outs = [dsl.cast_to(i32, "float32"), dsl.cast_to(i32, "float16"), dsl.cast_to(i32, "int8"),
            dsl.cast_to(i32, "uint8"), dsl.cast_to(i8, "float16"), dsl.cast_to(u8, "float16"),
            dsl.cast_to(i8, "int32"), dsl.cast_to(u8, "int8"), dsl.cast_to(cmp, "float16")]
    k = build("cast-int", [i32, i8, u8], outs)
    rng = np.random.default_rng(8)
    x = rng.integers(-400, 400, shape).astype(np.int32)
    x[0, :3] = [16777217, -300, 255]  # 2**24 + 1 rounds in fp32
    y = rng.integers(-128, 128, shape).astype(np.int8)
    z = rng.integers(0, 256, shape).astype(np.uint8)
    res = call(k, x, y, z)
    np.testing.assert_array_equal(res[0], x.astype(np.float32))
    with np.errstate(over="ignore"):  # 2**24 + 1 -> inf in fp16, as IEEE
        np.testing.assert_array_equal(res[1], x.astype(np.float64).astype(np.float16))
    np.testing.assert_array_equal(res[2], np.clip(x, -128, 127).astype(np.int8))
    np.testing.assert_array_equal(res[3], np.clip(x, 0, 255).astype(np.uint8))
    np.testing.assert_array_equal(res[4], y.astype(np.float16))
    np.testing.assert_array_equal(res[5], z.astype(np.float16))
    np.testing.assert_array_equal(res[6], y.astype(np.int32))
    np.testing.assert_array_equal(res[7], np.clip(z, 0, 127).astype(np.int8))
    np.testing.assert_array_equal(res[8], (x > 0).astype(np.float16))


# --- broadcast -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_broadcast_then_binary_op(dtype):
    row, = placeholders((1, 5), dtype, "row")
    col, = placeholders((7, 1), dtype, "col")
    vec, = placeholders((5,), dtype, "vec")
    big, = placeholders((3, 7, 5), dtype, "big")
    outs = [dsl.vadd(big, dsl.broadcast(row, (3, 7, 5))),
            dsl.vmul(dsl.broadcast(col, [7, 5]), dsl.broadcast(vec, [7, 5])),
            dsl.broadcast(1.5, (2, 3), dtype), dsl.broadcast(7, [4])]
    k = build(f"bcast-{dtype}", [row, col, vec, big], outs)
    rng = np.random.default_rng(9)
    r, c, v, g = (rand(rng, s, dtype) for s in [(1, 5), (7, 1), (5,), (3, 7, 5)])
    res = call(k, r, c, v, g)
    close(res[0], g.astype(np.float64) + r.astype(np.float64), dtype, "big + row")
    close(res[1], c.astype(np.float64) * v.astype(np.float64), dtype, "col * vec")
    np.testing.assert_array_equal(res[2], np.full((2, 3), 1.5, dtype))
    assert res[3].dtype == np.float16  # a scalar broadcast defaults to float16, as TBE
    np.testing.assert_array_equal(res[3], np.full(4, 7, np.float16))


# --- reductions ------------------------------------------------------------------------

REDUCE_CASES = [  # (shape, axis, keepdims)
    ((3, 5, 7), 1, False),
    ((3, 5, 7), -1, True),
    ((3, 5, 7), [0, 2], False),
    ((2, 3, 1, 5, 7), (-1, 1), True),
    ((97,), 0, False),  # full reduction: shape (1,)
    ((4, 6), None, True),
]


@pytest.mark.parametrize("dtype", FLOATS)
def test_reductions_axes_keepdims(dtype):
    ins, outs, refs = [], [], []
    rng = np.random.default_rng(10)
    arrays = []
    for n, (shape, axis, keep) in enumerate(REDUCE_CASES):
        (a,) = placeholders(shape, dtype, f"a{n}")
        ins.append(a)
        outs += [dsl.reduce_sum(a, axis, keep), dsl.reduce_max(a, axis, keepdims=keep),
                 dsl.reduce_min(a, axis=axis, keepdims=keep)]
        x = rand(rng, shape, dtype)
        arrays.append(x)
        ax = tuple(np.atleast_1d(axis)) if axis is not None else None
        for fn in (np.sum, np.max, np.min):
            ref = fn(x.astype(np.float64), axis=ax, keepdims=keep)
            refs.append(np.atleast_1d(ref))
    k = build(f"reduce-{dtype}", ins, outs)
    for i, (out, ref) in enumerate(zip(call(k, *arrays), refs)):
        close(out, ref, dtype, f"case {i // 3} op {i % 3}")


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_over_a_middle_axis_composes_reduce_broadcast_elemwise(dtype):
    """A TBE-style softmax over axis 1 of a 3-D tensor: reductions with keepdims, broadcasts
    back, exp and divide; every intermediate rounded to ``dtype`` as the kernel does."""
    shape = (3, 7, 5)
    (x,) = placeholders(shape, dtype, "x")
    m = dsl.broadcast(dsl.reduce_max(x, 1, keepdims=True), shape)
    e = dsl.vexp(dsl.vsub(x, m))
    y = dsl.vdiv(e, dsl.broadcast(dsl.reduce_sum(e, -2, keepdims=True), shape))
    k = build(f"softmax-{dtype}", [x], [y])
    xv = (np.random.default_rng(13).standard_normal(shape) * 2).astype(dtype)
    d = np.dtype(dtype)
    x64 = xv.astype(np.float64)
    ev = np.exp((x64 - x64.max(1, keepdims=True)).astype(d).astype(np.float64))
    ev = ev.astype(d).astype(np.float64)
    ref = ev / ev.sum(1, keepdims=True).astype(d).astype(np.float64)
    close(call(k, xv)[0], ref, dtype, "softmax", rtol=2 * RTOL[dtype])
    np.testing.assert_allclose(call(k, xv)[0].astype(np.float64).sum(1), 1.0,
                               rtol=8 * RTOL[dtype])


@st.composite
def _reduce_cases(draw):
    rank = draw(st.integers(1, 5))
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 5, 7, 11]), min_size=rank,
                                max_size=rank)))
    axes = draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank,
                         unique_by=lambda a: a % rank))
    return shape, axes, draw(st.booleans()), draw(st.sampled_from(FLOATS))


@settings(max_examples=6, deadline=None, derandomize=True)
@given(_reduce_cases())
def test_reductions_random_axes_then_broadcast_back(case):
    """Any rank 1-5, any set of (negative) axes, with or without keepdims; the keepdims sum
    broadcast back and subtracted (x - mean-like), as normalisations do."""
    shape, axes, keep, dtype = case
    (a,) = placeholders(shape, dtype, "a")
    s = dsl.reduce_sum(a, axes, keepdims=True)
    centred = dsl.vsub(a, dsl.broadcast(s, shape))
    outs = [dsl.reduce_max(a, axes, keep), centred]
    k = build(f"reduce-prop-{shape}-{axes}-{keep}-{dtype}", [a], outs)
    x = rand(np.random.default_rng(14), shape, dtype)
    x64, ax = x.astype(np.float64), tuple(v % len(shape) for v in axes)
    mx, c = call(k, x)
    close(mx, np.atleast_1d(x64.max(ax, keepdims=keep)), dtype, "reduce_max")
    s64 = x64.sum(ax, keepdims=True).astype(dtype).astype(np.float64)  # rounded to dtype
    close(c, x64 - s64, dtype, "x - sum", atol=4 * RTOL[dtype])


def test_fp16_sum_accumulates_in_fp32_and_int32_sum_is_exact():
    h, = placeholders((3, 4099), "float16", "h")
    i, = placeholders((5, 9, 11), "int32", "i")
    outs = [dsl.reduce_sum(h, -1), dsl.reduce_sum(i, [0, 2], keepdims=True),
            dsl.reduce_max(i, 1)]
    k = build("reduce-acc", [h, i], outs)
    rng = np.random.default_rng(11)
    x = rng.uniform(0.9, 1.1, (3, 4099)).astype(np.float16)  # fp16 running sums lose ~2 units
    y = rng.integers(-10**6, 10**6, (5, 9, 11)).astype(np.int32)
    s, t, m = call(k, x, y)
    ref = x.astype(np.float64).sum(-1)
    np.testing.assert_allclose(s.astype(np.float64), ref.astype(np.float16), rtol=1e-3)
    np.testing.assert_array_equal(t, y.astype(np.int64).sum((0, 2), keepdims=True))
    np.testing.assert_array_equal(m, y.max(1))


def test_stage_tags():
    from dsl.ops import tag

    a, b = placeholders((4, 8), "float16", "a", "b")
    assert dsl.vadd(a, b).op.tag == "elemwise.vadd"
    assert dsl.broadcast(a, (2, 4, 8)).op.tag == tag.BROADCAST
    assert dsl.reduce_max(a, 1).op.tag == "reduce.reduce_max"
    s = dsl.reduce_sum(a, 1)  # fp16: fp32 reduction, then an elementwise cast
    assert s.op.tag == "elemwise.reduce_sum_cast" and s.op.input_tensors[0].op.tag == \
        "reduce.reduce_sum"
    assert dsl.vcmp(a, b, mode="bit").op.tag == "injective.vcmp_bit"
    for t in (dsl.vadd(a, b), dsl.broadcast(a, (2, 4, 8)), dsl.reduce_max(a, 1)):
        assert tag.pattern_of(t.op.tag) in (tag.ELEMWISE, tag.BROADCAST, tag.REDUCE)


# --- errors (before any build) ---------------------------------------------------------


def _errors():
    from dsl import tvm

    h = tvm.placeholder((4, 8), name="h", dtype="float16")
    f = tvm.placeholder((4, 8), name="f", dtype="float32")
    g = tvm.placeholder((4, 9), name="g", dtype="float16")
    i = tvm.placeholder((4, 8), name="i", dtype="int32")
    return [
        ("E65002", lambda: dsl.vadd(h, f), "h"),  # names both dtypes
        ("E65002", lambda: dsl.vsel(dsl.vcmp(h, h), h, f), "float32"),
        ("E65002", lambda: dsl.vcmpsel(h, f), "float32"),
        ("E60003", lambda: dsl.vmul(h, g), "broadcast"),
        ("E60006", lambda: dsl.vexp(i), "int32"),
        ("E60006", lambda: dsl.vdiv(i, i), "int32"),
        ("E60005", lambda: dsl.vadd(h, 1.0), "te.Tensor"),
        ("E60005", lambda: dsl.vadds(h, True), "number"),
        ("E60005", lambda: dsl.vadds(h, "1"), "number"),
        ("E60012", lambda: dsl.vadds(i, 0.5), "whole"),
        ("E60012", lambda: dsl.vmuls(i, 2**31), "[-2147483648"),
        ("E60012", lambda: dsl.vadds(h, 1e6), "65504"),
        ("E60012", lambda: dsl.broadcast(10**40, (2,), "float32"), "largest finite"),
        ("E60012", lambda: dsl.vcmp(h, h, "lte"), "'lt'"),
        ("E60012", lambda: dsl.vcmp(h, h, mode="mask"), "'bit'"),
        ("E60003", lambda: dsl.vcmp(g, g, mode="bit"), "divisible by 8"),
        ("E60006", lambda: dsl.vsel(h, h, h), "bool"),
        ("E60003", lambda: dsl.vsel(dsl.vcmp(h, h), g, 0.0), "[4, 8]"),
        ("E60012", lambda: dsl.cast_to(h, "float64"), "float16"),
        ("E60005", lambda: dsl.cast_to(h, "int8", f1628IntegerFlag=1), "True or False"),
        ("E60012", lambda: dsl.round(h, "int8"), "int32"),
        ("E60006", lambda: dsl.floor(i), "float"),
        ("E60003", lambda: dsl.broadcast(g, (4, 8)), "right-aligned"),
        ("E60003", lambda: dsl.broadcast(h, (8,)), "right-aligned"),
        ("E60006", lambda: dsl.broadcast(h, (2, 4, 8), "float32"), "cast_to"),
        ("E60003", lambda: dsl.broadcast(1.0, (0, 3)), ">= 1"),
        ("E60012", lambda: dsl.reduce_sum(h, 2), "[-2, 1]"),
        ("E60012", lambda: dsl.reduce_sum(h, [1, -1]), "twice"),
        ("E60005", lambda: dsl.reduce_max(h, []), "non-empty"),
        ("E60005", lambda: dsl.reduce_min(h, 1.0), "int"),
        ("E60005", lambda: dsl.reduce_sum(h, 0, keepdims=1), "True or False"),
        ("E60012", lambda: dsl.vlog(h, impl_mode="fast"), "high_precision"),
    ]


@pytest.mark.parametrize("n", range(len(_errors())))
def test_bad_calls_raise_dsl_error_naming_the_rule(n):
    code, fn, text = _errors()[n]
    with pytest.raises(DslError) as e:
        fn()
    assert e.value.code == code, str(e.value)
    assert text in str(e.value)


def test_dtype_mismatch_names_both_operands():
    from dsl import tvm

    a = tvm.placeholder((3,), name="a", dtype="float16")
    b = tvm.placeholder((3,), name="b", dtype="float32")
    with pytest.raises(DslError) as e:
        dsl.vsub(a, b)
    assert "lhs" in e.value.param and "rhs" in e.value.param
    assert e.value.value == ("float16", "float32")


# --- composed with a cube operator -----------------------------------------------------


def test_vector_epilogue_on_conv2d_backprop_input():
    """``relu_grad(dx + residual)``: dx of a stride-2 conv2d (5HD), a residual add, and the
    ReLU-gradient mask of the forward output, one kernel, against float64 numpy."""
    from dsl import tvm
    from dsl.ops.layout import nc1hwc0_to_nchw, nchw_to_5hd, weight_to_fracz

    from reference import conv2d_backprop_input as ref_dx

    n, cin, cout, h, w, kh, kw, stride, pad = 2, 5, 7, 9, 7, 3, 3, 2, 1
    ho, wo = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
    para = {"strides": [stride, stride], "padding": [pad] * 4, "dilations": [1, 1, 1, 1],
            "res_dtype": "float32"}
    fz_shape = dsl.layout.GroupLayout.from_weight((cout, cin, kh, kw), 1).fracz_shape
    filt = tvm.placeholder(fz_shape, name="filters", dtype="float16")
    dy = tvm.placeholder((n, 1, ho, wo, 16), name="dy", dtype="float16")
    dx = dsl.conv2d_backprop_input(filt, dy, (cout, cin, kh, kw), (n, cin, h, w), para)
    shape5 = tuple(int(d) for d in dx.shape)
    res = tvm.placeholder(shape5, name="residual", dtype="float32")
    fwd = tvm.placeholder(shape5, name="fwd", dtype="float32")
    out = dsl.vsel(dsl.vcmp(fwd, 0.0, "gt"), dsl.vadd(dx, res), 0.0)
    k = build("cube-epilogue", [filt, dy, res, fwd], [out])

    rng = np.random.default_rng(12)
    wt = rand(rng, (cout, cin, kh, kw), "float16")
    g = rand(rng, (n, cout, ho, wo), "float16")
    r5, f5 = rand(rng, shape5, "float32"), rand(rng, shape5, "float32")
    got = call(k, weight_to_fracz(wt, 1), nchw_to_5hd(g), r5, f5)[0]
    dx_ref = ref_dx(g.astype(np.float64), wt.astype(np.float64), (n, cin, h, w), (stride, stride),
                    (pad,) * 4, (1, 1), 1)
    r, f = nc1hwc0_to_nchw(r5, cin), nc1hwc0_to_nchw(f5, cin)
    ref = np.where(f > 0, dx_ref + r, 0.0)
    close(nc1hwc0_to_nchw(got, cin), ref, "float32", "relu_grad(dx + residual)", rtol=2e-5)
