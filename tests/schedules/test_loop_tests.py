"""schedules.loop_tests: tests put where one loop decides them (``with_tests``) and tests put
inside an unrolled register tile after peeling the loops around it (``peeled``): the peeled
function folds every such test away when lowered, computes bit for bit what the unpeeled one
does, and gives up, unchanged, where peeling would copy too much."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import s_tir, te, tirx

from schedules import loop_tests
from schedules.zero_taps import skip_zero_taps


def _tiled_conv1d(n, c, k, pad, rows, flat=False):
    """y[i, o] = sum_{j, ci} xp[i + j, ci] * w[j, ci, o] (xp: x zero-padded by ``pad``),
    scheduled as a register tile: the output positions split into tiles of ``rows``
    unrolled rows, the tap and channel loops between the tile loop and its rows (``flat``:
    fused into one loop, ``j = r // c``)."""
    x = te.placeholder((n, c), name="x")
    w = te.placeholder((k, c, 16), name="w")
    xp = te.compute((n + 2 * pad, c), lambda i, ci: te.if_then_else(
        tvm.tirx.all(i >= pad, i < n + pad), x[i - pad, ci], tvm.tirx.const(0.0, "float32")),
        name="xp", tag="pad")
    j = te.reduce_axis((0, k), name="j")
    ci = te.reduce_axis((0, c), name="ci")
    n_out = n + 2 * pad - k + 1
    y = te.compute((n_out, 16), lambda i, o: te.sum(xp[i + j, ci] * w[j, ci, o], axis=[j, ci]),
                   name="y", tag="conv")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, w, y]))
    blk = sch.get_sblock("y")
    i, o, jl, cl = sch.get_loops(blk)
    io, ii = sch.split(i, [None, rows])
    sch.reorder(io, jl, cl, ii, o)
    sch.unroll(ii)
    if flat:
        sch.fuse(jl, cl)
    sch.decompose_reduction(blk, io)  # the init above the tiles, as in the operators' kernels
    return sch.mod["main"], n_out


def _lowered(func):
    """``func`` through TVM's lowering up to the simplification after ``UnrollLoop``."""
    passes = [s_tir.transform.CanonicalizeLoop(), s_tir.transform.LowerInitBlock(),
              s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
              s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation(),
              s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(),
              tirx.transform.VectorizeLoop(True), tirx.transform.UnrollLoop(),
              tirx.transform.StmtSimplify(), tirx.transform.RemoveNoOp()]
    return tvm.ir.transform.Sequential(passes)(tvm.IRModule({"main": func}))["main"]


def _nodes(stmt, kind) -> list:
    found: list = []
    tvm_ffi.structural_walk(stmt, (kind, found.append), order="pre")
    return found


def _updates(stmt, trips: int = 1) -> int:
    """Executions of the statements ``y[..] = y[..] + ...`` under ``stmt`` (the lanes loop
    ``o`` counted as one), ignoring the guard of a ragged tile (none in these shapes)."""
    if isinstance(stmt, tvm.tirx.For):
        inner = 1 if stmt.loop_var.name == "o" else int(stmt.extent)
        return _updates(stmt.body, trips * inner)
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return sum(_updates(s, trips) for s in stmt.seq)
    if isinstance(stmt, tvm.tirx.IfThenElse):
        return _updates(stmt.then_case, trips)
    if isinstance(stmt, tvm.tirx.AllocBuffer | tvm.tirx.DeclBuffer | tvm.tirx.AttrStmt):
        return _updates(stmt.body, trips) if hasattr(stmt, "body") else 0
    if isinstance(stmt, tvm.tirx.BufferStore):
        return trips if stmt.buffer.name == "y" and isinstance(stmt.value, tvm.tirx.Add) else 0
    return 0


def _run(func, x, w, n_out):
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros((n_out, 16), "float32"), dev)
    lib["main"](tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
    return out.numpy()


def _reference(x, w, pad, n_out):
    n = x.shape[0]
    y = np.zeros((n_out, 16))
    for i in range(n_out):
        for j in range(w.shape[0]):
            if 0 <= i + j - pad < n:
                y[i] += x[i + j - pad].astype(np.float64) @ w[j].astype(np.float64)
    return y


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("n,c,k,pad,rows", [(14, 3, 3, 1, 7), (28, 5, 5, 2, 4), (6, 2, 7, 3, 3)])
def test_peeled_tile_folds_its_tests_and_sums_the_same(n, c, k, pad, rows, flat):
    """With ``flat``, the runs of the fused tap x channel loop that share a tap are loops
    whose test TVM's simplifier decides from the run's range (``r // c`` constant there)."""
    func, n_out = _tiled_conv1d(n, c, k, pad, rows, flat)
    peeled = skip_zero_taps(func)
    assert not peeled.same_as(func)
    # every test the peel put inside the unrolled rows is a constant once they are unrolled
    ifs = lambda f: _nodes(_lowered(f).body, tvm.tirx.IfThenElse)  # noqa: E731
    assert len(ifs(peeled)) <= len(ifs(func))
    # and the updates left are exactly the products of real data: one per (row, tap, channel)
    # whose padded index falls inside x, none for a row that reads padding
    inside = sum(c for i in range(n_out) for j in range(k) if 0 <= i + j - pad < n)
    assert _updates(_lowered(peeled).body) == inside < _updates(_lowered(func).body)
    rng = np.random.default_rng(n * 7 + k)
    x = rng.standard_normal((n, c)).astype("float32")
    w = rng.standard_normal((k, c, 16)).astype("float32")
    fast = _run(peeled, x, w, n_out)
    np.testing.assert_array_equal(fast, _run(func, x, w, n_out))
    np.testing.assert_allclose(fast, _reference(x, w, pad, n_out), rtol=1e-5, atol=1e-5)


def test_interior_runs_stay_loops_with_variables_of_their_own():
    """The tiles whose rows never meet the padding run as one loop, untested, over a fresh
    variable (TVM binds a variable to one range), while the edge tiles are copies."""
    func, _ = _tiled_conv1d(64, 4, 3, 1, 8)  # 8 tiles: the first and last meet the padding
    peeled = skip_zero_taps(func)
    tile_loops = [lp for lp in _nodes(peeled.body, tvm.tirx.For)
                  if lp.loop_var.name == "i_0"]
    ranges = sorted((int(lp.min), int(lp.extent)) for lp in tile_loops)
    assert ranges == [(1, 6)]  # tiles 0 and 7 peeled, 1..6 a loop
    (inner,) = tile_loops
    original = [lp for lp in _nodes(func.body, tvm.tirx.For) if lp.loop_var.name == "i_0"]
    assert not inner.loop_var.same_as(original[0].loop_var)


def test_too_many_copies_leave_the_function_unchanged(monkeypatch):
    func, _ = _tiled_conv1d(14, 3, 3, 1, 7)
    monkeypatch.setattr(loop_tests, "PEEL_COPIES", 1)  # the two edge tiles need two
    assert skip_zero_taps(func).same_as(func)
    monkeypatch.setattr(loop_tests, "PEEL_COPIES", 16)
    monkeypatch.setattr(loop_tests, "PEEL_RUNS", 0)
    assert skip_zero_taps(func).same_as(func)


def test_held_on_grid_evaluates_index_arithmetic():
    a, b = tvm.tirx.Var("a", "int32"), tvm.tirx.Var("b", "int32")
    term = tvm.tirx.And(tvm.tirx.LE(1, a * 2 + b), tvm.tirx.LT(a * 2 + b, 6))
    held = loop_tests.held_on_grid(term, [(a, 0, 4), (b, 0, 2)])
    expect = np.array([[1 <= 2 * i + j < 6 for j in range(2)] for i in range(4)])
    np.testing.assert_array_equal(held, expect)
    assert loop_tests.held_on_grid(tvm.tirx.Select(a < 1, a, b), [(a, 0, 2), (b, 0, 2)]) is None


def test_a_run_is_kept_only_where_its_test_folds():
    """A run of a flat loop is left a loop only where TVM's analyzer, the run bound to its
    range, makes the test a constant at every unrolled row: ``r // 64`` is constant over
    ``[64, 128)``, not over ``[32, 96)``."""
    r, row = tvm.tirx.Var("r", "int32"), tvm.tirx.Var("row", "int32")
    term = tvm.tirx.LE(1, row + tvm.tirx.FloorDiv(r, 64))
    peel = loop_tests.Peel(term, ((r, 0, 192), (row, 0, 4)), row)
    assert loop_tests._folds(term, peel, {r: (64, 64)})
    assert not loop_tests._folds(term, peel, {r: (32, 64)})
