"""``python -m dsl show``: what a built kernel is, how many threads it runs on, its assembly
and its lowered TIR.

From ``kernel_meta/`` (the working directory's, then the kernel cache's; ``--dir`` names
another parent)::

    python -m dsl show                        # the kernels found
    python -m dsl show NAME                   # metadata: operator, tensors, target, schedule,
                                              # threads
    python -m dsl show NAME --asm             # disassembly of kernel_meta/NAME.so (objdump)

``kernel_meta/`` keeps the compiled library, not the TIR it came from; the TIR, LLVM IR and
compiler assembly come from rebuilding the kernels a script builds (nothing is written)::

    python -m dsl show --example examples/depthwise.py --tir [NAME]
    python -m dsl show --example examples/depthwise.py --asm [NAME]   # also --llvm

A kernel runs on TVM's thread pool when its schedule has a parallel loop (``parallel: yes``);
the pool has ``TVM_NUM_THREADS`` threads, read once, when the first kernel runs (``import dsl``
sets it to the machine's cores unless already set).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from dsl.cli import output
from dsl.cli.common import UsageError, prog


def meta_dirs(parent: str | None) -> list[Path]:
    """Where kernels are looked for: ``<parent>/kernel_meta``, else the working directory's
    and the kernel cache's."""
    if parent:
        return [Path(parent) / "kernel_meta"]
    from dsl.runtime.kernel_cache import cache_root

    return [Path.cwd() / "kernel_meta", cache_root() / "kernel_meta"]


def find_kernel(name: str, dirs: list[Path]) -> Path:
    """``kernel_meta/<name>.json`` in the first of ``dirs`` that has it (UsageError listing
    the kernels there otherwise)."""
    for d in dirs:
        if (d / f"{name}.json").is_file():
            return d / f"{name}.json"
    raise UsageError(f"no kernel {name!r} in {', '.join(map(str, dirs))}", list_kernels(dirs))


def list_kernels(dirs: list[Path]) -> list[str]:
    return sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.json")})


def threads_info(so: Path) -> dict:
    """Whether the library launches TVM's thread pool, and the pool's size in this process."""
    import tvm

    parallel = so.is_file() and b"TVMBackendParallelLaunch" in so.read_bytes()
    return {"parallel": parallel, "pool_threads": int(tvm.runtime.num_threads()),
            "TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS")}


def describe(js: Path) -> list[tuple[str, str]]:
    """(field, value) rows of a kernel's metadata."""
    meta = json.loads(js.read_text())
    so = js.with_suffix(".so")
    thr = threads_info(so)
    target = meta.get("target") or {}
    rows = [("name", meta.get("name", js.stem)), ("op", str(meta.get("op"))),
            ("library", str(so))]
    rows += [(f"tensor {i}", f"{t.get('role')} {t.get('name')} {t.get('shape')} "
                             f"{t.get('dtype')} {t.get('format')}")
             for i, t in enumerate(meta.get("tensors") or [])]
    rows += [("target", f"{target.get('name')} {json.dumps(target.get('llvm', {}))}"),
             ("schedule", json.dumps(meta.get("schedule"), sort_keys=True)),
             ("params", json.dumps(meta.get("params"), sort_keys=True, default=str)),
             ("build seconds", str(meta.get("build_seconds"))),
             ("parallel", "yes" if thr["parallel"] else "no (one thread)"),
             ("threads", f"{thr['pool_threads'] if thr['parallel'] else 1} "
                         f"(TVM_NUM_THREADS={thr['TVM_NUM_THREADS']})")]
    return rows


def disassemble(so: Path) -> str:
    """The library's machine code (``objdump -d`` of its .text)."""
    tool = shutil.which("objdump")
    if tool is None:
        raise UsageError("--asm of a built kernel needs objdump (binutils); or rebuild with "
                         "--example FILE --asm, which asks the compiler")
    proc = subprocess.run([tool, "-d", "--no-show-raw-insn", "-j", ".text", str(so)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise UsageError(f"objdump failed on {so}: {proc.stderr.strip()}")
    # drop the C runtime's start-up stubs: only the kernel's own functions are of interest
    blocks = proc.stdout.split("\n\n")
    return "\n\n".join(b for b in blocks if not any(f"<{stub}>:" in b for stub in _CRT_STUBS))


_CRT_STUBS = ("deregister_tm_clones", "register_tm_clones", "__do_global_dtors_aux",
              "frame_dummy", "_init", "_fini")


def rebuilt_sources(example: str, name: str | None, kind: str) -> list[tuple[str, str]]:
    """(kernel name, text) for each kernel the example builds (or only ``name``): its
    lowered TIR (``kind="tir"``), LLVM IR ("ll") or assembly ("asm")."""
    import tvm

    from dsl.cli.tune import recording_builds
    from dsl.runtime.build import lower

    seen = _run_recorded(example, recording_builds)
    names = [kname for _, _, kname in seen]
    if name is not None and name not in names:
        raise UsageError(f"{example} builds no kernel {name!r}", names)
    out = []
    for sch, tensors, kname in seen:
        if name is not None and kname != name:
            continue
        mod = lower(sch, kname, tensors)
        if kind == "tir":
            out.append((kname, mod.script()))
        else:
            lib = tvm.compile(mod, target=sch.target.tvm_target())
            out.append((kname, lib.mod.inspect_source(kind)))
    return out


def _run_recorded(example: str, recording_builds) -> list:
    """Run the example script in a scratch directory, recording its builds."""
    import runpy
    import tempfile

    path = Path(example).resolve()
    if not path.is_file():
        raise UsageError(f"--example {example!r} is not a file")
    old_cwd, old_argv = os.getcwd(), sys.argv
    with tempfile.TemporaryDirectory(prefix="dsl-show-") as tmp:
        try:
            os.chdir(tmp)
            sys.argv = [str(path)]
            # the script's own prints go to stderr: stdout carries the TIR / assembly
            with recording_builds() as seen, contextlib.redirect_stdout(sys.stderr):
                runpy.run_path(str(path), run_name="__main__")
        finally:
            os.chdir(old_cwd)
            sys.argv = old_argv
    return seen


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog("show"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="kernel name (kernel_meta/NAME.so); none: list")
    p.add_argument("--dir", default=None, metavar="PARENT",
                   help="look in PARENT/kernel_meta (default: ./kernel_meta, then the cache)")
    view = p.add_mutually_exclusive_group()
    view.add_argument("--asm", action="store_true", help="assembly")
    view.add_argument("--tir", action="store_true", help="lowered TIR (needs --example)")
    view.add_argument("--llvm", action="store_true", help="LLVM IR (needs --example)")
    p.add_argument("--example", default=None, metavar="FILE",
                   help="rebuild the kernels this script builds instead of reading kernel_meta")
    output.add_json_arg(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.example:
            kind = "tir" if args.tir else "ll" if args.llvm else "asm" if args.asm else "tir"
            for kname, text in rebuilt_sources(args.example, args.name, kind):
                print(f"# ---- {kname} ({kind}) ----\n{text}")
            return 0
        if args.tir or args.llvm:
            raise UsageError("kernel_meta/ holds the compiled library, not its TIR or LLVM "
                             "IR: add --example FILE (rebuilds in memory), or build with "
                             "config {'print_ir': True}")
        return _show_built(args)
    except UsageError as exc:
        return exc.report("show")


def _show_built(args) -> int:
    dirs = meta_dirs(args.dir)
    if not args.name:
        names = list_kernels(dirs)
        if not output.json_to_stdout(args.json):
            print("\n".join(names) if names else f"no kernels in {', '.join(map(str, dirs))}")
        output.write_json({"kernels": names, "dirs": [str(d) for d in dirs]}, args.json)
        return 0
    js = find_kernel(args.name, dirs)
    if args.asm:
        print(disassemble(js.with_suffix(".so")))
        return 0
    rows = describe(js)
    if not output.json_to_stdout(args.json):
        print(output.format_table(("field", "value"), rows))
    output.write_json({"meta": json.loads(js.read_text()),
                       "threads": threads_info(js.with_suffix(".so"))}, args.json)
    return 0
