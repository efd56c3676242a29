"""The hostile-input corpus: invalid calls of every public entry point of the core.

Each entry is ``(id, code, param, call)``: ``call()`` must raise :class:`dsl.DslError` with
``code`` and a ``param`` containing ``param``. Calls run with the working directory and
``DSL_CACHE_DIR`` inside a fresh temporary directory (see ``test_hostile.py``), so any file a
refused call writes is caught. ``call`` may take the prepared kernel directory (``kdir``) when
it needs a built kernel (load / Kernel.__call__ cases).
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
from pathlib import Path

import numpy as np

import dsl
from dsl import kernel_cache, layout
from dsl.errors import (
    E_CHANNEL,
    E_DTYPE,
    E_DTYPE_MISMATCH,
    E_FILE,
    E_GEOMETRY_IN,
    E_GEOMETRY_OUT,
    E_GROUPS,
    E_NAME,
    E_RANGE,
    E_SHAPE,
    E_TYPE,
    E_VALUE,
)

CASES: list[tuple[str, str, str, object]] = []
DROP = object()  # para value meaning "remove this key"
UNSET = object()  # tensor argument meaning "the valid default placeholder"
KNAME = "rel_k"  # the kernel prepared for load / call cases


def add(cid: str, code: str, param: str, call) -> None:
    ids = {c[0] for c in CASES}
    n, base = 2, cid
    while cid in ids:
        cid, n = f"{base}#{n}", n + 1
    CASES.append((cid, code, param, call))


def ph(shape, dtype="float32", name="t"):
    from tvm import te

    return te.placeholder(shape, name=name, dtype=dtype)


def _para(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if v is DROP:
            out.pop(k, None)
        else:
            out[k] = v
    return out


# --- conv2d_backprop_input ---------------------------------------------------------------------

def dx(fz=(9, 1, 16, 16), dy=(1, 1, 5, 5, 16), fs=(16, 16, 3, 3), xs=(1, 16, 5, 5),
       dtype="float32", wdtype=None, filters=UNSET, out_backprop=UNSET, para=UNSET, **over):
    filters = ph(fz, wdtype or dtype, "filters") if filters is UNSET else filters
    out_backprop = ph(dy, dtype, "out_backprop") if out_backprop is UNSET else out_backprop
    pd = _para({"padding": [1, 1, 1, 1]}, over) if para is UNSET else para
    return dsl.conv2d_backprop_input(filters, out_backprop, fs, xs, pd)


def dw(x=(1, 1, 5, 5, 16), dy=(1, 1, 5, 5, 16), fs=(16, 16, 3, 3), dtype="float32",
       dydtype=None, input_x=UNSET, out_backprop=UNSET, para=UNSET, **over):
    input_x = ph(x, dtype, "fmap") if input_x is UNSET else input_x
    out_backprop = ph(dy, dydtype or dtype, "out_backprop") if out_backprop is UNSET \
        else out_backprop
    pd = _para({"padding": [1, 1, 1, 1]}, over) if para is UNSET else para
    return dsl.conv2d_backprop_filter(input_x, out_backprop, fs, pd)


BAD_NAMES = ["../evil", "a/b", "a\\b", "", "1abc", "x" * 201, "a\x00b", "/abs", "a.b", "..",
             ".", "a b", "é", "name\n", "-x", None, 5, b"bytes", ["k"], True]

# (strides value, code) etc.: every shape a 2-/4-int list can go wrong in
SEQ2_BAD = [([], E_SHAPE), ([1], E_SHAPE), ([1, 1, 1], E_SHAPE), ([0, 1], E_RANGE),
            ([1, -1], E_RANGE), ([2**31, 1], E_RANGE), ([2**63, 1], E_RANGE), ([True, 1], E_TYPE),
            ([1.0, 1], E_TYPE), (["1", 1], E_TYPE), ([np.nan, 1], E_TYPE), ("11", E_TYPE),
            (1, E_TYPE), (None, E_TYPE), ({1, 2}, E_TYPE), (np.int64(2), E_TYPE),
            (np.array(2), E_TYPE), (np.array([[1, 1]]), E_SHAPE), (np.array([1.5, 1]), E_TYPE),
            ([None, 1], E_TYPE), ([1 + 0j, 1], E_TYPE)]
PAD_BAD = [([1, 1, 1], E_SHAPE), ([-1, 0, 0, 0], E_RANGE), ([2**31, 0, 0, 0], E_RANGE),
           ([0.5, 0, 0, 0], E_TYPE), ([False, 0, 0, 0], E_TYPE), ("0000", E_TYPE),
           (0, E_TYPE), ([0, 0, 0, 0, 0], E_SHAPE)]
DIL_BAD = [([2, 1, 1, 1], E_RANGE), ([1, 2, 1, 1], E_RANGE), ([1, 1, 0, 1], E_RANGE),
           ([1, 1, 1, 2**31], E_RANGE), ([1, 1], E_SHAPE), ([1, 1, True, 1], E_TYPE),
           ([1, 1, 1.0, 1], E_TYPE)]
DTYPE_BAD = ["int8", "float64", "bfloat16", "fp16", "", None, 16, np.float32, ["float16"]]
SIZES_BAD = [((16, 16, 3), E_SHAPE), ((16, 16, 3, 3, 1), E_SHAPE), ((0, 16, 3, 3), E_SHAPE),
             ((16, -16, 3, 3), E_SHAPE), ((16, 16, 3.0, 3), E_TYPE), ((16, 16, True, 3), E_TYPE),
             ("16163", E_TYPE), (None, E_TYPE), ({16: 1}, E_TYPE), ((2**60, 16, 3, 3), E_SHAPE),
             ((2**63, 1, 1, 1), E_SHAPE), ((16, 16, "3", 3), E_TYPE)]

for key, bad in (("strides", SEQ2_BAD), ("padding", PAD_BAD), ("dilations", DIL_BAD)):
    for v, code in bad:
        add(f"dx-{key}-{v!r}"[:60], code, f"para_dict['{key}']", lambda v=v, key=key: dx(
            **{key: v}))
for key, bad in (("strides", SEQ2_BAD[:12]), ("padding", PAD_BAD[:5]),
                 ("dilations", DIL_BAD[:4])):
    for v, code in bad:
            add(f"dw-{key}-{v!r}"[:60], code, f"para_dict['{key}']", lambda v=v, key=key: dw(
            **{key: v}))
for v in DTYPE_BAD:
    code = E_DTYPE
    if v != "bfloat16":  # dx may return bfloat16
        add(f"dx-res_dtype-{v!r}", code, "para_dict['res_dtype']", lambda v=v: dx(res_dtype=v))
    add(f"dw-res_dtype-{v!r}", code, "para_dict['res_dtype']", lambda v=v: dw(res_dtype=v))
# int32 is the result of int8 inputs only
add("dx-res_dtype-int32-float", E_DTYPE, "para_dict['res_dtype']", lambda: dx(res_dtype="int32"))
for v in BAD_NAMES:
    add(f"dx-kernel_name-{v!r}"[:60], E_NAME, "para_dict['kernel_name']",
        lambda v=v: dx(kernel_name=v))
for v in BAD_NAMES[:6]:
    add(f"dw-kernel_name-{v!r}"[:60], E_NAME, "para_dict['kernel_name']",
        lambda v=v: dw(kernel_name=v))
for v, code in ((1, E_RANGE), (-1, E_RANGE), (True, E_TYPE), (0.0, E_TYPE), ("0", E_TYPE)):
    add(f"dx-offset_x-{v!r}", code, "para_dict['offset_x']", lambda v=v: dx(offset_x=v))
for v in (1, [0], 0.0, "w"):
    add(f"dx-offset_w-{v!r}", E_VALUE, "para_dict['offset_w']", lambda v=v: dx(offset_w=v))
for k in ("stride", "pad", "data_format", "", "offset_w "):
    add(f"dx-unknown-key-{k!r}", E_VALUE, f"para_dict['{k}']", lambda k=k: dx(**{k: 1}))
for k in ("offset_x", "group_dict", "stride"):
    add(f"dw-unknown-key-{k!r}", E_VALUE, f"para_dict['{k}']", lambda k=k: dw(**{k: 0}))
for v in (None, [], "para", 5, [("strides", [1, 1])]):
    add(f"dx-para_dict-{v!r}", E_TYPE, "para_dict", lambda v=v: dx(para=v))
    add(f"dw-para_dict-{v!r}", E_TYPE, "para_dict", lambda v=v: dw(para=v))
for v, code in SIZES_BAD:
    add(f"dx-filter_sizes-{v!r}", code, "filter_sizes", lambda v=v: dx(fs=v))
    add(f"dx-input_sizes-{v!r}", code, "input_sizes", lambda v=v: dx(xs=v))
    add(f"dw-filter_sizes-{v!r}", code, "filter_sizes", lambda v=v: dw(fs=v))

# tensors
for dt in ("int8", "float64", "int32", "bool", "uint16"):  # bfloat16 is accepted by both
    if dt != "int8":  # int8 dx is TBE's quantised dx (tests/dsl/ops/...int8.py)
        add(f"dx-dtype-{dt}", E_DTYPE, "out_backprop.dtype", lambda dt=dt: dx(dtype=dt))
    add(f"dw-dtype-{dt}", E_DTYPE, "input_x.dtype", lambda dt=dt: dw(dtype=dt))
add("dx-dtype-mismatch", E_DTYPE_MISMATCH, "filters.dtype", lambda: dx(wdtype="float16"))
add("dw-dtype-mismatch", E_DTYPE_MISMATCH, "out_backprop.dtype", lambda: dw(dydtype="float16"))
for what, kw, param in (
        ("filters-rank3", {"fz": (9, 16, 16)}, "filters.shape"),
        ("filters-rank5", {"fz": (9, 1, 16, 16, 1)}, "filters.shape"),
        ("dy-rank4", {"dy": (1, 1, 5, 80)}, "out_backprop.shape"),
        ("dy-zero", {"dy": (1, 0, 5, 5, 16)}, "out_backprop.shape"),
        ("filters-zero", {"fz": (0, 1, 16, 16)}, "filters.shape"),
        ("dy-huge", {"dy": (2**20, 2**20, 2**20, 2**20, 16)}, "out_backprop.shape")):
    add(f"dx-{what}", E_SHAPE, param, lambda kw=kw: dx(**kw))
for what, kw, param in (
        ("x-rank4", {"x": (1, 1, 5, 80)}, "input_x.shape"),
        ("x-zero", {"x": (1, 1, 0, 5, 16)}, "input_x.shape"),
        ("dy-rank6", {"dy": (1, 1, 5, 5, 16, 1)}, "out_backprop.shape"),
        ("x-c0-8", {"x": (1, 2, 5, 5, 8)}, "input_x.shape"),
        ("dy-c0-32", {"dy": (1, 1, 5, 5, 32)}, "out_backprop.shape"),
        ("dy-batch", {"dy": (2, 1, 5, 5, 16)}, "out_backprop.shape[0]"),
        ("x-huge", {"x": (2**20, 2**20, 2**20, 2**20, 16)}, "input_x.shape")):
    add(f"dw-{what}", E_SHAPE, param, lambda kw=kw: dw(**kw))


def _not_tensors():
    yield "numpy", np.zeros((1, 1, 5, 5, 16), "float32")
    yield "none", None
    yield "list", [[1.0]]
    yield "str", "out_backprop"


for what, obj in _not_tensors():
    add(f"dx-filters-{what}", E_TYPE, "filters", lambda obj=obj: dx(filters=obj))
    add(f"dx-out_backprop-{what}", E_TYPE, "out_backprop", lambda obj=obj: dx(out_backprop=obj))
    add(f"dw-input_x-{what}", E_TYPE, "input_x", lambda obj=obj: dw(input_x=obj))
    add(f"dw-out_backprop-{what}", E_TYPE, "out_backprop", lambda obj=obj: dw(out_backprop=obj))


def _symbolic(shape_fn):
    from tvm import te

    return te.placeholder(shape_fn(te.var("n")), name="sym", dtype="float32")


add("dx-symbolic-dy", E_SHAPE, "out_backprop.shape",
    lambda: dx(out_backprop=_symbolic(lambda n: (n, 1, 5, 5, 16))))
add("dw-symbolic-x", E_SHAPE, "input_x.shape",
    lambda: dw(input_x=_symbolic(lambda n: (1, 1, n, 5, 16))))
add("dx-bool-dim", E_TYPE, "out_backprop.shape", lambda: dx(dy=(True, 1, 5, 5, 16)))
add("dx-bool-dim-filters", E_TYPE, "filters.shape", lambda: dx(fz=(9, True, 16, 16)))
add("dw-bool-dim", E_TYPE, "input_x.shape", lambda: dw(x=(True, 1, 5, 5, 16)))
add("dx-channel-fracz", E_CHANNEL, "filters.shape", lambda: dx(fz=(9, 2, 16, 16)))
add("dx-channel-dy-c1", E_CHANNEL, "out_backprop.shape", lambda: dx(dy=(1, 2, 5, 5, 16)))
add("dx-channel-dy-c0", E_CHANNEL, "out_backprop.shape", lambda: dx(dy=(1, 1, 5, 5, 8)))
add("dx-batch", E_SHAPE, "out_backprop.shape[0]", lambda: dx(xs=(2, 16, 5, 5)))
add("dx-cin-vs-groups", E_CHANNEL, "input_sizes[1]", lambda: dx(xs=(1, 24, 5, 5)))
add("dx-geometry-ho", E_GEOMETRY_IN, "out_backprop H", lambda: dx(xs=(1, 16, 6, 5)))
add("dx-geometry-wo", E_GEOMETRY_IN, "out_backprop W", lambda: dx(xs=(1, 16, 5, 7)))
add("dx-geometry-stride", E_GEOMETRY_IN, "out_backprop H", lambda: dx(strides=[2, 1]))
add("dx-kernel-too-big", E_GEOMETRY_OUT, "kernel H",
    lambda: dx(dy=(1, 1, 1, 1, 16), xs=(1, 16, 1, 1), padding=[0, 0, 0, 0]))
add("dx-dilated-too-big", E_GEOMETRY_OUT, "kernel W",
    lambda: dx(dy=(1, 1, 5, 1, 16), padding=[1, 1, 0, 0], dilations=[1, 1, 1, 3]))
add("dw-c1-mismatch", E_CHANNEL, "input_x.shape[1]", lambda: dw(x=(1, 2, 5, 5, 16)))
add("dw-dy-c1-mismatch", E_CHANNEL, "out_backprop.shape[1]", lambda: dw(dy=(1, 2, 5, 5, 16)))
add("dw-geometry-ho", E_GEOMETRY_IN, "out_backprop H", lambda: dw(dy=(1, 1, 4, 5, 16)))
add("dw-kernel-too-big", E_GEOMETRY_OUT, "kernel H",
    lambda: dw(fs=(16, 16, 9, 1), dy=(1, 1, 1, 5, 16)))
# int64 overflow of derived tensors (the arguments fit), refused before anything is compiled;
# tensors past 2**31 elements build with 64-bit indexing (tests/dsl/runtime/test_index64.py)
add("dx-int64-5hd-result", E_SHAPE, "input_sizes",
    lambda: dx(fz=(1, 1, 16, 16), dy=(1, 1, 1, 1, 16), fs=(1, 1, 1, 1),
               xs=(1, 1, 2**30, 2**30), padding=[0, 0, 0, 0], strides=[2**30, 2**30]))
add("dw-int64-padded-x", E_SHAPE, "input_x.shape",
    lambda: dw(x=(1, 1, 2**29, 2**29, 16), dy=(1, 1, 2, 2, 16), fs=(16, 16, 1, 1),
               padding=[2**29] * 4, strides=[2**30, 2**30]))

# groups / group_dict on a grouped dx: Cin 16, Cout 32, groups 2
G_FS, G_XS, G_DY = (32, 8, 3, 3), (1, 16, 5, 5), (1, 2, 5, 5, 16)
G_FZ = layout.GroupLayout.from_weight(G_FS, 2).fracz_shape
G_GD = dsl.calculate_group((1, 32, 5, 5), G_XS, G_FS, 2)


def gdx(**over):
    return dx(fz=G_FZ, dy=G_DY, fs=G_FS, xs=G_XS, **over)


for v, code in ((0, E_GROUPS), (-2, E_GROUPS), (True, E_TYPE), (2.0, E_TYPE), ("2", E_TYPE),
                (None, E_TYPE), (np.float64(2), E_TYPE)):
    add(f"dx-groups-{v!r}", code, "para_dict['groups']", lambda v=v: gdx(groups=v))
    add(f"dw-groups-{v!r}", code, "para_dict['groups']", lambda v=v: dw(groups=v))
add("dx-groups-3", E_CHANNEL, "input_sizes[1]", lambda: gdx(groups=3))
add("dx-groups-wrong-fracz", E_CHANNEL, "filters.shape",
    lambda: dx(fz=(18, 2, 16, 16), dy=G_DY, fs=G_FS, xs=G_XS, groups=2))
add("dw-groups-3", E_CHANNEL, "input_x.shape[1]", lambda: dw(fs=(16, 8, 3, 3), groups=3))
add("dw-groups-not-dividing", E_GROUPS, "groups",
    lambda: dw(x=(1, 1, 5, 5, 16), fs=(16, 5, 3, 3), dy=(1, 1, 5, 5, 16), groups=3))
for key in ("g_extend", "multiple_extend", "dx_c1_extend", "dy_c1_extend", "filter_c_ori"):
    for v in (G_GD[key] + 1, True, float(G_GD[key]), np.array([G_GD[key], 1]), str(G_GD[key]),
              None):
        add(f"dx-group_dict-{key}-{v!r}"[:60], E_GROUPS, f"para_dict['group_dict']['{key}']",
            lambda key=key, v=v: gdx(group_dict={**G_GD, key: v}))
for key in ("g_extend", "groups", "dy_c_ori"):
    add(f"dx-group_dict-missing-{key}", E_GROUPS, f"para_dict['group_dict']['{key}']",
        lambda key=key: gdx(group_dict={k: v for k, v in G_GD.items() if k != key}))
for v in ("NHWC", ["NCHW"], None, 0):
    add(f"dx-group_dict-format-{v!r}", E_GROUPS, "para_dict['group_dict']['filter_ori_format']",
        lambda v=v: gdx(group_dict={**G_GD, "filter_ori_format": v}))
for v in ("gd", [G_GD], None, 7):
    add(f"dx-group_dict-{v!r}"[:60], E_GROUPS, "para_dict['group_dict']",
        lambda v=v: gdx(group_dict=v))
add("dx-group_dict-groups-0", E_GROUPS, "para_dict['group_dict']['groups']",
    lambda: gdx(group_dict={**G_GD, "groups": 0}))
add("dx-group_dict-vs-groups", E_GROUPS, "para_dict['group_dict']['groups']",
    lambda: gdx(group_dict={**G_GD, "groups": 1}, groups=2))

# --- calculate_group ---------------------------------------------------------------------------
CG = ((1, 32, 4, 4), (1, 32, 4, 4), (32, 4, 3, 3), 8)


def cg(i=None, v=None, **kw):
    args = list(CG)
    if i is not None:
        args[i] = v
    return dsl.calculate_group(*args, **kw)


for i, pname in enumerate(("out_backprop_nchw", "input_size_nchw", "w_shape_nchw")):
    for v, code in ((None, E_TYPE), ((1, 32, 4), E_SHAPE), ((1, 0, 4, 4), E_SHAPE),
                    ((1, 32, -4, 4), E_SHAPE), ((1, 32.0, 4, 4), E_TYPE),
                    ((True, 32, 4, 4), E_TYPE), ("1234", E_TYPE)):
        add(f"calc-{pname}-{v!r}", code, pname, lambda i=i, v=v: cg(i, v))
for v, code in ((0, E_GROUPS), (-8, E_GROUPS), (True, E_TYPE), (8.0, E_TYPE), ("8", E_TYPE),
                (None, E_TYPE)):
    add(f"calc-groups-{v!r}", code, "groups", lambda v=v: cg(3, v))
add("calc-groups-5", E_CHANNEL, "input_size_nchw[1]", lambda: cg(3, 5))
add("calc-groups-not-dividing-cout", E_GROUPS, "groups",
    lambda: dsl.calculate_group((1, 30, 4, 4), (1, 28, 4, 4), (30, 4, 3, 3), 7))
add("calc-groups-channel", E_CHANNEL, "input_size_nchw[1]", lambda: cg(3, 4))
add("calc-cout-mismatch", E_CHANNEL, "out_backprop_nchw[1]", lambda: cg(0, (1, 16, 4, 4)))
for v in ("NCDHW", ["NCHW"], None, "nchw", 0):
    add(f"calc-format-{v!r}", E_SHAPE, "filter_ori_format",
        lambda v=v: cg(filter_ori_format=v))
for v in (["float16"], None, "float64"):  # int8 selects c0_size_k = 32
    add(f"calc-dtype-{v!r}", E_TYPE, "filter_dtype", lambda v=v: cg(filter_dtype=v))

# --- layouts: numpy packers and TE computes ------------------------------------------------------
A4 = np.zeros((1, 20, 3, 3), "float32")
A5 = np.zeros((1, 2, 3, 3, 16), "float32")
W4 = np.zeros((16, 16, 3, 3), "float32")
for what, v in (("list", [[[1.0]]]), ("rank2", np.zeros((2, 3))), ("zero-c", np.zeros((1, 0, 3))),
                ("zero-n", np.zeros((0, 4, 3, 3))), ("none", None), ("scalar", np.float32(1))):
    add(f"nchw_to_5hd-{what}", E_SHAPE, "x", lambda v=v: layout.nchw_to_5hd(v))
for what, args, code, param in (
        ("c0-8", (np.zeros((1, 2, 3, 8)), 4), E_SHAPE, "x5"),
        ("rank3", (np.zeros((1, 3, 16)), 4), E_SHAPE, "x5"),
        ("channels-0", (A5, 0), E_SHAPE, "channels"),
        ("channels-33", (A5, 33), E_SHAPE, "channels"),
        ("channels-bool", (A5, True), E_TYPE, "channels"),
        ("channels-float", (A5, 20.0), E_TYPE, "channels"),
        ("channels-none", (A5, None), E_TYPE, "channels"),
        ("list", ([1, 2], 1), E_SHAPE, "x5")):
    add(f"nc1hwc0_to_nchw-{what}", code, param, lambda args=args: layout.nc1hwc0_to_nchw(*args))
for what, args, code, param in (
        ("list", ([1.0], 1), E_TYPE, "w"),
        ("rank3", (np.zeros((16, 16, 3)), 1), E_SHAPE, "w.shape"),
        ("groups-0", (W4, 0), E_GROUPS, "groups"),
        ("groups-3", (W4, 3), E_GROUPS, "groups"),
        ("groups-bool", (W4, True), E_TYPE, "groups"),
        ("groups-float", (W4, 1.0), E_TYPE, "groups"),
        ("zero", (np.zeros((0, 16, 3, 3)), 1), E_SHAPE, "w_shape_nchw")):
    add(f"weight_to_fracz-{what}", code, param, lambda args=args: layout.weight_to_fracz(*args))
for what, args, code, param in (
        ("wrong-shape", (np.zeros((9, 1, 16, 16)), (16, 32, 3, 3), 1), E_SHAPE, "fz.shape"),
        ("w_shape-rank", (np.zeros((9, 1, 16, 16)), (16, 16, 3), 1), E_SHAPE, "w_shape_nchw"),
        ("w_shape-neg", (np.zeros((9, 1, 16, 16)), (16, 16, -3, 3), 1), E_SHAPE,
         "w_shape_nchw"),
        ("list", ([0], (16, 16, 3, 3), 1), E_TYPE, "fz"),
        ("groups-0", (np.zeros((9, 1, 16, 16)), (16, 16, 3, 3), 0), E_GROUPS, "groups")):
    add(f"fracz_to_weight-{what}", code, param, lambda args=args: layout.fracz_to_weight(*args))
for what, fn, code, param in (
        ("5hd-numpy", lambda: layout.nchw_to_5hd_compute(A4), E_TYPE, "x"),
        ("5hd-rank2", lambda: layout.nchw_to_5hd_compute(ph((2, 3))), E_SHAPE, "x.shape"),
        ("5hd-zero", lambda: layout.nchw_to_5hd_compute(ph((1, 0, 3))), E_SHAPE, "x.shape"),
        ("5hd-symbolic", lambda: layout.nchw_to_5hd_compute(_symbolic(lambda n: (1, n, 3))),
         E_SHAPE, "x.shape"),
        ("5hd-bool-dim", lambda: layout.nchw_to_5hd_compute(ph((True, 3, 3))), E_TYPE,
         "x.shape"),
        ("5hd-int64", lambda: layout.nchw_to_5hd_compute(ph((1, 1, 2**30, 2**30))), E_SHAPE,
         "x.shape"),
        ("from5hd-channels-33", lambda: layout.nc1hwc0_to_nchw_compute(ph((1, 2, 3, 3, 16)), 33),
         E_SHAPE, "channels"),
        ("from5hd-channels-0", lambda: layout.nc1hwc0_to_nchw_compute(ph((1, 2, 3, 3, 16)), 0),
         E_SHAPE, "channels"),
        ("from5hd-channels-bool",
         lambda: layout.nc1hwc0_to_nchw_compute(ph((1, 2, 3, 3, 16)), True), E_TYPE,
         "channels"),
        ("from5hd-c0-8", lambda: layout.nc1hwc0_to_nchw_compute(ph((1, 2, 3, 3, 8)), 4), E_SHAPE,
         "x5.shape"),
        ("from5hd-numpy", lambda: layout.nc1hwc0_to_nchw_compute(A5, 4), E_TYPE, "x5"),
        ("fracz-numpy", lambda: layout.weight_to_fracz_compute(W4), E_TYPE, "w"),
        ("fracz-rank3", lambda: layout.weight_to_fracz_compute(ph((16, 16, 3))), E_SHAPE,
         "w.shape"),
        ("fracz-groups-0", lambda: layout.weight_to_fracz_compute(ph((16, 16, 3, 3)), 0),
         E_GROUPS, "groups"),
        ("weight-wrong-fz", lambda: layout.fracz_to_weight_compute(ph((9, 2, 16, 16)),
                                                                   (16, 16, 3, 3)),
         E_SHAPE, "fz.shape"),
        ("weight-numpy", lambda: layout.fracz_to_weight_compute(np.zeros((9, 1, 16, 16)),
                                                                (16, 16, 3, 3)),
         E_TYPE, "fz")):
    add(f"te-{what}", code, param, fn)


# --- auto_schedule / build ---------------------------------------------------------------------

def _dx_graph():
    w, dy = ph((9, 1, 16, 16), name="filters"), ph((1, 1, 5, 5, 16), name="out_backprop")
    return w, dy, dx(filters=w, out_backprop=dy, res_dtype="float32")


def _foreign_compute():
    from tvm import te

    q = ph((3,), name="q")
    return te.compute((3,), lambda i: q[i] * 2.0, name="other")


def bld(config_over=None, sch=UNSET, tensors=None, drop=()):
    w, dy, out = _dx_graph()
    cfg = {"name": "hostile", "tensor_list": [w, dy, out] if tensors is None else tensors(
        w, dy, out), "kernel_meta_parent_dir": "."}
    cfg.update(config_over or {})
    for k in drop:
        cfg.pop(k)
    return dsl.build(dsl.auto_schedule(out) if sch is UNSET else sch, cfg)


for v in (None, [], "x", [None], (1, 2), np.zeros(3)):
    add(f"auto_schedule-res-{v!r}"[:60], E_VALUE, "res", lambda v=v: dsl.auto_schedule(v))
for v in ("bogus", 5, "", "x86-avx1024"):
    add(f"auto_schedule-target-{v!r}", E_VALUE, "target",
        lambda v=v: dsl.auto_schedule(_dx_graph()[2], target=v))
for v in (None, "sch", 5):
    add(f"build-sch-{v!r}", E_TYPE, "sch", lambda v=v: bld(sch=v))
add("build-sch-tensor", E_TYPE, "sch", lambda: bld(sch=_dx_graph()[2]))
for v in (None, [], "cfg", 1):
    add(f"build-config-{v!r}", E_TYPE, "config",
        lambda v=v: dsl.build(dsl.auto_schedule(_dx_graph()[2]), v))
add("build-no-name", E_VALUE, "config['name']", lambda: bld(drop=("name",)))
for v in BAD_NAMES:
    add(f"build-name-{v!r}"[:60], E_NAME, "config['name']", lambda v=v: bld({"name": v}))
for what, tl, code, param in (
        ("none", lambda w, dy, o: None, E_TYPE, "config['tensor_list']"),
        ("str", lambda w, dy, o: "w,dy,dx", E_TYPE, "config['tensor_list']"),
        ("numpy", lambda w, dy, o: [w, dy, np.zeros(3)], E_TYPE, "config['tensor_list']"),
        ("missing-output", lambda w, dy, o: [w, dy], E_VALUE, "config['tensor_list']"),
        ("missing-input", lambda w, dy, o: [w, o], E_VALUE, "config['tensor_list']"),
        ("foreign-compute", lambda w, dy, o: [w, dy, o, _foreign_compute()], E_VALUE,
         "config['tensor_list'][3]"),
        ("duplicate", lambda w, dy, o: [w, w, dy, o], E_VALUE, "config['tensor_list'][1]"),
        ("duplicate-out", lambda w, dy, o: [w, dy, o, o], E_VALUE, "config['tensor_list'][3]"),
        ("intermediate", lambda w, dy, o: [w, dy, o.op.input_tensors[0], o], E_VALUE,
         "config['tensor_list'][2]")):
    add(f"build-tensor_list-{what}", code, param, lambda tl=tl: bld(tensors=tl))
for k, v, code in (("bogus", 1, E_VALUE), ("print_ir", 1, E_TYPE), ("need_build", "yes", E_TYPE),
                   ("print_ir", None, E_TYPE), ("need_build", 0, E_TYPE),
                   ("kernel_meta_parent_dir", 5, E_TYPE),
                   ("kernel_meta_parent_dir", b"/tmp", E_TYPE),
                   ("kernel_meta_parent_dir", "a\x00b", E_TYPE),
                   ("kernel_meta_parent_dir", ["."], E_TYPE)):
    add(f"build-{k}-{v!r}", code, f"config['{k}']", lambda k=k, v=v: bld({k: v}))


def _parent_is_file():
    Path("afile").write_text("x")
    return bld({"kernel_meta_parent_dir": "afile"})


def _kernel_meta_symlink():
    os.makedirs("elsewhere")
    os.symlink("elsewhere", "kernel_meta")
    return bld()


def _lock_symlink():
    """A planted lock symlink must not make build create (or lock) a file outside."""
    os.makedirs("kernel_meta")
    os.symlink("../planted_target", "kernel_meta/.hostile.lock")
    return bld()


def _placeholder_output():
    p = ph((4, 4), name="p")
    return dsl.build(dsl.auto_schedule(p), {"name": "k", "tensor_list": [p]})


def _bool_dim_placeholder():
    from tvm import te

    p = ph((True, 4), name="p")
    out = te.compute((1, 4), lambda i, j: p[i, j] * 2.0, name="double")
    return dsl.build(dsl.auto_schedule(out), {"name": "k", "tensor_list": [p, out]})


def _giant_stage():
    from tvm import te

    p = ph((2**32,), name="p")
    big = te.compute((2**32, 2**32), lambda i, j: p[i] * p[j], name="outer")
    return dsl.build(dsl.auto_schedule(big), {"name": "k", "tensor_list": [p, big]})


add("build-parent-is-file", E_FILE, "config['kernel_meta_parent_dir']", _parent_is_file)
add("build-kernel_meta-symlink", E_FILE, "config['kernel_meta_parent_dir']",
    _kernel_meta_symlink)
add("build-lock-symlink", E_FILE, "config['kernel_meta_parent_dir']", _lock_symlink)
add("build-placeholder-output", E_VALUE, "sch", _placeholder_output)
add("build-bool-dim", E_TYPE, "config['tensor_list']", _bool_dim_placeholder)
add("build-int64-stage", E_SHAPE, "config['tensor_list']", _giant_stage)


def _graph_io():
    w, dy, out = _dx_graph()
    return [w, dy], [out]


for v in ("../evil", "a/b", "9lives", "x" * 180, "a.b", "a\n"):
    # a signature of its own per case: a memory-cache hit would skip the name check
    add(f"kernel_cache-prefix-{v!r}"[:60], E_NAME, "config['name']",
        lambda v=v: kernel_cache.get_kernel({"rel-prefix": v}, _graph_io, prefix=v))
add("kernel_cache-target", E_VALUE, "target",
    lambda: kernel_cache.get_kernel({"rel": 1}, _graph_io, prefix="k", target="bogus"))


# --- load ---------------------------------------------------------------------------------------

def build_golden(parent: Path) -> None:
    """The kernel every load / call case starts from (built once per session)."""
    w, dy, out = _dx_graph()
    dsl.build(dsl.auto_schedule(out), {"name": KNAME, "tensor_list": [w, dy, out],
                                       "kernel_meta_parent_dir": str(parent)})


def _json(kdir):
    return kdir / "kernel_meta" / f"{KNAME}.json"


def _edit_json(kdir, fn):
    js = _json(kdir)
    meta = json.loads(js.read_text())
    js.write_text(json.dumps(fn(meta)))


def _load_after(fn):
    def call(kdir):
        fn(kdir)
        return dsl.load(KNAME, kdir)
    return call


for v in BAD_NAMES:
    add(f"load-name-{v!r}"[:60], E_NAME, "name", lambda kdir, v=v: dsl.load(v, kdir))
for v in (5, b"/tmp", "a\x00b", ["."]):
    add(f"load-parent-{v!r}", E_TYPE, "kernel_meta_parent_dir", lambda kdir, v=v: dsl.load(
        KNAME, v))
add("load-missing", E_FILE, "name", lambda kdir: dsl.load("absent", kdir))
add("load-missing-json", E_FILE, "name", _load_after(lambda kdir: _json(kdir).unlink()))
add("load-missing-so", E_FILE, "name",
    _load_after(lambda kdir: (kdir / "kernel_meta" / f"{KNAME}.so").unlink()))
MALFORMED = {
    "truncated": lambda kdir: _json(kdir).write_text(_json(kdir).read_text()[:40]),
    "empty": lambda kdir: _json(kdir).write_text(""),
    "binary": lambda kdir: _json(kdir).write_bytes(b"\xff\xfe\x00garbage"),
    "array": lambda kdir: _json(kdir).write_text("[1, 2]"),
    "nested-bomb": lambda kdir: _json(kdir).write_text("[" * 100_000 + "]" * 100_000),
    "nan-sha": lambda kdir: _edit_json(kdir, lambda m: {**m, "sha256": float("nan")}),
    "string": lambda kdir: _json(kdir).write_text('"kernel"'),
    "no-sha": lambda kdir: _edit_json(kdir, lambda m: {k: v for k, v in m.items()
                                                       if k != "sha256"}),
    "sha-int": lambda kdir: _edit_json(kdir, lambda m: {**m, "sha256": 0}),
    "tensors-dict": lambda kdir: _edit_json(kdir, lambda m: {**m, "tensors": {}}),
    "tensor-no-shape": lambda kdir: _edit_json(kdir, lambda m: {**m, "tensors": [
        {k: v for k, v in t.items() if k != "shape"} for t in m["tensors"]]}),
    "tensor-shape-neg": lambda kdir: _edit_json(kdir, lambda m: {**m, "tensors": [
        {**t, "shape": [-1]} for t in m["tensors"]]}),
    "tensor-shape-str": lambda kdir: _edit_json(kdir, lambda m: {**m, "tensors": [
        {**t, "shape": "1,2"} for t in m["tensors"]]}),
    "tensor-role": lambda kdir: _edit_json(kdir, lambda m: {**m, "tensors": [
        {**t, "role": "weird"} for t in m["tensors"]]}),
    "tensor-dtype": lambda kdir: _edit_json(kdir, lambda m: {**m, "tensors": [
        {**t, "dtype": 32} for t in m["tensors"]]}),
    "tensor-list-of-str": lambda kdir: _edit_json(kdir, lambda m: {**m, "tensors": ["a"]}),
    "no-output": lambda kdir: _edit_json(kdir, lambda m: {**m, "tensors": [
        t for t in m["tensors"] if t["role"] == "input"]}),
    "versions-list": lambda kdir: _edit_json(kdir, lambda m: {**m, "versions": [1]}),
    "target-str": lambda kdir: _edit_json(kdir, lambda m: {**m, "target": "host"}),
    "function-int": lambda kdir: _edit_json(kdir, lambda m: {**m, "function": 3}),
}
for what, fn in MALFORMED.items():
    add(f"load-json-{what}", E_FILE, "kernel json", _load_after(fn))


def _so(kdir):
    return kdir / "kernel_meta" / f"{KNAME}.so"


def _replace_so(data: bytes):
    def fn(kdir):
        _so(kdir).write_bytes(data)
        _edit_json(kdir, lambda m: {**m, "sha256": __import__("hashlib").sha256(
            data).hexdigest()})
    return fn


add("load-so-appended", E_FILE, "kernel .so",
    _load_after(lambda kdir: _so(kdir).write_bytes(_so(kdir).read_bytes() + b"\0")))
add("load-so-truncated", E_FILE, "kernel .so",
    _load_after(lambda kdir: _so(kdir).write_bytes(_so(kdir).read_bytes()[:1000])))
add("load-so-garbage-matching-sha", E_FILE, "kernel .so", _load_after(_replace_so(b"\x7fELF" +
                                                                                  b"x" * 64)))
add("load-so-empty-matching-sha", E_FILE, "kernel .so", _load_after(_replace_so(b"")))
add("load-so-no-such-function", E_FILE, "kernel .so",
    _load_after(lambda kdir: _edit_json(kdir, lambda m: {**m, "function": "nope"})))
add("load-old-dsl", E_FILE, "kernel json versions", _load_after(lambda kdir: _edit_json(
    kdir, lambda m: {**m, "versions": {**m["versions"], "dsl": "0.0.1"}})))
add("load-json-format", E_FILE, "kernel json versions", _load_after(lambda kdir: _edit_json(
    kdir, lambda m: {**m, "versions": {**m["versions"], "json_format": 99}})))
add("load-foreign-target", E_FILE, "kernel json target", _load_after(lambda kdir: _edit_json(
    kdir, lambda m: {**m, "target": {**m["target"], "name": "riscv"}})))
add("load-foreign-llvm", E_FILE, "kernel json target", _load_after(lambda kdir: _edit_json(
    kdir, lambda m: {**m, "target": {**m["target"], "llvm": {"kind": "llvm",
                                                              "mtriple": "aarch64"}}})))


# --- Kernel.__call__ --------------------------------------------------------------------------

def good_args():
    rng = np.random.default_rng(0)
    return (rng.uniform(-1, 1, (9, 1, 16, 16)).astype("float32"),
            rng.uniform(-1, 1, (1, 1, 5, 5, 16)).astype("float32"))


def _call(transform):
    def call(kdir):
        return dsl.load(KNAME, kdir)(*transform(*good_args()))
    return call


def _ro(a):
    a.flags.writeable = False
    return a


OUT = (1, 1, 5, 5, 16)
for what, tf, code, param in (
        ("no-args", lambda w, y: (), E_VALUE, "rel_k(...)"),
        ("one-arg", lambda w, y: (w,), E_VALUE, "rel_k(...)"),
        ("four-args", lambda w, y: (w, y, np.empty(OUT, "float32"), w), E_VALUE, "rel_k(...)"),
        ("list", lambda w, y: (w.tolist(), y), E_TYPE, "argument 0"),
        ("none", lambda w, y: (None, y), E_TYPE, "argument 0"),
        ("memoryview", lambda w, y: (w, memoryview(y)), E_TYPE, "argument 1"),
        ("masked", lambda w, y: (np.ma.masked_array(w, mask=w > 0), y), E_TYPE, "argument 0"),
        ("wrong-shape", lambda w, y: (w[:1], y), E_SHAPE, "argument 0"),
        ("transposed", lambda w, y: (w.transpose(1, 0, 2, 3), y), E_SHAPE, "argument 0"),
        ("0-d", lambda w, y: (np.ones((), "float32"), y), E_SHAPE, "argument 0"),
        ("np-scalar", lambda w, y: (np.float32(1.0), y), E_TYPE, "argument 0"),
        ("flat-wrong-size", lambda w, y: (w.ravel()[:-1], y), E_SHAPE, "argument 0"),
        ("float64", lambda w, y: (w.astype("float64"), y), E_TYPE, "argument 0"),
        ("float16", lambda w, y: (w, y.astype("float16")), E_TYPE, "argument 1"),
        ("big-endian", lambda w, y: (w.astype(">f4"), y), E_TYPE, "argument 0"),
        ("object", lambda w, y: (w.astype(object), y), E_TYPE, "argument 0"),
        ("int32", lambda w, y: (w.astype("int32"), y), E_TYPE, "argument 0"),
        ("out-readonly", lambda w, y: (w, y, _ro(np.empty(OUT, "float32"))), E_VALUE,
         "output 0"),
        ("out-flat-readonly", lambda w, y: (w, y, _ro(np.empty(400, "float32"))), E_VALUE,
         "output 0"),
        ("out-wrong-shape", lambda w, y: (w, y, np.empty((1, 1, 5, 5, 8), "float32")), E_SHAPE,
         "argument 2"),
        ("out-wrong-size", lambda w, y: (w, y, np.empty(401, "float32")), E_SHAPE,
         "argument 2"),
        ("out-wrong-dtype", lambda w, y: (w, y, np.empty(OUT, "float16")), E_TYPE,
         "argument 2"),
        ("out-list", lambda w, y: (w, y, [0.0] * 400), E_TYPE, "argument 2")):
    add(f"call-{what}", code, param, _call(tf))


def _tampered_shape(kdir):
    """A .json whose shapes no longer match the .so (the sha256 covers only the .so)."""
    _edit_json(kdir, lambda m: {**m, "tensors": [
        {**t, "shape": [2, *t["shape"][1:]] if t["name"] != "filters" else t["shape"]}
        for t in m["tensors"]]})
    w, y = good_args()
    return dsl.load(KNAME, kdir)(w, np.concatenate([y, y]))


def _tampered_dtype(kdir):
    _edit_json(kdir, lambda m: {**m, "tensors": [{**t, "dtype": "float16"}
                                                 for t in m["tensors"]]})
    w, y = good_args()
    return dsl.load(KNAME, kdir)(w.astype("float16"), y.astype("float16"))


add("call-json-shape-disagrees-with-so", E_FILE, "rel_k(...)", _tampered_shape)
add("call-json-dtype-disagrees-with-so", E_FILE, "rel_k(...)", _tampered_dtype)


def needs_kdir(call) -> bool:
    return "kdir" in inspect.signature(call).parameters


def copy_golden(golden: Path, dest: Path) -> Path:
    shutil.copytree(golden, dest)
    return dest
