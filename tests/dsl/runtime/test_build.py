"""The TBE workflow: auto_schedule -> build -> kernel_meta/<name>.{so,json} -> load."""

import json
import multiprocessing as mp

import numpy as np
import pytest
import tvm

import dsl
from dsl import tvm as dtvm
from dsl.ops.layout import nchw_to_5hd, weight_to_fracz


def _dx():
    dy = dtvm.placeholder((2, 1, 5, 5, 16), name="out_backprop", dtype="float16")
    w = dtvm.placeholder((9, 1, 16, 16), name="filters", dtype="float16")
    dx = dsl.conv2d_backprop_input(w, dy, (16, 16, 3, 3), (2, 16, 5, 5),
                                   {"padding": [1, 1, 1, 1], "res_dtype": "float32"})
    return w, dy, dx


def _build(tmp_path, name="k_dx", **cfg):
    w, dy, dx = _dx()
    meta = dsl.build(dsl.auto_schedule(dx), {"name": name, "tensor_list": [w, dy, dx],
                                             "kernel_meta_parent_dir": str(tmp_path), **cfg})
    return meta, (w, dy, dx)


def test_build_writes_so_and_json(tmp_path):
    meta, _ = _build(tmp_path)
    so, js = tmp_path / "kernel_meta" / "k_dx.so", tmp_path / "kernel_meta" / "k_dx.json"
    assert so.is_file() and js.is_file()
    on_disk = json.loads(js.read_text())
    assert on_disk == meta
    assert [t["name"] for t in meta["tensors"]] == ["filters", "out_backprop", "dx"]
    assert [t["format"] for t in meta["tensors"]] == ["FRACTAL_Z", "NC1HWC0", "NC1HWC0"]
    assert meta["tensors"][2] == {"name": "dx", "shape": [2, 1, 5, 5, 16], "dtype": "float32",
                                  "format": "NC1HWC0", "role": "output"}
    assert meta["op"] == "conv2d_backprop_input"
    assert meta["params"]["padding"] == [1, 1, 1, 1]
    assert meta["target"]["name"] == "host" and meta["versions"]["dsl"] == dsl.__version__
    assert meta["schedule"]["source"] == "default"
    import hashlib
    assert meta["sha256"] == hashlib.sha256(so.read_bytes()).hexdigest()
    # plain TVM loads it, and the function carries the kernel's name
    mod = tvm.runtime.load_module(str(so))
    assert mod.get_function("k_dx", query_imports=True) is not None
    assert not [p for p in (tmp_path / "kernel_meta").iterdir() if ".tmp" in p.name]


def test_loaded_kernel_runs_and_writes_outputs(tmp_path):
    _build(tmp_path)
    kernel = dsl.load("k_dx", tmp_path)
    rng = np.random.default_rng(0)
    w = rng.uniform(-1, 1, (16, 16, 3, 3)).astype("float16")
    dy = rng.uniform(-1, 1, (2, 16, 5, 5)).astype("float16")
    args = (weight_to_fracz(w), nchw_to_5hd(dy))
    out = kernel(*args)
    given = np.full((2, 1, 5, 5, 16), np.nan, dtype="float32")
    assert kernel(*args, given) is given
    np.testing.assert_array_equal(given, out)
    with pytest.raises(dsl.DslError) as e:
        kernel(args[0], args[1].astype("float32"))
    assert "dtype" in e.value.param
    with pytest.raises(dsl.DslError):
        kernel(args[0][:1], args[1])


def test_rebuild_same_kernel_reuses_library(tmp_path):
    meta1, _ = _build(tmp_path)
    so = tmp_path / "kernel_meta" / "k_dx.so"
    stamp = so.stat().st_mtime_ns
    meta2, _ = _build(tmp_path)
    assert meta2["cache_key"] == meta1["cache_key"] and so.stat().st_mtime_ns == stamp


def test_need_build_false_writes_nothing(tmp_path, capsys):
    mod, _ = _build(tmp_path, need_build=False, print_ir=True)
    assert isinstance(mod, tvm.IRModule) and "k_dx" in [g.name_hint for g in mod.get_global_vars()]
    assert "dx_acc" in capsys.readouterr().out
    assert not (tmp_path / "kernel_meta").exists()


@pytest.mark.parametrize("name", ["../evil", "a/b", "", "1abc", "x" * 201, "a\x00b", "/abs",
                                  "a.b", None, 5])
def test_bad_names_refused_nothing_written(tmp_path, name):
    with pytest.raises(dsl.DslError) as e:
        _build(tmp_path, name=name)
    assert e.value.code in ("E60030",) and "name" in e.value.param
    assert not (tmp_path / "kernel_meta").exists()
    assert list(tmp_path.parent.glob("evil*")) == []


def test_bad_config_refused(tmp_path):
    w, dy, dx = _dx()
    sch = dsl.auto_schedule(dx)
    for cfg, param in [({"name": "k", "tensor_list": [w, dx]}, "tensor_list"),
                       ({"name": "k", "tensor_list": [w, dy, dx], "bogus": 1}, "bogus"),
                       ({"name": "k", "tensor_list": [w, dy, dx], "print_ir": 1}, "print_ir")]:
        with pytest.raises(dsl.DslError) as e:
            dsl.build(sch, {**cfg, "kernel_meta_parent_dir": str(tmp_path)})
        assert param in e.value.param
    assert not (tmp_path / "kernel_meta").exists()


def test_load_refuses_tampered_or_foreign_kernels(tmp_path):
    _build(tmp_path)
    meta_dir = tmp_path / "kernel_meta"
    js = meta_dir / "k_dx.json"
    good = js.read_text()
    with pytest.raises(dsl.DslError) as e:
        dsl.load("missing", tmp_path)
    assert e.value.code == "E60040"
    meta = json.loads(good)
    for change in ({"sha256": "0" * 64}, {"versions": {**meta["versions"], "dsl": "0.0.0"}},
                   {"target": {**meta["target"], "llvm": {"kind": "llvm", "mcpu": "bogus"}}}):
        js.write_text(json.dumps({**meta, **change}))
        with pytest.raises(dsl.DslError) as e:
            dsl.load("k_dx", tmp_path)
        assert e.value.code == "E60040"
    js.write_text(good[: len(good) // 2])
    with pytest.raises(dsl.DslError) as e:
        dsl.load("k_dx", tmp_path)
    assert "malformed" in str(e.value)
    js.write_text(good)
    with open(meta_dir / "k_dx.so", "ab") as f:
        f.write(b"\0")
    with pytest.raises(dsl.DslError) as e:
        dsl.load("k_dx", tmp_path)
    assert "sha256" in str(e.value)


def test_target_context_selects_target(tmp_path):
    w, dy, dx = _dx()
    with dsl.target("x86-avx2"):
        sch = dsl.auto_schedule(dx)
    assert sch.target.name == "x86-avx2"
    meta = dsl.build(sch, {"name": "k_avx2", "tensor_list": [w, dy, dx],
                           "kernel_meta_parent_dir": str(tmp_path)})
    assert meta["target"]["llvm"]["mcpu"] == "haswell"
    assert dsl.auto_schedule(dx).target.name == "host"


def _build_in_child(parent):
    w, dy, dx = _dx()
    dsl.build(dsl.auto_schedule(dx), {"name": "k_race", "tensor_list": [w, dy, dx],
                                      "kernel_meta_parent_dir": parent})


def test_concurrent_builds_leave_one_valid_pair(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_build_in_child, args=(str(tmp_path),)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    kernel = dsl.load("k_race", tmp_path)  # checks the sha256 pairing
    assert kernel.name == "k_race"
    assert sorted(p.name for p in (tmp_path / "kernel_meta").iterdir()
                  if not p.name.startswith(".")) == ["k_race.json", "k_race.so"]
