"""bfloat16 inputs to the TBE pair (dx, dw): exactly representable bf16 data against the float64
reference, fp32 accumulation, within 1e-2 of max|ref| (helpers.TOL)."""

import numpy as np
import pytest

import dsl
import targets
from dsl.ops.layout import fracz_to_weight

from cases import CONV_CASES, C
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
from reference import conv2d_backprop_filter as ref_dw
from reference import conv2d_backprop_input as ref_dx

ml_dtypes = pytest.importorskip("ml_dtypes")

# dense, stride 2 + asymmetric pad, stride 3 + dilation, grouped, depthwise, stem (positions)
BF16_CASES = [CONV_CASES[i] for i in (1, 2, 3, 4, 7, 8, 12)]


@pytest.mark.parametrize("c", BF16_CASES, ids=case_id)
@pytest.mark.parametrize("res_dtype", ["float32", "bfloat16"])
def test_dx_bfloat16(c, res_dtype):
    dy, w = dx_data(c, "bfloat16")
    assert dy.dtype == ml_dtypes.bfloat16
    fz, dy5 = weight_to_fracz(w, c["groups"]), nchw_to_5hd(dy)
    assert fz.dtype == dy5.dtype == ml_dtypes.bfloat16
    out5 = dx_kernel(c, "bfloat16", res_dtype)(fz, dy5)
    assert out5.dtype == np.dtype(getattr(ml_dtypes, res_dtype, res_dtype))
    ref = ref_dx(dy.astype(np.float64), w.astype(np.float64), (c["n"], c["cin"], c["h"], c["w"]),
                 c["stride"], c["pads"], c["dil"], c["groups"])
    out = nc1hwc0_to_nchw(out5, c["cin"]).astype(np.float64)
    assert_close(out, ref, "bfloat16", case_id(c))
    if res_dtype == "float32":  # fp32 accumulation of exact products: fp32 accuracy
        assert_close(out, ref, "float32", case_id(c))


# dense layers (Cin in the lanes), which an AVX512-BF16 target lays out as bf16 pairs of Cout
# for vdpbf16ps: odd channels + batch 2, stride 2 + asymmetric pad, stride 3 + dilation 2,
# 1x1 with prime sizes (dy read as it comes, no padded copy)
DOT_CASES = [
    C(2, 37, 20, 7, 8, 3, 1, (1, 1, 1, 1), 1, 1),
    C(1, 16, 40, 9, 10, 3, 2, (1, 0, 0, 1), 1, 1),
    C(1, 40, 24, 13, 12, (3, 2), (3, 2), (2, 1, 0, 2), 2, 1),
    C(2, 33, 17, 11, 9, 1, 1, (0, 0, 0, 0), 1, 1),
]
# dw's x_pair keeps only the rows and columns the reduction reads: a strided 1x1 with padding
# (every other row, every fourth column), a dilated 3x3 at stride 1 (every other column), a
# 1x1 at stride 3 whose odd Wo leaves a zero dy in its last pair; a Wo of 2, whose tile
# products are one pair deep (their k loop has one step)
DW_DOT_CASES = DOT_CASES + [
    C(2, 24, 20, 9, 11, 1, 2, (1, 0, 2, 1), 1, 1),
    C(1, 17, 32, 11, 12, 3, 1, (2, 2, 2, 2), 2, 1),
    C(1, 16, 19, 7, 13, 1, (2, 3), (0, 1, 0, 0), 1, 1),
    C(1, 64, 48, 10, 4, 2, (1, 2), (1, 1, 0, 0), 1, 1),  # Wo 2: one pair per tile row
]


@pytest.mark.parametrize("c", DOT_CASES, ids=case_id)
def test_dx_bfloat16_dot_layout(c):
    """The vdpbf16ps layout (``[.., Cout/2, 16, 2]`` weight, bf16 dy pairs) is right on any
    host: laid out for an AVX512-BF16 target, scheduled for this one (tensorized into the
    instruction where the host has it, multiply-adds where not)."""
    from dsl.ops.conv2d_backprop_input import dot_depth
    from dsl.ops.group import GroupLayout

    w_sizes = (c["cout"], c["cin"], c["kh"], c["kw"])
    with targets.use("sapphirerapids"):
        assert dot_depth("bfloat16", GroupLayout.from_weight(w_sizes, 1), False) == 2
    dy, w = dx_data(c, "bfloat16")
    out5 = dx_kernel(c, "bfloat16", "float32", layout_for="sapphirerapids")(
        weight_to_fracz(w, 1), nchw_to_5hd(dy))
    ref = ref_dx(dy.astype(np.float64), w.astype(np.float64), (c["n"], c["cin"], c["h"], c["w"]),
                 c["stride"], c["pads"], c["dil"], 1)
    assert_close(nc1hwc0_to_nchw(out5, c["cin"]).astype(np.float64), ref, "float32", case_id(c))


def _host_without_tiles(monkeypatch):
    """This machine as a target without AMX, registered for this test only (``dsl.load``
    finds a kernel's target by name): its dot-product path is ``vdpbf16ps``, Zen 4's."""
    import dataclasses

    host = targets.get("host")
    if not host.has_tiles("bfloat16"):
        return None
    tgt = dataclasses.replace(host, name="host-without-amx",
                              isa=frozenset(f for f in host.isa if not f.startswith("amx")))
    monkeypatch.setitem(targets._REGISTRY, tgt.name, tgt)
    return tgt


@pytest.mark.parametrize("tiles", [True, False], ids=["host", "without-amx"])
@pytest.mark.parametrize("c", DW_DOT_CASES, ids=case_id)
def test_dw_bfloat16_dot_layout(c, tiles, monkeypatch):
    """dw over pairs of Wo positions (``x_pair`` / ``dy_pair`` for vdpbf16ps; an odd Wo pads
    its last pair with zero dy) is right on any host, as for dx above; on a host with AMX also
    through the ``vdpbf16ps`` path."""
    target = None if tiles else _host_without_tiles(monkeypatch)
    if not tiles and target is None:
        pytest.skip("the host has no AMX: its own run above is the non-tile path")
    from dsl.ops.conv2d_backprop_filter import dot_depth
    from dsl.ops.group import GroupLayout

    w_shape = (c["cout"], c["cin"], c["kh"], c["kw"])
    with targets.use("sapphirerapids"):
        assert dot_depth("bfloat16", GroupLayout.from_weight(w_shape, 1), False) == 2
    x, dy = dw_data(c, "bfloat16")
    out = dw_kernel(c, "bfloat16", "float32", target=target, layout_for="sapphirerapids")(
        nchw_to_5hd(x), nchw_to_5hd(dy))
    ref = ref_dw(x.astype(np.float64), dy.astype(np.float64), w_shape, c["stride"], c["pads"],
                 c["dil"], 1)
    mask = weight_to_fracz(np.ones(w_shape, np.float32), 1) != 0
    assert not out[~mask].any(), "pad positions must be exactly zero"
    assert_close(fracz_to_weight(out, w_shape, 1), ref, "float32", case_id(c))


@pytest.mark.parametrize("k,stride,dil,shape", [
    (1, 1, 1, (1, 1, 9, 5, 16, 2)),   # 1x1: the even columns of each pair only
    (1, 2, 1, (1, 1, 5, 3, 16, 2)),   # strided 1x1: every other row, every fourth column
    (3, 1, 2, (1, 1, 13, 7, 16, 2)),  # dilation 2: every other column
    (3, 1, 1, (1, 1, 11, 11, 16, 2)),  # 3x3: every padded row and column
])
def test_dw_x_pair_holds_only_what_the_reduction_reads(k, stride, dil, shape):
    from tvm import te

    from dsl.ops import tag

    pad = dil * (k - 1) // 2
    x = te.placeholder((1, 1, 9, 9, 16), name="fmap", dtype="bfloat16")
    ho = (9 + 2 * pad - dil * (k - 1) - 1) // stride + 1
    dy = te.placeholder((1, 1, ho, ho, 16), name="out_backprop", dtype="bfloat16")
    with targets.use("sapphirerapids"):
        dw = dsl.conv2d_backprop_filter(x, dy, (16, 16, k, k), {
            "strides": [stride, stride], "padding": [pad] * 4, "dilations": [1, 1, dil, dil]})
    stages = {t.op.tag: t for t in _stages(dw)}
    assert tuple(int(d) for d in stages[tag.DW_X_PAIR].shape) == shape


def _stages(out):
    seen, todo = {}, [out]
    while todo:
        t = todo.pop()
        if t.op.name not in seen:
            seen[t.op.name] = t
            todo.extend(getattr(t.op, "input_tensors", []))
    return list(seen.values())


@pytest.mark.parametrize("c", BF16_CASES, ids=case_id)
def test_dw_bfloat16(c):
    x, dy = dw_data(c, "bfloat16")
    out = dw_kernel(c, "bfloat16", "float32")(nchw_to_5hd(x), nchw_to_5hd(dy))
    w_shape = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    ref = ref_dw(x.astype(np.float64), dy.astype(np.float64), w_shape, c["stride"], c["pads"],
                 c["dil"], c["groups"])
    assert out.dtype == np.float32
    mask = weight_to_fracz(np.ones(w_shape, np.float32), c["groups"]) != 0
    assert not out[~mask].any(), "cross-group / pad positions must be exactly zero"
    got = fracz_to_weight(out, w_shape, c["groups"])
    assert_close(got, ref, "bfloat16", case_id(c))
    assert_close(got, ref, "float32", case_id(c))


def test_bfloat16_packers_round_trip():
    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, (2, 19, 3, 4)).astype(ml_dtypes.bfloat16)
    a5 = dsl.layout.nchw_to_5hd(a)
    assert a5.dtype == ml_dtypes.bfloat16 and a5.shape == (2, 2, 3, 4, 16)
    np.testing.assert_array_equal(dsl.layout.nc1hwc0_to_nchw(a5, 19), a)
    w = rng.uniform(-1, 1, (12, 3, 2, 3)).astype(ml_dtypes.bfloat16)
    fz = dsl.layout.weight_to_fracz(w, 4)
    assert fz.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(dsl.layout.fracz_to_weight(fz, w.shape, 4), w)


def test_dw_refuses_bfloat16_result():
    from tvm import te

    from dsl.errors import DslError
    x = te.placeholder((1, 1, 5, 5, 16), name="x", dtype="bfloat16")
    dy = te.placeholder((1, 1, 3, 3, 16), name="dy", dtype="bfloat16")
    with pytest.raises(DslError, match="res_dtype"):
        dsl.conv2d_backprop_filter(x, dy, (16, 16, 3, 3), {"res_dtype": "bfloat16"})
