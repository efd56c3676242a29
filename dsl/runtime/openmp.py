"""Run kernels' parallel loops on the process's OpenMP team (PyTorch's) instead of TVM's pool.

Why: a generated kernel hands each parallel loop to ``TVMBackendParallelLaunch``, TVM's own
thread pool. Inside a PyTorch program that makes two pools on the same cores. After each of its
parallel ops PyTorch's OpenMP workers (libgomp) keep spinning, waiting for the next region
(``GOMP_SPINCOUNT``, milliseconds on some CPUs), and TVM's workers woken just then share the
cores with them: a grouped dx+dw of ``examples/train_cnn.py`` that takes 3.2 ms alone took
5.4-7.5 ms right after a PyTorch op. ``GOMP_SPINCOUNT`` / ``OMP_WAIT_POLICY`` would cure our
kernels and slow PyTorch's own. Instead the kernels run their parallel loops on PyTorch's team:
the workers already spinning pick the work up at once, and there is one pool.

How: every kernel library holds a data symbol ``__TVMBackendParallelLaunch``, a function
pointer the TVM runtime fills when the library loads. :func:`adopt` points it at
``dsl_parallel_launch``, the C shim below, which runs TVM's parallel body inside
``GOMP_parallel`` of the OpenMP runtime already loaded in the process: task ``i`` of ``n`` is
OpenMP thread ``i`` of a team of ``n``, the team size is the calling thread's OpenMP setting
(``torch.set_num_threads``), and a team of one calls the body directly.
``__TVMBackendParallelBarrier`` goes to ``GOMP_barrier`` the same way. A task that fails
fails the launch, as on TVM's pool (its message stays with the OpenMP thread that raised it).
The shim is compiled once per machine and compiler (``$DSL_CACHE_DIR/runtime/``, published by
atomic rename) and reaches the runtime through the addresses passed at start-up, never by
linking its own copy.

When there is no OpenMP runtime in the process (a PyTorch built on another backend), no C
compiler, another OS than Linux, or ``DSL_OPENMP=0``, kernels keep TVM's pool; the reason is
logged once on the ``"dsl"`` logger and :func:`status` returns it.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import re
import sys
import tempfile
import threading
from pathlib import Path

LOG = logging.getLogger("dsl")
ENV = "DSL_OPENMP"  # "0" keeps TVM's pool
LAUNCH_SLOT = "__TVMBackendParallelLaunch"
BARRIER_SLOT = "__TVMBackendParallelBarrier"

# C and C++ alike (the compiler found may be g++). TVMParallelGroupEnv is {void*, int32}.
SHIM_SOURCE = r"""
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef struct { void* sync_handle; int32_t num_task; } Env;
typedef int (*Body)(int, Env*, void*);
typedef void (*GompParallel)(void (*)(void*), void*, unsigned, unsigned);
typedef void (*GompBarrier)(void);
typedef int (*OmpInt)(void);
static GompParallel gomp_parallel;
static GompBarrier gomp_barrier;
static OmpInt thread_num, num_threads, max_threads, in_parallel;
struct Job { Body body; void* cdata; volatile int rc; };

long dsl_omp_launches = 0;   /* launches run by this shim (tests read it) */
int dsl_omp_last_team = 0;   /* the team size of the last launch */

static void run_task(void* p) {
  struct Job* job = (struct Job*)p;
  Env env = {0, num_threads()};
  int rc = job->body(thread_num(), &env, job->cdata);
  if (rc != 0) job->rc = rc;  /* any failing task fails the launch, as in TVM's pool */
}

int dsl_parallel_launch(Body body, void* cdata, int num_task) {
  __atomic_fetch_add(&dsl_omp_launches, 1, __ATOMIC_RELAXED);
  int n = in_parallel() ? 1 : max_threads();
  if (num_task > 0 && num_task < n) n = num_task;
  dsl_omp_last_team = n;
  if (n <= 1) {
    Env env = {0, 1};
    return body(0, &env, cdata);
  }
  struct Job job = {body, cdata, 0};
  gomp_parallel(run_task, &job, (unsigned)n, 0);
  return job.rc;
}

int dsl_parallel_barrier(int task_id, Env* env) {
  (void)task_id;
  (void)env;
  gomp_barrier();
  return 0;
}

void dsl_omp_init(void* par, void* bar, void* tnum, void* nthr, void* mthr, void* inpar) {
  gomp_parallel = (GompParallel)par;
  gomp_barrier = (GompBarrier)bar;
  thread_num = (OmpInt)tnum;
  num_threads = (OmpInt)nthr;
  max_threads = (OmpInt)mthr;
  in_parallel = (OmpInt)inpar;
}
#ifdef __cplusplus
}
#endif
"""

_OMP_NAME = re.compile(r"lib(gomp|iomp5|omp)([-.][^/]*)?\.so[^/]*$")
_OMP_SYMBOLS = ("GOMP_parallel", "GOMP_barrier", "omp_get_thread_num", "omp_get_num_threads",
                "omp_get_max_threads", "omp_in_parallel")


class _Runtime:
    """The loaded shim, wired to one OpenMP runtime."""

    def __init__(self, shim: ctypes.CDLL, omp_path: str):
        self.shim, self.omp_path = shim, omp_path
        self.launch = ctypes.cast(shim.dsl_parallel_launch, ctypes.c_void_p).value
        self.barrier = ctypes.cast(shim.dsl_parallel_barrier, ctypes.c_void_p).value


_STATE: dict = {}  # "runtime": _Runtime | None, "reason": str
_LOCK = threading.Lock()


def status() -> tuple[bool, str]:
    """``(True, path of the OpenMP runtime used)`` or ``(False, why TVM's pool is kept)``."""
    rt = _runtime()
    return (True, rt.omp_path) if rt is not None else (False, _STATE["reason"])


def launches() -> int:
    """Parallel launches run on the OpenMP team so far in this process (0 when unavailable)."""
    rt = _runtime()
    return ctypes.c_long.in_dll(rt.shim, "dsl_omp_launches").value if rt is not None else 0


def last_team() -> int:
    """The team size of the last launch run on the OpenMP team (0 before any)."""
    rt = _runtime()
    return ctypes.c_int.in_dll(rt.shim, "dsl_omp_last_team").value if rt is not None else 0


def library_slots(path: str) -> dict[str, int]:
    """Addresses of the launch / barrier pointers in the library at ``path``, which must be
    loaded already (the same mapping is found again; nothing new is loaded). Empty when the
    library has no parallel loop or the platform cannot tell."""
    if not sys.platform.startswith("linux"):
        return {}
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return {}
    try:
        found = {}
        for name in (LAUNCH_SLOT, BARRIER_SLOT):
            with contextlib.suppress(ValueError):
                found[name] = ctypes.addressof(ctypes.c_void_p.in_dll(lib, name))
        return found
    finally:
        import _ctypes

        _ctypes.dlclose(lib._handle)  # drop only the reference taken here


def adopt(kernel) -> bool:
    """Run ``kernel``'s parallel loops on the process's OpenMP team from now on.

    Returns whether they do (False: no parallel loop, or the shim is unavailable; the kernel
    keeps TVM's pool and computes the same). Safe while other threads call the kernel: a call
    in flight finishes on the pool it started with.
    """
    slots = getattr(kernel, "parallel_slots", {})
    if LAUNCH_SLOT not in slots:
        return False
    rt = _runtime()
    if rt is None:
        return False
    ctypes.c_void_p.from_address(slots[LAUNCH_SLOT]).value = rt.launch
    if BARRIER_SLOT in slots:
        ctypes.c_void_p.from_address(slots[BARRIER_SLOT]).value = rt.barrier
    return True


def adopted(kernel) -> bool:
    """Whether ``kernel``'s parallel loops run on the OpenMP team."""
    slots = getattr(kernel, "parallel_slots", {})
    rt = _STATE.get("runtime")
    return (rt is not None and LAUNCH_SLOT in slots
            and ctypes.c_void_p.from_address(slots[LAUNCH_SLOT]).value == rt.launch)


# --- setting up ------------------------------------------------------------------------------

def _runtime() -> _Runtime | None:
    if "reason" not in _STATE:
        with _LOCK:
            if "reason" not in _STATE:
                rt, reason = _start()
                if rt is None:
                    LOG.info("dsl: kernels keep TVM's thread pool: %s", reason)
                _STATE["runtime"], _STATE["reason"] = rt, reason
    return _STATE["runtime"]


def _start() -> tuple[_Runtime | None, str]:
    if os.environ.get(ENV, "1") == "0":
        return None, f"{ENV}=0"
    if not sys.platform.startswith("linux"):
        return None, f"the OpenMP launch shim is Linux-only (this is {sys.platform})"
    omp = _loaded_openmp()
    if omp is None:
        return None, "no OpenMP runtime is loaded in this process"
    try:
        shim = ctypes.CDLL(str(_shim_library()))
    except Exception as exc:  # noqa: BLE001 - no compiler, a read-only disk: keep TVM's pool
        return None, f"cannot build the OpenMP launch shim ({str(exc).splitlines()[0][:200]})"
    shim.dsl_omp_init(*(ctypes.cast(getattr(omp, s), ctypes.c_void_p) for s in _OMP_SYMBOLS))
    return _Runtime(shim, omp._name), omp._name


def _loaded_openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime mapped in this process (PyTorch's first), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return None
    torch = sys.modules.get("torch")
    torch_dir = os.path.dirname(getattr(torch, "__file__", "") or "") or "\0"
    for path in sorted((p for p in paths if _OMP_NAME.search(p)),
                       key=lambda p: (not p.startswith(torch_dir), p)):
        try:
            lib = ctypes.CDLL(path)  # already mapped: only a reference, kept for good
        except OSError:
            continue
        if all(hasattr(lib, s) for s in _OMP_SYMBOLS):
            return lib
    return None


def _shim_library() -> Path:
    """The compiled shim, built on first use and cached per source and compiler."""
    from tvm.support import cc

    from dsl.runtime.kernel_cache import cache_root

    compiler = cc.get_cc()
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC)")
    digest = hashlib.sha256(f"{SHIM_SOURCE}\0{compiler}".encode()).hexdigest()[:16]
    try:
        return _publish(cc, compiler, cache_root() / "runtime", f"omp_launch_{digest}.so")
    except OSError:  # a read-only cache: a private copy for this process
        import atexit
        import shutil

        where = Path(tempfile.mkdtemp(prefix="dsl-omp-"))
        atexit.register(shutil.rmtree, where, True)
        return _publish(cc, compiler, where, f"omp_launch_{digest}.so")


def _publish(cc, compiler: str, directory: Path, name: str) -> Path:
    from dsl.runtime.atomic import sweep_dead_temps

    so = directory / name
    if so.exists():
        return so
    directory.mkdir(parents=True, exist_ok=True)
    sweep_dead_temps(directory, name)
    return _compile(cc, compiler, directory, so)


def _compile(cc, compiler: str, directory: Path, so: Path) -> Path:
    from dsl.runtime.atomic import tmp_prefix

    with tempfile.TemporaryDirectory() as work:
        src = Path(work) / "omp_launch.c"
        src.write_text(SHIM_SOURCE)
        fd, tmp = tempfile.mkstemp(prefix=tmp_prefix(so.name), suffix=".tmp", dir=directory)
        os.close(fd)
        try:
            cc.create_shared(tmp, [str(src)], options=["-O2"], cc=compiler)
            os.replace(tmp, so)  # readers see no file or a whole one
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return so
