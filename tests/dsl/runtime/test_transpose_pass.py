"""The lowering pass that turns runs of strided gathers into row loads and shuffles: exact on
the copies it rewrites (transposes of odd sizes, fp32 and fp16, a packed weight layout), and
statements it must not touch left alone."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import tirx

import targets
from dsl.runtime.build import compile_module
from dsl.runtime.transpose_pass import rewrite


def _i(v: int):
    return tirx.IntImm("int32", v)


def _guarded(cond, value, dtype: str, rows: int):
    return tirx.if_then_else(cond, value, tirx.Broadcast(tirx.FloatImm(dtype, 0.0), rows))


def _gathers(rows: int, cols: int, run: int, dtype: str, step: int = 1, same=False,
             guard=None):
    """A function of ``cols // run`` blocks, each ``run`` stores ``b[c, 0:rows] = a[0:rows, c]``
    (``c`` stepping by ``step`` inside a block): the lowered shape of a transposing copy.
    ``guard(k, t)``: each store's value ``if_then_else(guard, gather, 0)`` (a padded copy)."""
    a = tirx.decl_buffer((rows * cols,), dtype, "a")
    b = a if same else tirx.decl_buffer((rows * cols,), dtype, "b")
    k = tirx.Var("k", "int32")
    stores = []
    for t in range(run):
        col = k * run + t * step if step == 1 else k + t * step
        value = tirx.BufferLoad(a, [tirx.Ramp(col, _i(cols), rows)])
        if guard is not None:
            value = _guarded(guard(k, t), value, dtype, rows)
        stores.append(tirx.BufferStore(b, value, [tirx.Ramp(col * rows, _i(1), rows)]))
    blocks = cols // run if step == 1 else 1
    body = tirx.For(k, _i(0), _i(blocks), tirx.ForKind.SERIAL, tirx.SeqStmt(stores))
    return tirx.PrimFunc([a] if same else [a, b], body).with_attr(
        {"tirx.noalias": not same, "global_symbol": "main"})


def _shuffles(func) -> int:
    found = []
    tvm_ffi.structural_walk(func.body, (tirx.Shuffle, found.append), order="post")
    return len(found)


@pytest.mark.parametrize("rows, cols, run, dtype", [
    (16, 72, 8, "float32"), (16, 40, 4, "float32"), (8, 48, 16, "float32"),
    (16, 64, 8, "float16"), (4, 36, 4, "float32"), (16, 2304, 8, "float32")], ids=str)
def test_transposing_copy_is_rewritten_and_exact(rows, cols, run, dtype):
    func = _gathers(rows, cols, run, dtype)
    assert _shuffles(rewrite(func)) == run
    lib = compile_module(tvm.IRModule({"main": func}), targets.current().tvm_target())
    src = np.random.default_rng(rows * cols).standard_normal(rows * cols).astype(dtype)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(rows * cols, dtype), dev)
    lib["main"](tvm.runtime.tensor(src, dev), out)
    np.testing.assert_array_equal(out.numpy().reshape(cols, rows), src.reshape(rows, cols).T)


def _run(func, rows: int, cols: int, dtype: str):
    lib = compile_module(tvm.IRModule({"main": func}), targets.current().tvm_target())
    src = np.random.default_rng(rows * cols).standard_normal(rows * cols).astype(dtype)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.full(rows * cols, 7, dtype), dev)
    lib["main"](tvm.runtime.tensor(src, dev), out)
    return src.reshape(rows, cols), out.numpy().reshape(cols, rows)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_guarded_run_loads_its_rows_only_under_the_guard(dtype):
    """A padded copy's run, each gather under the same scalar row test: one ``if`` whose
    true side holds the row loads and the shuffles and whose false side stores the zeros;
    the copy exact on both sides (blocks 1 and 3 of 6 guarded off)."""
    rows, cols, run = 16, 48, 8
    func = _gathers(rows, cols, run, dtype, guard=lambda k, t: tirx.And(k != 1, k != 3))
    new = rewrite(func)
    ifs = []
    tvm_ffi.structural_walk(new.body, (tirx.IfThenElse, ifs.append), order="post")
    assert len(ifs) == 1 and _shuffles(new) == run
    loads_under = []
    tvm_ffi.structural_walk(ifs[0].then_case, (tirx.Bind, loads_under.append), order="post")
    assert len(loads_under) == rows  # every row load sits under the test
    src, out = _run(func, rows, cols, dtype)
    want = src.T.copy()
    want[run:2 * run] = 0
    want[3 * run:4 * run] = 0
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("case", ["short run", "columns not consecutive", "in place",
                                  "guards differ", "vector guard"])
def test_statements_it_must_not_touch(case):
    """Three gathers (below the 4 worth a transpose), gathers two columns apart (their row
    loads would read other elements), a gather back into its own buffer (the row loads
    would move above stores they must follow), gathers each under its own test and gathers
    under a per-lane test (a run of row loads would read what some lane's test excludes) are
    left as they are."""
    lanes = tirx.Ramp(_i(0), _i(1), 16)
    func = {"short run": lambda: _gathers(16, 48, 3, "float32"),
            "columns not consecutive": lambda: _gathers(16, 64, 8, "float32", step=2),
            "in place": lambda: _gathers(16, 64, 8, "float32", same=True),
            "guards differ": lambda: _gathers(16, 64, 8, "float32",
                                              guard=lambda k, t: k * 8 + t < 13),
            "vector guard": lambda: _gathers(
                16, 64, 8, "float32",
                guard=lambda k, t: lanes < tirx.Broadcast(k + 3, 16)),
            }[case]()
    assert rewrite(func).same_as(func)


def test_pipeline_starts_from_tvms_default(monkeypatch):
    """Our pipeline is the one ``tvm.compile`` runs when none is named (TVM's "default"),
    then the rewrite: kernels with nothing to rewrite keep the code they had."""
    from tvm.tirx import compilation_pipeline as pipelines

    from dsl.runtime.build import _register_pipeline

    name = _register_pipeline()
    asked = []
    real = pipelines.get_tir_pipeline

    def spy(which=None, **kwargs):
        asked.append(which)
        return real(which, **kwargs)

    monkeypatch.setattr(pipelines, "get_tir_pipeline", spy)
    pipelines.PIPELINE_MAP[name]()
    assert asked == ["default"]
