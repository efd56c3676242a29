"""Tensors of 2**31 elements or more are indexed in 64 bits; smaller kernels stay in 32 bits.

TVM indexes in int32 unless told otherwise, and an int32 flat index past 2**31 - 1 wraps
silently. ``dsl.runtime.schedule.INT64_INDEX_FROM`` is where kernels switch to int64: the big
cases here are lowered only (never run: they would need tens of GiB), and every operator runs
end to end with the switch lowered to 1, so its schedule is exercised on int64 loops and
indices and checked against the float64 reference.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm

import dsl
from dsl import kernel_cache
from dsl import tvm as dtvm
from dsl.ops.layout import fracz_to_weight
from dsl.runtime import schedule
from dsl.runtime.build import compile_module

from helpers import (
    assert_close,
    case_id,
    dw_data,
    dw_kernel,
    dx_data,
    dx_kernel,
    nc1hwc0_to_nchw,
    nchw_to_5hd,
    weight_to_fracz,
)
from reference import avg_pool2d_backward as ref_pool
from reference import conv2d_backprop_filter as ref_dw
from reference import conv2d_backprop_input as ref_dx
from reference import convolution_backward as ref_conv
from reference import deconv_grad_filter as ref_deconv

BIG = 11586  # 16 * 11586**2 = 2_147_766_336 >= 2**31
SMALL = 11585  # 16 * 11585**2 = 2_147_395_600 < 2**31


def _dx_1x1(hw: int, dtype: str = "float32"):
    dy = dtvm.placeholder((1, 1, hw, hw, 16), name="out_backprop", dtype=dtype)
    w = dtvm.placeholder((1, 1, 16, 16), name="filters", dtype=dtype)
    dx = dsl.conv2d_backprop_input(w, dy, (16, 16, 1, 1), (1, 16, hw, hw),
                                   {"res_dtype": "float32"})
    return [w, dy, dx]


def _dw_1x1(hw: int):
    x = dtvm.placeholder((1, 1, hw, hw, 16), name="fmap", dtype="float32")
    dy = dtvm.placeholder((1, 1, hw, hw, 16), name="out_backprop", dtype="float32")
    dw = dsl.conv2d_backprop_filter(x, dy, (16, 16, 1, 1), {"res_dtype": "float32"})
    return [x, dy, dw]


def _pool(hw: int):
    dy = dtvm.placeholder((1, 16, hw, hw), name="grad_output", dtype="float32")
    x = dtvm.placeholder((1, 16, hw, hw), name="self", dtype="float32")
    gx = dsl.avg_pool2d_backward(dy, x, [1, 1], [1, 1], [0, 0], False, True, 0)
    return [dy, gx]


def _big_operators():
    """Each operator on tensors of 2**31 elements or more: name -> (tensor_list, outputs)."""
    from dsl.ops.avg_pool2d_backward import avg_pool2d_backward_5hd
    from dsl.ops.deconv_grad_filter import deconv_grad_filter
    from dsl.ops.layout import nchw_to_5hd_compute

    def ph(shape, name):
        return dtvm.placeholder(shape, name=name, dtype="float32")

    h = BIG
    dy, w = ph((1, 1, h // 2, h // 2, 16), "out_backprop"), ph((9, 1, 16, 16), "filters")
    s2 = {"strides": [2, 2], "padding": [1, 1, 1, 1], "res_dtype": "float32"}
    yield "dx_3x3_s2", [w, dy], [dsl.conv2d_backprop_input(w, dy, (16, 16, 3, 3),
                                                           (1, 16, h, h), s2)]
    x, dyw = ph((1, 1, h, h, 16), "fmap"), ph((1, 1, h // 2, h // 2, 16), "out_backprop")
    yield "dw_3x3_s2", [x, dyw], [dsl.conv2d_backprop_filter(x, dyw, (16, 16, 3, 3), s2)]
    go, xc, wc = ph((1, 4, 50000, 50000), "go"), ph((1, 1, 50000, 50000), "x"), \
        ph((4, 1, 1, 1), "w")
    yield "aclnn_conv2d", [go, xc, wc], list(dsl.convolution_backward(
        go, xc, wc, [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True] * 3, 0))
    go, xc, wc = ph((2, 2, 2**30), "go"), ph((2, 2, 2**30 + 2), "x"), ph((2, 2, 3), "w")
    yield "aclnn_conv1d", [go, xc, wc], [t for t in dsl.convolution_backward(
        go, xc, wc, None, [1], [0], [1], False, [0], 1, [True, True, False], 0) if t is not None]
    go, xc, wc = ph((1, 4, 50000, 50000), "go"), ph((1, 4, 25000, 25000), "x"), \
        ph((4, 2, 2, 2), "w")
    yield "aclnn_transposed", [go, xc, wc], list(dsl.convolution_backward(
        go, xc, wc, [4], [2, 2], [0, 0], [1, 1], True, [0, 0], 2, [True] * 3, 0))
    dyp, xp = ph((1, 16, h // 2, h // 2), "grad_output"), ph((1, 16, h, h), "self")
    yield "avg_pool", [dyp], [dsl.avg_pool2d_backward(dyp, xp, [3, 3], [2, 2], [1, 1], False,
                                                      True, 0)]
    yield "avg_pool_5hd", [dy], [avg_pool2d_backward_5hd(
        dy, ph((1, 1, h, h, 16), "self"), [3, 3], [2, 2], [1, 1], False, True, 0)]
    dyd, xd = ph((2, 2 * h, h, 16), "dy"), ph((2, h, h // 2, 16), "x")
    yield "deconv", [dyd, xd], [deconv_grad_filter(dyd, xd, kernel=4, stride=2, pad=1)]
    xl = ph((1, 17, h, h), "x")
    yield "layout", [xl], [nchw_to_5hd_compute(xl)]


BIG_OPS = {name: (ins, outs) for name, ins, outs in _big_operators()}


def _lower(tensors, name="big", outputs=None):
    sch = dsl.auto_schedule(outputs or tensors[-1])
    return dsl.build(sch, {"name": name, "tensor_list": tensors, "need_build": False})


def _buffer_dims(text: str) -> list[str]:
    """The dimension expressions of every ``T.Buffer((d0, d1, ...), ...)`` in ``text``."""
    dims = []
    for m in re.finditer(r"T\.Buffer\(\(", text):
        depth, start, i = 0, m.end(), m.end()
        while depth >= 0:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if text[i] == "," and depth == 0 or depth < 0:
                dims.append(text[start:i].strip())
                start = i + 1
            i += 1
    return [d for d in dims if d]


def _index_dtypes(mod) -> set[str]:
    """The dtypes of the dimensions of the functions' argument buffers (TVMScript prints an
    int64 dimension as ``T.int64(n)`` and an int32 one as a bare ``n``)."""
    sigs = " ".join(re.findall(r"def \w+\((.*)\):", mod.script()))
    return {"int64" if d.startswith("T.int64(") else "int32" if d.isdigit() else d
            for d in _buffer_dims(sigs)}


def _after_narrowing(mod) -> str:
    """The kernel as ``tvm.compile`` lowers it, captured right after TVM's NarrowDataType pass
    (buffers flattened; indices narrowed to int32 wherever TVM proves they fit)."""
    seen = []

    @tvm.instrument.pass_instrument
    class Capture:
        def run_after_pass(self, mod, info):
            if info.name == "tirx.NarrowDataType":
                seen.append(mod.script())

    target = dsl.auto_schedule(_pool(4)[-1]).target.tvm_target()
    with tvm.transform.PassContext(instruments=[Capture()]):
        compile_module(mod, target)
    assert seen, "NarrowDataType did not run"
    return seen[0]


@pytest.mark.parametrize("name", list(BIG_OPS))
def test_every_operator_on_2_31_elements_lowers_with_int64_indices(name):
    ins, outs = BIG_OPS[name]
    mod = _lower([*ins, *outs], outputs=outs)
    assert _index_dtypes(mod) == {"int64"}
    # loops, block vars, indices: all 64-bit (uint32 only as the non-finite scans' float bits)
    assert re.search(r"(?<!u)int32", mod.script()) is None


@pytest.mark.parametrize("make", [_dx_1x1, _dw_1x1, _pool], ids=["dx", "dw", "avg_pool"])
def test_just_under_2_31_elements_keeps_int32_indices(make):
    assert _index_dtypes(_lower(make(BIG))) == {"int64"}
    small = _lower(make(SMALL))
    assert _index_dtypes(small) == {"int32"}
    assert "int64" not in small.script()


def test_long_reduction_compiles(tmp_path):
    """A reduction over 2**30 positions around an unrolled body: TVM's UnrollLoop overflowed
    its 32-bit step count and unrolled the whole loop (bad_alloc); build disables that."""
    ins, outs = BIG_OPS["aclnn_conv1d"]
    meta = dsl.build(dsl.auto_schedule(outs), {"name": "long", "tensor_list": [*ins, *outs],
                                               "kernel_meta_parent_dir": str(tmp_path)})
    assert (tmp_path / "kernel_meta" / "long.so").stat().st_size > 0
    assert meta["tensors"][0]["shape"] == [2, 2, 2**30]


def test_big_kernel_keeps_int64_flat_indices_through_lowering():
    """A flat index into a buffer of 2**31 elements cannot be narrowed to int32: the compiled
    kernel addresses its big buffers in 64 bits."""
    text = _after_narrowing(_lower(_dx_1x1(BIG)))
    big = {name for name, n in re.findall(
        r"(\w+) = T\.(?:decl|alloc)_buffer\(\(T\.int64\((\d+)\),\)", text)
        if int(n) >= 2**31}
    assert {"out_backprop_1", "dx_1"} <= big, text[:3000]
    for name in big:
        # flattened, an access is sum(var * stride): int64 strides print as T.int64(...)
        subscripts = re.findall(rf"\b{name}\[([^\]]*)\]", text)
        assert subscripts, name
        for index in subscripts:
            assert "T.int64(" in index, f"{name}[{index}] is not indexed in 64 bits"


def test_no_refusal_at_2_31_elements():
    dx = _dx_1x1(BIG)[-1]
    assert [int(d) for d in dx.shape] == [1, 1, BIG, BIG, 16]
    with pytest.raises(dsl.DslError) as e:  # past int64 indexing it is still refused
        dsl.conv2d_backprop_input(
            dtvm.placeholder((1, 1, 16, 16), name="filters", dtype="float32"),
            dtvm.placeholder((1, 1, 1, 1, 16), name="out_backprop", dtype="float32"),
            (16, 16, 1, 1), (1, 16, 2**31, 2**31), {"strides": [2**31 - 1, 2**31 - 1]})
    assert e.value.code == "E60003" and e.value.param == "input_sizes"
    assert "int64" in e.value.rule


@pytest.fixture
def forced_int64(monkeypatch, tmp_path):
    """Every kernel built inside indexes in int64 (the kernel cache keys on the switch), and
    is built afresh; each load is checked to be an int64 kernel."""
    monkeypatch.setattr(schedule, "INT64_INDEX_FROM", 1)
    monkeypatch.setenv("DSL_CACHE_DIR", str(tmp_path))
    kernel_cache.clear_memory()
    real_load, loaded = kernel_cache_load(), []

    def load(name, parent=None):
        kernel = real_load(name, parent)
        loaded.append(kernel.meta["index_dtype"])
        return kernel

    monkeypatch.setattr("dsl.runtime.kernel.load", load)
    yield
    kernel_cache.clear_memory()
    assert set(loaded) <= {"int64"}, loaded


def kernel_cache_load():
    from dsl.runtime import kernel

    return kernel.load


def test_forced_switch_lowers_small_kernels_in_int64(forced_int64):
    assert _index_dtypes(_lower(_dx_1x1(5))) == {"int64"}


CASES = [
    {"n": 2, "cin": 5, "cout": 7, "h": 9, "w": 11, "kh": 3, "kw": 2, "stride": (2, 1),
     "pads": (1, 0, 0, 1), "dil": (1, 2), "groups": 1},
    {"n": 2, "cin": 6, "cout": 9, "h": 7, "w": 5, "kh": 3, "kw": 3, "stride": (1, 2),
     "pads": (1, 1, 1, 1), "dil": (1, 1), "groups": 3},
    {"n": 1, "cin": 3, "cout": 17, "h": 13, "w": 13, "kh": 5, "kw": 5, "stride": (2, 2),
     "pads": (2, 2, 2, 2), "dil": (1, 1), "groups": 1},  # the few-channel stem path
]


@pytest.mark.parametrize("c", CASES, ids=case_id)
def test_forced_int64_dx_and_dw_match_reference(forced_int64, c):
    dy, w = dx_data(c, "float32")
    out5 = dx_kernel(c, "float32", "float32")(weight_to_fracz(w, c["groups"]), nchw_to_5hd(dy))
    ref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"], c["dil"],
                 c["groups"])
    assert_close(nc1hwc0_to_nchw(out5, c["cin"]), ref, "float32", "dx " + case_id(c))
    x, dy = dw_data(c, "float16")
    out = dw_kernel(c, "float16", "float32")(nchw_to_5hd(x), nchw_to_5hd(dy))
    w_shape = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    ref = ref_dw(x, dy, w_shape, c["stride"], c["pads"], c["dil"], c["groups"])
    assert_close(fracz_to_weight(out, w_shape, c["groups"]), ref, "float32", "dw " + case_id(c))


@pytest.mark.parametrize("transposed", [False, True])
def test_forced_int64_convolution_backward_matches_reference(forced_int64, transposed):
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (2, 4, 7, 6)).astype("float32")
    if transposed:
        w = rng.uniform(-1, 1, (4, 3, 3, 2)).astype("float32")
        go_hw = ((7 - 1) * 2 - 2 + 2 + 1, (6 - 1) * 1 - 0 + 1 + 1)
        go = rng.uniform(-1, 1, (2, 6, *go_hw)).astype("float32")
        pads, stride = [1, 0], [2, 1]
    else:
        w = rng.uniform(-1, 1, (6, 2, 3, 2)).astype("float32")
        go = rng.uniform(-1, 1, (2, 6, 4, 5)).astype("float32")
        pads, stride = [1, 0], [2, 1]
    gi, gw, gb = dsl.aclnn.convolution_backward(
        go, x, w, [6], stride, pads, [1, 1], transposed, [0, 0], 2, [True, True, True], 0)
    ri, rw, rb = ref_conv(go, x, w, stride, [(p, p) for p in pads], [1, 1], transposed,
                          [0, 0], 2)
    assert_close(gi, ri, "float32", "grad_input")
    assert_close(gw, rw, "float32", "grad_weight")
    assert_close(gb, rb, "float32", "grad_bias")


@pytest.mark.parametrize("layout", ["NCHW", "NC1HWC0"])
def test_forced_int64_avg_pool_matches_reference(forced_int64, layout):
    rng = np.random.default_rng(6)
    x = np.zeros((2, 3, 9, 8), "float32")
    dy = rng.uniform(-1, 1, (2, 3, 5, 4)).astype("float32")
    args = ([3, 3], [2, 2], [1, 1], False, False, 0)
    ref = ref_pool(dy, x.shape, (3, 3), (2, 2), (1, 1), False, False, 0)
    if layout == "NCHW":
        out = dsl.aclnn.avg_pool2d_backward(dy, x, *args)
    else:
        from dsl.ops.avg_pool2d_backward import avg_pool2d_backward_5hd

        d5 = dtvm.placeholder((2, 1, 5, 4, 16), name="grad_output", dtype="float32")
        x5 = dtvm.placeholder((2, 1, 9, 8, 16), name="self", dtype="float32")
        res = avg_pool2d_backward_5hd(d5, x5, *args)
        kernel = kernel_cache.get_kernel({"test": "pool5hd_int64"}, lambda: ([d5], [res]),
                                         prefix="t_pool5")
        out = nc1hwc0_to_nchw(kernel(nchw_to_5hd(dy)), 3)
    assert_close(out, ref, "float32", layout)


def test_forced_int64_deconv_grad_filter_matches_reference(forced_int64):
    from dsl.api.deconvgradfilter import fp_deconv_grad_filter_p

    p = [2, 5, 4, 6, 2, 11, 9, 4, 3, 2, 2, 3, 1, 2, 2, 1, 2]
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, 2 * 5 * 4 * 6).astype("float32")
    dy = rng.uniform(-1, 1, 2 * 11 * 9 * 4).astype("float32")
    dw = np.zeros(2 * 2 * 3 * 2 * 3, "float32")
    fp_deconv_grad_filter_p(dy, x, dw, p)
    ref = ref_deconv(dy.reshape(2, 11, 9, 4), x.reshape(2, 5, 4, 6), p[8:10], p[10:12],
                     p[12:14], p[14:16], p[16])
    assert_close(dw.reshape(ref.shape), ref, "float32", "deconv")


def test_forced_int64_layout_kernel_matches_numpy(forced_int64):
    from dsl.ops.layout import nchw_to_5hd_compute

    x = dtvm.placeholder((2, 19, 3, 5), name="x", dtype="float32")
    y = nchw_to_5hd_compute(x)
    kernel = kernel_cache.get_kernel({"test": "layout_int64"}, lambda: ([x], [y]),
                                     prefix="t_lay")
    a = np.random.default_rng(8).uniform(-1, 1, (2, 19, 3, 5)).astype("float32")
    np.testing.assert_array_equal(kernel(a), nchw_to_5hd(a))
