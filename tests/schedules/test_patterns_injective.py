"""Pattern rules for injective stages: elementwise chains inlined and vectorised, broadcasts,
padding and layout stages inlined into their consumer; 1-D to 5-D, odd/prime sizes, fp32 and
fp16, against numpy float64, and the rule each stage took."""

import numpy as np
import pytest
from pattern_helpers import build_run, check, rand
from tvm import te

SHAPES = [(1031,), (7, 129), (3, 5, 37), (2, 3, 5, 19), (2, 3, 1, 5, 13), (4, 4096)]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_elementwise_chain_is_inlined_and_vectorised(shape, dtype):
    rng = np.random.default_rng(len(shape))
    x = te.placeholder(shape, name="x", dtype=dtype)
    y = te.placeholder(shape, name="y", dtype=dtype)
    a = te.compute(shape, lambda *i: x(*i) * y(*i), name="a", tag="elemwise")
    b = te.compute(shape, lambda *i: te.exp(a(*i)), name="b")
    c = te.compute(shape, lambda *i: te.max(b(*i) - y(*i), te.const(0, dtype)), name="c")
    xn, yn = rand(shape, dtype, rng), rand(shape, dtype, rng)
    (out,), why = build_run([c], [x, y], [xn, yn])
    x64, y64 = xn.astype(np.float64), yn.astype(np.float64)
    check(out, np.maximum(np.exp(x64 * y64) - y64, 0), dtype, "chain")
    assert why.rule_of("a") == "patterns.inline"
    assert why.rule_of("b") == "patterns.inline"
    assert why.rule_of("c") == "patterns.injective"
    assert why.fell_to_generic() == []


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", SHAPES[1:], ids=str)
def test_broadcast_along_leading_axes(shape, dtype):
    rng = np.random.default_rng(3)
    x = te.placeholder(shape, name="x", dtype=dtype)
    bias = te.placeholder(shape[-1:], name="bias", dtype=dtype)
    out_t = te.compute(shape, lambda *i: x(*i) + bias(i[-1]), name="out")
    xn, bn = rand(shape, dtype, rng), rand(shape[-1:], dtype, rng)
    (out,), why = build_run([out_t], [x, bias], [xn, bn])
    check(out, xn.astype(np.float64) + bn.astype(np.float64), dtype, "bias")
    assert why.rule_of("out") == "patterns.injective"
    assert "broadcast" in dict((s, w) for s, _, w in why.stages)["out"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_padding_and_transpose_inlined_into_consumer(dtype):
    rng = np.random.default_rng(5)
    n, h, w = 3, 11, 13
    x = te.placeholder((n, h, w), name="x", dtype=dtype)
    pad = te.compute((n, h + 2, w + 2), lambda b, i, j: te.if_then_else(
        te.all(i >= 1, i <= h, j >= 1, j <= w), x[b, i - 1, j - 1], te.const(0, dtype)),
        name="pad")
    tr = te.compute((n, w + 2, h + 2), lambda b, j, i: pad[b, i, j], name="tr")
    out_t = te.compute((n, w, h), lambda b, j, i: tr[b, j, i] + tr[b, j + 2, i + 2],
                       name="out")
    xn = rand((n, h, w), dtype, rng)
    (out,), why = build_run([out_t], [x], [xn])
    p = np.pad(xn.astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    ref = (p[:, :h, :w] + p[:, 2:, 2:]).transpose(0, 2, 1)
    check(out, ref, dtype, "pad")
    assert why.rule_of("pad") == "patterns.inline"
    assert why.rule_of("tr") == "patterns.inline"
    assert why.rule_of("out") == "patterns.injective"


def test_two_outputs_each_scheduled():
    rng = np.random.default_rng(9)
    shape = (5, 67)
    x = te.placeholder(shape, name="x")
    a = te.compute(shape, lambda i, j: x[i, j] * 2.0, name="a")
    b = te.compute(shape, lambda i, j: a[i, j] + 1.0, name="b")
    xn = rand(shape, "float32", rng)
    (oa, ob), why = build_run([a, b], [x], [xn])
    check(oa, xn * 2.0, "float32")
    check(ob, xn.astype(np.float64) * 2.0 + 1.0, "float32")
    assert why.rule_of("a") == "patterns.injective"
    assert why.rule_of("b") == "patterns.injective"


def _vector_loops(func) -> list[int]:
    """Extents of the vectorised loops of a scheduled PrimFunc."""
    import tvm
    import tvm_ffi

    loops: list = []
    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, loops.append), order="post")
    return [int(lp.extent) for lp in loops if lp.kind == tvm.tirx.ForKind.VECTORIZED]


@pytest.mark.parametrize(("w", "pads", "dtype"), [(56, (1, 1), "float32"), (27, (2, 1), "float32"),
                                                  (40, (0, 3), "float16"), (13, (1, 1), "float32")],
                         ids=str)
def test_padded_rows_interior_in_whole_vectors(w, pads, dtype):
    """A padding stage whose rows are no whole number of vectors (56 + 2) is written with
    its rows' interior in guard-free parts of whole vectors, the borders plain; exact. A
    row interior shorter than a vector (13) keeps the plain rule."""
    import dsl
    import targets

    rng = np.random.default_rng(w)
    lo, hi = pads
    x = te.placeholder((2, 3, 5, w), name="x", dtype=dtype)
    y = te.compute((2, 3, 7, w + lo + hi), lambda b, c, i, j: te.if_then_else(
        te.all(i >= 1, i < 6, j >= lo, j < w + lo), x[b, c, i - 1, j - lo],
        te.const(0, dtype)), name="pad")
    xn = rand((2, 3, 5, w), dtype, rng)
    (out,), _ = build_run([y], [x], [xn])
    np.testing.assert_array_equal(out, np.pad(xn, ((0, 0), (0, 0), (1, 1), pads)))
    lanes = targets.current().lanes(dtype)
    vectors = _vector_loops(dsl.auto_schedule([y]).s_tir([x, y]).mod["main"])
    if w >= lanes:
        assert vectors and sum(vectors) == w and all(v % 4 == 0 or v == w for v in vectors), \
            vectors
    else:
        assert sum(vectors) != w, vectors


def test_bounds_without_border_keep_the_plain_rule():
    """A "padding" by zero (bounds that hold across the whole row, 17 columns) has no border
    to split off: the plain rule takes it, with no fall to the generic schedule."""
    import warnings

    rng = np.random.default_rng(17)
    x = te.placeholder((2, 3, 9, 17), name="x")
    y = te.compute((2, 3, 9, 17), lambda b, c, i, j: te.if_then_else(
        te.all(i >= 0, i < 9, j >= 0, j < 17), x[b, c, i, j], 0.0), name="xpad")
    xn = rand((2, 3, 9, 17), "float32", rng)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (out,), why = build_run([y], [x], [xn])
    np.testing.assert_array_equal(out, xn)
    assert {s: r for s, r, _ in why.stages}["xpad"] == "patterns.injective", why.stages


@pytest.mark.parametrize(("w", "dtype"), [(112, "float32"), (80, "float32"), (96, "float16"),
                                          (96, "float32"), (100, "float32")], ids=str)
def test_rows_of_whole_vectors_take_no_guarded_tail(w, dtype):
    """An elementwise stage whose rows are whole vectors but not whole pairs of them (112 =
    7 x 16) is vectorised one vector a step, never a pair with a guarded half at the end of
    each row (a stride-1 max pool's gradient ran 1.47x faster); rows of whole pairs (96 fp32)
    keep the pair, rows of no whole vector (100) the pair and its guard. Exact."""
    import dsl
    import targets

    rng = np.random.default_rng(w)
    x = te.placeholder((3, 5, w), name="x", dtype=dtype)
    y = te.placeholder((3, 5, w), name="y", dtype=dtype)
    z = te.compute((3, 5, w), lambda a, i, j: te.max(x[a, i, j], y[a, i, j]), name="z")
    xn, yn = rand((3, 5, w), dtype, rng), rand((3, 5, w), dtype, rng)
    (out,), _ = build_run([z], [x, y], [xn, yn])
    np.testing.assert_array_equal(out, np.maximum(xn, yn))
    lanes = targets.current().lanes(dtype)
    vectors = _vector_loops(dsl.auto_schedule([z]).s_tir([x, y, z]).mod["main"])
    whole = w % lanes == 0 and w % (2 * lanes)
    assert vectors == ([lanes] if whole else [2 * lanes]), vectors



@pytest.mark.parametrize(("h", "w", "per_row", "fused"), [(56, 56, False, True),
                                                          (4, 56, False, True),
                                                          (56, 56, True, False),
                                                          (5, 13, False, False)], ids=str)
def test_rows_fused_with_their_plane_into_whole_vectors(h, w, per_row, fused):
    """A batch-norm backward's dx over NCHW (rows of 56: no whole number of vectors) with
    per-channel scalars: the rows and their plane (56 x 56, 4 x 56) fused into one run of
    whole vectors; a read indexed by the row alone (``r[i]``) or a plane no whole number of
    vectors (5 x 13) keeps the rows apart. Exact to float32 rounding."""
    import dsl
    import targets

    rng = np.random.default_rng(h * w)
    shape = (2, 3, h, w)
    x, dy = te.placeholder(shape, name="x"), te.placeholder(shape, name="dy")
    g = te.placeholder((3,), name="g")
    r = te.placeholder((h,), name="r")
    dx = te.compute(shape, lambda b, c, i, j: g[c] * (dy[b, c, i, j] - x[b, c, i, j]) + (
        r[i] if per_row else 0.0), name="dx")
    xn, dyn, gn, rn = (rand(s, "float32", rng) for s in (shape, shape, (3,), (h,)))
    (out,), _ = build_run([dx], [x, dy, g, r], [xn, dyn, gn, rn])
    ref = gn[None, :, None, None] * (dyn.astype(np.float64) - xn) + (
        rn[None, None, :, None] if per_row else 0.0)
    check(out, ref, "float32", "dx")
    func = dsl.auto_schedule([dx]).s_tir([x, dy, g, r, dx]).mod["main"]
    assert _vector_loops(func)
    if w % targets.current().lanes("float32"):  # rows apart, each ends in a part-vector
        assert ("T.where" not in func.script()) == fused, func.script()
