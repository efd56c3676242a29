"""This machine's arithmetic roof, measured once and cached: the number every % of roof uses.

The roof is what the vector units issue when nothing else limits them: a loop of
independent multiply-adds on registers. It has to be written so the compiler can neither
merge the chains (an earlier FMA loop in C, whose twelve chains the compiler folded into
one, reported 1.5x to 3x the real roof) nor spill them, so the loop is inline assembly with
every accumulator named: ``nacc`` independent chains (12 ymm on AVX2, 24 zmm on AVX-512;
at least ``fma_latency * fma_units`` = 8 to 10 are needed), generated here, compiled by ``cc``
and CHECKED by disassembling the binary: the loop must hold ``nacc`` instructions writing
``nacc`` distinct registers.

The clock is measured in the same thread, around the FMA loop, with a chain of dependent
register-register ``add`` (latency 1 on every x86 core; a register source, because Golden
Cove renames immediate adds away). A figure above ``flops_per_cycle * clock`` (the target's
FMA pipes x lanes x 2 per cycle) is impossible and refused with :class:`RoofError`.

Kinds: ``float32`` (``vfmadd231ps``; ``mulps`` + ``addps`` on SSE2), ``bfloat16``
(``vdpbf16ps``: 4 FLOP per fp32 lane) and ``int8`` (``vpdpbusd``: 8 ops per int32 lane),
each where the ISA has it; on a core with AMX the bfloat16 and int8 roofs are the tile
unit's (``tdpbf16ps`` / ``tdpbusd`` into 4 accumulator tiles from 4 loaded ones: 16384 and
32768 operations each), as the kernels run there. Results are cached as JSON under
``$DSL_CACHE_DIR/roof`` (else ``$XDG_CACHE_HOME/dsl/roof`` or ``~/.cache/dsl/roof``), keyed
by LLVM's host CPU name, the CPU flags and the core count; an entry measured with another
instruction than :func:`loop_isa` now picks is measured again. :func:`mca_predict` asks
``llvm-mca`` what it expects of a loop.

The same file caches the memory bandwidth (:func:`measured_bandwidth`, measured by
:mod:`targets.bandwidth` with TVM kernels), the roof of the memory-bound benchmark rows.

This module depends on nothing in ``dsl``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import targets
from targets import CpuTarget

KINDS = ("float32", "bfloat16", "int8")
TOLERANCE = 0.05  # timer and clock-sample jitter allowed above the issue bound


class RoofError(RuntimeError):
    """The roof cannot be measured here, or the measurement is impossible (refused)."""


@dataclass(frozen=True)
class Loop:
    """The generated roof loop: one iteration's instructions and what they compute."""

    isa: str  # "sse", "avx2" or "avx512"
    dtype: str
    body: tuple[str, ...]  # AT&T assembly, one instruction each
    nacc: int  # independent accumulator chains
    flops: int  # arithmetic operations per iteration
    mnemonic: str


# isa: (register prefix, lanes of 32 bits, accumulators, first source register); an AMX
# "lane" is one 32-bit element of a 16 x 16 accumulator tile
_ISA = {"sse": ("xmm", 4, 12, 14), "avx2": ("ymm", 8, 12, 14), "avx512": ("zmm", 16, 24, 30),
        "amx": ("tmm", 256, 4, 4)}
# (isa, dtype): (mnemonic, operations per 32-bit lane per instruction)
_OPS = {("sse", "float32"): ("mulps/addps", 1), ("avx2", "float32"): ("vfmadd231ps", 2),
        ("avx512", "float32"): ("vfmadd231ps", 2), ("avx512", "bfloat16"): ("vdpbf16ps", 4),
        ("avx512", "int8"): ("vpdpbusd", 8), ("avx2", "int8"): ("{vex} vpdpbusd", 8),
        ("amx", "bfloat16"): ("tdpbf16ps", 64), ("amx", "int8"): ("tdpbusd", 128)}


def loop_isa(target: CpuTarget, dtype: str = "float32") -> str | None:
    """Which loop measures ``dtype`` on ``target`` (None: the ISA has no such instruction)."""
    if target.flops_per_cycle(dtype) == 0:
        return None
    if target.has_tiles(dtype):
        return "amx"
    if target.vector_bits >= 512 and target.has("avx512f"):
        isa = "avx512"
    else:
        isa = "avx2" if target.has("avx2", "fma") else "sse"
    if dtype == "int8" and not target.has("avx512_vnni"):
        isa = "avx2"  # AVX-VNNI: the VEX-encoded ymm form
    return isa if (isa, dtype) in _OPS else None


def make_loop(isa: str, dtype: str = "float32") -> Loop:
    """The roof loop body for ``isa`` and ``dtype`` (see :data:`_ISA`, :data:`_OPS`)."""
    reg, lanes, nacc, src = _ISA[isa]
    mnemonic, ops = _OPS[(isa, dtype)]
    if isa == "amx":  # accumulator tile (m, n) from A tile 4 + m and B tile 6 + n
        body = tuple(f"{mnemonic} %tmm{6 + i % 2}, %tmm{4 + i // 2}, %tmm{i}"
                     for i in range(nacc))
    elif isa == "sse":  # no FMA: half the chains multiply, half add (one pipe each)
        body = tuple(f"{'mulps' if i < nacc // 2 else 'addps'} %{reg}{src + (i >= nacc // 2)}, "
                     f"%{reg}{i}" for i in range(nacc))
    else:
        body = tuple(f"{mnemonic} %{reg}{src}, %{reg}{src + 1}, %{reg}{i}" for i in range(nacc))
    return Loop(isa, dtype, body, nacc, nacc * lanes * ops, mnemonic.split()[-1])


_C_TEMPLATE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

static double now(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
}
static double cpu_now(void) {  /* this thread's CPU time: time preempted does not count */
  struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
static unsigned char amx_cfg[64] __attribute__((aligned(64), used));  /* read by asm */
static void amx_setup(void) {  /* Linux lends the tile state on request (arch_prctl) */
  syscall(SYS_arch_prctl, 0x1023, 18);
  amx_cfg[0] = 1;
  for (int t = 0; t < 8; t++) { amx_cfg[16 + 2 * t] = 64; amx_cfg[48 + t] = 16; }
}
void roof_loop(long n) {
  __asm__ volatile(@ZERO@ "1:\n\t" @BODY@ "dec %0\n\tjnz 1b\n\t" @END@
                   : "+r"(n) : : @CLOBBER@ "cc");
}
void clock_loop(long n) {  /* CLOCK_ADDS dependent adds per iteration: that many cycles */
  long x = 0, one = 1;
  __asm__ volatile("1:\n\t" @ADDS@ "dec %[n]\n\tjnz 1b\n\t"
                   : [x] "+r"(x), [n] "+r"(n) : [one] "r"(one) : "cc");
}
static long n_fma, n_clk; static int reps; static pthread_barrier_t bar;
static double ghz(void) {  /* best of 3 samples: a preempted sample only reads lower */
  double best = 0;
  for (int i = 0; i < 3; i++) {
    double t0 = cpu_now(); clock_loop(n_clk); double t = cpu_now() - t0;
    if (n_clk * @NADD@ / t / 1e9 > best) best = n_clk * @NADD@ / t / 1e9;
  }
  return best;
}
static void *worker(void *arg) {
  long id = (long)arg;
  for (int r = 0; r < reps; r++) {
    double g0 = ghz();
    pthread_barrier_wait(&bar);
    double t0 = now(), c0 = cpu_now(); roof_loop(n_fma); double c1 = cpu_now(), t1 = now();
    pthread_barrier_wait(&bar);
    double g1 = ghz();
    printf("rep %d thread %ld secs %.9f cpu %.9f ghz %.4f %.4f\n", r, id, t1 - t0, c1 - c0,
           g0, g1);
  }
  return NULL;
}
int main(int argc, char **argv) {
  double seconds = atof(argv[1]); reps = atoi(argv[2]); int threads = argc - 3;
  @SETUP@
  cpu_set_t set; CPU_ZERO(&set); CPU_SET(atoi(argv[3]), &set);
  sched_setaffinity(0, sizeof set, &set);
  long n = 1000; double t = 0;
  while (t < 0.02) { n *= 2; double t0 = cpu_now(); roof_loop(n); t = cpu_now() - t0; }
  n_fma = (long)(n * seconds / t) + 1;
  n = 1000; t = 0;
  while (t < 0.002) { n *= 2; double t0 = cpu_now(); clock_loop(n); t = cpu_now() - t0; }
  n_clk = (long)(n * 0.005 / t) + 1;
  printf("n_fma %ld\n", n_fma); fflush(stdout);
  pthread_barrier_init(&bar, NULL, threads);
  pthread_t tid[1024];
  for (long i = 0; i < threads; i++) {
    pthread_attr_t attr; pthread_attr_init(&attr);
    cpu_set_t one; CPU_ZERO(&one); CPU_SET(atoi(argv[3 + i]), &one);
    pthread_attr_setaffinity_np(&attr, sizeof one, &one);
    pthread_create(&tid[i], &attr, worker, (void *)i);
  }
  for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
  return 0;
}
"""
CLOCK_ADDS = 64


def c_source(loop: Loop) -> str:
    """The measuring program for ``loop`` (C with the loop as inline assembly)."""
    reg, _, nacc, src = _ISA[loop.isa]
    used = [*range(nacc), src, src + 1]
    body = "".join(f'"{ins.replace("%", "%%")}\\n\\t" ' for ins in loop.body)
    if loop.isa == "amx":  # every tile 16 x 64 bytes, zeroed; released after
        zeros = '"ldtilecfg amx_cfg(%%rip)\\n\\t" ' + "".join(
            f'"tilezero %%tmm{i}\\n\\t" ' for i in range(8))
        clobber, end = "", '"tilerelease\\n\\t"'
    else:
        zero = {"sse": "pxor %%xmm{0}, %%xmm{0}", "avx2": "vpxor %%xmm{0}, %%xmm{0}, %%xmm{0}",
                "avx512": "vpxord %%zmm{0}, %%zmm{0}, %%zmm{0}"}[loop.isa]
        zeros = "".join(f'"{zero.format(i)}\\n\\t" ' for i in used)
        clobber = "".join(f'"xmm{i}", ' for i in used)
        end = '"vzeroupper\\n\\t"' if loop.isa != "sse" else ""
    adds = "".join('"add %[one], %[x]\\n\\t" ' for _ in range(CLOCK_ADDS))
    subs = {"@ZERO@": zeros, "@BODY@": body, "@END@": end, "@CLOBBER@": clobber,
            "@ADDS@": adds, "@NADD@": str(CLOCK_ADDS),
            "@SETUP@": "amx_setup();" if loop.isa == "amx" else ""}
    text = _C_TEMPLATE
    for key, value in subs.items():
        text = text.replace(key, value)
    return text


def compile_loop(loop: Loop, workdir: Path) -> Path:
    """Compile the measuring program; check its loop by disassembly; return the binary."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        raise RoofError("no C compiler (cc): the roof loop is compiled from generated C")
    src, exe = workdir / "roof.c", workdir / "roof"
    src.write_text(c_source(loop))
    flags = ["-mavx512f"] if loop.isa == "avx512" else []
    proc = subprocess.run([cc, "-O2", "-pthread", *flags, "-o", str(exe), str(src)],
                          capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RoofError(f"cc failed on the roof loop ({loop.isa}/{loop.dtype}):\n{proc.stderr}")
    check_disassembly(disassemble(exe, "roof_loop"), loop)
    return exe


def disassemble(exe: Path, symbol: str) -> str:
    """``objdump -d`` of one function (empty string when objdump is missing)."""
    if shutil.which("objdump") is None:
        return ""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(exe)],
                         capture_output=True, text=True, check=False).stdout
    match = re.search(rf"<{symbol}>:\n(.*?)(?:\n\n|\Z)", out, re.S)
    return match.group(1) if match else ""


def accumulators(asm: str, mnemonic: str) -> list[str]:
    """Destination registers of ``mnemonic`` in AT&T ``asm`` (the last operand), in order."""
    regs = []
    for line in asm.splitlines():
        if re.search(rf"\b{re.escape(mnemonic)}\b", line):
            regs.append(line.rsplit(",", 1)[-1].strip().lstrip("%"))
    return regs


def check_disassembly(asm: str, loop: Loop) -> None:
    """Refuse a binary whose loop lost chains (merged, or spilled through memory)."""
    if not asm:
        return  # no objdump: the inline assembly names every register, nothing to merge
    names = ["mulps", "addps"] if loop.isa == "sse" else [loop.mnemonic]
    dests = [r for m in names for r in accumulators(asm, m)]
    if len(dests) != loop.nacc or len(set(dests)) != loop.nacc or "(" in "".join(dests):
        raise RoofError(f"roof loop disassembles to {len(set(dests))} distinct accumulators "
                        f"in {len(dests)} instructions, expected {loop.nacc}: {dests}")


@dataclass(frozen=True)
class Roof:
    """One measured roof.

    ``gflops`` is all threads together in the best of ``reps`` runs, each thread's work over
    its own CPU time; ``gflops_per_core`` is that over ``threads``; ``ghz`` the mean clock the
    threads read around that run; ``bound_gflops`` what the FMA pipes can issue at those
    clocks (``flops_per_cycle * ghz * threads``). ``gflops_wall`` is the same run's work over
    wall time (first start to last end) and ``busy`` its CPU time over wall time: below 1 the
    machine was shared while measuring (then the wall figure is low, the CPU-time one holds).
    """

    dtype: str
    threads: int
    cpus: tuple[int, ...]
    isa: str
    mnemonic: str
    chains: int
    gflops: float
    gflops_per_core: float
    ghz: float
    flops_per_cycle: int
    bound_gflops: float
    gflops_wall: float
    busy: float
    seconds: float
    reps: int
    mcpu: str

    @property
    def fraction_of_bound(self) -> float:
        return self.gflops / self.bound_gflops if self.bound_gflops else 0.0


def check_bound(flops_per_s: float, ghz: float, flops_per_cycle: int, threads: int = 1,
                tol: float = TOLERANCE) -> None:
    """Refuse a rate the FMA pipes cannot issue: above ``flops_per_cycle * ghz * threads``
    (plus ``tol`` for timer jitter), or not a positive number.

    Raises
    ------
    RoofError
        The figure is impossible: chains merged by a compiler, a wrong clock, a wrong fact.
    """
    bound = flops_per_cycle * ghz * 1e9 * threads
    if not flops_per_s > 0 or not ghz > 0:
        raise RoofError(f"roof measurement gave {flops_per_s / 1e9:.3f} GFLOP/s at "
                        f"{ghz:.3f} GHz: not a measurement")
    if flops_per_s > bound * (1 + tol):
        raise RoofError(
            f"measured {flops_per_s / 1e9:.1f} GFLOP/s on {threads} thread(s) exceeds the issue "
            f"bound {bound / 1e9:.1f} GFLOP/s ({flops_per_cycle} FLOP/cycle/core x "
            f"{ghz:.3f} GHz x {threads}): refused (merged chains or wrong target facts)")


def check_samples(samples: list[tuple], flops_per_cycle: int) -> None:
    """Hold every thread sample to the issue bound at the highest clock any reading saw.

    A clock reading only errs low (a hypervisor's stolen time counts as the thread's CPU
    time, so the add chain seems slower), and a loop at the bound (AMX runs at 98-100%) was
    refused on a lent 16-core VM whose reading dipped 7% below the clock the loop ran at.
    One clock for all samples still refuses what the check is for: merged chains or wrong
    facts, 1.5-3x over.
    """
    clock = max(g for _, g, *_ in samples)
    for rate, *_ in samples:  # the best run's sum is then within threads x the bound too
        check_bound(rate, clock, flops_per_cycle)


def _parse(out: str, loop: Loop, threads: int) -> tuple[list[tuple], list[tuple]]:
    """(the best run's per-thread (FLOP/s, GHz, wall s, CPU s), every thread sample).

    Rates are per second of the thread's own CPU time: on a shared machine a thread that
    was preempted did no work meanwhile, and the roof is what a core does while it runs.
    """
    n_fma = int(re.search(r"^n_fma (\d+)", out, re.M).group(1))
    work = n_fma * loop.flops
    runs: dict[int, list[tuple]] = {}
    for rep, _, wall, cpu, g0, g1 in re.findall(
            r"^rep (\d+) thread (\d+) secs (\S+) cpu (\S+) ghz (\S+) (\S+)", out, re.M):
        cpu_s = max(float(cpu), 1e-9)
        runs.setdefault(int(rep), []).append(
            (work / cpu_s, max(float(g0), float(g1)), float(wall), cpu_s))
    if not runs or any(len(v) != threads for v in runs.values()):
        raise RoofError(f"roof program output is incomplete:\n{out[-2000:]}")
    best = max(runs.values(), key=lambda run: sum(r for r, *_ in run))
    return best, [x for run in runs.values() for x in run]


def measure(dtype: str = "float32", threads: int = 1, *, target: CpuTarget | None = None,
            seconds: float = 0.2, reps: int = 5) -> Roof:
    """Measure the ``dtype`` roof on ``threads`` pinned threads (one per CPU of this
    process's affinity), checking every sample against the issue bound.

    ``target`` supplies the facts (default ``host``); it must be runnable here.
    """
    tgt = target or targets.get("host")
    isa = loop_isa(tgt, dtype)
    if isa is None:
        raise RoofError(f"{tgt.name} ({tgt.mcpu}) has no {dtype} dot-product/FMA instruction")
    cpus = sorted(os.sched_getaffinity(0))
    if not 1 <= threads <= len(cpus):
        raise RoofError(f"threads={threads}: this process may run on {len(cpus)} CPU(s)")
    loop = make_loop(isa, dtype)
    with tempfile.TemporaryDirectory(prefix="dsl_roof_") as tmp:
        exe = compile_loop(loop, Path(tmp))
        args = [str(exe), f"{seconds:g}", str(reps), *map(str, cpus[:threads])]
        proc = subprocess.run(args, capture_output=True, text=True, check=False,
                              timeout=60 + 4 * reps * seconds)
    if proc.returncode:
        raise RoofError(f"roof program failed ({proc.returncode}): {proc.stderr[-2000:]}")
    best, samples = _parse(proc.stdout, loop, threads)
    fpc = tgt.flops_per_cycle(dtype)
    check_samples(samples, fpc)
    total = sum(r for r, *_ in best)
    ghz = sum(g for _, g, *_ in best) / threads
    work = best[0][0] * best[0][3]  # FLOP per thread (rate x CPU seconds)
    wall = threads * work / max(w for *_, w, _ in best)
    busy = sum(c for *_, c in best) / sum(w for *_, w, _ in best)
    return Roof(dtype, threads, tuple(cpus[:threads]), isa, loop.mnemonic, loop.nacc,
                total / 1e9, total / 1e9 / threads, ghz, fpc, fpc * ghz * threads, wall / 1e9,
                busy, seconds, reps, tgt.mcpu)


def cache_root() -> Path:
    """``$DSL_CACHE_DIR``, else ``$XDG_CACHE_HOME/dsl`` or ``~/.cache/dsl`` (as the kernel
    cache)."""
    env = os.environ.get("DSL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsl"


def cache_file(target: CpuTarget | None = None) -> Path:
    """Where this machine's roofs are cached: keyed by LLVM CPU name, flags and cores."""
    from targets.cpu import host_features

    tgt = target or targets.get("host")
    flags = hashlib.sha256(" ".join(sorted(host_features())).encode()).hexdigest()[:12]
    return cache_root() / "roof" / f"{tgt.mcpu}-{targets.machine_cores()}c-{flags}.json"


def cached(dtype: str = "float32", threads: int | None = None) -> Roof | None:
    """The cached roof of this machine for ``dtype`` on ``threads`` (default all cores)."""
    threads = threads or targets.machine_cores()
    entry = _read_cache(cache_file()).get(f"{dtype}/{threads}")
    try:
        hit = Roof(**{**entry, "cpus": tuple(entry["cpus"])}) if entry else None
    except (TypeError, KeyError):
        return None  # an entry from another version of this module: measure again
    if hit is not None and hit.isa != loop_isa(targets.get("host"), dtype):
        return None  # measured with another instruction (bfloat16 before AMX counted)
    return hit


def measured_peak(dtype: str = "float32", threads: int | None = None, *,
                  refresh: bool = False, seconds: float = 0.2, reps: int = 5) -> Roof:
    """This machine's ``dtype`` roof on ``threads`` (default: all cores), from the cache or
    measured once and cached. ``refresh`` measures again.

    Raises
    ------
    RoofError
        No such instruction here, no compiler, or an impossible figure (nothing is cached).
    """
    threads = threads or targets.machine_cores()
    hit = None if refresh else cached(dtype, threads)
    if hit is not None:
        return hit
    roof = measure(dtype, threads, seconds=seconds, reps=reps)
    _store({f"{dtype}/{threads}": asdict(roof)})
    return roof


def cached_bandwidth(kind: str = "copy", threads: int | None = None):
    """The cached memory bandwidth (:class:`targets.bandwidth.Bandwidth`) of ``kind``
    (``read`` or ``copy``) on ``threads`` (default all cores), or None."""
    from targets import bandwidth

    threads = threads or targets.machine_cores()
    entry = _read_cache(cache_file()).get(f"bandwidth-{kind}/{threads}")
    bw = bandwidth.from_json(entry) if isinstance(entry, dict) else None
    # an entry measured on shared cores (before that was refused) is measured again
    return bw if bw is not None and bw.busy >= bandwidth.BUSY_MIN else None


def measured_bandwidths(counts, *, refresh: bool = False, nbytes: int | None = None,
                        reps: int = 5) -> dict:
    """This machine's memory bandwidth, both kinds (``read``, ``copy``: see
    :mod:`targets.bandwidth`) at each of ``counts`` threads, ``{(kind, threads):
    Bandwidth}``: from the cache beside the FMA roofs (same file, same key), the missing
    counts (all of them with ``refresh``) measured in one run and cached.

    Raises
    ------
    RoofError
        Too many threads, a kernel that fails its checks, or an impossible figure (nothing
        is cached then).
    """
    from targets import bandwidth

    counts = sorted({int(c) for c in counts})
    out = {} if refresh else {(k, n): bw for n in counts for k in bandwidth.KINDS
                              if (bw := cached_bandwidth(k, n)) is not None}
    missing = [n for n in counts if any((k, n) not in out for k in bandwidth.KINDS)]
    if missing:
        fresh = bandwidth.measure(missing, nbytes=nbytes, reps=reps)
        _store({f"bandwidth-{k}/{n}": bandwidth.to_json(bw) for (k, n), bw in fresh.items()})
        out.update(fresh)
    return out


def measured_bandwidth(kind: str = "copy", threads: int | None = None, *,
                       refresh: bool = False, nbytes: int | None = None, reps: int = 5):
    """One memory bandwidth of this machine (:func:`measured_bandwidths`); ``threads``
    defaults to all cores."""
    threads = threads or targets.machine_cores()
    return measured_bandwidths([threads], refresh=refresh, nbytes=nbytes, reps=reps)[
        (kind, threads)]


def _store(entries: dict) -> None:
    """Add ``entries`` to this machine's cache file, atomically."""
    path = cache_file()
    data = _read_cache(path)  # another process may have written meanwhile
    data.update(entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)  # atomic: a reader sees the old file or the new one


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
