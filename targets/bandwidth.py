"""This machine's memory bandwidth, measured with TVM kernels generated here: the roof of every
memory-bound benchmark row (GB/s).

Two kinds, each on buffers several times the caches (at least :data:`CACHE_MULTIPLE` x the
L2 + L3 of the machine, and at least :data:`MIN_BYTES`), so the figure is DRAM's:

* ``read``: ``S[t, j] = sum_r A[t, r, j]`` over ``A`` of shape ``(T, R, 8 * lanes)`` float32
  (``T`` = threads, one parallel chunk each). The innermost axis is vectorised, so LLVM keeps
  ``8 * lanes`` partial sums in eight vector registers: eight independent add chains, each
  adding straight from memory (``vaddps mem, acc, acc``), so the loop waits on memory, not on
  the add latency. Bytes counted: ``A``'s.
* ``copy``: STREAM's *scale*, ``B = 3 * A`` (the multiply stops LLVM from replacing the loop
  by a ``memcpy`` call, whose non-temporal stores the generated kernels never use). Bytes
  counted as STREAM does: ``A``'s + ``B``'s (read + write; the write-allocate read of ``B`` is
  real traffic not counted, as in every kernel's own GB/s).

The kernels are CHECKED before they are timed (:func:`check_read_asm`,
:func:`check_copy_asm`): the read loop must add from memory into at least
:data:`ACCUMULATORS` distinct registers and store nothing; the copy loop must load, multiply
and store vectors, without calls or non-temporal stores; and their results are checked
(every element read: the sums are exact on ones; ``B == 3``).

A figure is refused (:class:`targets.roof.RoofError`) when it is not a positive number, when
the buffer does not exceed the caches enough to measure DRAM, or when it exceeds what the
threads' load ports could move at :data:`MAX_GHZ` (two vector loads per cycle per core): a
figure a core cannot issue; and when in every pass other processes had the cores (``busy``,
CPU time over threads x wall time, under :data:`BUSY_MIN`; passes go on for up to
:data:`PASS_BUDGET` seconds looking for one that was not shared): on a shared machine the
figure would be what the others left. The kernels run in a fresh ``python -m targets.bandwidth``
process (one for all the thread counts asked for), whose TVM thread pool is set to each count
in turn, unpinned, and whose buffers go with it: the caller's own pool and memory are left
alone.

This module depends on nothing in ``dsl``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import targets
from targets import CpuTarget
from targets.roof import RoofError

KINDS = ("read", "copy")
ACCUMULATORS = 8  # independent vector add chains in the read loop (> add latency x 2 pipes)
CACHE_MULTIPLE = 4  # the buffer exceeds the machine's L2 + L3 at least this many times
MIN_BYTES = 256 << 20
DEFAULT_BYTES = 512 << 20  # one pass: about 20-60 ms on one DDR4/DDR5 channel's worth
MAX_GHZ = 6.0  # no x86 core clocks higher: the load-port bound uses it
BUSY_MIN = 0.85  # a pass whose threads had their cores less than this was shared: refused
PASS_BUDGET = 3.0  # seconds of extra passes spent looking for one that was not shared
LOADS_PER_CYCLE = 2


class BandwidthError(RoofError):
    """A bandwidth kernel or figure that fails its checks (refused)."""


@dataclass(frozen=True)
class Bandwidth:
    """One measured memory bandwidth.

    ``gbps`` is the bytes one pass moves (read: the buffer; copy: source + destination) over
    the best pass's wall time, all ``threads`` together; ``nbytes`` those bytes;
    ``cache_bytes`` the L2 + L3 they exceed; ``bound_gbps`` the load-port bound (refusal
    rule); ``busy`` the process's CPU time over ``threads`` x wall time in that pass (below 1:
    the machine was shared while measuring).
    """

    kind: str
    threads: int
    gbps: float
    gbps_per_core: float
    nbytes: int
    seconds: float
    reps: int
    busy: float
    cache_bytes: int
    bound_gbps: float
    accumulators: int
    isa_bits: int
    mcpu: str


def cache_bytes(target: CpuTarget) -> int:
    """L2 + L3 the machine's threads can fill, in bytes: the target's per-core shares times
    the cores, or, when larger, every whole L3 instance sysfs shows (2 vCPUs of a VM can fill
    their host's whole 32 MiB L3, though their share of it is 2 x 4 MiB)."""
    cores = targets.machine_cores()
    return (target.l2_kib * cores + max(target.l3_kib * cores, sysfs_l3_kib())) * 1024


def sysfs_l3_kib(root: str = "/sys/devices/system/cpu") -> int:
    """The sum of the distinct L3 instances that this process's CPUs share (0 without
    sysfs)."""
    from targets.cpu import _kib

    seen: dict[str, int] = {}
    for cpu in os.sched_getaffinity(0):
        base = os.path.join(root, f"cpu{cpu}", "cache")
        for entry in (os.listdir(base) if os.path.isdir(base) else ()):
            try:
                with open(os.path.join(base, entry, "level")) as f:
                    if f.read().strip() != "3":
                        continue
                with open(os.path.join(base, entry, "shared_cpu_list")) as f:
                    shared = f.read().strip()
                with open(os.path.join(base, entry, "size")) as f:
                    seen[shared] = _kib(f.read().strip())
            except (OSError, ValueError):
                continue
    return sum(seen.values())


def buffer_bytes(target: CpuTarget, requested: int | None = None) -> int:
    """Bytes of one pass: ``requested``, else the larger of :data:`DEFAULT_BYTES` and
    :data:`CACHE_MULTIPLE` x the caches."""
    if requested:
        return int(requested)
    return max(DEFAULT_BYTES, CACHE_MULTIPLE * cache_bytes(target))


def bound_gbps(target: CpuTarget, threads: int) -> float:
    """What ``threads`` cores' load ports can move at :data:`MAX_GHZ`: an upper bound."""
    return threads * LOADS_PER_CYCLE * target.vector_bits / 8 * MAX_GHZ


def check_bandwidth(gbps: float, nbytes: int, caches: int, bound: float,
                    kind: str = "read", threads: int = 1, busy: float = 1.0) -> None:
    """Refuse an impossible or meaningless bandwidth figure.

    Raises
    ------
    BandwidthError
        ``gbps`` not a positive number; a buffer of ``nbytes`` smaller than
        :data:`CACHE_MULTIPLE` x ``caches`` (the figure would be a cache's); ``gbps`` above
        ``bound`` (what the load ports can move); ``busy`` (CPU time over threads x wall
        time) under :data:`BUSY_MIN`: other processes had the cores, the figure is their
        leftover, not the machine's.
    """
    if not gbps > 0 or math.isinf(gbps):
        raise BandwidthError(f"{kind} bandwidth measurement gave {gbps} GB/s: not a measurement")
    if nbytes < CACHE_MULTIPLE * caches:
        raise BandwidthError(
            f"{kind} bandwidth buffer {nbytes / 2**20:.0f} MiB is under {CACHE_MULTIPLE} x "
            f"the caches ({caches / 2**20:.0f} MiB L2 + L3): the figure would be the cache's, "
            f"not memory's; refused")
    if gbps > bound:
        raise BandwidthError(
            f"measured {gbps:.1f} GB/s {kind} on {threads} thread(s) exceeds what their load "
            f"ports can move ({bound:.0f} GB/s at {MAX_GHZ} GHz): refused (a kernel that did "
            f"not read its buffer, or a wrong timer)")
    if busy < BUSY_MIN:
        raise BandwidthError(
            f"{kind} bandwidth on {threads} thread(s): in every pass other processes had the "
            f"cores (busy {busy:.2f} < {BUSY_MIN}): the figure ({gbps:.1f} GB/s) is not the "
            f"machine's; refused, measure again when it is quieter")


def _schedule(func, parallel_reduce: bool):
    """Parallel chunks, the 8-vector axis vectorised; the read's sums in registers."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    block = sch.get_sblock("S" if parallel_reduce else "B")
    if not parallel_reduce:
        t, _, j = sch.get_loops(block)
        sch.parallel(t)
        sch.vectorize(j)
        return sch
    t, j, r = sch.get_loops(block)
    sch.reorder(t, r, j)
    sch.parallel(t)
    local = sch.cache_write(block, 0, "local")  # the partial sums: registers after LLVM
    sch.reverse_compute_at(local, t)
    sch.vectorize(sch.get_loops(local)[-1])
    sch.vectorize(sch.get_loops(block)[-1])  # before decompose_reduction (s_tir's order)
    sch.decompose_reduction(block, r)
    return sch


def build_kernel(kind: str, threads: int, nbytes: int, target: CpuTarget):
    """The ``kind`` kernel over ``nbytes`` in ``threads`` chunks: ``(library, shape)``."""
    import tvm
    from tvm import te

    width = ACCUMULATORS * target.lanes("float32")
    rows = max(1, nbytes // (4 * threads * width))
    a = te.placeholder((threads, rows, width), "float32", name="A")
    if kind == "read":
        r = te.reduce_axis((0, rows), name="r")
        out = te.compute((threads, width), lambda t, j: te.sum(a[t, r, j], axis=r), name="S",
                         tag="bandwidth_read")
    else:
        out = te.compute(a.shape, lambda t, i, j: a[t, i, j] * te.const(3.0, "float32"),
                         name="B", tag="bandwidth_copy")
    sch = _schedule(te.create_prim_func([a, out]), kind == "read")
    return tvm.compile(sch.mod, target=target.tvm_target()), (threads, rows, width)


_LABEL = re.compile(r"^([.\w$]+):")
_JUMP = re.compile(r"^\s+j\w+\s+([.\w$]+)\s*$")


def loops(asm: str) -> list[list[str]]:
    """Every block of AT&T ``asm`` from a label to a jump back to it (instructions only)."""
    lines = [s.split("#")[0].rstrip() for s in asm.splitlines()]
    labels = {m.group(1): i for i, s in enumerate(lines) if (m := _LABEL.match(s))}
    out = []
    for j, line in enumerate(lines):
        m = _JUMP.match(line)
        if m and labels.get(m.group(1), j) < j:
            out.append([s.strip() for s in lines[labels[m.group(1)] + 1:j + 1]
                        if s.strip() and not s.strip().startswith(".") and not _LABEL.match(s)])
    return out


_ADD_MEM = re.compile(r"^v?addps\s+[^,]*\(.*\),\s*(?:%[xyz]mm\d+,\s*)?%([xyz]mm\d+)$")
_STORE = re.compile(r"^v?mov(?:u|a|nt)ps\s+%[xyz]mm\d+,\s*\S*\(")


def _hot(asm: str, pattern: re.Pattern) -> list[str]:
    """The loop with the most instructions matching ``pattern``; of equals, the shortest (an
    outer loop holds its inner loop's instructions and more)."""
    return max(loops(asm), key=lambda b: (sum(bool(pattern.match(s)) for s in b), -len(b)),
               default=[])


def check_read_asm(asm: str, accumulators: int = ACCUMULATORS) -> int:
    """The read kernel's hot loop (the one with the most memory-source adds) must add from
    memory into at least ``accumulators`` distinct registers and store nothing (a spilled
    accumulator would be a store). Returns the distinct accumulators.

    Raises BandwidthError otherwise.
    """
    best = _hot(asm, _ADD_MEM)
    dests = {m.group(1) for s in best if (m := _ADD_MEM.match(s))}
    stores = [s for s in best if _STORE.match(s)]
    if len(dests) < accumulators or stores:
        raise BandwidthError(
            f"read kernel's loop adds from memory into {len(dests)} distinct registers "
            f"(want >= {accumulators}) with {len(stores)} stores: the sums are not in "
            f"independent registers; refused")
    return len(dests)


def check_copy_asm(asm: str) -> None:
    """The copy kernel's hot loop must store vectors (plain stores: what the generated
    kernels use), multiply them, and call nothing (no ``memcpy``)."""
    best = _hot(asm, _STORE)
    text = "\n".join(best)
    if (not any(_STORE.match(s) for s in best) or "mulps" not in text or "call" in text
            or "movntps" in text):
        raise BandwidthError(f"copy kernel's loop is not a vector load-multiply-store loop:\n"
                             f"{text[:1000]}")


def _configure_pool(threads: int) -> None:
    """This process's TVM pool to ``threads`` threads (unpinned: ``TVM_BIND_THREADS=0`` in the
    measuring process, else TVM pins the calling thread and a worker to one core)."""
    import tvm

    tvm.get_global_func("runtime.config_threadpool")(1, threads, [str(i) for i in range(threads)])


def _time(fn, reps: int, threads: int, budget: float = PASS_BUDGET) -> tuple[float, float]:
    """Best wall seconds of the passes whose threads all had their cores (``busy`` >=
    :data:`BUSY_MIN`; the best of all when none did), and that pass's CPU seconds. At least
    ``reps`` passes after one warm-up, more (within ``budget`` seconds) until one is not
    shared."""
    fn()
    passes, start = [], time.perf_counter()
    while len(passes) < reps or (not any(c / (t * threads) >= BUSY_MIN for t, c in passes)
                                 and time.perf_counter() - start < budget):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        passes.append((time.perf_counter() - t0, time.process_time() - c0))
    clean = [(t, c) for t, c in passes if c / (t * threads) >= BUSY_MIN]
    return min(clean or passes)


def _measure_kind(kind: str, threads: int, buffers, reps: int, tgt: CpuTarget) -> dict:
    """Time ``kind`` on ``threads`` threads over views of ``buffers`` = (source, destination):
    read sums the whole source, copy scales its first half into the destination."""
    import numpy as np
    import tvm

    src, dst = buffers
    lib, shape = build_kernel(kind, threads, src.numel() * 4 // (1 if kind == "read" else 2),
                              tgt)
    asm = lib.mod.inspect_source("asm")
    nacc = check_read_asm(asm) if kind == "read" else 0
    if kind == "copy":
        check_copy_asm(asm)
    out = (tvm.runtime.empty((threads, shape[2]), "float32", tvm.cpu()) if kind == "read"
           else dst._create_view(shape))
    np.from_dlpack(out).fill(0.0)
    fn, view = lib["main"], src._create_view(shape)
    secs, cpu = _time(lambda: fn(view, out), reps, threads)
    # float32 sums of ones are exact up to 2^24 and stay there (n + 1 rounds back to n)
    want = float(min(shape[1], 2**24)) if kind == "read" else 3.0
    if not bool(np.all(np.from_dlpack(out) == want)):
        raise BandwidthError(f"{kind} kernel's result is wrong: it did not read every element")
    moved = int(np.prod(shape)) * 4 * (1 if kind == "read" else 2)
    return {"kind": kind, "threads": threads, "nbytes": moved, "seconds": secs,
            "busy": cpu / (secs * threads), "accumulators": nacc}


def measure_here(counts: list[int], nbytes: int, reps: int) -> list[dict]:
    """In this process: both kinds at each thread count, raw figures. The pool is created
    with the most threads first (TVM never grows it later), then set to each count; the
    buffers (``nbytes`` of ones, ``nbytes / 2`` to write) are filled once, which faults
    their pages in before anything is timed."""
    import numpy as np
    import tvm

    tgt = targets.get("host")
    _configure_pool(max(counts))
    src = tvm.runtime.empty((nbytes // 4,), "float32", tvm.cpu())  # 64-byte aligned
    dst = tvm.runtime.empty((nbytes // 8,), "float32", tvm.cpu())
    np.from_dlpack(src).fill(1.0)
    np.from_dlpack(dst).fill(0.0)
    out = []
    for threads in counts:
        _configure_pool(threads)
        out += [_measure_kind(kind, threads, (src, dst), reps, tgt) for kind in KINDS]
    return out


def measure(counts=(1,), *, nbytes: int | None = None, reps: int = 5,
            target: CpuTarget | None = None) -> dict[tuple[str, int], Bandwidth]:
    """Both kinds at each of ``counts`` threads, measured in one fresh process (one TVM
    import), each figure checked by :func:`check_bandwidth`. Keys: ``(kind, threads)``.

    Raises
    ------
    targets.roof.RoofError
        Too many threads, a kernel that fails its checks, or an impossible figure.
    """
    tgt = target or targets.get("host")
    counts = sorted(set(counts))
    if not counts or not 1 <= counts[0] <= counts[-1] <= targets.machine_cores():
        raise RoofError(f"threads={counts}: this process may run on "
                        f"{targets.machine_cores()} CPU(s)")
    size = buffer_bytes(tgt, nbytes)
    root = str(Path(__file__).resolve().parents[1])  # this checkout's targets package
    env = {**os.environ, "TVM_BIND_THREADS": "0", "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-m", "targets.bandwidth", ",".join(map(str, counts)),
                           str(size), str(reps)], capture_output=True, text=True, check=False,
                          env=env, timeout=600)
    if proc.returncode:
        raise RoofError(f"bandwidth measurement failed: {proc.stderr.strip()[-1500:]}")
    return {(bw.kind, bw.threads): bw
            for bw in (_result(raw, tgt, reps) for raw in _last_json(proc.stdout))}


def _last_json(stdout: str) -> list[dict]:
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise RoofError(f"bandwidth measurement printed no result: {stdout[-500:]!r}") from None


def _result(raw: dict, tgt: CpuTarget, reps: int) -> Bandwidth:
    """One raw figure of the measuring process, checked, as a :class:`Bandwidth`."""
    threads, caches = raw["threads"], cache_bytes(tgt)
    gbps, bound = raw["nbytes"] / raw["seconds"] / 1e9, bound_gbps(tgt, raw["threads"])
    check_bandwidth(gbps, raw["nbytes"], caches, bound, raw["kind"], threads, raw["busy"])
    return Bandwidth(raw["kind"], threads, gbps, gbps / threads, raw["nbytes"], raw["seconds"],
                     reps, raw["busy"], caches, bound, raw["accumulators"], tgt.vector_bits,
                     tgt.mcpu)


def from_json(entry: dict) -> Bandwidth | None:
    """A cached entry back as a :class:`Bandwidth` (None: another version's entry)."""
    try:
        return Bandwidth(**entry)
    except TypeError:
        return None


def to_json(bw: Bandwidth) -> dict:
    return asdict(bw)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m targets.bandwidth",
                                description="measure memory bandwidth here (raw JSON)")
    p.add_argument("threads", help="comma-separated thread counts")
    p.add_argument("nbytes", type=int)
    p.add_argument("reps", type=int)
    args = p.parse_args(argv)
    try:
        counts = [int(t) for t in args.threads.split(",")]
        print(json.dumps(measure_here(counts, args.nbytes, args.reps)))
    except BandwidthError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
