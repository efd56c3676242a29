"""schedules.zero_taps: the tap loops of a reduction over a zero-padded stage run under a
bounds test, the results are bit for bit those of the unskipped kernel and match the math,
and every shape the pass must not touch is left alone."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te

from schedules.zero_taps import skip_zero_taps


def _conv1d(n, c, k, pad, pad_value=0.0, term="mul"):
    """y[i, o] = sum_{j, ci} xp[i + j, ci] * w[j, ci, o], xp = x zero-padded by ``pad``
    (``pad_value`` outside; ``term="add"``: xp + w, not a product)."""
    x = te.placeholder((n, c), name="x")
    w = te.placeholder((k, c, 16), name="w")
    xp = te.compute(
        (n + 2 * pad, c),
        lambda i, ci: te.if_then_else(tvm.tirx.all(i >= pad, i < n + pad), x[i - pad, ci],
                                      tvm.tirx.const(pad_value, "float32")),
        name="xp", tag="pad")
    j = te.reduce_axis((0, k), name="j")
    ci = te.reduce_axis((0, c), name="ci")
    n_out = n + 2 * pad - k + 1
    op = (lambda a, b: a * b) if term == "mul" else (lambda a, b: a + b)
    y = te.compute((n_out, 16), lambda i, o: te.sum(op(xp[i + j, ci], w[j, ci, o]),
                                                    axis=[j, ci]), name="y", tag="conv")
    return x, w, y


def _scheduled(x, w, y, decompose=True):
    """The reduction with its tap loop ``j`` outside the channel loop, init split off above
    it (``decompose``)."""
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, w, y]))
    blk = sch.get_sblock("y")
    i, o, j, ci = sch.get_loops(blk)
    sch.reorder(i, j, ci, o)
    if decompose:
        sch.decompose_reduction(blk, j)
    return sch.mod["main"]


def _ifs(func) -> list:
    found: list = []
    tvm_ffi.structural_walk(func.body, (tvm.tirx.IfThenElse, found.append), order="pre")
    return found


def _run(func, x, w, out_shape):
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in (x, w)]
    out = tvm.runtime.tensor(np.zeros(out_shape, "float32"), dev)
    lib["main"](*args, out)
    return out.numpy()


def _reference(x, w, pad):
    """float64, the padded positions left out of the sum (the math)."""
    n, c = x.shape
    k = w.shape[0]
    n_out = n + 2 * pad - k + 1
    y = np.zeros((n_out, w.shape[2]))
    for i in range(n_out):
        for j in range(k):
            src = i + j - pad
            if 0 <= src < n:
                y[i] += x[src].astype(np.float64) @ w[j].astype(np.float64)
    return y


@pytest.mark.parametrize("n,c,k,pad", [(7, 3, 3, 1), (13, 5, 5, 2), (4, 16, 7, 3), (1, 2, 3, 1)])
def test_taps_skipped_and_results_identical(n, c, k, pad):
    x, w, y = _conv1d(n, c, k, pad)
    func = _scheduled(x, w, y)
    skipped = skip_zero_taps(func)
    assert len(_ifs(skipped)) == len(_ifs(func)) + 1  # one test, on the tap loop
    test = _ifs(skipped)[-1]
    assert "j" in str(test.condition) and str(n + pad) in str(test.condition)
    rng = np.random.default_rng(n * 100 + k)
    xa = rng.standard_normal((n, c)).astype("float32")
    wa = rng.standard_normal((k, c, 16)).astype("float32")
    out_shape = (n + 2 * pad - k + 1, 16)
    fast, plain = _run(skipped, xa, wa, out_shape), _run(func, xa, wa, out_shape)
    np.testing.assert_array_equal(fast, plain)
    np.testing.assert_allclose(fast, _reference(xa, wa, pad), rtol=1e-5, atol=1e-5)


def test_infinite_weight_on_a_padding_tap_is_left_out():
    """A tap that only meets padding contributes nothing, as in the math: an infinite weight
    there no longer turns a border output into NaN (0 * inf)."""
    n, c, k, pad = 6, 2, 3, 1
    x, w, y = _conv1d(n, c, k, pad)
    func = skip_zero_taps(_scheduled(x, w, y))
    xa = np.ones((n, c), "float32")
    wa = np.ones((k, c, 16), "float32")
    wa[0] = np.inf  # tap 0 of output 0 reads padding only ...
    out = _run(func, xa, wa, (n, 16))
    np.testing.assert_array_equal(out[0], np.full(16, 2 * c, "float32"))
    # ... but serves every other output from real data: those are inf
    assert np.isinf(out[1:]).all()


@pytest.mark.parametrize("case", ["pad_value_one", "sum_not_product", "init_inside"])
def test_left_alone(case):
    """A pad that is not zero, a term that is not a product, and a reduction whose init is
    still inside its block (a skipped first step would lose it) get no test."""
    if case == "pad_value_one":
        x, w, y = _conv1d(9, 3, 3, 1, pad_value=1.0)
        func = _scheduled(x, w, y)
    elif case == "sum_not_product":
        x, w, y = _conv1d(9, 3, 3, 1, term="add")
        func = _scheduled(x, w, y)
    else:
        x, w, y = _conv1d(9, 3, 3, 1)
        func = _scheduled(x, w, y, decompose=False)
    assert skip_zero_taps(func).same_as(func)


@pytest.mark.parametrize("unroll", [False, True])
def test_a_test_inside_an_unrolled_loop_is_one_that_folds(unroll):
    """The padded index uses only the row loop: tested there when it is serial; when it is
    unrolled, the test goes inside it, where each unrolled row's copy decides it at compile
    time (no branch left between the register tile's rows); the sums are the same."""
    x = te.placeholder((16, 3), name="x")
    w = te.placeholder((3, 16), name="w")
    xq = te.compute((20, 3), lambda i, ci: te.if_then_else(
        tvm.tirx.all(i >= 2, i < 18), x[i - 2, ci], tvm.tirx.const(0.0, "float32")), name="xq")
    ci = te.reduce_axis((0, 3), name="ci")
    z = te.compute((20, 16), lambda i, o: te.sum(xq[i, ci] * w[ci, o], axis=[ci]), name="z")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, w, z]))
    blk = sch.get_sblock("z")
    i, o, r = sch.get_loops(blk)
    sch.reorder(r, i, o)
    if unroll:
        sch.unroll(i)
    sch.decompose_reduction(blk, r)
    func = sch.mod["main"]
    skipped = skip_zero_taps(func)
    (test,) = [t for t in _ifs(skipped) if "i" in str(t.condition)]
    loops: list = []
    tvm_ffi.structural_walk(skipped.body, (tvm.tirx.For, loops.append), order="pre")
    (row,) = [lp for lp in loops if lp.body.same_as(test)]  # the test is the row loop's body
    assert row.loop_var.name == "i" and (row.kind == tvm.tirx.ForKind.UNROLLED) == unroll
    rng = np.random.default_rng(7)
    xa = rng.standard_normal((16, 3)).astype("float32")
    wa = rng.standard_normal((3, 16)).astype("float32")
    np.testing.assert_array_equal(_run(skipped, xa, wa, (20, 16)), _run(func, xa, wa, (20, 16)))


def _tested_blocks(outs, inputs) -> set:
    """Names of the blocks under the tests the pass adds to the scheduled kernel."""
    import dsl

    sch = dsl.auto_schedule(outs)
    func = sch.s_tir([*inputs, *outs]).mod["main"]
    names: set = set()
    for test in _ifs(skip_zero_taps(func)):
        tvm_ffi.structural_walk(test.then_case, (tvm.s_tir.SBlock, lambda b: names.add(
            b.name_hint)), order="pre")
    return names - {b.name_hint for t in _ifs(func) for b in _blocks(t)}


def _blocks(stmt) -> list:
    found: list = []
    tvm_ffi.structural_walk(stmt, (tvm.s_tir.SBlock, found.append), order="pre")
    return found


@pytest.mark.parametrize("nd,mask,tested", [(3, "dx", True), (3, "dw", True), (2, "dx", True),
                                            (2, "dw", True), (1, "dx", True)])
def test_operators_padded_taps(nd, mask, tested):
    """convolution_backward's dx and dw read dy / x zero-padded. The taps of a 3-D dx and dw and
    of a 2-D dx are tested above the register tile; a 2-D dw's padded taps and a 1-D dx's (its
    only padded axis is the tile's row, its chunk one flat loop of taps x channels) inside the
    tile's unrolled rows, where the loops around them are peeled. (The operator tests check
    every result against the float64 reference, skipped taps and all.)"""
    from dsl.ops.convolution_backward import convolution_backward

    size = (5, 6, 7)[-nd:]
    go = te.placeholder((2, 8, *size), name="grad_output")
    x = te.placeholder((2, 6, *size), name="input")
    w = te.placeholder((8, 6, *(3,) * nd), name="weight")
    outs = [t for t in convolution_backward(go, x, w, None, [1] * nd, [1] * nd, [1] * nd, False,
                                            [0] * nd, 1, [mask == "dx", mask == "dw", False])
            if t is not None]
    names = _tested_blocks(outs, [go, w] if mask == "dx" else [go, x])
    # (the exact twins, run only for a non-finite weight, may be tested too: their bodies
    # are small against this layer's share of padding)
    fast = {name for name in names if "exact" not in name}
    assert fast == ({f"cb_{mask}_acc_update"} if tested else set())


def test_user_conv_with_inline_padding(tmp_path):
    """A user's direct convolution whose padded read is inline (``if_then_else`` inside the
    sum): its register tile stays in registers across every tap (the accumulators' index uses
    no loop inside the reduction), so its taps are not tested (LLVM would load and store the
    tile around each tested body); the result is the math."""
    import dsl

    n, c, h, wd, k, o = 2, 5, 7, 9, 3, 4
    x = te.placeholder((n, c, h, wd), name="x")
    w = te.placeholder((o, c, k, k), name="w")
    rc = te.reduce_axis((0, c), name="rc")
    rh = te.reduce_axis((0, k), name="rh")
    rw = te.reduce_axis((0, k), name="rw")

    def term(b, f, i, j):
        ih, iw = i + rh - 1, j + rw - 1
        inside = tvm.tirx.all(ih >= 0, ih < h, iw >= 0, iw < wd)
        return te.if_then_else(inside, x[b, rc, ih, iw], tvm.tirx.const(0.0, "float32")) \
            * w[f, rc, rh, rw]

    y = te.compute((n, o, h, wd), lambda b, f, i, j: te.sum(term(b, f, i, j),
                                                            axis=[rc, rh, rw]), name="y")
    assert _tested_blocks([y], [x, w]) == set()
    rng = np.random.default_rng(3)
    xa = rng.standard_normal((n, c, h, wd)).astype("float32")
    wa = rng.standard_normal((o, c, k, k)).astype("float32")
    dsl.build(dsl.auto_schedule([y]), {"name": "user_conv_inline_pad", "tensor_list": [x, w, y],
                                       "kernel_meta_parent_dir": str(tmp_path)})
    out = dsl.load("user_conv_inline_pad", str(tmp_path))(xa, wa)
    xp = np.pad(xa.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((n, o, h, wd))
    for i in range(k):
        for j in range(k):
            ref += np.einsum("bchw,fc->bfhw", xp[:, :, i:i + h, j:j + wd], wa[:, :, i, j])
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,k,pad,unit,tested", [
    (9, 3, 1, True, True),     # one-iteration loops down to the test: the tile reloads anyway
    (9, 3, 1, False, False),   # inside the stretch, 2 of 27 (row, tap) pairs skipped: refused
    (2, 5, 2, False, True),    # inside, 6 of 10 pairs skipped: worth the tile's reloads
])
def test_tests_inside_the_register_tile_stretch(n, k, pad, unit, tested):
    """With the output channels' loop (the accumulators' index) above the tap loop, the
    accumulators stay in registers across the taps, and a test there costs a load and store
    of each per tested body: it is taken only through one-iteration loops or where the steps
    it skips outweigh that; the results stay those of the unskipped kernel."""
    x, w, y = _conv1d(n, 16, k, pad)
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, w, y]))
    blk = sch.get_sblock("y")
    i, o, j, ci = sch.get_loops(blk)
    jo, ji = sch.split(j, [k, 1] if unit else [1, k])
    sch.reorder(i, jo, o, ji, ci)
    sch.decompose_reduction(blk, jo)
    func = sch.mod["main"]
    skipped = skip_zero_taps(func)
    assert (not skipped.same_as(func)) == tested
    rng = np.random.default_rng(k)
    xa = rng.standard_normal((n, 16)).astype("float32")
    wa = rng.standard_normal((k, 16, 16)).astype("float32")
    shape = (n + 2 * pad - k + 1, 16)
    np.testing.assert_array_equal(_run(skipped, xa, wa, shape), _run(func, xa, wa, shape))


def _user_conv(n, c, o, hw, k, pad, groups=1, nd=2):
    """A user's NCHW (NCDHW) convolution over a padding stage of its own, as the bench's."""
    size = (hw,) * nd
    x = te.placeholder((n, c, *size), name="x")
    w = te.placeholder((o, c // groups, *(k,) * nd), name="w")

    def pad_at(b, ci, *ix):
        inside = tvm.tirx.all(*(i >= pad for i in ix), *(i < hw + pad for i in ix))
        return te.if_then_else(inside, x[(b, ci, *(i - pad for i in ix))],
                               tvm.tirx.const(0.0, "float32"))

    xp = te.compute((n, c, *(hw + 2 * pad,) * nd), pad_at, name="pad")
    cg = c // groups
    rc = te.reduce_axis((0, cg), name="rc")
    taps = [te.reduce_axis((0, k), name=nm) for nm in ("rz", "ry", "rx")[-nd:]]
    out = hw + 2 * pad - k + 1

    def body(b, f, *ix):
        ci = f // (o // groups) * cg + rc
        return te.sum(xp[(b, ci, *(i + t for i, t in zip(ix, taps)))] * w[(f, rc, *taps)],
                      axis=[rc, *taps])

    return x, w, te.compute((n, o, *(out,) * nd), body, name="conv")


def _reference_conv(xa, wa, pad, groups=1):
    nd = xa.ndim - 2
    xp = np.pad(xa.astype(np.float64), ((0, 0), (0, 0), *((pad, pad),) * nd))
    o, cg, k = wa.shape[0], wa.shape[1], wa.shape[2]
    out = xa.shape[2] + 2 * pad - k + 1
    ref = np.zeros((xa.shape[0], o, *(out,) * nd))
    for f in range(o):
        g = f // (o // groups)
        for tap in np.ndindex(*(k,) * nd):
            win = xp[(slice(None), slice(g * cg, (g + 1) * cg),
                      *(slice(t, t + out) for t in tap))]
            ref[:, f] += np.einsum("bc...,c->b...", win, wa[(f, slice(None), *tap)])
    return ref


def _same_and_exact(sch, func, skipped, y, xa, wa, ref, fill: float) -> None:
    """The user conv ``func`` and its zero-tap-skipping form ``skipped``, each run on ``xa``,
    ``wa`` into an output filled with ``fill``: bit for bit the same, and ``ref`` (float64)
    within 1e-4."""
    dev = tvm.cpu()

    def run(f):
        lib = tvm.compile(tvm.IRModule({"main": f}), target=sch.target.tvm_target())
        out = tvm.runtime.tensor(np.full([int(d) for d in y.shape], fill, "float32"), dev)
        lib["main"](tvm.runtime.tensor(xa, dev), tvm.runtime.tensor(wa, dev), out)
        return out.numpy()

    fast = run(skipped)
    np.testing.assert_array_equal(fast, run(func))
    np.testing.assert_allclose(fast, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n,c,o,hw,groups,nd", [(2, 16, 32, 7, 1, 2), (1, 16, 32, 5, 2, 2),
                                                 (1, 6, 32, 5, 1, 3), (3, 7, 32, 7, 1, 2)],
                         ids=str)
def test_user_conv_skips_its_row_and_column_padding_taps(n, c, o, hw, groups, nd):
    """A user's NCHW convolution over small planes (vectors across its output channels, each
    tile a whole row of positions): its row taps (``ry``; ``rz`` too in 3-D) run outside the
    input channels, where one test per tap skips a border row's padding taps over all the
    channels, and its column taps' tests fold inside the tile's unrolled positions once the
    tap loop is peeled (the tile position along the row, a loop of one iteration, decides
    nothing). The sums are bit for bit those of the kernel without the pass, and the math
    (float64) with padding left out."""
    import dsl

    x, w, y = _user_conv(n, c, o, hw, 3, 1, groups, nd)
    sch = dsl.auto_schedule([y])
    assert "vectors along v_f" in dict((s, t) for s, _, t in dsl.explain(sch).stages)["conv"]
    func = sch.s_tir([x, w, y]).mod["main"]
    loops: list = []
    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, loops.append), order="pre")
    order = [lp.loop_var.name for lp in loops if lp.loop_var.name in ("rz", "ry", "rc", "rx")]
    expected = ["rz", "ry", "rc", "rx"] if nd == 3 else ["ry", "rc", "rx"]
    assert order[:len(expected)] == expected, order
    skipped = skip_zero_taps(func)
    conds = [str(t.condition) for t in _ifs(skipped)]
    assert any("ry" in cd for cd in conds), conds  # the row taps' test
    updates = [b for b in _blocks(skipped.body) if b.name_hint == "conv_update"]
    assert len(updates) > 1  # the tap loop peeled for the column taps' tests
    rng = np.random.default_rng(hw * c)
    xa = rng.standard_normal((n, c, *(hw,) * nd)).astype("float32")
    wa = rng.standard_normal((o, c // groups, *(3,) * nd)).astype("float32")
    _same_and_exact(sch, func, skipped, y, xa, wa, _reference_conv(xa, wa, 1, groups), 0.0)


@pytest.mark.parametrize("hw,pad", [(14, 1), (21, 1), (12, 9)], ids=str)
def test_user_conv_peels_its_tile_position_keeping_every_tile(hw, pad):
    """Rows of 14 or 21 in tiles of 7 positions: the column taps' tests fold only once the
    tile position (a loop with the tile's init and write-back inside) is peeled too. Each
    peeled copy keeps its tile, even one whose positions all read padding (pad 9: outputs
    of zeros, written): results bit for bit those without the pass and float64 within 1e-4,
    on an output filled with NaN first."""
    import dsl

    n, c, o = 1, 16, 32
    x, w, y = _user_conv(n, c, o, hw, 3, pad)
    sch = dsl.auto_schedule([y])
    func = sch.s_tir([x, w, y]).mod["main"]
    skipped = skip_zero_taps(func)
    inits = [b for b in _blocks(skipped.body) if b.name_hint == "conv_init"]
    if pad == 1:
        assert len(inits) > 1  # the tile position peeled
    rng = np.random.default_rng(hw)
    xa = rng.standard_normal((n, c, hw, hw)).astype("float32")
    wa = rng.standard_normal((o, c, 3, 3)).astype("float32")
    _same_and_exact(sch, func, skipped, y, xa, wa, _reference_conv(xa, wa, pad), np.nan)
