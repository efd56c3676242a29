"""dsl.runtime.run_if: side stages, flag-guarded fallbacks and exact twins.

What must hold: side stages never change a kernel's arguments; a fallback runs only inside
its flag's test; a reader of a stage with an exact twin takes the twin's values exactly when
the flag is set; and in dx, the register tile still writes the output (the fallback costs no
fused write-back).
"""

from __future__ import annotations

import re

import numpy as np
import tvm
from tvm import te

import dsl
from dsl.ops import tag
from dsl.runtime.build import compile_module, lower


def _toy():
    """out = 2 * (x + 1), or 2 * (10 * x) when some x is negative: ``a`` (x + 1) has the exact
    twin ``twin`` (10 * x), which runs only when ``neg`` (any x < 0) is set."""
    x = te.placeholder((37,), name="x")
    r = te.reduce_axis((0, 37), name="r")
    neg = te.compute((1,), lambda _: te.max(te.if_then_else(x[r] < 0, 1, 0), axis=r),
                     name="neg", tag="toy.flag")
    # reductions (over one term), so that no rule inlines them away, as dx's are
    k = te.reduce_axis((0, 1), name="k")
    twin = te.compute((37,), lambda i: te.sum(x[i + k] * 10.0, axis=k), name="twin",
                      tag="toy.twin", attrs={tag.RUN_IF: "neg"})
    k2 = te.reduce_axis((0, 1), name="k2")
    a = te.compute((37,), lambda i: te.sum(x[i + k2] + 1.0, axis=k2), name="a",
                   tag="toy.fast", attrs={tag.EXACT_TWIN: "twin"})
    out = te.compute((37,), lambda i: a[i] * 2.0, name="out", tag="toy.out")
    tag.with_side_stages(out, [neg, twin])
    return x, out


def test_side_stages_keep_the_arguments_and_the_twin_replaces_only_when_flagged():
    x, out = _toy()
    sch = dsl.auto_schedule(out)
    func = sch.prim_func([x, out])
    assert len(func.params) == 2  # the side stages are buffers, not arguments
    mod = lower(sch, "toy", [x, out])
    script = mod.script()
    assert re.search(r"if neg\[0\] != 0:\s*\n\s*for", script), script  # the twin is guarded
    lib = compile_module(mod, sch.target.tvm_target())
    for xs in (np.arange(37, dtype="float32"), np.arange(37, dtype="float32") - 3):
        got = tvm.runtime.tensor(np.zeros(37, "float32"))
        lib["toy"](tvm.runtime.tensor(xs), got)
        want = 2 * (10 * xs if (xs < 0).any() else xs + 1)
        np.testing.assert_array_equal(got.numpy(), want)


def _dx(n=1, cin=32, cout=24, h=9, k=3, s=1, pad=1):
    ho = (h + 2 * pad - k) // s + 1
    dy = te.placeholder((n, -(-cout // 16), ho, ho, 16), name="out_backprop", dtype="float32")
    fz = dsl.layout.GroupLayout.from_weight((cout, cin, k, k), 1).fracz_shape
    w = te.placeholder(fz, name="filters", dtype="float32")
    dx = dsl.conv2d_backprop_input(w, dy, (cout, cin, k, k), (n, cin, h, h),
                                   {"strides": [s, s], "padding": [pad] * 4,
                                    "dilations": [1, 1, 1, 1], "res_dtype": "float32"})
    return w, dy, dx


def test_dx_fallback_is_guarded_and_the_tile_still_writes_dx():
    w, dy, dx = _dx()
    sch = dsl.auto_schedule(dx)
    script = lower(sch, "dx", [w, dy, dx]).script()
    # the exact twin runs inside the flag's test, and only there
    guarded = script[script.index("if dx_w_nonfinite[0] != T.int8(0):"):]
    assert 'sblock("dx_exact_init")' in guarded[:1500], script
    assert 'sblock("dx_exact_update")' in guarded[:3000], script
    # dx is still written from the register tile's write-back, which takes the twin's value
    # when the flag is set
    assert any(d[0] == "dx" and "register tile" in d[2] for d in sch.decisions), sch.decisions
    wb = script[script.index('sblock("dx_acc_local")'):]
    # (and within the buffers' bounds: see the test below)
    assert "if dx_w_nonfinite[0] != T.int8(0)" in wb[:2000] and "dx_exact[" in wb[:2000]


def test_strided_dx_reads_each_phase_twin():
    w, dy, dx = _dx(s=2, h=10)
    script = lower(dsl.auto_schedule(dx), "dx", [w, dy, dx]).script()
    for ph in ("0_0", "0_1", "1_0", "1_1"):
        wb = script[script.index(f'sblock("dx_acc_{ph}_local")'):]
        assert f"dx_exact_{ph}[" in wb[:2000], ph


def test_int8_dx_has_no_fallback():
    dy = te.placeholder((1, 1, 7, 7, 32), name="out_backprop", dtype="int8")
    lay = dsl.ops.group.Int8DxLayout.from_weight((24, 20, 3, 3), 1)
    w = te.placeholder(lay.fracz_shape, name="filters", dtype="int8")
    dx = dsl.conv2d_backprop_input(w, dy, (24, 20, 3, 3), (1, 20, 7, 7),
                                   {"strides": [1, 1], "padding": [1] * 4,
                                    "dilations": [1, 1, 1, 1], "res_dtype": "int32"})
    assert tag.side_stages(dx.op) == ()
    assert "nonfinite" not in lower(dsl.auto_schedule(dx), "q", [w, dy, dx]).script()


def test_a_twin_no_reader_takes_is_refused():
    """A schedule that moves the fast stage's buffer to another layout and not its twin's
    would silently keep the inexact values: lowering says so instead."""
    import pytest

    from dsl.runtime.run_if import take_exact_twins

    x, out = _toy()
    sch = tvm.s_tir.Schedule(dsl.auto_schedule(out).prim_func([x, out]))
    sch.transform_layout(sch.get_sblock("a"), ("write", 0), lambda i: (i // 37, i % 37))
    with pytest.raises(NotImplementedError, match="twin"):
        take_exact_twins(sch.mod["main"])


def test_twin_copy_stays_in_bounds_where_the_reader_masks_its_load():
    # dw of 2 input channels: the FracZ write-back runs 16 lanes and reads the accumulators
    # only for the 2 real ones (an if_then_else around the load). The twin's copy, before
    # the reader, once ran for all 16 lanes: past the buffer, over the kernel's other
    # accumulators (wrong results) and the heap (a segfault later in the process).
    import targets
    from dsl import layout

    from helpers import dw_data, para
    from reference import conv2d_backprop_filter as ref_dw

    c = {"n": 1, "cin": 2, "cout": 11, "h": 1, "w": 4, "kh": 1, "kw": 2, "stride": (1, 1),
         "pads": (2, 0, 0, 0), "dil": (1, 1), "groups": 1}
    x_t = te.placeholder((1, 1, 1, 4, 16), name="fmap")
    dy_t = te.placeholder((1, 1, 3, 3, 16), name="out_backprop")
    dw_t = dsl.conv2d_backprop_filter(x_t, dy_t, (11, 2, 1, 2), para(c, res_dtype="float32"))
    sch = dsl.auto_schedule(dw_t, targets.current())
    func = lower(sch, "k", [x_t, dy_t, dw_t])
    copies = re.findall(r"if dw_nonfinite\[0\] != T\.int8\(0\) and (.*):", func.script())
    assert copies and all("lane" in cond for cond in copies), copies  # bounded by the lanes
    run = compile_module(func, targets.current().tvm_target())["k"]
    x, dy = dw_data(c, "float32", 2)
    dy[0, 0, 0, 0] = np.nan  # it meets only padding: no NaN in dw
    args = [tvm.runtime.tensor(layout.nchw_to_5hd(x)), tvm.runtime.tensor(layout.nchw_to_5hd(dy)),
            tvm.runtime.empty((2, 1, 16, 16), "float32", tvm.cpu())]
    run(*args)
    out = layout.fracz_to_weight(args[2].numpy(), (11, 2, 1, 2), 1)
    ref = ref_dw(x, dy, (11, 2, 1, 2), (1, 1), (2, 0, 0, 0), (1, 1), 1)
    assert not np.isnan(ref).any()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
