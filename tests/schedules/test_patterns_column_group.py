"""Pattern rule for column groups (``schedules/patterns/column_group.py``): normalisations
over an axis that is not the innermost one, written as a user would (a softmax over the
channels of NCHW, ConvNeXt's channels-first layer norm, an L2 normalisation across
channels, a softmax over axis 0), against numpy float64; odd and prime sizes, batch > 1,
1 and 2 cores, float32 and float16."""

import numpy as np
import pytest
from pattern_helpers import build_run, check, rand
from tvm import te

import targets


def _softmax_over(x, axis: int, dtype):
    """Softmax of ``x`` over ``axis`` (max, exp, sum, divide), each stage a te.compute."""
    shape = [int(d) for d in x.shape]
    rest = shape[:axis] + shape[axis + 1:]

    def full(i, r):  # the index of x with r at ``axis``
        return (*i[:axis], r, *i[axis:])

    r1 = te.reduce_axis((0, shape[axis]), name="r1")
    m = te.compute(rest, lambda *i: te.max(x(*full(i, r1)), axis=r1), name="m")
    e = te.compute(shape, lambda *i: te.exp(x(*i) - m(*i[:axis], *i[axis + 1:])), name="e")
    r2 = te.reduce_axis((0, shape[axis]), name="r2")
    s = te.compute(rest, lambda *i: te.sum(e(*full(i, r2)), axis=r2), name="s")
    return te.compute(shape, lambda *i: e(*i) / s(*i[:axis], *i[axis + 1:]), name="y")


def _ref_softmax(xn, axis):
    x = xn.astype(np.float64)
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _target(cores):
    return targets.get("host").with_cores(cores)


def _rules(why, names):
    return {n: why.rule_of(n) for n in names}


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(2, 19, 13, 11), (3, 8, 56, 56), (2, 5, 3, 4, 17)],
                         ids=str)
def test_softmax_over_channels(shape, dtype, cores):
    """NCHW with 19 channels over 13 x 11, 8 over 56 x 56 (pieces of 4 rows a task), and
    NCDHW (three trailing axes, one run): every stage in the column group."""
    rng = np.random.default_rng(11)
    x = te.placeholder(shape, name="x", dtype=dtype)
    y = _softmax_over(x, 1, dtype)
    xn = rand(shape, dtype, rng, -3, 3)
    (out,), why = build_run([y], [x], [xn], target=_target(cores))
    check(out, _ref_softmax(xn, 1), dtype, f"softmax over channels {shape}")
    assert set(_rules(why, "mesy").values()) == {"patterns.column_group"}, str(why)


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize("shape", [(37, 300), (64, 96)], ids=str)
def test_softmax_over_axis_0(shape, cores):
    """No leading axis: the tasks are pieces of the columns alone."""
    x = te.placeholder(shape, name="x")
    y = _softmax_over(x, 0, "float32")
    xn = rand(shape, "float32", np.random.default_rng(12), -3, 3)
    (out,), why = build_run([y], [x], [xn], target=_target(cores))
    check(out, _ref_softmax(xn, 0), "float32", f"softmax over axis 0 {shape}")
    assert why.rule_of("y") == "patterns.column_group", str(why)


@pytest.mark.parametrize("cores", [1, 2])
def test_channels_first_layer_norm(cores):
    """ConvNeXt's layer norm over the channels of NCHW with its affine: the variance's
    reduction reads the mean (a reduction reading the group's injective stage), 37
    channels over 9 x 12."""
    n, c, h, w = 3, 37, 9, 12
    x = te.placeholder((n, c, h, w), name="x")
    g, b = te.placeholder((c,), name="g"), te.placeholder((c,), name="b")
    r1, r2 = te.reduce_axis((0, c), name="r1"), te.reduce_axis((0, c), name="r2")
    s1 = te.compute((n, h, w), lambda a, i, j: te.sum(x[a, r1, i, j], axis=r1), name="s1")
    mu = te.compute((n, h, w), lambda a, i, j: s1[a, i, j] / float(c), name="mu")
    s2 = te.compute((n, h, w), lambda a, i, j: te.sum(
        (x[a, r2, i, j] - mu[a, i, j]) * (x[a, r2, i, j] - mu[a, i, j]), axis=r2), name="s2")
    y = te.compute((n, c, h, w), lambda a, q, i, j: (x[a, q, i, j] - mu[a, i, j]) / te.sqrt(
        s2[a, i, j] / float(c) + 1e-6) * g[q] + b[q], name="y")
    rng = np.random.default_rng(13)
    xn, gn, bn = (rand(s, "float32", rng) for s in ((n, c, h, w), (c,), (c,)))
    (out,), why = build_run([y], [x, g, b], [xn, gn, bn], target=_target(cores))
    x64 = xn.astype(np.float64)
    u, v = x64.mean(1, keepdims=True), x64.var(1, keepdims=True)
    ref = (x64 - u) / np.sqrt(v + 1e-6) * gn[:, None, None] + bn[:, None, None]
    check(out, ref, "float32", "channels-first layer norm")
    assert _rules(why, ["s1", "s2", "y"]) == dict.fromkeys(
        ["s1", "s2", "y"], "patterns.column_group"), str(why)


def test_l2_normalisation_across_channels():
    """``x / max(||x||_c, eps)``: one reduction, 2 cores, 23 channels over 7 x 29."""
    n, c, h, w = 2, 23, 7, 29
    x = te.placeholder((n, c, h, w), name="x")
    r = te.reduce_axis((0, c), name="r")
    ss = te.compute((n, h, w), lambda a, i, j: te.sum(x[a, r, i, j] * x[a, r, i, j], axis=r),
                    name="ss")
    y = te.compute((n, c, h, w), lambda a, q, i, j: x[a, q, i, j] / te.max(
        te.sqrt(ss[a, i, j]), 1e-12), name="y")
    xn = rand((n, c, h, w), "float32", np.random.default_rng(14))
    (out,), why = build_run([y], [x], [xn], target=_target(2))
    x64 = xn.astype(np.float64)
    check(out, x64 / np.sqrt((x64 ** 2).sum(1, keepdims=True)), "float32", "l2 normalise")
    assert _rules(why, ["ss", "y"]) == dict.fromkeys(["ss", "y"], "patterns.column_group")


def test_many_reduced_steps_keep_one_pass_a_stage():
    """A softmax over 1000 classes of 12 x 12: a task's share of L2 leaves pieces of 48
    elements, under ``MIN_PIECE_BYTES`` a class, so the rule refuses and each stage is its
    own pass (the outer-reduction rule's); still exact."""
    from schedules.patterns.column_group import MIN_PIECE_BYTES

    shape = (2, 1000, 12, 12)
    assert 48 * 4 < MIN_PIECE_BYTES
    x = te.placeholder(shape, name="x")
    y = _softmax_over(x, 1, "float32")
    xn = rand(shape, "float32", np.random.default_rng(15), -3, 3)
    (out,), why = build_run([y], [x], [xn], target=targets.get("x86-avx512").with_cores(1))
    check(out, _ref_softmax(xn, 1), "float32", "softmax over 1000 classes")
    assert why.rule_of("m") == "patterns.outer_reduction", str(why)
    assert why.fell_to_generic() == []


@pytest.mark.parametrize("cores", [1, 2])
def test_softmax_over_channels_in_the_vector_dsl(cores):
    """TBE's vector DSL keeps the reduced axis (``reduce_max(x, 1, keepdims=True)``, then
    ``broadcast``): the consumers read ``m[n, 0, h, w]``, an axis of one, and the group is
    a column group all the same (21 classes over 17 x 24, batch 2)."""
    from dsl.compat import tvm as dtvm
    from dsl.ops import vector as vec

    shape = (2, 21, 17, 24)
    x = dtvm.placeholder(shape, name="x", dtype="float32")
    m = vec.broadcast(vec.reduce_max(x, 1, keepdims=True), shape)
    e = vec.vexp(vec.vsub(x, m))
    y = vec.vdiv(e, vec.broadcast(vec.reduce_sum(e, 1, keepdims=True), shape))
    xn = rand(shape, "float32", np.random.default_rng(16), -3, 3)
    (out,), why = build_run([y], [x], [xn], target=_target(cores))
    check(out, _ref_softmax(xn, 1), "float32", "vector-DSL softmax over channels")
    rules = {s: r for s, r, _ in why.stages}
    assert {rules[s] for s in ("reduce_max", "reduce_sum", "vexp", "vdiv")} == {
        "patterns.column_group"}, str(why)


@pytest.mark.parametrize("cores", [1, 2])
def test_log_softmax_over_channels_computes_its_log_once_a_vector(cores):
    """``y = x - m - log(s)``: ``log(s[n, h, w])`` is the same for every channel, so the
    channels loop inside each vector of the piece (LLVM computes the log once a vector);
    the softmax's ``e / s`` keeps the channels outside the piece. 13 classes over 6 x 40."""
    import tvm

    from schedules.patterns.column_group import _invariant_call

    n, c, h, w = 2, 13, 6, 40
    x = te.placeholder((n, c, h, w), name="x")
    r1, r2 = te.reduce_axis((0, c), name="r1"), te.reduce_axis((0, c), name="r2")
    m = te.compute((n, h, w), lambda a, i, j: te.max(x[a, r1, i, j], axis=r1), name="m")
    s = te.compute((n, h, w), lambda a, i, j: te.sum(te.exp(x[a, r2, i, j] - m[a, i, j]),
                                                     axis=r2), name="s")
    y = te.compute((n, c, h, w), lambda a, q, i, j: x[a, q, i, j] - m[a, i, j] - te.log(
        s[a, i, j]), name="y")
    xn = rand((n, c, h, w), "float32", np.random.default_rng(17), -4, 4)
    (out,), why = build_run([y], [x], [xn], target=_target(cores))
    check(out, np.log(_ref_softmax(xn, 1)), "float32", "log-softmax over channels")
    assert why.rule_of("y") == "patterns.column_group", str(why)
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    assert _invariant_call(sch, sch.get_sblock("y"), [1])
    z = _softmax_over(x, 1, "float32")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, z]))
    assert not _invariant_call(sch, sch.get_sblock("y"), [1])  # e / s: no call
    assert not _invariant_call(sch, sch.get_sblock("e"), [1])  # exp(x - m) moves with c


@pytest.mark.parametrize("cores", [1, 2])
def test_softmax_over_two_middle_axes(cores):
    """``m[n, w] = max_{c, d} x[n, c, d, w]``: two reduced axes, both outside each piece."""
    n, c, d, w = 2, 5, 7, 48
    x = te.placeholder((n, c, d, w), name="x")
    r1, r2, r3, r4 = (te.reduce_axis((0, e), name=f"r{k}") for k, e in enumerate((c, d, c, d)))
    m = te.compute((n, w), lambda a, j: te.max(x[a, r1, r2, j], axis=[r1, r2]), name="m")
    e = te.compute((n, c, d, w), lambda a, b, k, j: te.exp(x[a, b, k, j] - m[a, j]), name="e")
    s = te.compute((n, w), lambda a, j: te.sum(e[a, r3, r4, j], axis=[r3, r4]), name="s")
    y = te.compute((n, c, d, w), lambda a, b, k, j: e[a, b, k, j] / s[a, j], name="y")
    xn = rand((n, c, d, w), "float32", np.random.default_rng(18), -3, 3)
    (out,), why = build_run([y], [x], [xn], target=_target(cores))
    x64 = xn.astype(np.float64)
    ex = np.exp(x64 - x64.max((1, 2), keepdims=True))
    check(out, ex / ex.sum((1, 2), keepdims=True), "float32", "softmax over (c, d)")
    assert set(_rules(why, "mesy").values()) == {"patterns.column_group"}, str(why)
