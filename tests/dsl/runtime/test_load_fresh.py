"""``dsl.load`` returns the kernel on disk now, never an earlier build of the same name.

The dynamic loader keeps one library per path: before the fix, loading a rebuilt kernel while
the first build was still mapped returned the first build (wrong numbers with equal shapes, a
shape error with new ones). Each case holds the earlier kernel alive on purpose, since that is
what kept its library mapped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

import dsl
from dsl import tvm as dtvm
from dsl.ops.layout import nc1hwc0_to_nchw, nchw_to_5hd, weight_to_fracz

from reference import conv2d_backprop_input as ref_dx

ROOT = Path(__file__).resolve().parents[3]
# variant -> (spatial size, dilation, padding): "A" and "B" differ in shapes; "A" and "D" have
# the same tensor shapes but compute different things (dilation 2 reads other taps)
VARIANTS = {"A": (5, 1, 1), "B": (6, 1, 1), "D": (5, 2, 2)}


def _graph(variant: str):
    s, d, p = VARIANTS[variant]
    dy = dtvm.placeholder((1, 1, s, s, 16), name="out_backprop", dtype="float32")
    w = dtvm.placeholder((9, 1, 16, 16), name="filters", dtype="float32")
    dx = dsl.conv2d_backprop_input(w, dy, (16, 16, 3, 3), (1, 16, s, s),
                                   {"padding": [p] * 4, "dilations": [1, 1, d, d],
                                    "res_dtype": "float32"})
    return w, dy, dx


def _build(parent, name: str, variant: str) -> dict:
    w, dy, dx = _graph(variant)
    return dsl.build(dsl.auto_schedule(dx), {"name": name, "tensor_list": [w, dy, dx],
                                             "kernel_meta_parent_dir": str(parent)})


def _check(kernel, variant: str) -> None:
    """Run ``kernel`` as ``variant`` and compare with the float64 reference."""
    s, d, p = VARIANTS[variant]
    rng = np.random.default_rng(s * 10 + d)
    w = rng.uniform(-1, 1, (16, 16, 3, 3)).astype("float32")
    dy = rng.uniform(-1, 1, (1, 16, s, s)).astype("float32")
    out = nc1hwc0_to_nchw(kernel(weight_to_fracz(w), nchw_to_5hd(dy)), 16)
    ref = ref_dx(dy, w, (1, 16, s, s), (1, 1), (p,) * 4, (d, d), 1)
    err = np.abs(out - ref).max() / max(1.0, np.abs(ref).max())
    assert err <= 2e-5, f"{kernel.name} run as {variant}: relative error {err:.3g}"


def _variant_of(meta: dict) -> str:
    s, dil = meta["tensors"][1]["shape"][2], meta["params"]["dilations"][2]
    return next(v for v, (vs, vd, _) in VARIANTS.items() if (vs, vd) == (s, dil))


def test_rebuild_with_other_shapes_loads_the_new_kernel(tmp_path):
    _build(tmp_path, "k", "A")
    first = dsl.load("k", tmp_path)
    _build(tmp_path, "k", "B")
    second = dsl.load("k", tmp_path)
    assert second.inputs[1]["shape"] == [1, 1, 6, 6, 16]
    _check(second, "B")
    _check(first, "A")  # the earlier kernel still runs its own library


def test_rebuild_of_another_computation_with_equal_shapes_loads_the_new_kernel(tmp_path):
    _build(tmp_path, "k", "A")
    first = dsl.load("k", tmp_path)
    _check(first, "A")
    _build(tmp_path, "k", "D")
    second = dsl.load("k", tmp_path)
    assert [t["shape"] for t in second.meta["tensors"]] == \
        [t["shape"] for t in first.meta["tensors"]]
    _check(second, "D")
    _check(first, "A")
    _build(tmp_path, "k", "A")  # and back: a third load is the first computation again
    _check(dsl.load("k", tmp_path), "A")


def test_rebuild_by_another_process_loads_the_new_kernel(tmp_path):
    _build(tmp_path, "k", "A")
    first = dsl.load("k", tmp_path)
    _check(first, "A")
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
            "import test_load_fresh as t; t._build(sys.argv[3], 'k', 'D')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code, str(ROOT / "tests"), str(Path(__file__).parent),
                    str(tmp_path)], check=True, timeout=600, env=env)
    _check(dsl.load("k", tmp_path), "D")
    _check(first, "A")


def test_threads_loading_while_another_rebuilds_always_get_a_published_kernel(tmp_path):
    _build(tmp_path, "k", "A")
    held, errors, stop = [], [], threading.Event()

    def reader():
        try:
            while not stop.is_set():
                kernel = dsl.load("k", tmp_path)
                _check(kernel, _variant_of(kernel.meta))
                held.append(kernel)  # keep every library mapped: the old bug's trigger
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for variant in "DADB":
            _build(tmp_path, "k", variant)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert not errors, errors[0]
    assert not any(t.is_alive() for t in threads)
    last = dsl.load("k", tmp_path)
    assert _variant_of(last.meta) == "B"
    _check(last, "B")
    seen = {_variant_of(k.meta) for k in held}
    assert held and seen <= set(VARIANTS), seen


def test_load_leaves_no_private_copy_behind(tmp_path):
    _build(tmp_path, "k", "A")
    kernel = dsl.load("k", tmp_path)
    _check(kernel, "A")
    names = sorted(p.name for p in (tmp_path / "kernel_meta").iterdir())
    assert names == [".k.lock", "k.json", "k.so"]


def test_load_from_a_read_only_kernel_meta(tmp_path, monkeypatch):
    """Where kernel_meta/ takes no file (read-only; root ignores modes, so simulated), the
    private copy goes to a private temporary directory, and is fresh there too."""
    import tempfile

    _build(tmp_path, "k", "A")
    first = dsl.load("k", tmp_path)
    _build(tmp_path, "k", "D")
    meta, real = tmp_path / "kernel_meta", tempfile.mkstemp
    used = []

    def mkstemp(*args, dir=None, **kw):  # noqa: A002 - tempfile's own keyword
        if dir is not None and Path(dir) == meta:
            raise PermissionError(13, "Permission denied", str(dir))
        used.append(dir)
        return real(*args, dir=dir, **kw)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    _check(dsl.load("k", tmp_path), "D")
    _check(first, "A")
    assert used and not any(list(Path(d).iterdir()) for d in used)
