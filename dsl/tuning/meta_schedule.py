"""Glue between :func:`dsl.tune` and ``tvm.s_tir.meta_schedule``.

What meta-schedule needs from us, and nothing about *when* to search or what to do with the
result (that is :mod:`dsl.tuning.tune`):

* a database adapter (:func:`classes` ``["StoreDatabase"]``) over one
  :class:`dsl.tuning.database.WorkloadStore`, appending every measured record to disk at once;
* a measure callback (``["Progress"]``) that reports batches and stops the search on Ctrl-C;
* the design space: our registered rule replayed as a ``ScheduleFn`` (:func:`hand_space`)
  next to meta-schedule's own ``PostOrderApply``;
* builder, runner (local or RPC tracker) and search-strategy settings (:func:`search`).

The classes are built lazily: importing ``dsl`` must load neither meta-schedule's Python-side
objects nor xgboost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
import time
import warnings

from dsl.errors import E_VALUE, fail
from dsl.tuning import database as tuning_db

# Set by the first Ctrl-C of a search; the measure callback polls it after each measured batch
# (meta-schedule runs its loop in C++, so a KeyboardInterrupt raised at an arbitrary point
# could land between a measurement and its record).
STOP = threading.Event()

_CLASSES: dict = {}


class SearchStopped(RuntimeError):
    """Raised by the measure callback after the batch in which Ctrl-C came (it reaches
    :func:`search` as the FFI's RuntimeError, which checks :data:`STOP`)."""


def parse_tracker(tracker) -> tuple[str, int]:
    """``"host:port"`` (default ``$TVM_TRACKER_HOST:$TVM_TRACKER_PORT``) -> (host, port)."""
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


def check_tracker(host: str, port: int, key: str, wait: float = 10.0) -> None:
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


def _store_database(PyDatabase, TuningRecord, Workload, structural_equal):
    class StoreDatabase(PyDatabase):
        """A meta-schedule database over one :class:`dsl.tuning.database.WorkloadStore`.

        Every committed record is appended to disk at once (so an interrupted search keeps
        it); records already on disk are loaded at start so a new search resumes from them.
        ``records`` is ``[(mean seconds, TuningRecord)]``, fastest first.
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
            return bool(structural_equal(mod, self.workload.mod))

        def commit_workload(self, mod):
            if not self.has_workload(mod):  # one task per search: anything else is a bug
                raise ValueError("StoreDatabase holds a single workload")
            return self.workload

        def commit_tuning_record(self, record) -> None:
            as_json = tuning_db.plain_json(record.as_json())
            rid = tuning_db.record_id(as_json[0], self.store.key)
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

    return StoreDatabase


def _progress_callback(PyMeasureCallback):
    class Progress(PyMeasureCallback):
        """Reports each measured batch on a :class:`dsl.progress.Steps` (with the best
        GFLOP/s so far) and ends the search after the batch in which Ctrl-C came."""

        def __init__(self, steps, flops: float, best: float | None):
            super().__init__()
            self.steps, self.flops, self.best = steps, flops, best

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
                  runner_results) -> None:
            for res in runner_results:
                t = tuning_db.mean_seconds(res.run_secs) if res.error_msg is None else None
                if t is not None and (self.best is None or t < self.best):
                    self.best = t
            self.steps.update(len(runner_results), self.best_text())
            if STOP.is_set():
                # Ctrl-C: this batch's records are committed (the database callback runs
                # first). Raising unwinds meta-schedule's loop at once, whichever of its
                # paths called us (terminating the task from here can leave it handing a
                # finished task back to its loop, which then fails a check).
                raise SearchStopped("stopped by Ctrl-C")

        def best_text(self) -> str:
            if self.best and self.flops:
                return f"best {self.flops / self.best / 1e9:8.2f} GFLOP/s"
            return "best        - GFLOP/s"

    return Progress


def classes() -> dict:
    """``{"StoreDatabase": ..., "Progress": ...}``, built on first use."""
    if not _CLASSES:
        import tvm_ffi
        from tvm.ir.utils import derived_object
        from tvm.s_tir.meta_schedule.database import PyDatabase, TuningRecord, Workload
        from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

        store = _store_database(PyDatabase, TuningRecord, Workload, tvm_ffi.structural_equal)
        _CLASSES.update(StoreDatabase=derived_object(store),
                        Progress=derived_object(_progress_callback(PyMeasureCallback)))
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


def hand_space(base, mod):
    """meta-schedule's ScheduleFn replaying our registered rule on the normalised workload
    ``mod``, or None if it does not apply (the search then uses meta-schedule's own space)."""
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


@contextlib.contextmanager
def stop_on_sigint():
    """First Ctrl-C: finish the batch being measured, keep its records, stop the search.
    Second Ctrl-C: the default action (records already written stay on disk)."""
    STOP.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        STOP.set()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        sys.stderr.write("\n[tune] Ctrl-C: stopping after the current batch "
                         "(Ctrl-C again to abort at once)\n")

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def _stopped_quietly():
    """End the search without an error when it unwound because of Ctrl-C."""
    try:
        yield
    except Exception:
        if not STOP.is_set():
            raise


@contextlib.contextmanager
def quiet_meta_schedule():
    """meta-schedule logs every task table at INFO to the console; our progress replaces it
    (``DSL_TUNE_DEBUG=1`` shows meta-schedule's own log at DEBUG)."""
    import logging

    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    old = logger.level
    logger.setLevel(logging.DEBUG if os.environ.get("DSL_TUNE_DEBUG") else logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(old)


def _runner(remote, evaluator: dict, timeout: float, max_workers: int):
    """Measure locally, or on the RPC servers ``remote = (host, port, key)``."""
    from tvm.s_tir import meta_schedule as ms

    eval_cfg = ms.runner.EvaluatorConfig(**evaluator)
    if remote is None:
        return ms.runner.LocalRunner(timeout_sec=timeout, evaluator_config=eval_cfg)
    return ms.runner.RPCRunner(
        ms.runner.RPCConfig(tracker_host=remote[0], tracker_port=remote[1],
                            tracker_key=remote[2], session_timeout_sec=int(timeout)),
        evaluator_config=eval_cfg, max_workers=max_workers)


def search(mod, base, db, progress, todo: int, *, seed, remote, evaluator: dict,
           max_workers: int, trials_per_iter: int | None, seed_from_rule: bool,
           timeout: float) -> None:
    """Measure ``todo`` candidates of ``mod`` (the normalised workload of the Schedule
    ``base``) into ``db`` (a ``StoreDatabase``), reporting to ``progress`` (a ``Progress``)."""
    from tvm.s_tir import meta_schedule as ms

    preload_tensor_intrin()
    space = ms.space_generator.PostOrderApply()
    hand = hand_space(base, mod) if seed_from_rule else None
    if hand is not None:
        space = ms.space_generator.SpaceGeneratorUnion([hand, space])
    # The search's population scales with the budget: a handful of trials need not evolve
    # 512 candidates.
    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=min(512, max(32, 8 * todo)),
        init_min_unmeasured=min(50, max(8, 2 * todo)),
        genetic_num_iters=4 if todo >= 32 else 2)
    with tempfile.TemporaryDirectory(prefix="dsl-tune-") as work_dir, \
            quiet_meta_schedule(), stop_on_sigint(), _stopped_quietly():
        ms.tune_tir(
            mod, target=base.target.tvm_target(), work_dir=work_dir,
            max_trials_global=todo, num_trials_per_iter=min(trials_per_iter or 64, todo),
            builder=ms.builder.LocalBuilder(max_workers=max_workers, timeout_sec=timeout,
                                            initializer=preload_tensor_intrin),
            runner=_runner(remote, evaluator, timeout, max_workers), database=db,
            cost_model=ms.cost_model.XGBModel(num_tuning_cores=max_workers),
            measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"),
                               progress],
            space=space, strategy=strategy, num_tuning_cores=max_workers, seed=seed)
