"""Hostile-input corpus for the operators built on the core: aclnn convolution_backward and
avg_pool2d_backward (numpy), their TE forms, deconv_grad_filter (TE) and the DeconvGradFilter
``param[]`` calls. Same contract as ``rel_corpus.py``: ``(id, code, param, call)``.
"""

from __future__ import annotations

import numpy as np

import dsl
from dsl.errors import (
    E_CHANNEL,
    E_DTYPE,
    E_DTYPE_MISMATCH,
    E_GEOMETRY_IN,
    E_GEOMETRY_OUT,
    E_GROUPS,
    E_RANGE,
    E_SHAPE,
    E_TYPE,
    E_VALUE,
)

OPS_CASES: list[tuple[str, str, str, object]] = []
# Refused correctly but only after something was written: known bugs of those modules (not
# ours to fix), kept strict so the entry fails loudly once the owner fixes it.
KNOWN_BUGS: dict[str, str] = {}


def add(cid, code, param, call):
    assert cid not in {c[0] for c in OPS_CASES}, cid
    OPS_CASES.append((cid, code, param, call))


def f32(*shape):
    return np.ones(shape, "float32")


def lazy_huge(*shape):
    """A huge array that costs no memory (every element aliases one value)."""
    return np.broadcast_to(np.float32(1), shape)


def _ro(a):
    a.setflags(write=False)
    return a


# --- dsl.aclnn.convolution_backward ------------------------------------------------------------

def cb(**over):
    from dsl import aclnn

    args = {"grad_output": f32(1, 4, 5, 5), "input": f32(1, 2, 5, 5), "weight": f32(4, 2, 1, 1),
            "bias_sizes": [4], "stride": [1, 1], "padding": [0, 0], "dilation": [1, 1],
            "transposed": False, "output_padding": [0, 0], "groups": 1,
            "output_mask": [True, True, True]}
    return aclnn.convolution_backward(**{**args, **over})


for cid, over, code, param in (
        ("stride-0", {"stride": [0, 1]}, E_RANGE, "stride[0]"),
        ("stride-bool", {"stride": [True, 1]}, E_TYPE, "stride[0]"),
        ("stride-np-scalar", {"stride": np.int64(1)}, E_TYPE, "stride"),
        ("stride-short", {"stride": [1]}, E_SHAPE, "stride"),
        ("stride-huge", {"stride": [2**40, 1]}, E_RANGE, "stride[0]"),
        ("padding-neg", {"padding": [-1, 0]}, E_RANGE, "padding[0]"),
        ("padding-float", {"padding": [1.5, 0]}, E_TYPE, "padding[0]"),
        ("padding-3", {"padding": [0, 0, 0]}, E_SHAPE, "padding"),
        ("padding-geometry", {"padding": [1, 1, 1, 1]}, E_GEOMETRY_IN, "grad_output H"),
        ("dilation-0", {"dilation": [0, 1]}, E_RANGE, "dilation[0]"),
        ("dilation-3", {"dilation": [1, 1, 1]}, E_SHAPE, "dilation"),
        ("groups-0", {"groups": 0}, E_GROUPS, "groups"),
        ("groups-bool", {"groups": True}, E_TYPE, "groups"),
        ("groups-float", {"groups": 2.0}, E_TYPE, "groups"),
        ("groups-3", {"groups": 3}, E_CHANNEL, "input.shape[1]"),
        ("mask-ints", {"output_mask": [1, 1, 1]}, E_TYPE, "output_mask[0]"),
        ("mask-str", {"output_mask": "yes"}, E_TYPE, "output_mask"),
        ("mask-short", {"output_mask": [True, True]}, E_SHAPE, "output_mask"),
        ("mask-none", {"output_mask": None}, E_TYPE, "output_mask"),
        ("transposed-int", {"transposed": 1}, E_TYPE, "transposed"),
        ("transposed-none", {"transposed": None}, E_TYPE, "transposed"),
        ("output_padding-neg", {"output_padding": [-1, 0]}, E_RANGE, "output_padding[0]"),
        ("bias-wrong", {"bias_sizes": [5]}, E_CHANNEL, "bias_sizes"),
        ("bias-none", {"bias_sizes": None}, E_VALUE, "bias_sizes"),
        ("bias-str", {"bias_sizes": "4"}, E_TYPE, "bias_sizes"),
        ("bias-bool", {"bias_sizes": [True]}, E_TYPE, "bias_sizes[0]"),
        ("cube-7", {"cube_math_type": 7}, E_RANGE, "cube_math_type"),
        ("cube-bool", {"cube_math_type": True}, E_TYPE, "cube_math_type"),
        ("cube-none", {"cube_math_type": None}, E_TYPE, "cube_math_type"),
        ("go-rank3", {"grad_output": f32(1, 4, 5)}, E_SHAPE, "grad_output.shape"),
        ("go-ho", {"grad_output": f32(1, 4, 6, 5)}, E_GEOMETRY_IN, "grad_output H"),
        ("go-channels", {"grad_output": f32(1, 3, 5, 5)}, E_CHANNEL, "grad_output.shape[1]"),
        ("go-complex", {"grad_output": np.ones((1, 4, 5, 5), "complex64")}, E_DTYPE,
         "grad_output.dtype"),  # float64 is accepted (accumulated in float64, for gradcheck)
        ("go-int32", {"grad_output": np.ones((1, 4, 5, 5), "int32")}, E_DTYPE,
         "grad_output.dtype"),
        ("go-list", {"grad_output": [[1.0]]}, E_TYPE, "grad_output"),
        ("go-object", {"grad_output": f32(1, 4, 5, 5).astype(object)}, E_DTYPE,
         "grad_output.dtype"),
        ("go-masked", {"grad_output": np.ma.masked_array(f32(1, 4, 5, 5))}, E_TYPE,
         "grad_output"),
        ("input-none", {"input": None}, E_TYPE, "input"),
        ("weight-cin", {"weight": f32(4, 3, 1, 1)}, E_CHANNEL, "input.shape[1]"),
        ("weight-kernel", {"weight": f32(4, 2, 9, 9)}, E_GEOMETRY_OUT, "kernel H"),
        ("weight-big-endian", {"weight": np.ones((4, 2, 1, 1), ">f4")}, E_DTYPE, "weight.dtype"),
        ("weight-zero", {"weight": f32(0, 2, 1, 1)}, E_SHAPE, "weight.shape[0]"),
        ("input-zero-n", {"input": f32(0, 2, 5, 5)}, E_SHAPE, "grad_output.shape[0]"),
        ("input-zero-c", {"input": f32(1, 0, 5, 5)}, E_CHANNEL, "input.shape[1]"),
        # numpy arrays stay under 2**63 elements; a padded copy of one need not
        ("input-int64-overflow", {"grad_output": f32(1, 4, 3, 3),
                                  "input": lazy_huge(1, 1, 2**30, 2**30),
                                  "weight": f32(4, 1, 1, 1), "padding": [2**31 - 1] * 2,
                                  "stride": [2**31 - 1] * 2}, E_SHAPE, "padded X")):
    add(f"aclnn-conv-{cid}", code, param, lambda over=over: cb(**over))


# --- dsl.aclnn.avg_pool2d_backward -------------------------------------------------------------

def ap(**over):
    from dsl import aclnn

    args = {"grad_output": f32(1, 2, 2, 2), "self": f32(1, 2, 4, 4), "kernel_size": [2, 2],
            "stride": [2, 2], "padding": [0, 0], "ceil_mode": False, "count_include_pad": True,
            "divisor_override": 0}
    return aclnn.avg_pool2d_backward(**{**args, **over})


for cid, over, code, param in (
        ("kernel-0", {"kernel_size": [0, 2]}, E_RANGE, "kernel_size[0]"),
        ("kernel-empty", {"kernel_size": []}, E_SHAPE, "kernel_size"),
        ("kernel-3", {"kernel_size": [2, 2, 2]}, E_SHAPE, "kernel_size"),
        ("kernel-bool", {"kernel_size": [True, 2]}, E_TYPE, "kernel_size[0]"),
        ("kernel-int", {"kernel_size": 2}, E_TYPE, "kernel_size"),
        ("stride-0", {"stride": [0, 2]}, E_RANGE, "stride[0]"),
        ("stride-float", {"stride": [2.0, 2]}, E_TYPE, "stride[0]"),
        ("padding-big", {"padding": [2, 0]}, E_RANGE, "padding"),
        ("padding-neg", {"padding": [-1, 0]}, E_RANGE, "padding[0]"),
        ("ceil-int", {"ceil_mode": 1}, E_TYPE, "ceil_mode"),
        ("ceil-none", {"ceil_mode": None}, E_TYPE, "ceil_mode"),
        ("count-str", {"count_include_pad": "no"}, E_TYPE, "count_include_pad"),
        ("divisor-float", {"divisor_override": 1.5}, E_TYPE, "divisor_override"),
        ("divisor-bool", {"divisor_override": True}, E_TYPE, "divisor_override"),
        ("divisor-huge", {"divisor_override": 2**70}, E_RANGE, "divisor_override"),
        ("divisor-none", {"divisor_override": None}, E_TYPE, "divisor_override"),
        ("cube-9", {"cube_math_type": 9}, E_RANGE, "cube_math_type"),
        ("dy-ho", {"grad_output": f32(1, 2, 3, 2)}, E_GEOMETRY_IN, "grad_output"),
        ("dy-channels", {"grad_output": f32(1, 3, 2, 2)}, E_CHANNEL, "grad_output"),
        ("dy-float64", {"grad_output": np.ones((1, 2, 2, 2))}, E_DTYPE_MISMATCH,
         "grad_output.dtype"),
        ("dy-int8", {"grad_output": np.ones((1, 2, 2, 2), "int8"),
                     "self": np.ones((1, 2, 4, 4), "int8")}, E_DTYPE, "dtype"),
        ("self-float16", {"self": np.ones((1, 2, 4, 4), "float16")}, E_DTYPE_MISMATCH,
         "grad_output.dtype"),
        ("self-rank3", {"self": f32(1, 2, 4)}, E_SHAPE, "grad_output.shape"),
        ("dy-list", {"grad_output": [1]}, E_TYPE, "grad_output"),
        ("dy-masked", {"grad_output": np.ma.masked_array(f32(1, 2, 2, 2))}, E_TYPE,
         "grad_output"),
        ("self-zero-c", {"self": f32(1, 0, 4, 4)}, E_SHAPE, "self.shape[1]"),
        ("dy-zero-c", {"grad_output": f32(1, 0, 2, 2)}, E_SHAPE, "grad_output.shape[1]"),
        ("self-zero-n", {"self": f32(0, 2, 4, 4)}, E_SHAPE, "self.shape[0]")):
    add(f"aclnn-avgpool-{cid}", code, param, lambda over=over: ap(**over))


# --- TE forms ------------------------------------------------------------------------------------

def ph(shape, dtype="float32", name="t"):
    from tvm import te

    return te.placeholder(shape, name=name, dtype=dtype)


def _sym(*shape):
    from tvm import te

    return ph(tuple(te.var("n") if d is None else d for d in shape))


CB_REST = ([4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, True])
add("te-conv-numpy", E_TYPE, "grad_output",
    lambda: dsl.convolution_backward(f32(1, 4, 5, 5), ph((1, 2, 5, 5)), ph((4, 2, 1, 1)),
                                     *CB_REST))
add("te-conv-symbolic", E_SHAPE, "grad_output.shape",
    lambda: dsl.convolution_backward(_sym(None, 4, 5, 5), ph((1, 2, 5, 5)), ph((4, 2, 1, 1)),
                                     *CB_REST))
add("te-avgpool-numpy", E_TYPE, "grad_output",
    lambda: dsl.avg_pool2d_backward(f32(1, 2, 2, 2), ph((1, 2, 4, 4)), [2, 2], [2, 2], [0, 0],
                                    False, True, 0))


def _build_all(outs, name="bool_dim"):
    """Build a TE operator's outputs (default argument order) into the working directory."""
    outs = [t for t in (outs if isinstance(outs, (list, tuple)) else [outs]) if t is not None]
    sch = dsl.auto_schedule(outs)
    return dsl.build(sch, {"name": name, "tensor_list": sch.default_tensor_list()})


# A placeholder whose shape holds a bool (int(True) == 1) once passed the TE operators' checks
# and failed in LLVM; the shared dsl.errors.te_shape now refuses it when the op is defined.
add("te-conv-bool-dim", E_TYPE, "grad_output.shape",
    lambda: _build_all(dsl.convolution_backward(ph((True, 4, 5, 5), name="go"),
                                                ph((1, 2, 5, 5)), ph((4, 2, 1, 1)), *CB_REST)))
add("te-avgpool-bool-dim", E_TYPE, "grad_output.shape",
    lambda: _build_all(dsl.avg_pool2d_backward(ph((True, 2, 2, 2), name="go"),
                                               ph((1, 2, 4, 4)), [2, 2], [2, 2], [0, 0], False,
                                               True, 0)))


def _dgf(**kw):
    from dsl.ops.deconv_grad_filter import deconv_grad_filter

    dy = kw.pop("dy") if "dy" in kw else ph((1, 3, 3, 2), name="dy")
    x = kw.pop("x") if "x" in kw else ph((1, 3, 3, 2), name="x")
    return deconv_grad_filter(dy, x, **{"kernel": 2, **kw})


for cid, kw, code, param in (
        ("kernel-0", {"kernel": 0}, E_SHAPE, "kernel[0]"),
        ("kernel-bool", {"kernel": True}, E_TYPE, "kernel[0]"),
        ("kernel-3", {"kernel": (2, 2, 2)}, E_SHAPE, "kernel"),
        ("kernel-str", {"kernel": "2"}, E_TYPE, "kernel[0]"),
        ("kernel-float", {"kernel": 2.0}, E_TYPE, "kernel[0]"),
        ("stride-0", {"stride": 0}, E_RANGE, "stride[0]"),
        ("stride-1-elem", {"stride": (1,)}, E_SHAPE, "stride"),
        ("pad-neg", {"pad": -1}, E_RANGE, "pad[0]"),
        ("dilation-0", {"dilation": 0}, E_RANGE, "dilation[0]"),
        ("group-0", {"group": 0}, E_GROUPS, "group"),
        ("group-3", {"group": 3}, E_CHANNEL, "x.shape[3]"),
        ("group-bool", {"group": True}, E_TYPE, "group"),
        ("dy-numpy", {"dy": f32(1, 3, 3, 2)}, E_TYPE, "dy"),
        ("dtype-int8", {"dy": ph((1, 3, 3, 2), "int8"), "x": ph((1, 3, 3, 2), "int8")}, E_DTYPE,
         "x.dtype")):
    add(f"te-deconv-{cid}", code, param, lambda kw=kw: _dgf(**dict(kw)))
add("te-deconv-bool-dim", E_TYPE, "dy.shape",
    lambda: _build_all(_dgf(dy=ph((True, 3, 3, 2), name="dy"))))


# --- dsl.deconvgradfilter param[] ---------------------------------------------------------------
P = [1, 3, 3, 2, 1, 3, 3, 2, 2, 2, 1, 1, 0, 0, 1, 1, 1]


def dg(p=None, dy=None, x=None, dw=None, mask=1, private=False, half=False):
    from dsl import deconvgradfilter as m

    dy = f32(1, 3, 3, 2) if dy is None else dy
    x = f32(1, 3, 3, 2) if x is None else x
    dw = np.zeros(16, "float32") if dw is None else dw
    p = P if p is None else p
    if private:
        fn = m.hp_deconv_grad_filter_p if half else m.fp_deconv_grad_filter_p
        return fn(dy, x, dw, p)
    fn = m.hp_deconv_grad_filter_s if half else m.fp_deconv_grad_filter_s
    return fn(dy, x, dw, p, mask)


def _p(i, v):
    p = list(P)
    p[i] = v
    return p


for i, v, code, param in ((0, 0, E_SHAPE, "param[0]"), (0, -1, E_SHAPE, "param[0]"),
                          (1, 0, E_SHAPE, "param[1]"), (3, 3, E_SHAPE, "x.size"),
                          (7, 0, E_SHAPE, "param[7]"), (8, 0, E_SHAPE, "param[8]"),
                          (10, 0, E_RANGE, "param[10]"), (12, -1, E_RANGE, "param[12]"),
                          (14, 0, E_RANGE, "param[14]"), (16, 0, E_GROUPS, "param[16]"),
                          (16, 3, E_CHANNEL, "param[3]"), (0, True, E_TYPE, "param[0]"),
                          (1, 2.0, E_TYPE, "param[1]"), (1, "3", E_TYPE, "param[1]"),
                          (16, None, E_TYPE, "param[16]"), (8, 100, E_SHAPE, "dw.size"),
                          (5, 2**62, E_SHAPE, "param[")):
    for private in (False, True):
        add(f"deconv-param[{i}]={v!r}-{'p' if private else 's'}", code, param,
            lambda i=i, v=v, private=private: dg(_p(i, v), private=private))
for cid, kw, code, param in (
        ("param-short", {"p": P[:16]}, E_SHAPE, "param"),
        ("param-str", {"p": "12345678901234567"}, E_TYPE, "param"),
        ("param-int", {"p": 17}, E_TYPE, "param"),
        ("param-bytes", {"p": b"x" * 17}, E_TYPE, "param"),
        ("param-float-array", {"p": np.array(P, float)}, E_TYPE, "param"),
        ("param-2d", {"p": np.array([P])}, E_TYPE, "param"),
        ("param-uint64-huge", {"p": np.array(_p(5, 2**63), np.uint64)}, E_SHAPE, "param["),
        ("param-no-tap", {"p": [1, 3, 3, 2, 1, 1, 1, 2, 1, 1, 1, 1, 5, 5, 1, 1, 1],
                          "dy": f32(1, 1, 1, 2), "dw": np.zeros(4, "float32")}, E_GEOMETRY_OUT,
         "param[5]"),
        ("mask-0", {"mask": 0}, E_RANGE, "core_mask"),
        ("mask-neg", {"mask": -1}, E_RANGE, "core_mask"),
        ("mask-beyond", {"mask": 2**40}, E_RANGE, "core_mask"),
        ("mask-bool", {"mask": True}, E_TYPE, "core_mask"),
        ("mask-float", {"mask": 1.0}, E_TYPE, "core_mask"),
        ("mask-none", {"mask": None}, E_TYPE, "core_mask"),
        ("mask-str", {"mask": "1"}, E_TYPE, "core_mask"),
        ("dw-readonly", {"dw": _ro(np.zeros(16, "float32"))}, E_VALUE, "dw"),
        ("dw-size", {"dw": np.zeros(15, "float32")}, E_SHAPE, "dw.size"),
        ("dw-float64", {"dw": np.zeros(16)}, E_DTYPE, "dw.dtype"),
        ("dy-list", {"dy": [1.0] * 18}, E_TYPE, "dy"),
        ("x-masked", {"x": np.ma.masked_array(f32(1, 3, 3, 2))}, E_TYPE, "x"),
        ("dy-big-endian", {"dy": f32(1, 3, 3, 2).astype(">f4")}, E_DTYPE, "dy.dtype"),
        ("half-given-float32", {"half": True, "private": True}, E_DTYPE, "dy.dtype")):
    add(f"deconv-{cid}", code, param, lambda kw=kw: dg(**kw))
