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

This module is the search's policy (how many trials, resume, the head-to-head, the decision).
meta-schedule's side (database adapter, design space, builder and runner) is
:mod:`dsl.tuning.meta_schedule`; the command line (``python -m dsl tune``) is
:mod:`dsl.cli.tune`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from dsl.errors import E_TYPE, E_VALUE, check_int, fail
from dsl.progress import Steps
from dsl.runtime.schedule import Schedule, auto_schedule
from dsl.runtime.target import get as target_get
from dsl.tuning import database as tuning_db
from dsl.tuning import meta_schedule as glue

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


def _timing_args(base: Schedule, tensors, dev) -> list:
    """Device tensors for one call of the kernel: random inputs, and outputs of the right
    dtype (their initial contents do not matter for timing)."""
    import tvm

    from dsl.runtime.build import random_inputs
    from dsl.runtime.schedule import same_tensor

    args, ins = [], iter(random_inputs(tensors, base))
    for t in tensors:
        if any(same_tensor(t, o) for o in base.outputs):
            # an input generator for the output's dtype (bfloat16 included)
            (zeros,) = random_inputs([t], dataclasses.replace(base, outputs=[]))
            args.append(tvm.runtime.tensor(zeros, dev))
        else:
            args.append(tvm.runtime.tensor(next(ins), dev))
    return args


def _verified_candidates(base: Schedule, store, db, name: str, tensors, target) -> list:
    """The (up to three) fastest measured records that build and agree numerically with the
    default schedule: ``[(record id, trace, run seconds, runtime module)]``. Those that do
    not are rejected in the store, so builds never try them."""
    from dsl.runtime.build import compile_module, lower, verify_tuned

    rejected, out = store.rejected(), []
    for _, rec in db.records[:3]:
        trace, run_secs = tuning_db.plain_json(rec.as_json())[:2]
        rid = tuning_db.record_id(trace, store.key)
        if rid in rejected or any(c[0] == rid for c in out):
            continue
        cand = dataclasses.replace(base, override=tuning_db.TraceOverride(trace),
                                   schedule_meta={"source": "tuned"})
        try:
            rt_mod = compile_module(lower(cand, name, tensors), target).jit()
            problem = verify_tuned(cand, rt_mod, name, tensors)
        except Exception as exc:  # noqa: BLE001 - a broken candidate is rejected, not fatal
            problem = f"it fails to build or run: {exc}"
        if problem:
            store.reject(rid, problem)
        else:
            out.append((rid, trace, run_secs, rt_mod))
    return out


def _local_check(base: Schedule, store: tuning_db.WorkloadStore, db, result: TuneResult,
                 evaluator: dict) -> None:
    """Head-to-head on this machine: the default schedule vs the best candidates that agree
    with it numerically, timed in alternating rounds (medians, so that load from other
    processes hits every side alike); record the decision (the tuned id, or None for the
    default)."""
    import tvm

    from dsl.runtime.build import compile_module, lower
    from dsl.runtime.timing import alternating_medians

    name = "dsl_tune_check"
    tensors = base.default_tensor_list()
    dev = tvm.cpu()
    args = _timing_args(base, tensors, dev)

    def timer(rt_mod):
        f = rt_mod.time_evaluator(name, dev, number=evaluator["number"], repeat=1,
                                  min_repeat_ms=2 * evaluator["min_repeat_ms"])
        return lambda: float(f(*args).mean)

    target = base.target.tvm_target()
    default = compile_module(lower(base, name, tensors), target).jit()
    candidates = _verified_candidates(base, store, db, name, tensors, target)
    times = alternating_medians([timer(default)] + [timer(c[3]) for c in candidates],
                                CHECK_ROUNDS)
    result.default_seconds = times[0]
    common = {"default_seconds": times[0], "trials": result.records,
              "tuning_seconds": round(result.seconds, 3), "flops": result.flops}
    if candidates:
        best = min(range(1, len(times)), key=times.__getitem__)
        result.tuned_seconds = times[best]
        if times[best] < ACCEPT_RATIO * times[0]:
            rid, trace, run_secs, _ = candidates[best - 1]
            store.accept(rid, trace, tuning_db.mean_seconds(run_secs),
                         tuned_seconds=times[best], seed=db.seed, **common)
            result.accepted = rid
            return
    store.accept(None, None, None, tuned_seconds=result.tuned_seconds, **common)


def _base_schedule(res_or_sch, target) -> Schedule:
    """The un-overridden Schedule to tune: from a Schedule (on ``target`` if given) or from
    the output tensor(s)."""
    if isinstance(res_or_sch, Schedule):
        sch = res_or_sch
        if target is not None:
            sch = dataclasses.replace(sch, target=target_get(target))
    else:
        sch = auto_schedule(res_or_sch, target=target)
    return dataclasses.replace(sch, override=None, schedule_meta=None)


def _remote(rpc_key, tracker) -> tuple[str, int, str] | None:
    """(host, port, key) of the RPC tracker to measure on, or None to measure locally."""
    if rpc_key is not None and not isinstance(rpc_key, str):
        raise fail(E_TYPE, "rpc_key", rpc_key, "must be the RPC servers' key (a string)")
    if rpc_key is None and tracker is None:
        return None
    return (*glue.parse_tracker(tracker), rpc_key or "dsl")


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
        Print progress (a bar on a terminal, one line per measured batch otherwise) and the
        summary on stderr.
    name : str, optional
        Label for the progress (default: the anchor op's name).

    Returns
    -------
    TuneResult
    """
    _require_extras()
    glue.STOP.clear()  # a Ctrl-C that ended an earlier call in this process is spent
    trials = check_int("trials", trials, lo=1, hi=100_000)
    max_workers = check_int("max_workers", max_workers, lo=1, hi=256)
    if seed is not None:
        seed = check_int("seed", seed, lo=0, hi=2**31 - 1)
    base = _base_schedule(res_or_sch, target)
    db_root = tuning_db.root(database)
    if db_root is None:
        raise fail(E_VALUE, "database", os.environ.get(tuning_db.ENV),
                   f"the tuning database is switched off (${tuning_db.ENV}); pass database=")
    remote = _remote(rpc_key, tracker)  # a configuration error is raised before any search

    from tvm.s_tir.analysis import estimate_tir_flops

    mod = tuning_db.normalize(base.prim_func())
    store = tuning_db.WorkloadStore(db_root, base.target, tuning_db.workload_key(mod))
    store.save_workload(mod)
    label = name or base.op_info()["op"]
    result = TuneResult(label, store.key, str(store.dir), flops=float(estimate_tir_flops(mod)))
    db = glue.classes()["StoreDatabase"](store, mod, seed)
    todo = trials - len(db.records) if resume else trials
    if remote is not None and todo > 0:
        glue.check_tracker(*remote)
    evaluator = {"number": number, "repeat": repeat, "min_repeat_ms": min_repeat_ms}
    settings = {"seed": seed, "remote": remote, "evaluator": evaluator,
                "max_workers": max_workers, "trials_per_iter": trials_per_iter,
                "seed_from_rule": seed_from_rule, "timeout": timeout}
    _search(base, mod, store, db, result, max(todo, 0), settings, progress)
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


def _search(base: Schedule, mod, store, db, result: TuneResult, todo: int, settings: dict,
            progress: bool) -> None:
    """Measure ``todo`` new candidates (none: only the check runs); fill in ``result``'s
    trials, records, seconds and error. A failed or interrupted search keeps its records."""
    best = db.records[0][0] if db.records else None
    t0 = time.perf_counter()
    with Steps(todo, f"[tune {result.name}]", unit="trial",
               enabled=progress and todo > 0) as steps:
        callback = glue.classes()["Progress"](steps, result.flops, best)
        try:
            if todo > 0:
                glue.search(mod, base, db, callback, todo, **settings)
        except KeyboardInterrupt:
            result.interrupted = True
        except Exception as exc:  # noqa: BLE001 - a failed search leaves the default schedule
            result.error = f"search failed: {type(exc).__name__}: {str(exc)[:500]}"
        finally:
            result.interrupted = result.interrupted or glue.STOP.is_set()
            result.seconds = time.perf_counter() - t0
            result.trials = db.new
            result.records = store.count_records()
