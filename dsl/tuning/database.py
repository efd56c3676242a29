"""The tuning database: measured meta-schedule records per (workload, target), on disk.

Layout under the root (:func:`root`: the ``database=`` argument, else ``$DSL_TUNING_DB``, else
``$XDG_CACHE_HOME/dsl/tuning`` or ``~/.cache/dsl/tuning``)::

    <target name>-<hash of the codegen target>/      one directory per target: the key is
        <workload hash>.workload.json                 the target, not just the workload
        <workload hash>.jsonl                         every measured candidate (search history)
        <workload hash>.decisions.jsonl               "accept" / "reject" lines

The *workload* is the un-scheduled PrimFunc of a kernel in its default argument order
(:meth:`dsl.schedule.Schedule.prim_func`), normalised as meta-schedule does; its key is its
structural hash, checked against the stored module with structural equality.

Every line is one JSON object written with a single ``O_APPEND`` ``write`` under an exclusive
``flock``, so concurrent tuners never interleave partial lines, and a writer that finds the file
not ending in a newline (a process killed mid-write) starts on a fresh line. Readers skip any line
that does not parse, with a warning, so a truncated or corrupt record is never fatal.

``build`` reads only the decisions file: the latest ``accept`` whose record has not been
rejected names the tuned schedule (its trace is stored in the line itself, so the look-up parses
a few small lines and nothing else).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import targets
from dsl.runtime.atomic import write_text_atomic

ENV = "DSL_TUNING_DB"
FORMAT = 1
# meta-schedule commits failed builds / runs with a huge sentinel time; anything this slow is
# not a measurement.
_FAILED_SECONDS = 1e9


class TuningDbWarning(UserWarning):
    """A database file or line could not be used (it is skipped)."""


def root(database: str | os.PathLike | None = None) -> Path | None:
    """The database directory: ``database``, else ``$DSL_TUNING_DB``, else the user cache.

    ``$DSL_TUNING_DB=off`` disables the look-up in ``auto_schedule`` (returns None).
    """
    if database is not None:
        return Path(database)
    env = os.environ.get(ENV)
    if env:
        return None if env.lower() in ("off", "none", "0") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsl" / "tuning"


def target_codegen(target: targets.CpuTarget) -> dict:
    """What of a target changes generated code (the LLVM attributes and the core count)."""
    return {**target.llvm, "num-cores": target.cores}


def target_key(target: targets.CpuTarget) -> str:
    """Directory name of a target: its registry name plus a hash of its codegen attributes.

    Two machines sharing a home directory get different keys when their host CPUs differ.
    """
    text = json.dumps(target_codegen(target), sort_keys=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in target.name)
    return f"{safe}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def normalize(func):
    """The IRModule meta-schedule tunes for ``func`` (a PrimFunc): ``main``, noalias.

    The same steps as meta-schedule's ``_normalize_mod``, without importing meta-schedule
    (``build`` calls this on every look-up).
    """
    import tvm

    if not (func.attrs and "global_symbol" in func.attrs):
        func = func.with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func.with_attr("tirx.noalias", True)})


def workload_key(mod) -> str:
    import tvm_ffi

    return f"{tvm_ffi.structural_hash(mod) & (2**64 - 1):016x}"


def record_id(trace_json, workload: str) -> str:
    text = json.dumps([workload, trace_json], sort_keys=True, default=_json_default)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def mean_seconds(run_secs) -> float | None:
    """Mean of a record's run times, or None for a failed / missing measurement."""
    try:
        vals = [float(v) for v in run_secs]
    except (TypeError, ValueError):
        return None
    if not vals or not all(math.isfinite(v) and 0 < v < _FAILED_SECONDS for v in vals):
        return None
    return sum(vals) / len(vals)


# ----------------------------------------------------------------------------------------------
# Files: append one line atomically, read lines resiliently.


def _json_default(obj):
    """TVM containers and numbers inside traces (``IntImm`` decision indices, ``Array``...)
    as plain JSON values; anything else is an error, never a silent ``str()``."""
    value = getattr(obj, "value", None)
    if isinstance(value, (int, float)):
        return value
    if hasattr(obj, "items"):
        return dict(obj.items())
    if hasattr(obj, "__len__") and hasattr(obj, "__getitem__"):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def plain_json(obj):
    """``obj`` (e.g. ``Trace.as_json()``) as plain Python lists, dicts, numbers and strings."""
    return json.loads(json.dumps(obj, default=_json_default))


def append_line(path: Path, obj: dict) -> None:
    """Append ``obj`` as one JSON line: one ``write`` with ``O_APPEND`` under ``flock``."""
    data = (json.dumps(obj, default=_json_default) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        # A writer killed mid-line leaves no newline; start afresh so only its line is lost.
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def read_lines(path: Path, *, prefix: bytes | None = None) -> list[dict]:
    """The JSON objects of a JSON-lines file; bad lines are skipped with a warning.

    ``prefix``: parse only lines starting with it (a cheap filter for the fast look-up).
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        warnings.warn(f"tuning database: cannot read {path}: {exc}", TuningDbWarning,
                      stacklevel=2)
        return []
    out, bad = [], 0
    for line in raw.split(b"\n"):
        line = line.strip()
        if not line or (prefix is not None and not line.startswith(prefix)):
            continue
        try:
            obj = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            bad += 1
            continue
        if isinstance(obj, dict) and obj.get("format") == FORMAT:
            out.append(obj)
        else:
            bad += 1
    if bad:
        warnings.warn(f"tuning database: skipped {bad} corrupt or truncated line(s) in {path}",
                      TuningDbWarning, stacklevel=2)
    return out




# ----------------------------------------------------------------------------------------------
# One workload on one target.


@dataclass
class Tuned:
    """The accepted tuned schedule of a workload (one ``accept`` line)."""

    id: str
    trace: list
    run_seconds: float
    line: dict
    path: Path


class WorkloadStore:
    """The files of one (workload, target) pair."""

    def __init__(self, db_root: Path, target: targets.CpuTarget, wkey: str):
        self.dir = Path(db_root) / target_key(target)
        self.target, self.key = target, wkey
        self.records_path = self.dir / f"{wkey}.jsonl"
        self.decisions_path = self.dir / f"{wkey}.decisions.jsonl"
        self.workload_path = self.dir / f"{wkey}.workload.json"

    # -- the workload module -------------------------------------------------------------
    def save_workload(self, mod) -> None:
        """Store the workload module once (atomically: a reader never sees half a file)."""
        if self.workload_path.is_file():
            return
        import tvm

        write_text_atomic(self.workload_path, json.dumps(
            {"format": FORMAT, "key": self.key, "module": tvm.ir.save_json(mod)}))

    def matches(self, mod) -> bool:
        """True if the stored workload is structurally equal to ``mod`` (no hash collision).

        A missing or unreadable workload file is not a match (warned): nothing is applied to a
        kernel the record may not belong to.
        """
        import tvm
        import tvm_ffi

        try:
            stored = tvm.ir.load_json(json.loads(self.workload_path.read_text())["module"])
        except FileNotFoundError:
            return False
        except Exception as exc:  # noqa: BLE001 - any corruption means "not usable"
            warnings.warn(f"tuning database: unreadable workload {self.workload_path}: {exc}",
                          TuningDbWarning, stacklevel=2)
            return False
        return bool(tvm_ffi.structural_equal(stored, mod))

    # -- candidates (search history) -------------------------------------------------------
    def append_record(self, entry: dict) -> None:
        append_line(self.records_path, {"format": FORMAT, "kind": "record", **entry})

    def records(self) -> list[dict]:
        """Every measured candidate with a valid time, fastest first."""
        out = []
        for r in read_lines(self.records_path):
            if r.get("kind") != "record" or not isinstance(r.get("record"), list):
                continue
            t = mean_seconds(r["record"][1] if len(r["record"]) > 1 else None)
            if t is not None:
                out.append({**r, "seconds": t})
        return sorted(out, key=lambda r: r["seconds"])

    def count_records(self) -> int:
        return len(read_lines(self.records_path))

    # -- decisions ---------------------------------------------------------------------------
    def accept(self, rec_id: str | None, trace, run_seconds: float | None, **info) -> None:
        """Record the tuned schedule to use (``rec_id=None``: keep the default schedule)."""
        append_line(self.decisions_path, {"format": FORMAT, "kind": "accept", "id": rec_id,
                                          "trace": trace, "run_seconds": run_seconds,
                                          "time": time.time(), **info})

    def reject(self, rec_id: str, reason: str) -> None:
        """Mark a record unusable (fails to build, wrong results, slower than the default)."""
        append_line(self.decisions_path, {"format": FORMAT, "kind": "reject", "id": rec_id,
                                          "reason": reason[:2000], "time": time.time()})

    def rejected(self) -> dict[str, str]:
        return {d["id"]: d.get("reason", "") for d in read_lines(self.decisions_path)
                if d.get("kind") == "reject" and isinstance(d.get("id"), str)}

    def tuned(self) -> Tuned | None:
        """The latest accepted, not rejected, tuned schedule; None means the default."""
        lines = read_lines(self.decisions_path, prefix=b'{"format": 1, "kind": "')
        rejected = {d["id"] for d in lines if d.get("kind") == "reject"}
        for d in reversed(lines):
            if d.get("kind") != "accept":
                continue
            if d.get("id") is None:
                return None  # the latest decision was "the default is at least as fast"
            if d["id"] in rejected:
                continue
            if not isinstance(d.get("trace"), list):
                continue
            return Tuned(d["id"], d["trace"], float(d.get("run_seconds") or 0.0), d,
                         self.decisions_path)
        return None


def store_for(mod, target: targets.CpuTarget, database=None) -> WorkloadStore | None:
    db_root = root(database)
    return None if db_root is None else WorkloadStore(db_root, target, workload_key(mod))


def lookup(sch, database=None) -> tuple[Tuned, WorkloadStore] | None:
    """The tuned schedule recorded for a :class:`dsl.schedule.Schedule`, if any.

    Cheap when nothing is tuned for the target (one ``stat``); otherwise builds the PrimFunc,
    hashes it and reads the small decisions file.
    """
    db_root = root(database)
    if db_root is None or not (db_root / target_key(sch.target)).is_dir():
        return None
    mod = normalize(sch.prim_func())
    store = WorkloadStore(db_root, sch.target, workload_key(mod))
    if not store.decisions_path.is_file():
        return None
    tuned = store.tuned()
    if tuned is None or not store.matches(mod):
        return None
    return tuned, store


def apply_tuned(sch, database=None) -> None:
    """Point ``sch`` at its tuned schedule when the database has one (used by auto_schedule).

    Never raises: a database problem leaves the default schedule in place, with a warning.
    """
    try:
        found = lookup(sch, database)
    except Exception as exc:  # noqa: BLE001 - tuning must never break a build
        warnings.warn(f"tuning database look-up failed, using the default schedule: {exc}",
                      TuningDbWarning, stacklevel=2)
        return
    if found is None:
        return
    tuned, store = found
    sch.override = TraceOverride(tuned.trace)
    sch.schedule_meta = {
        "source": "tuned", "run_seconds": tuned.run_seconds, "trace": tuned.trace,
        "record": {"id": tuned.id, "database": str(store.dir), "workload": store.key,
                   **{k: tuned.line[k] for k in ("seed", "trials", "tuning_seconds",
                                                  "default_seconds", "tuned_seconds", "time")
                      if k in tuned.line}}}


class TraceOverride:
    """``Schedule.override``: replay a stored trace on a fresh ``s_tir.Schedule``."""

    def __init__(self, trace):
        self.trace = trace

    def __call__(self, sch) -> None:
        from tvm.s_tir.schedule import Trace

        Trace.apply_json_to_schedule(self.trace, sch)


def reject(schedule_meta: dict, reason: str) -> None:
    """Mark the record a schedule_meta came from as rejected (build's re-verification)."""
    rec = (schedule_meta or {}).get("record") or {}
    if not rec.get("id") or not rec.get("database") or not rec.get("workload"):
        return
    path = Path(rec["database"]) / f"{rec['workload']}.decisions.jsonl"
    try:
        append_line(path, {"format": FORMAT, "kind": "reject", "id": rec["id"],
                           "reason": reason[:2000], "time": time.time()})
    except OSError as exc:
        warnings.warn(f"tuning database: could not mark {rec['id']} rejected: {exc}",
                      TuningDbWarning, stacklevel=2)
