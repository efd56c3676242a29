"""``build``: compile a schedule into ``kernel_meta/<name>.so`` + ``kernel_meta/<name>.json``.

Files are published atomically: each build writes private temporary files in ``kernel_meta/``
and renames them into place under an advisory lock (``fcntl.flock``, released by the kernel
when a process dies, so a killed build leaves no stale lock). Readers therefore see either the
previous complete pair or the new one, and :func:`dsl.kernel.load` checks the ``.so`` against
the sha256 recorded in the ``.json``.

A build whose cache key (sha256 of the scheduled TIR, the target, and the DSL / TVM versions)
matches the existing ``.json`` reuses the existing ``.so`` without compiling.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

from dsl.errors import E_FILE, E_TYPE, E_VALUE, check_elems, fail
from dsl.ops.para_dict import check_kernel_name
from dsl.runtime.atomic import sweep_dead_temps, tmp_prefix
from dsl.runtime.schedule import Schedule, same_tensor, walk

CONFIG_KEYS = ("name", "tensor_list", "kernel_meta_parent_dir", "print_ir", "need_build",
               "bool_storage_as_1bit", "dummy_placeholder")
# 2: kernel arguments are element-aligned (the generated code assumed 64-byte aligned before);
# in the cache keys through versions(), so no library built for the old convention is reused
JSON_FORMAT = 2


def versions() -> dict:
    import tvm

    from dsl._version import __version__

    return {"dsl": __version__, "tvm": tvm.__version__, "json_format": JSON_FORMAT}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_config(sch, config) -> tuple[str, list, Path, bool, bool]:
    from tvm import te

    if not isinstance(sch, Schedule):
        raise fail(E_TYPE, "sch", type(sch).__name__,
                   "must be the Schedule returned by dsl.auto_schedule(res)")
    if not isinstance(config, dict):
        raise fail(E_TYPE, "config", config, "must be a dict with 'name' and 'tensor_list'")
    for key in config:
        if key not in CONFIG_KEYS:
            raise fail(E_VALUE, f"config['{key}']", config[key],
                       f"is not a build option; allowed: {', '.join(CONFIG_KEYS)}")
    if "name" not in config:
        raise fail(E_VALUE, "config['name']", None, "is required: the kernel's name")
    name = check_kernel_name("config['name']", config["name"])
    tensors = config.get("tensor_list")
    if not isinstance(tensors, (list, tuple)) or not all(
            isinstance(t, te.Tensor) for t in tensors):
        raise fail(E_TYPE, "config['tensor_list']", tensors,
                   "must be a list of te.Tensor: the kernel's inputs then outputs, in call order")
    tensors = list(tensors)
    for i, t in enumerate(tensors):  # TVM rejects a repeated parameter as ill-formed TIR
        if any(same_tensor(t, u) for u in tensors[:i]):
            raise fail(E_VALUE, f"config['tensor_list'][{i}]", t.op.name,
                       "appears twice; list each input and output once")
    placeholders, computes = walk(sch.outputs)
    for t in sch.outputs:  # a placeholder as output has no block to schedule or compute
        if isinstance(t.op, te.PlaceholderOp):
            raise fail(E_VALUE, "sch", t.op.name,
                       "outputs a placeholder; auto_schedule needs a computed tensor")
    for t in placeholders:  # int(True) passes shape checks, then LLVM fails to verify
        if any(str(getattr(d, "ty", "")) == "bool" for d in t.shape):
            raise fail(E_TYPE, "config['tensor_list']", t.op.name,
                       "has a bool in its shape: dimensions must be integers")
    for op in computes:  # every stage, before lowering: at most int64-indexable
        for k in range(op.num_outputs):
            shape = [int(d) for d in op.output(k).shape]
            check_elems("config['tensor_list']", op.name, shape, f"stage '{op.name}'")
    for i, t in enumerate(tensors):
        # a placeholder the computation never reads is still a kernel argument: a dx whose taps
        # all fall in the padding is identically zero and reads neither dy nor the filters
        if isinstance(t.op, te.PlaceholderOp):
            continue
        if not any(same_tensor(t, u) for u in [*placeholders, *sch.outputs]):
            raise fail(E_VALUE, f"config['tensor_list'][{i}]", t.op.name,
                       "is neither an input nor an output of the scheduled computation")
    for t in [*placeholders, *sch.outputs]:
        if not any(same_tensor(t, u) for u in tensors):
            role = "output" if any(same_tensor(t, o) for o in sch.outputs) else "input"
            raise fail(E_VALUE, "config['tensor_list']", [u.op.name for u in tensors],
                       f"must include {role} '{t.op.name}'")
    _check_inputs_first(sch, tensors)
    parent = config.get("kernel_meta_parent_dir", None)
    if parent is None:
        parent = os.getcwd()
    if not isinstance(parent, (str, os.PathLike)) or "\x00" in str(parent):
        raise fail(E_TYPE, "config['kernel_meta_parent_dir']", parent,
                   "must be a directory path (str or os.PathLike)")
    flags = []
    for key, default in (("print_ir", False), ("need_build", True)):
        v = config.get(key, default)
        if not isinstance(v, bool):
            raise fail(E_TYPE, f"config['{key}']", v, "must be True or False")
        flags.append(v)
    return name, tensors, Path(parent) / "kernel_meta", flags[0], flags[1]


def _check_inputs_first(sch: Schedule, tensors: list) -> None:
    """Inputs, then outputs, as TBE's build requires: the kernel is called in this order, and
    ``load``'s callable takes the inputs first, so an input after an output would be fed the
    wrong array."""
    is_out = [any(same_tensor(t, o) for o in sch.outputs) for t in tensors]
    if True not in is_out:
        return
    first = is_out.index(True)
    for i in range(first + 1, len(tensors)):
        if not is_out[i]:
            raise fail(E_VALUE, f"config['tensor_list'][{i}]", tensors[i].op.name,
                       f"is an input listed after the output '{tensors[first].op.name}' "
                       f"(config['tensor_list'][{first}]): list the inputs first, then the "
                       f"outputs, e.g. {[t.op.name for t, o in zip(tensors, is_out) if not o]}"
                       f" + {[t.op.name for t, o in zip(tensors, is_out) if o]}")


def lower(sch: Schedule, name: str, tensor_list):
    """The scheduled IRModule with its one function named ``name``, its arguments declared
    element-aligned (:func:`element_aligned_args`) and its fallback stages wired in
    (:func:`dsl.runtime.run_if.wire_fallbacks`)."""
    import tvm

    from dsl.runtime.run_if import wire_fallbacks
    from schedules.amx import lower_tiles
    from schedules.zero_taps import skip_zero_taps

    func = lower_tiles(element_aligned_args(wire_fallbacks(sch.s_tir(tensor_list).mod["main"])))
    func = skip_zero_taps(func)
    return tvm.IRModule({name: func.with_attr("global_symbol", name)})


def element_aligned_args(func):
    """``func`` with every buffer argument declared aligned to its element size only.

    TVM declares a buffer ``data_alignment`` of 64 bytes by default; ``MakePackedAPI`` turns it
    into a ``storage_alignment`` attribute, from which LLVM gets an ``align 64`` parameter
    attribute, an alignment assumption and aligned vector loads and stores (``vmovaps``), so an
    argument off that boundary (numpy only guarantees 16 bytes) would fault or had to be
    copied. Declared element-aligned, the code uses unaligned vector moves (``vmovups``), as
    fast as aligned ones on aligned data on x86 since Nehalem, and any C-contiguous array runs
    in place. Buffers the kernel allocates itself keep TVM's alignment.
    """
    from tvm.tirx import decl_buffer
    from tvm.tirx.transform.common import BufferReplacer

    remap = {}
    for p in func.params:
        if not hasattr(p.ty, "data_alignment"):  # a scalar parameter
            continue
        align = max(1, p.dtype.bits * p.dtype.lanes // 8)
        if p.data_alignment != align:
            remap[p] = decl_buffer(p.shape, p.dtype, p.name, None, p.strides, p.elem_offset,
                                   p.scope(), align, p.offset_factor)
    return BufferReplacer(remap)(func) if remap else func


# TVM 0.27's UnrollLoop multiplies a loop's extent by its body's step count in 32-bit ints: a
# long loop around an unrolled body (a reduction over 2**30 positions) overflows to a negative
# count, passes the "small enough to unroll" test and is unrolled into billions of statements
# (the process dies in bad_alloc). TVM's defaults auto-unroll nothing else (max step and max
# extent 0), so a depth of 0 changes no other kernel; explicit unroll loops still unroll.
COMPILE_CONFIG = {"tirx.UnrollLoop": {"auto_max_depth": 0}}


# Our passes after TVM's own lowering (the name changes the cache key: they change the code).
PIPELINE = "dsl.default+gather_to_shuffles+lane_shuffles"


def _register_pipeline() -> str:
    """TVM's default pipeline (the one ``tvm.compile`` runs when none is named: its
    ``s_tir`` pipeline in 0.27), then :func:`dsl.runtime.transpose_pass.transpose_pass` and
    :func:`dsl.runtime.lane_shuffle_pass.lane_shuffle_pass`, registered (once) under
    :data:`PIPELINE`."""
    import tvm
    from tvm.tirx import compilation_pipeline as pipelines

    from dsl.runtime.lane_shuffle_pass import lane_shuffle_pass
    from dsl.runtime.transpose_pass import transpose_pass

    if PIPELINE not in pipelines.PIPELINE_MAP:
        def factory():
            base, host, device = pipelines.get_tir_pipeline("default")
            ours = [transpose_pass(), lane_shuffle_pass()]
            return tvm.transform.Sequential([base, *ours]), host, device

        pipelines.register_tir_pipeline(PIPELINE, factory)
    return PIPELINE


@functools.lru_cache(maxsize=1)
def pipeline_key() -> dict:
    """:data:`PIPELINE` and a hash of our passes' source: a cache key part (an edit to a pass
    changes the code of kernels whose TIR did not change)."""
    from dsl.runtime import lane_shuffle_pass, transpose_pass

    return {"name": PIPELINE, "passes": [sha256_file(Path(m.__file__))
                                         for m in (transpose_pass, lane_shuffle_pass)]}


def compile_module(mod, target):
    """``tvm.compile`` with :data:`COMPILE_CONFIG` added to the current pass context and our
    passes after TVM's lowering (:data:`PIPELINE`); every kernel, tuned candidates included,
    is compiled so."""
    import tvm

    cur = tvm.transform.PassContext.current()
    config = {**{str(k): v for k, v in cur.config.items()}, **COMPILE_CONFIG}
    with tvm.transform.PassContext(opt_level=cur.opt_level, required_pass=cur.required_pass,
                                   disabled_pass=cur.disabled_pass,
                                   instruments=cur.instruments, config=config):
        return tvm.compile(mod, target=target, tir_pipeline=_register_pipeline())


def cache_key(mod, sch: Schedule) -> str:
    # show_meta: strings the script prints as metadata references (such as the LLVM IR that
    # a ``pragma_import_llvm`` loop links in) change the code too
    text = json.dumps({"tir": mod.script(show_meta=True), "target": sch.target.as_json(),
                       "compile": COMPILE_CONFIG, "pipeline": pipeline_key(),
                       "versions": versions()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


@contextlib.contextmanager
def _lock(path: Path):
    # O_NOFOLLOW: a planted symlink must not make us create a file outside kernel_meta/
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)



def _prepare_meta_dir(meta_dir: Path, name: str) -> None:
    """Create ``kernel_meta/`` and remove temporaries of builders that died (SIGKILL, OOM).

    A symlinked ``kernel_meta`` is refused: following it would write outside the chosen
    ``kernel_meta_parent_dir``.
    """
    try:
        if meta_dir.is_symlink():
            raise fail(E_FILE, "config['kernel_meta_parent_dir']", str(meta_dir.parent),
                       f"has a symlink {meta_dir.name}/; builds write only inside the parent, "
                       "so make kernel_meta a real directory")
        meta_dir.mkdir(parents=True, exist_ok=True)
        sweep_dead_temps(meta_dir, name)
    except OSError as exc:
        raise fail(E_FILE, "config['kernel_meta_parent_dir']", str(meta_dir.parent),
                   f"cannot hold kernel_meta/: {exc}") from None


MIN_FREE_BYTES = 64 << 20  # a kernel is well under 1 MiB; its objects and the link need more


def _check_free_space(meta_dir: Path) -> None:
    """Refuse to compile onto a (nearly) full disk: LLVM does not report a failed write, it
    aborts the whole process ("LLVM ERROR: IO failure on output stream")."""
    import shutil

    for where in (meta_dir, Path(tempfile.gettempdir())):  # export_library links in $TMPDIR
        try:
            free = shutil.disk_usage(where).free
        except OSError:
            continue
        if free < MIN_FREE_BYTES:
            raise fail(E_FILE, "config['kernel_meta_parent_dir']", str(where),
                       f"has {free} bytes free; building needs {MIN_FREE_BYTES} (LLVM aborts "
                       "the process when a write fails); free some space")


def _tensor_entries(sch: Schedule, tensors) -> list[dict]:
    formats = sch.op_info()["formats"]
    out = []
    for t in tensors:
        role = "output" if any(same_tensor(t, o) for o in sch.outputs) else "input"
        out.append({"name": t.op.name, "shape": [int(d) for d in t.shape], "dtype": str(t.dtype),
                    "format": formats.get(t.op.name, "ND"), "role": role})
    return out


def _existing_matches(meta_dir: Path, name: str, key: str) -> dict | None:
    so, js = meta_dir / f"{name}.so", meta_dir / f"{name}.json"
    if not js.is_file():  # a FIFO or a device planted there would block or never end
        return None
    try:
        meta = json.loads(js.read_text())
        if meta.get("cache_key") == key and so.is_file() and sha256_file(so) == meta["sha256"]:
            return meta
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        # any unusable .json (a list, "[[[[..." too deep to parse): rebuild over it
        return None
    return None


_BUILD_OBSERVERS: list = []


@contextlib.contextmanager
def observe_builds(callback):
    """Call ``callback(sch, config)`` at the start of every :func:`build` inside the block
    (the tuner uses it to find the kernels an example script builds)."""
    _BUILD_OBSERVERS.append(callback)
    try:
        yield
    finally:
        _BUILD_OBSERVERS.remove(callback)


def build(sch: Schedule, config: dict) -> dict | object:
    """Compile ``sch`` as TBE's ``build(sch, config)`` does.

    Parameters
    ----------
    sch : Schedule
        From :func:`dsl.auto_schedule`.
    config : dict
        ``name`` (``^[A-Za-z_][A-Za-z0-9_]*$``, <= 200 chars; the file stem and the exported
        function's name), ``tensor_list`` (inputs then outputs, the call order),
        ``kernel_meta_parent_dir`` (default: the working directory), ``print_ir`` (print which rule
        scheduled each stage and why, :func:`dsl.explain`, then the scheduled TIR),
        ``need_build`` (False: schedule and lower only, write nothing).

    Returns
    -------
    dict
        The kernel's JSON metadata (also written to ``kernel_meta/<name>.json``); with
        ``need_build=False``, the lowered ``IRModule`` instead.
    """
    for observer in list(_BUILD_OBSERVERS):
        observer(sch, config)
    name, tensors, meta_dir, print_ir, need_build = _check_config(sch, config)
    t0 = time.perf_counter()
    try:
        mod = lower(sch, name, tensors)
    except Exception as exc:  # a stored trace that no longer applies must not break the build
        if not is_tuned(sch):
            raise
        sch = _reject_tuned(sch, name, f"its trace does not apply: {exc}")
        mod = lower(sch, name, tensors)
    if print_ir:
        from dsl.runtime.explain import explain

        print(explain(sch, tensors))
        print(mod.script())
    if not need_build:
        return mod
    key = cache_key(mod, sch)
    _prepare_meta_dir(meta_dir, name)
    reused = _existing_matches(meta_dir, name, key)
    if reused is not None:
        return reused  # a published tuned kernel was verified when it was first built
    _check_free_space(meta_dir)


    lib = None
    if is_tuned(sch):
        try:
            lib = compile_module(mod, sch.target.tvm_target())
            problem = verify_tuned(sch, lib.jit(), name, tensors)
        except Exception as exc:  # noqa: BLE001 - any failure of a tuned schedule -> default
            problem = f"it fails to build or run: {exc}"
        if problem:
            lib = None
            sch = _reject_tuned(sch, name, problem)
            mod = lower(sch, name, tensors)
            key = cache_key(mod, sch)
            reused = _existing_matches(meta_dir, name, key)
            if reused is not None:
                return reused

    so_path, js_path = meta_dir / f"{name}.so", meta_dir / f"{name}.json"
    tmp_so = tmp_js = None
    try:
        fd, tmp_so = tempfile.mkstemp(prefix=tmp_prefix(name), suffix=".so.tmp", dir=meta_dir)
        os.close(fd)
        if lib is None:
            lib = compile_module(mod, sch.target.tvm_target())
        lib.export_library(tmp_so)
        digest = sha256_file(Path(tmp_so))
        info = sch.op_info()
        meta = {"name": name, "function": name, "op": info["op"], "params": info["params"],
                "tensors": _tensor_entries(sch, tensors), "target": sch.target.as_json(),
                "versions": versions(), "schedule": _schedule_meta(sch),
                "index_dtype": sch.index_dtype(),
                "sha256": digest, "cache_key": key,
                "build_seconds": round(time.perf_counter() - t0, 4)}
        fd, tmp_js = tempfile.mkstemp(prefix=tmp_prefix(name), suffix=".json.tmp",
                                      dir=meta_dir)
        with os.fdopen(fd, "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        with _lock(meta_dir / f".{name}.lock"):
            # the old .json goes first: a build killed between the renames then leaves a .so
            # without .json ("not built"), never a new .so beside the old .json
            with contextlib.suppress(FileNotFoundError):
                os.unlink(js_path)
            os.replace(tmp_so, so_path)
            tmp_so = None
            os.replace(tmp_js, js_path)
            tmp_js = None
        return meta
    except Exception as exc:
        if isinstance(exc, OSError):
            raise fail(E_FILE, "config['kernel_meta_parent_dir']", str(meta_dir.parent),
                       f"could not write the kernel files: {exc}") from exc
        raise
    finally:
        for leftover in (tmp_so, tmp_js):
            if leftover:
                with contextlib.suppress(OSError):
                    os.unlink(leftover)


def _schedule_meta(sch: Schedule) -> dict:
    meta = {"source": "default", "rule": sch.rule_name}
    meta.update(getattr(sch, "schedule_meta", None) or {})
    return meta


# Largest |tuned - default| / max(1, max|default|) accepted per output dtype. The schedules may
# sum in different orders (meta-schedule splits and rfactors reductions), so fp32 rounding
# differs; a wrong index or a missed element is off by O(1) and is caught.
VERIFY_TOL = {"float64": 1e-9, "float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}


def is_tuned(sch: Schedule) -> bool:
    return (getattr(sch, "schedule_meta", None) or {}).get("source") == "tuned"


def default_schedule(sch: Schedule) -> Schedule:
    """The same kernel with the registered rule instead of any tuned trace."""
    return dataclasses.replace(sch, override=None, schedule_meta=None)


def _reject_tuned(sch: Schedule, name: str, reason: str) -> Schedule:
    from dsl.runtime.schedule import TUNING_HOOKS

    warnings.warn(f"kernel '{name}': tuned schedule rejected, using the default schedule: "
                  f"{reason}", RuntimeWarning, stacklevel=3)
    rec = (sch.schedule_meta or {}).get("record") or {}
    if TUNING_HOOKS.reject is not None:
        TUNING_HOOKS.reject(sch.schedule_meta, reason)
    out = default_schedule(sch)
    out.schedule_meta = {"rejected_tuned": {"id": rec.get("id"), "reason": reason[:500]}}
    return out


def random_inputs(tensors, sch: Schedule, seed: int = 0) -> list:
    """Random numpy arrays for the kernel's inputs (in ``tensors`` order)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for t in tensors:
        if any(same_tensor(t, o) for o in sch.outputs):
            continue
        shape, dtype = [int(d) for d in t.shape], str(t.dtype)
        if dtype == "bool":
            a = rng.integers(0, 2, size=shape).astype(bool)
        elif dtype.startswith(("int", "uint")):
            a = rng.integers(0, 4, size=shape).astype(dtype)
        elif dtype == "bfloat16":
            import ml_dtypes

            a = rng.uniform(-1, 1, size=shape).astype(np.float32).astype(ml_dtypes.bfloat16)
        else:
            a = rng.uniform(-1, 1, size=shape).astype(dtype)
        out.append(a)
    return out


def run_module(rt_mod, name: str, tensors, sch: Schedule, inputs: list, fill: float) -> list:
    """Run ``name`` of a runtime module on ``inputs``; outputs start as ``fill`` so an element
    a schedule never writes shows up."""
    import numpy as np
    import tvm

    dev, ins, args, outs = tvm.cpu(), iter(inputs), [], []
    for t in tensors:
        if any(same_tensor(t, o) for o in sch.outputs):
            dtype = str(t.dtype)
            if dtype == "bfloat16":
                import ml_dtypes

                init = np.full([int(d) for d in t.shape], fill, np.float32).astype(
                    ml_dtypes.bfloat16)
            else:
                is_float = dtype.startswith("float")
                init = np.full([int(d) for d in t.shape], fill if is_float else 7, dtype)
            outs.append(tvm.runtime.tensor(init, dev))
            args.append(outs[-1])
        else:
            args.append(tvm.runtime.tensor(next(ins), dev))
    rt_mod[name](*args)
    return [o.numpy() for o in outs]


def verify_tuned(sch: Schedule, rt_tuned, name: str, tensors) -> str | None:
    """Compare a tuned kernel with the default schedule on the same random inputs.

    Returns None when they agree, else what is wrong.
    """
    import numpy as np

    base = default_schedule(sch)
    rt_default = compile_module(lower(base, name, tensors), sch.target.tvm_target()).jit()
    inputs = random_inputs(tensors, sch)
    want = run_module(rt_default, name, tensors, sch, inputs, 0.0)
    got = run_module(rt_tuned, name, tensors, sch, inputs, float("nan"))
    out_tensors = [t for t in tensors if any(same_tensor(t, o) for o in sch.outputs)]
    for t, g, w in zip(out_tensors, got, want):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if not np.array_equal(np.isfinite(g64), np.isfinite(w64)):
            return f"output '{t.op.name}' has elements it never writes or that overflow"
        fin = np.isfinite(w64)
        err = float(np.abs(g64[fin] - w64[fin]).max()) if fin.any() else 0.0
        scale = max(1.0, float(np.abs(w64[fin]).max()) if fin.any() else 0.0)
        tol = VERIFY_TOL.get(str(t.dtype), 0.0)
        if err / scale > tol:
            return (f"output '{t.op.name}' differs from the default schedule's by {err:.3g} "
                    f"(relative {err / scale:.3g} > {tol:g})")
    return None
