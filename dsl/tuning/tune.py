"""``dsl.tune``: meta-schedule search for one kernel, recorded in the tuning database.

``tune(res or sch, trials=...)`` searches schedules of the kernel's workload (its un-scheduled
PrimFunc) with ``tvm.s_tir.meta_schedule``, seeded with our hand schedule's design space, and
stores every measured candidate in :mod:`dsl.tuning.database` as it is measured. At the end it
compiles the best candidate and the default schedule side by side on this machine, checks that
they agree numerically and that the tuned one is faster, and records that decision; later
``auto_schedule`` / ``build`` calls of the same workload on the same target replay the accepted
trace with no search.

Measurement runs locally, or on other machines through TVM's RPC tracker (``rpc_key`` and
``tracker``) with meta-schedule's ``RPCRunner``.

``python -m dsl tune`` (:func:`main`) tunes every kernel an example script builds, or every
kernel of the benchmark suite.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import targets
from dsl.errors import E_TYPE, E_VALUE, DslError, check_int, fail
from dsl.runtime.schedule import Schedule, auto_schedule
from dsl.tuning import database as tuning_db

DEFAULT_TRIALS = 64
# A tuned schedule replaces the default only when at least 5% faster in the local
# head-to-head: a noise-level win could be a loss on the next run, and the goal is never to
# be slower than the default.
ACCEPT_RATIO = 0.95
# The head-to-head: rounds of one sample per side, each sample lasting at least twice the
# search's min_repeat_ms.
CHECK_ROUNDS = 7


@dataclasses.dataclass
class TuneResult:
    """What one :func:`tune` call did.

    Attributes
    ----------
    workload : str
        The workload's key (structural hash) in the database.
    database : str
        The target's directory in the database.
    trials : int
        Candidates measured by this call.
    records : int
        Candidates in the database for this workload and target after the call.
    seconds : float
        Wall time spent in the search.
    flops : float
        Floating-point operations of one kernel call (meta-schedule's estimate).
    default_seconds, tuned_seconds : float or None
        Local head-to-head run time of the default schedule and the best tuned candidate.
    accepted : str or None
        Record id of the tuned schedule later builds use; None means the default schedule.
    error : str or None
        Why the search or the check failed (the default schedule stays in use).
    interrupted : bool
        The search was stopped (Ctrl-C); every record measured so far is kept.
    """

    name: str
    workload: str
    database: str
    trials: int = 0
    records: int = 0
    seconds: float = 0.0
    flops: float = 0.0
    default_seconds: float | None = None
    tuned_seconds: float | None = None
    accepted: str | None = None
    error: str | None = None
    interrupted: bool = False

    def gflops(self, seconds: float | None) -> float | None:
        return None if not seconds or not self.flops else self.flops / seconds / 1e9

    def summary(self) -> str:
        def g(s):
            v = self.gflops(s)
            return "-" if v is None else f"{v:.2f}"

        choice = f"tuned ({self.accepted})" if self.accepted else "default"
        text = (f"[tune {self.name}] {self.trials} trials in {self.seconds:.1f}s "
                f"({self.records} records); default {g(self.default_seconds)} GFLOP/s, "
                f"tuned {g(self.tuned_seconds)} GFLOP/s -> builds use the {choice} schedule")
        if self.error:
            text += f"\n[tune {self.name}] note: {self.error}"
        if self.interrupted:
            text += f"\n[tune {self.name}] interrupted: records kept, a later run resumes"
        return text


def _require_extras() -> None:
    missing = []
    for mod in ("psutil", "cloudpickle", "xgboost"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise fail(E_VALUE, "dsl.tune", missing,
                   "needs the tuning extras: pip install 'convbwd-dsl[tune]' "
                   "(psutil, cloudpickle, xgboost-cpu; not the CUDA 'xgboost' wheel)")


def _parse_tracker(tracker) -> tuple[str, int]:
    if tracker is None:
        tracker = os.environ.get("TVM_TRACKER_HOST", "") and (
            f"{os.environ['TVM_TRACKER_HOST']}:{os.environ.get('TVM_TRACKER_PORT', '9190')}")
    if not isinstance(tracker, str) or ":" not in tracker:
        raise fail(E_VALUE, "tracker", tracker,
                   "must be 'host:port' of a TVM RPC tracker (python -m tvm.exec.rpc_tracker)")
    host, port = tracker.rsplit(":", 1)
    try:
        return host, int(port)
    except ValueError:
        raise fail(E_VALUE, "tracker", tracker, "must end in ':<port number>'") from None


def _check_tracker(host: str, port: int, key: str, wait: float = 10.0) -> None:
    """Fail fast when the tracker is unreachable or has no server under ``key``: otherwise
    every candidate waits out an RPC time-out and the search measures nothing."""
    import socket

    from tvm import rpc

    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        raise fail(E_VALUE, "tracker", f"{host}:{port}",
                   f"is not reachable ({exc}); start python -m tvm.exec.rpc_tracker") from None
    deadline = time.monotonic() + wait
    while True:
        queue = rpc.connect_tracker(host, port).summary().get("queue_info", {})
        if key in queue:
            return
        if time.monotonic() > deadline:
            raise fail(E_VALUE, "rpc_key", key,
                       f"has no RPC server at the tracker {host}:{port} (keys: "
                       f"{sorted(queue) or 'none'}); start python -m tvm.exec.rpc_server "
                       f"--tracker {host}:{port} --key {key}")
        time.sleep(0.5)


# ----------------------------------------------------------------------------------------------
# meta-schedule glue (classes built lazily: importing dsl must not load meta-schedule's Python
# side objects nor xgboost).

_CLASSES: dict = {}


def _classes() -> dict:
    if _CLASSES:
        return _CLASSES
    import tvm_ffi
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.database import PyDatabase, TuningRecord, Workload
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class StoreDatabase(PyDatabase):
        """A meta-schedule database over one :class:`dsl.tuning_db.WorkloadStore`.

        Every committed record is appended to disk at once (so an interrupted search keeps
        it); records already on disk are loaded at start so a new search resumes from them.
        """

        def __init__(self, store: tuning_db.WorkloadStore, mod, seed):
            super().__init__()
            self.store, self.seed = store, seed
            self.workload = Workload(mod)
            self.records: list = []
            self.ids: set = set()
            for r in store.records():
                try:
                    rec = TuningRecord.from_json(r["record"], self.workload)
                except Exception as exc:  # noqa: BLE001 - a bad line is skipped, not fatal
                    warnings.warn(f"tuning database: skipped unreadable record {r.get('id')}: "
                                  f"{exc}", tuning_db.TuningDbWarning, stacklevel=2)
                    continue
                self.records.append((r["seconds"], rec))
                self.ids.add(r.get("id"))
            self.records.sort(key=lambda x: x[0])
            self.new = 0

        def has_workload(self, mod) -> bool:
            return bool(tvm_ffi.structural_equal(mod, self.workload.mod))

        def commit_workload(self, mod):
            if not self.has_workload(mod):  # one task per search: anything else is a bug
                raise ValueError("StoreDatabase holds a single workload")
            return self.workload

        def commit_tuning_record(self, record) -> None:
            as_json = tuning_db.plain_json(record.as_json())
            trace = as_json[0]
            rid = tuning_db.record_id(trace, self.store.key)
            self.new += 1
            seconds = tuning_db.mean_seconds(as_json[1])
            self.store.append_record({"id": rid, "seconds": seconds, "seed": self.seed,
                                      "record": as_json, "time": time.time()})
            if seconds is not None and rid not in self.ids:
                self.ids.add(rid)
                self.records.append((seconds, record))
                self.records.sort(key=lambda x: x[0])

        def get_top_k(self, workload, top_k: int) -> list:
            return [r for _, r in self.records[:top_k]]

        def get_all_tuning_records(self) -> list:
            return [r for _, r in self.records]

        def __len__(self) -> int:
            return len(self.records)

    @derived_object
    class Progress(PyMeasureCallback):
        """A one-line progress bar on stderr, updated per measured batch."""

        def __init__(self, name: str, total: int, flops: float, best: float | None,
                     stream=None, enabled: bool = True):
            super().__init__()
            self.name, self.total, self.flops, self.best = name, total, flops, best
            self.done, self.t0, self.stopped = 0, time.perf_counter(), False
            self.stream, self.enabled = stream or sys.stderr, enabled

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
                  runner_results) -> None:
            if _STOP.is_set() and not self.stopped:
                # Ctrl-C: end the search here; this batch's records are already committed.
                self.stopped = True
                task_scheduler.terminate_task(task_id)
            self.done += len(runner_results)
            for res in runner_results:
                t = tuning_db.mean_seconds(res.run_secs) if res.error_msg is None else None
                if t is not None and (self.best is None or t < self.best):
                    self.best = t
            if self.enabled:
                self.stream.write("\r" + self.line())
                self.stream.flush()

        def line(self) -> str:
            elapsed = time.perf_counter() - self.t0
            left = max(0, self.total - self.done)
            eta = elapsed / self.done * left if self.done else float("nan")
            best = (f"{self.flops / self.best / 1e9:8.2f} GFLOP/s" if self.best and self.flops
                    else "       - GFLOP/s")
            eta_txt = "--:--" if math.isnan(eta) else f"{int(eta) // 60:02d}:{int(eta) % 60:02d}"
            width = 24
            fill = int(width * min(self.done, self.total) / max(1, self.total))
            return (f"[tune {self.name}] [{'#' * fill}{'.' * (width - fill)}] "
                    f"{self.done}/{self.total} trials  best {best}  ETA {eta_txt}  ")

    _CLASSES.update(StoreDatabase=StoreDatabase, Progress=Progress)
    return _CLASSES


@contextlib.contextmanager
def _fast_frame_stack():
    """Make ``inspect.stack()`` cheap while TVMScript parses.

    The TVMScript parser calls ``inspect.stack()`` for every ``@T.prim_func``; CPython resolves
    each frame's module by scanning ``sys.modules``, so importing ``tvm.s_tir.tensor_intrin``
    (which meta-schedule does in the tuner and in every builder process) takes 20-40 s here. The
    parser reads only the frames, their names and source lines, which ``linecache`` gives.
    """
    import inspect
    import linecache

    real = inspect.stack

    def stack(context: int = 1) -> list:
        out, frame = [], sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            line = linecache.getline(code.co_filename, frame.f_lineno)
            out.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name,
                                         [line] if line else None, 0 if line else None))
            frame = frame.f_back
        return out

    inspect.stack = stack
    try:
        yield
    finally:
        inspect.stack = real


def preload_tensor_intrin() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` quickly (also the builder processes' initializer)."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    with _fast_frame_stack():
        import tvm.s_tir.tensor_intrin  # noqa: F401


def _hand_space(base: Schedule, mod):
    """meta-schedule's ScheduleFn replaying our registered rule, or None if it does not apply
    to the normalised workload (the search then uses meta-schedule's own space only)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    def apply(sch):
        base.apply_rule(sch)
        return sch

    try:
        apply(tvm.s_tir.Schedule(mod))
    except Exception as exc:  # noqa: BLE001 - an unsuitable rule only loses the seed
        warnings.warn(f"hand schedule does not replay under meta-schedule ({exc}); "
                      "searching without it", RuntimeWarning, stacklevel=3)
        return None
    return ms.space_generator.ScheduleFn(apply)


def _local_check(base: Schedule, store: tuning_db.WorkloadStore, db, result: TuneResult,
                 evaluator: dict) -> None:
    """Head-to-head on this machine: the default schedule vs the best candidates that agree
    with it numerically, timed in alternating rounds (medians, so that load from other
    processes hits every side alike); record the decision (the tuned id, or None for the
    default)."""
    import tvm

    from dsl.cli.bench.runner import alternating_medians
    from dsl.runtime.build import lower, random_inputs, verify_tuned
    from dsl.runtime.schedule import same_tensor

    name = "dsl_tune_check"
    tensors = base.default_tensor_list()
    inputs = random_inputs(tensors, base)
    dev = tvm.cpu()
    args, ins = [], iter(inputs)
    for t in tensors:
        if any(same_tensor(t, o) for o in base.outputs):
            # The output's initial contents do not matter for timing; reuse an input
            # generator for the right dtype (bfloat16 included).
            (zeros,) = random_inputs([t], dataclasses.replace(base, outputs=[]))
            args.append(tvm.runtime.tensor(zeros, dev))
        else:
            args.append(tvm.runtime.tensor(next(ins), dev))

    def timer(rt_mod):
        f = rt_mod.time_evaluator(name, dev, number=evaluator["number"], repeat=1,
                                  min_repeat_ms=2 * evaluator["min_repeat_ms"])
        return lambda: float(f(*args).mean)

    target = base.target.tvm_target()
    sides = [timer(tvm.compile(lower(base, name, tensors), target=target).jit())]
    rejected = store.rejected()
    candidates = []
    for _, rec in db.records[:3]:
        trace, run_secs = tuning_db.plain_json(rec.as_json())[:2]
        rid = tuning_db.record_id(trace, store.key)
        if rid in rejected or any(c[0] == rid for c in candidates):
            continue
        cand = dataclasses.replace(base, override=tuning_db.TraceOverride(trace),
                                   schedule_meta={"source": "tuned"})
        try:
            rt_mod = tvm.compile(lower(cand, name, tensors), target=target).jit()
            problem = verify_tuned(cand, rt_mod, name, tensors)
        except Exception as exc:  # noqa: BLE001 - a broken candidate is rejected, not fatal
            problem = f"it fails to build or run: {exc}"
        if problem:
            store.reject(rid, problem)
            continue
        candidates.append((rid, trace, run_secs))
        sides.append(timer(rt_mod))
    times = alternating_medians(sides, CHECK_ROUNDS)
    result.default_seconds = times[0]
    common = {"default_seconds": times[0], "trials": result.records,
              "tuning_seconds": round(result.seconds, 3), "flops": result.flops}
    if candidates:
        best = min(range(1, len(times)), key=times.__getitem__)
        result.tuned_seconds = times[best]
        if times[best] < ACCEPT_RATIO * times[0]:
            rid, trace, run_secs = candidates[best - 1]
            store.accept(rid, trace, tuning_db.mean_seconds(run_secs),
                         tuned_seconds=times[best], seed=db.seed, **common)
            result.accepted = rid
            return
    store.accept(None, None, None, tuned_seconds=result.tuned_seconds, **common)


def tune(res_or_sch, trials: int = DEFAULT_TRIALS, target=None, database=None, *,
         seed: int | None = None, rpc_key: str | None = None, tracker: str | None = None,
         max_workers: int = 1, trials_per_iter: int | None = None, resume: bool = True,
         seed_from_rule: bool = True, number: int = 3, repeat: int = 1,
         min_repeat_ms: int = 50, timeout: float = 60.0, progress: bool = True,
         name: str | None = None) -> TuneResult:
    """Tune a kernel with meta-schedule and record the result for later builds.

    Parameters
    ----------
    res_or_sch : te.Tensor, list of te.Tensor, or Schedule
        The kernel's output tensor(s) or the :class:`dsl.Schedule` of it.
    trials : int
        Candidates to measure in total for this workload and target (with ``resume``, those
        already in the database count).
    target : str or CpuTarget, optional
        Default: the schedule's target, else :func:`targets.current`.
    database : path, optional
        Database root (default ``$DSL_TUNING_DB``, else ``~/.cache/dsl/tuning``). Builds look
        in ``$DSL_TUNING_DB`` / the default only.
    seed : int, optional
        Random seed of the search (recorded with every record).
    rpc_key, tracker : str, optional
        Measure on the RPC servers registered under ``rpc_key`` at the tracker
        ``"host:port"`` (default ``$TVM_TRACKER_HOST:$TVM_TRACKER_PORT``) instead of locally.
    max_workers : int
        Parallel builder processes (and RPC sessions).
    trials_per_iter : int, optional
        Candidates per measured batch (default ``min(64, trials)``).
    resume : bool
        Count the records already measured toward ``trials``.
    seed_from_rule : bool
        Add our registered rule's schedule to the search space.
    number, repeat, min_repeat_ms, timeout :
        Measurement settings (meta-schedule's ``EvaluatorConfig``) and the per-candidate
        build/run time limit in seconds.
    progress : bool
        Print the progress bar and the summary on stderr.
    name : str, optional
        Label for the progress bar (default: the anchor op's name).

    Returns
    -------
    TuneResult
    """
    _require_extras()
    _STOP.clear()  # a Ctrl-C that ended an earlier call in this process is spent
    trials = check_int("trials", trials, lo=1, hi=100_000)
    max_workers = check_int("max_workers", max_workers, lo=1, hi=256)
    if seed is not None:
        seed = check_int("seed", seed, lo=0, hi=2**31 - 1)
    if isinstance(res_or_sch, Schedule):
        sch = res_or_sch
        if target is not None:
            sch = dataclasses.replace(sch, target=targets.get(target))
    else:
        sch = auto_schedule(res_or_sch, target=target)
    base = dataclasses.replace(sch, override=None, schedule_meta=None)
    db_root = tuning_db.root(database)
    if db_root is None:
        raise fail(E_VALUE, "database", os.environ.get(tuning_db.ENV),
                   f"the tuning database is switched off (${tuning_db.ENV}); pass database=")
    if rpc_key is not None and not isinstance(rpc_key, str):
        raise fail(E_TYPE, "rpc_key", rpc_key, "must be the RPC servers' key (a string)")

    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    mod = tuning_db.normalize(base.prim_func())
    store = tuning_db.WorkloadStore(db_root, base.target, tuning_db.workload_key(mod))
    store.save_workload(mod)
    label = name or base.op_info()["op"]
    result = TuneResult(label, store.key, str(store.dir), flops=float(estimate_tir_flops(mod)))
    cls = _classes()
    db = cls["StoreDatabase"](store, mod, seed)
    todo = trials - len(db.records) if resume else trials
    evaluator = {"number": number, "repeat": repeat, "min_repeat_ms": min_repeat_ms}
    bar = cls["Progress"](label, max(todo, 0), result.flops,
                          db.records[0][0] if db.records else None, enabled=progress)
    remote = None
    if rpc_key is not None or tracker is not None:
        # A configuration error is the caller's to fix: raised before any search starts.
        remote = (*_parse_tracker(tracker), rpc_key or "dsl")
        if todo > 0:
            _check_tracker(*remote)
    t0 = time.perf_counter()
    try:
        if todo > 0:
            preload_tensor_intrin()
            per_iter = min(trials_per_iter or 64, todo)
            space = ms.space_generator.PostOrderApply()
            hand = _hand_space(base, mod) if seed_from_rule else None
            if hand is not None:
                space = ms.space_generator.SpaceGeneratorUnion([hand, space])
            eval_cfg = ms.runner.EvaluatorConfig(number=number, repeat=repeat,
                                                 min_repeat_ms=min_repeat_ms)
            if remote is not None:
                runner = ms.runner.RPCRunner(
                    ms.runner.RPCConfig(tracker_host=remote[0], tracker_port=remote[1],
                                        tracker_key=remote[2],
                                        session_timeout_sec=int(timeout)),
                    evaluator_config=eval_cfg, max_workers=max_workers)
            else:
                runner = ms.runner.LocalRunner(timeout_sec=timeout, evaluator_config=eval_cfg)
            # The search's population scales with the budget: a handful of trials need not
            # evolve 512 candidates.
            strategy = ms.search_strategy.EvolutionarySearch(
                population_size=min(512, max(32, 8 * todo)),
                init_min_unmeasured=min(50, max(8, 2 * todo)),
                genetic_num_iters=4 if todo >= 32 else 2)
            with tempfile.TemporaryDirectory(prefix="dsl-tune-") as work_dir, \
                    _quiet_meta_schedule(), _stop_on_sigint():
                ms.tune_tir(
                    mod, target=base.target.tvm_target(), work_dir=work_dir,
                    max_trials_global=todo, num_trials_per_iter=per_iter,
                    builder=ms.builder.LocalBuilder(max_workers=max_workers, timeout_sec=timeout,
                                                initializer=preload_tensor_intrin),
                    runner=runner, database=db,
                    cost_model=ms.cost_model.XGBModel(num_tuning_cores=max_workers),
                    measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"),
                                       bar],
                    space=space, strategy=strategy, num_tuning_cores=max_workers, seed=seed)
    except KeyboardInterrupt:
        result.interrupted = True
    except Exception as exc:  # noqa: BLE001 - a failed search leaves the default schedule
        result.error = f"search failed: {type(exc).__name__}: {str(exc)[:500]}"
    finally:
        result.interrupted = result.interrupted or _STOP.is_set()
        result.seconds = time.perf_counter() - t0
        result.trials = db.new
        result.records = store.count_records()
        if progress and todo > 0:
            sys.stderr.write("\r" + bar.line() + "\n")
    if not result.interrupted or db.records:
        try:
            _local_check(base, store, db, result, evaluator)
        except KeyboardInterrupt:
            result.interrupted = True
        except Exception as exc:  # noqa: BLE001 - the default schedule stays in use
            result.error = (result.error or "") + f" check failed: {exc}"
    if progress:
        sys.stderr.write(result.summary() + "\n")
    if result.interrupted:
        raise KeyboardInterrupt
    return result


_STOP = threading.Event()


@contextlib.contextmanager
def _stop_on_sigint():
    """First Ctrl-C: finish the batch being measured, keep its records, stop the search.
    Second Ctrl-C: the default action (records already written stay on disk).

    meta-schedule runs its loop in C++ and swallows exceptions raised in Python callbacks, so a
    plain ``KeyboardInterrupt`` would not stop it; the measure callback polls this flag.
    """
    _STOP.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        _STOP.set()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        sys.stderr.write("\n[tune] Ctrl-C: stopping after the current batch "
                         "(Ctrl-C again to abort at once)\n")

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def _quiet_meta_schedule():
    """meta-schedule logs every task table at INFO to the console; our bar replaces it."""
    import logging

    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    old = logger.level
    logger.setLevel(logging.DEBUG if os.environ.get("DSL_TUNE_DEBUG") else logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(old)


# ----------------------------------------------------------------------------------------------
# CLI


@contextlib.contextmanager
def recording_builds():
    """Record the (Schedule, tensor_list) of every ``dsl.build`` call inside the block.

    The real build still runs (examples load and check what they built).
    """
    from dsl.runtime.build import observe_builds

    seen: list[tuple[Schedule, list]] = []

    def record(sch, config):
        if isinstance(sch, Schedule) and isinstance(config, dict):
            seen.append((sch, list(config.get("tensor_list") or []), config.get("name")))

    with observe_builds(record):
        yield seen


def kernels_of_example(path: str | os.PathLike) -> list[tuple[Schedule, str]]:
    """Run an example script and return the kernels it builds (deduplicated by workload)."""
    import runpy

    path = Path(path).resolve()
    if not path.is_file():
        raise fail(E_VALUE, "--example", str(path), "must be an example script (.py file)")
    old_argv, old_cwd, old_path = sys.argv, os.getcwd(), list(sys.path)
    with tempfile.TemporaryDirectory(prefix="dsl-tune-example-") as tmp:
        try:
            sys.argv = [str(path)]
            sys.path.insert(0, str(path.parent))
            os.chdir(tmp)  # the example's kernel_meta/ goes to a scratch directory
            with recording_builds() as seen:
                try:
                    runpy.run_path(str(path), run_name="__main__")
                except SystemExit as exc:
                    if exc.code not in (0, None):
                        raise fail(E_VALUE, "--example", str(path),
                                   f"exited with status {exc.code}") from None
        finally:
            sys.argv, sys.path[:] = old_argv, old_path
            os.chdir(old_cwd)
    return _dedup(seen, path.stem)


def bench_workloads(suites, name_filter: str | None) -> list:
    """The benchmark workloads to tune (all suites unless ``suites``; ``name_filter`` is a
    substring of the workload name)."""
    from dsl.cli.bench import SUITES, load_suites

    return [w for w in load_suites(list(suites or SUITES))
            if not name_filter or name_filter in w.name]


def kernels_of_workload(w) -> tuple[list[tuple[Schedule, str]], object]:
    """Run a benchmark workload's ``setup()`` with builds recorded: its kernels and the
    prepared workload (built with whatever schedule the database gives)."""
    with tempfile.TemporaryDirectory(prefix="dsl-tune-bench-") as tmp:
        old_cwd = os.getcwd()
        os.chdir(tmp)
        try:
            with recording_builds() as seen:
                prepared = w.setup()
        finally:
            os.chdir(old_cwd)
    return _dedup(seen, w.name), prepared


def _dedup(seen, label: str) -> list[tuple[Schedule, str]]:
    out, keys = [], set()
    for i, (sch, _, kname) in enumerate(seen):
        base = dataclasses.replace(sch, override=None, schedule_meta=None)
        key = (tuning_db.workload_key(tuning_db.normalize(base.prim_func())),
               tuning_db.target_key(base.target))
        if key not in keys:
            keys.add(key)
            out.append((base, kname or f"{label}#{i}"))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m dsl tune``: tune the kernels of an example script or of the benchmarks."""
    p = argparse.ArgumentParser(
        prog="python -m dsl tune",
        description="Tune every kernel an example script builds, or the benchmark suite's, "
                    "into the tuning database that later builds read.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--example", action="append", metavar="FILE",
                     help="an example script; every kernel it builds is tuned (repeatable)")
    src.add_argument("--bench", action="store_true", help="the benchmark suite's kernels")
    p.add_argument("--suite", action="append", help="benchmark suite(s) (default: all)")
    p.add_argument("--filter", help="only benchmark workloads whose name contains this")
    p.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help="trials per kernel")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--target", default=None, help=f"target name ({', '.join(targets.names())})")
    p.add_argument("--database", default=None, help=f"database root (default ${tuning_db.ENV} "
                   "or ~/.cache/dsl/tuning)")
    p.add_argument("--rpc-key", default=None, help="measure on RPC servers with this key")
    p.add_argument("--tracker", default=None, help="RPC tracker host:port")
    p.add_argument("--max-workers", type=int, default=1)
    p.add_argument("--repeat", type=int, default=5,
                   help="--bench: timed samples per side after tuning (median)")
    p.add_argument("--json", default=None, metavar="PATH", help="--bench: write the table")
    p.add_argument("--no-resume", action="store_true",
                   help="run --trials new trials even if records exist")
    args = p.parse_args(argv)

    if args.database:
        os.environ[tuning_db.ENV] = args.database  # builds after tuning read the same database
    opts = {"seed": args.seed, "rpc_key": args.rpc_key, "tracker": args.tracker,
            "max_workers": args.max_workers, "resume": not args.no_resume}
    ctx = targets.use(args.target) if args.target else contextlib.nullcontext()
    try:
        with ctx:
            if args.example:
                kernels = [k for f in args.example for k in kernels_of_example(f)]
                if not kernels:
                    print("the example builds no kernel", file=sys.stderr)
                    return 1
                results = [tune(sch, args.trials, args.target, args.database, name=label,
                                **opts) for sch, label in kernels]
                print(format_table(results))
                return 0 if all(r.error is None for r in results) else 1
            return _tune_bench(args, opts)
    except KeyboardInterrupt:
        print("\ninterrupted: every record measured so far is kept", file=sys.stderr)
        return 130
    except DslError as exc:  # a usage problem (tracker down, bad example): no traceback
        print(f"python -m dsl tune: {exc}", file=sys.stderr)
        return 2


def _tune_bench(args, opts) -> int:
    """Tune every kernel of the selected benchmark workloads; then time the default schedule,
    the tuned one and PyTorch side by side (alternating samples, medians) per workload."""
    from dsl.cli.bench.runner import fair_thread_env, geomean, measure_alternating

    fair_thread_env(targets.get(args.target or "host").cores)
    workloads = bench_workloads(args.suite, args.filter)
    if not workloads:
        print("no benchmark workloads match", file=sys.stderr)
        return 1
    rows, ok = [], True
    for i, w in enumerate(workloads, 1):
        print(f"[{i}/{len(workloads)}] {w.name} {w.kind}", file=sys.stderr, flush=True)
        with _env(tuning_db.ENV, "off"):  # the default schedule, whatever is tuned
            kernels, default = kernels_of_workload(w)
        results = [tune(sch, args.trials, args.target, args.database, name=f"{w.name}:{label}",
                        **opts) for sch, label in kernels]
        ok = ok and all(r.error is None for r in results)
        _, tuned = kernels_of_workload(w)
        try:
            tuned.verify()
        except ValueError as exc:
            print(f"{w.name} {w.kind}: the tuned kernel gives a {exc}; remove its records "
                  f"from {results[0].database}", file=sys.stderr)
            ok = False
        fns = [default.ours, tuned.ours] + ([tuned.peer] if tuned.peer is not None else [])
        times = measure_alternating(fns, args.repeat, 0.03, 0.02)
        gf = [w.flops / t / 1e9 for t in times]
        rows.append({"workload": w.name, "kind": w.kind, "default": gf[0], "tuned": gf[1],
                     "pytorch": gf[2] if len(gf) > 2 else None,
                     "tune_s": sum(r.seconds for r in results),
                     "trials": sum(r.trials for r in results),
                     "records": sum(r.records for r in results),
                     "uses": "tuned" if any(r.accepted for r in results) else "default"})
        print(_bench_row(rows[-1]), flush=True)
    print()
    for r in rows:
        print(_bench_row(r))
    for key in ("default", "tuned"):
        ratio = geomean([r[key] / r["pytorch"] for r in rows if r["pytorch"]])
        if ratio:
            print(f"geomean {key}/PyTorch: {ratio:.3f}")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"trials": args.trials, "seed": args.seed, "rows": rows}, f, indent=1)
    return 0 if ok else 1


def _bench_row(r: dict) -> str:
    torch_txt = "-" if r["pytorch"] is None else f"{r['pytorch']:.1f}"
    return (f"{r['workload']:34s} {r['kind']:9s} default {r['default']:7.1f}  tuned "
            f"{r['tuned']:7.1f}  PyTorch {torch_txt:>7s} GFLOP/s  {r['trials']:4d} trials "
            f"{r['tune_s']:6.0f} s  builds use the {r['uses']} schedule")


@contextlib.contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def format_table(results: list[TuneResult]) -> str:
    def g(r, s):
        v = r.gflops(s)
        return "-" if v is None else f"{v:.2f}"

    rows = [("kernel", "trials", "tune s", "default GF/s", "tuned GF/s", "uses")]
    rows += [(r.name, str(r.trials), f"{r.seconds:.1f}", g(r, r.default_seconds),
              g(r, r.tuned_seconds), "tuned" if r.accepted else "default") for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)
