"""The tuning database: keying, atomic appends, resilient reads, and build's use of records.

No search runs here: records are written by hand (a real trace of a real schedule), so every
test takes a second or less.
"""

import json
import multiprocessing
import time
import warnings

import numpy as np
import pytest
from tvm import te

import dsl
import targets
from dsl import tuning_db
from dsl.runtime.build import default_schedule, random_inputs, run_module, verify_tuned


@pytest.fixture
def db(tmp_path, monkeypatch):
    root = tmp_path / "tuning"
    monkeypatch.setenv(tuning_db.ENV, str(root))
    return root


def two_stage(n=32):
    """A small two-stage kernel: B = 2 * A, C = B + 1."""
    a = te.placeholder((n, n), name="A", dtype="float32")
    b = te.compute((n, n), lambda i, j: a[i, j] * 2, name="Bm")
    c = te.compute((n, n), lambda i, j: b[i, j] + 1, name="C")
    return a, c


def traced(sch):
    """A real meta-schedule-style trace: a sampled tile split (with its decision) and a
    parallel loop on the output stage, serialised like a tuning record."""
    import tvm

    s = tvm.s_tir.Schedule(tuning_db.normalize(default_schedule(sch).prim_func()))
    blk = s.get_sblock("C")
    i, _ = s.get_loops(blk)
    factors = s.sample_perfect_tile(i, n=2)
    outer, _ = s.split(i, factors)
    s.parallel(outer)
    return tuning_db.plain_json(s.trace.as_json())


def accept(sch, trace, rec_id="r1", run_seconds=1e-6):
    mod = tuning_db.normalize(default_schedule(sch).prim_func())
    store = tuning_db.store_for(mod, sch.target)
    store.save_workload(mod)
    store.accept(rec_id, trace, run_seconds, seed=7)
    return store


def build_json(sch, tensors, tmp_path, name):
    return dsl.build(sch, {"name": name, "tensor_list": tensors,
                           "kernel_meta_parent_dir": str(tmp_path)})


def outputs_of(sch, tensors, tmp_path, name):
    kernel = dsl.load(name, tmp_path)
    (x,) = random_inputs(tensors, sch)
    return x, kernel(x)


def test_root_argument_env_and_default(tmp_path, monkeypatch):
    monkeypatch.delenv(tuning_db.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tuning_db.root() == tmp_path / "xdg" / "dsl" / "tuning"
    monkeypatch.setenv(tuning_db.ENV, str(tmp_path / "env"))
    assert tuning_db.root() == tmp_path / "env"
    assert tuning_db.root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.setenv(tuning_db.ENV, "off")
    assert tuning_db.root() is None


def test_key_includes_the_target():
    host, generic = targets.get("host"), targets.get("x86-64")
    assert tuning_db.target_key(host) != tuning_db.target_key(generic)
    # Same name, other core count: other generated code, so another key.
    assert tuning_db.target_key(host) != tuning_db.target_key(host.with_cores(host.cores + 1))
    assert tuning_db.target_key(host) == tuning_db.target_key(targets.get("host"))


def _appender(path, tag, n):
    for i in range(n):
        # Lines far above PIPE_BUF: interleaving would show as unparsable lines.
        tuning_db.append_line(path, {"format": tuning_db.FORMAT, "kind": "record",
                                     "tag": tag, "i": i, "pad": tag * 20000})


def test_concurrent_appends_never_interleave(tmp_path):
    path = tmp_path / "w.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_appender, args=(path, t, 40)) for t in "abcd"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any unparsable line would warn
        lines = tuning_db.read_lines(path)
    assert len(lines) == 160
    assert {(d["tag"], d["i"]) for d in lines} == {(t, i) for t in "abcd" for i in range(40)}


def test_truncated_and_corrupt_lines_are_skipped(tmp_path):
    path = tmp_path / "w.jsonl"
    good = {"format": tuning_db.FORMAT, "kind": "record", "i": 0}
    path.write_text(json.dumps(good) + "\n" + "{not json\n" + json.dumps(good)[:15])
    with pytest.warns(tuning_db.TuningDbWarning, match="skipped 2"):
        assert tuning_db.read_lines(path) == [good]
    # The next writer starts a fresh line: only the killed writer's line is lost.
    tuning_db.append_line(path, {**good, "i": 1})
    with pytest.warns(tuning_db.TuningDbWarning, match="skipped 2"):
        assert [d["i"] for d in tuning_db.read_lines(path)] == [0, 1]


def test_tuned_record_is_applied_fast_and_recorded(db, tmp_path):
    a, c = two_stage()
    sch = dsl.auto_schedule(c)
    assert sch.schedule_meta is None  # empty database: the default schedule
    trace = traced(sch)
    store = accept(sch, trace)

    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        tuned = dsl.auto_schedule(c)
        times.append(time.perf_counter() - t0)
    assert min(times) < 0.05, times  # the goal: a tuned re-build costs no search
    assert tuned.schedule_meta["source"] == "tuned"

    meta = build_json(tuned, [a, c], tmp_path, "tuned_k")
    s = meta["schedule"]
    assert s["source"] == "tuned" and s["trace"] == trace and s["run_seconds"] == 1e-6
    assert s["record"]["id"] == "r1" and s["record"]["seed"] == 7
    assert s["record"]["database"] == str(store.dir)
    x, y = outputs_of(tuned, [a, c], tmp_path, "tuned_k")
    np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)
    # The trace really ran: the tuned kernel's loop is split and parallel.
    text = dsl.build(tuned, {"name": "tuned_k", "tensor_list": [a, c],
                             "need_build": False}).script()
    assert "T.parallel" in text
    assert not store.rejected()


def test_other_target_and_switch_off_use_the_default(db, monkeypatch):
    _, c = two_stage()
    accept(dsl.auto_schedule(c), traced(dsl.auto_schedule(c)))
    assert dsl.auto_schedule(c, target="x86-64").schedule_meta is None
    monkeypatch.setenv(tuning_db.ENV, "off")
    assert dsl.auto_schedule(c).schedule_meta is None


def test_argument_order_does_not_matter(db, tmp_path):
    """The workload is keyed in its default argument order; a build with another order
    still replays the trace (it names blocks, not arguments)."""
    a = te.placeholder((16, 16), name="A")
    b = te.placeholder((16, 16), name="B2")
    c = te.compute((16, 16), lambda i, j: a[i, j] - b[i, j], name="C")
    sch = dsl.auto_schedule(c)
    accept(sch, traced(sch))
    meta = build_json(dsl.auto_schedule(c), [b, a, c], tmp_path, "order_k")
    assert meta["schedule"]["source"] == "tuned"
    kernel = dsl.load("order_k", tmp_path)
    x, y = np.ones((16, 16), "float32"), np.full((16, 16), 3, "float32")
    np.testing.assert_array_equal(kernel(x, y), y - x)  # arguments in the build's order


def test_trace_that_does_not_apply_falls_back(db, tmp_path):
    a, c = two_stage()
    trace = traced(dsl.auto_schedule(c))
    bad = json.loads(json.dumps(trace).replace('"C"', '"no_such_block"'))
    store = accept(dsl.auto_schedule(c), bad, rec_id="bad")
    sch = dsl.auto_schedule(c)
    assert sch.schedule_meta["source"] == "tuned"
    with pytest.warns(RuntimeWarning, match="tuned schedule rejected"):
        meta = build_json(sch, [a, c], tmp_path, "bad_k")
    assert meta["schedule"]["source"] == "default"
    assert meta["schedule"]["rejected_tuned"]["id"] == "bad"
    assert "bad" in store.rejected()
    x, y = outputs_of(sch, [a, c], tmp_path, "bad_k")
    np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)
    assert dsl.auto_schedule(c).schedule_meta is None  # rejected: never tried again


def test_wrong_results_are_rejected(db, tmp_path):
    """A schedule that builds but computes something else (an intermediate stored as int8)
    fails the re-verification against the default schedule."""
    a, c = two_stage()
    sch = dsl.auto_schedule(c)
    store = accept(sch, traced(sch), rec_id="wrong")
    tuned = dsl.auto_schedule(c)

    def corrupt(s):
        s.unsafe_set_dtype(s.get_sblock("Bm"), 0, "int8")

    tuned.override = corrupt
    with pytest.warns(RuntimeWarning, match="differs from the default"):
        meta = build_json(tuned, [a, c], tmp_path, "wrong_k")
    assert meta["schedule"]["source"] == "default"
    assert store.rejected()["wrong"].startswith("output 'C' differs")
    x, y = outputs_of(tuned, [a, c], tmp_path, "wrong_k")
    np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)


def test_unwritten_output_elements_are_caught(db, tmp_path):
    """Elements a tuned kernel never writes are caught even where the default writes 0."""
    a = te.placeholder((8, 8), name="A")
    c = te.compute((8, 8), lambda i, j: a[i, j] * 0, name="C")
    sch = dsl.auto_schedule(c)
    rt = _compiled_noop(sch, [a, c])
    problem = verify_tuned(sch, rt, "k", [a, c])
    assert "never writes" in problem


def _compiled_noop(sch, tensors):
    """A runtime module whose ``k`` leaves its output untouched."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def k(x: T.Buffer((8, 8), "float32"), y: T.Buffer((8, 8), "float32")):
        T.func_attr({"global_symbol": "k"})
        T.evaluate(0)

    return tvm.compile(tvm.IRModule({"k": k}), target=sch.target.tvm_target()).jit()


def test_corrupt_database_never_breaks_a_build(db, tmp_path):
    a, c = two_stage()
    sch = dsl.auto_schedule(c)
    store = accept(sch, traced(sch))
    store.workload_path.write_text("{truncated")
    with pytest.warns(tuning_db.TuningDbWarning, match="unreadable workload"):
        assert dsl.auto_schedule(c).schedule_meta is None
    store.decisions_path.write_bytes(b'{"format": 1, "kind": "acc')
    with pytest.warns(tuning_db.TuningDbWarning, match="skipped 1"):
        sch = dsl.auto_schedule(c)
    assert build_json(sch, [a, c], tmp_path, "corrupt_k")["schedule"]["source"] == "default"


def test_run_module_runs_the_kernel():
    a, c = two_stage(4)
    sch = dsl.auto_schedule(c)
    import tvm

    rt = tvm.compile(dsl.build(sch, {"name": "k", "tensor_list": [a, c], "need_build": False}),
                     target=sch.target.tvm_target()).jit()
    (x,) = random_inputs([a, c], sch)
    (y,) = run_module(rt, "k", [a, c], sch, [x], float("nan"))
    np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)
