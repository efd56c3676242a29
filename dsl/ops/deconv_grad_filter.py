"""``deconv_grad_filter``: dw of a grouped NHWC transposed convolution (seed 000).

Forward (what this is the gradient of), a transposed convolution in NHWC with
``ICg = in_c / group``, ``OCg = out_c / group``::

    y[b, ih*sh - pad_u + kh*dh, iw*sw - pad_l + kw*dw, g*OCg + oc]
        += x[b, ih, iw, g*ICg + ic] * W[g, oc, kh, kw, ic]

Taps landing outside ``[0, out_h) x [0, out_w)`` are dropped: ``out_h`` / ``out_w`` are free
(the seed's example uses ``out_h = in_h`` with a 4x4 kernel, i.e. a cropped output). The
weight gradient this module computes, for ``dy = dL/dy``::

    dw[g, oc, kh, kw, ic] = sum_{b, ih, iw} dy[b, ih*sh - pad_u + kh*dh,
                                               iw*sw - pad_l + kw*dw, g*OCg + oc]
                                           * x[b, ih, iw, g*ICg + ic]

with ``dy`` read as zero outside its bounds. Per group this is ``sum_b Im2Row(dy_b)^T . x_b``:
a GEMM with M = OCg*KH*KW, N = ICg and K = B*in_h*in_w.

Tensors
-------
dy : 4-D NHWC ``(B, out_h, out_w, out_c)``, float16 or float32.
x : 4-D NHWC ``(B, in_h, in_w, in_c)``, same dtype.
result : 5-D ``(group, OCg, KH, KW, ICg)`` (per group OHWI; the seed's
    ``[group, OCg*KH*KW, ICg]`` is the same memory), of the input dtype; accumulated in fp32.

Stages (schedules find them by tag)
-----------------------------------
``deconv_grad_filter.dy_pad``  dy zero-padded to every tap position, fp32 (branch-free GEMM).
``deconv_grad_filter.acc``     the fp32 reduction over ``(b, ih, iw)``.
``deconv_grad_filter``         the result cast to the input dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsl.errors import (
    E_CHANNEL,
    E_DTYPE,
    E_DTYPE_MISMATCH,
    E_GROUPS,
    E_RANGE,
    E_SHAPE,
    check_int,
    fail,
    te_shape,
)
from dsl.ops import fallback, tag
from dsl.ops.conv_geometry import ConvAxis, clamp_index

TAG = tag.DECONV_GRAD_FILTER
ACC_DTYPE = "float32"
DTYPES = ("float16", "float32")
MAX_ELEMS = 2**63 - 1  # int64 indexing (dsl.runtime.schedule.INT64_INDEX_FROM)

# Field order of DeconvGeometry, and the names errors use at the TE level.
FIELDS = ("batch", "in_h", "in_w", "in_c", "dy_batch", "out_h", "out_w", "out_c",
          "kernel_h", "kernel_w", "stride_h", "stride_w", "pad_u", "pad_l",
          "dilation_h", "dilation_w", "group")
TE_NAMES = dict(zip(FIELDS, (
    "x.shape[0]", "x.shape[1]", "x.shape[2]", "x.shape[3]",
    "dy.shape[0]", "dy.shape[1]", "dy.shape[2]", "dy.shape[3]",
    "kernel[0]", "kernel[1]", "stride[0]", "stride[1]", "pad[0]", "pad[1]",
    "dilation[0]", "dilation[1]", "group")))


@dataclass(frozen=True)
class DeconvGeometry:
    """Checked sizes of one DeconvGradFilter call (see the module docstring)."""

    batch: int
    in_h: int
    in_w: int
    in_c: int
    out_h: int
    out_w: int
    out_c: int
    kernel_h: int
    kernel_w: int
    stride_h: int
    stride_w: int
    pad_u: int
    pad_l: int
    dilation_h: int
    dilation_w: int
    group: int

    @property
    def icg(self) -> int:
        return self.in_c // self.group

    @property
    def ocg(self) -> int:
        return self.out_c // self.group

    @property
    def dw_shape(self) -> tuple[int, int, int, int, int]:
        return (self.group, self.ocg, self.kernel_h, self.kernel_w, self.icg)

    @property
    def x_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.in_h, self.in_w, self.in_c)

    @property
    def dy_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.out_h, self.out_w, self.out_c)

    def axes(self, names: dict | None = None) -> tuple[ConvAxis, ConvAxis]:
        """The (H, W) axes: dy is the tensor read at ``i*stride - pad + k*dilation``."""
        names = names or TE_NAMES
        return (ConvAxis.cropped("H", self.out_h, self.in_h, self.kernel_h, self.stride_h,
                                 self.pad_u, self.dilation_h, in_param=names["out_h"]),
                ConvAxis.cropped("W", self.out_w, self.in_w, self.kernel_w, self.stride_w,
                                 self.pad_l, self.dilation_w, in_param=names["out_w"]))

    @property
    def flops(self) -> float:
        """2 * multiply-adds of the dense GEMM (taps dropped at the borders included)."""
        return 2.0 * self.batch * self.in_h * self.in_w * self.kernel_h * self.kernel_w \
            * self.ocg * self.in_c

    def as_json(self) -> dict:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def check_geometry(values: dict, names: dict | None = None) -> DeconvGeometry:
    """Validate the 17 numbers of a call (keys :data:`FIELDS`) and return the geometry.

    ``names`` maps each field to the name errors report (``"param[5]"`` for the seed API);
    every rule is checked on plain ints, so a bad call never reaches TVM.
    """
    names = names or TE_NAMES
    v = {}
    for f in FIELDS:
        if f in ("pad_u", "pad_l"):
            v[f] = check_int(names[f], values[f], lo=0, code=E_RANGE)
        elif f.startswith(("stride", "dilation")):
            v[f] = check_int(names[f], values[f], lo=1, code=E_RANGE)
        elif f == "group":
            v[f] = check_int(names[f], values[f], lo=1, code=E_GROUPS)
        else:
            v[f] = check_int(names[f], values[f], lo=1, code=E_SHAPE)
    if v["dy_batch"] != v["batch"]:
        raise fail(E_SHAPE, names["dy_batch"], v["dy_batch"],
                   f"dy's batch must equal x's batch {names['batch']}={v['batch']}")
    for f in ("in_c", "out_c"):
        if v[f] % v["group"]:
            raise fail(E_CHANNEL, names[f], v[f],
                       f"must be divisible by group {names['group']}={v['group']}")
    del v["dy_batch"]
    geo = DeconvGeometry(**v)
    ah, aw = geo.axes(names)  # raises when no tap reaches dy along an axis
    # Each tensor's element count with the fields it grows with; an overflow names the
    # largest of them (the likeliest typo), not whichever field comes first.
    sizes = {"x": (math.prod(geo.x_shape), ("batch", "in_h", "in_w", "in_c")),
             "dy": (math.prod(geo.dy_shape), ("dy_batch", "out_h", "out_w", "out_c")),
             "dw": (math.prod(geo.dw_shape), ("kernel_h", "kernel_w", "in_c", "out_c")),
             "padded dy": (geo.batch * ah.tap_extent * aw.tap_extent * geo.out_c,
                           ("batch", "out_h", "out_w", "out_c", "kernel_h", "kernel_w"))}
    for what, (n, fields) in sizes.items():
        if n > MAX_ELEMS:
            field = max(fields, key=lambda f: values[f])
            raise fail(E_SHAPE, names[field], values[field],
                       f"makes {what} {n} elements; at most {MAX_ELEMS} fit int64 indexing")
    return geo


def _pair(param: str, value: object) -> tuple[object, object]:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return value[0], value[1]
    if isinstance(value, (list, tuple)):
        raise fail(E_SHAPE, param, value, "must be an int or a pair of ints (h, w)")
    return value, value


def _shape(param: str, t) -> tuple[int, ...]:
    dims = te_shape(param, t)
    if len(dims) != 4:
        raise fail(E_SHAPE, f"{param}.shape", list(dims), "must have rank 4 (NHWC)")
    return dims


def deconv_grad_filter(dy, x, *, kernel, stride=1, pad=0, dilation=1, group=1):
    """dw of a (grouped, strided, dilated, padded, cropped) NHWC transposed convolution.

    Math (see the module docstring), ``g`` the group, ``ICg = in_c/group``,
    ``OCg = out_c/group``, dy read as zero outside ``[0, out_h) x [0, out_w)``::

        dw[g, oc, kh, kw, ic] = sum_{b, ih, iw}
            dy[b, ih*sh - pad_u + kh*dh, iw*sw - pad_l + kw*dw, g*OCg + oc]
            * x[b, ih, iw, g*ICg + ic]

    Parameters
    ----------
    dy : te.Tensor
        Rank 4, NHWC ``(B, out_h, out_w, out_c)``, float16 or float32. Any ``out_h, out_w
        >= 1`` for which at least one tap lands inside dy (rows no tap reaches are ignored).
    x : te.Tensor
        Rank 4, NHWC ``(B, in_h, in_w, in_c)``, the dtype of dy, same batch.
    kernel : int or (int, int)
        ``(k_h, k_w)``.
    stride, dilation : int or (int, int)
        ``(h, w)``, each >= 1.
    pad : int or (int, int)
        ``(pad_u, pad_l)``, each >= 0: the forward's output crop at the top / left.
    group : int
        Divides in_c and out_c.

    Returns
    -------
    te.Tensor
        Rank 5 ``(group, OCg, k_h, k_w, ICg)`` (per group OHWI) of the input dtype, accumulated
        in float32.
    """
    from tvm import te

    geo = _check_call(dy, x, kernel, stride, pad, dilation, group)
    side = []
    if _dy_padded(geo):  # the padding meets x: an exact twin for a NaN / inf in x
        flag = fallback.nonfinite_flag(TAG, "dw_nonfinite", [x])
        side = [flag, _acc_stage(geo, dy, x, flag=flag)]
    acc = _acc_stage(geo, _dy_pad_stage(geo, dy), x, twin=side[1] if side else None)
    attrs = tag.kernel_attrs(TAG, geo.as_json(), {dy.op.name: "NHWC", x.op.name: "NHWC",
                                                  "dw": "GOHWI"})
    dtype = str(x.dtype)
    dw = te.compute(geo.dw_shape, lambda *i: acc[i].astype(dtype), name="dw", tag=TAG,
                    attrs=attrs)
    return tag.with_side_stages(dw, side) if side else dw


def _dy_padded(geo: DeconvGeometry) -> bool:
    """Whether some tap reads dy_pad's zeros (a crop at the top / left or rows past dy)."""
    return any(a.pad_before or a.tap_extent > a.pad_before + n
               for a, n in zip(geo.axes(), (geo.out_h, geo.out_w)))


def _check_call(dy, x, kernel, stride, pad, dilation, group) -> DeconvGeometry:
    """The TE arguments checked into a geometry (errors name ``dy.shape[1]``, ``kernel[0]``...)."""
    dy_shape = _shape("dy", dy)
    x_shape = _shape("x", x)
    dtype = str(x.dtype)
    if dtype not in DTYPES:
        raise fail(E_DTYPE, "x.dtype", dtype, "must be float16 or float32")
    if str(dy.dtype) != dtype:
        raise fail(E_DTYPE_MISMATCH, "dy.dtype", str(dy.dtype), f"must equal x.dtype={dtype}")
    kh, kw = _pair("kernel", kernel)
    sh, sw = _pair("stride", stride)
    pu, pl = _pair("pad", pad)
    dh, dw_ = _pair("dilation", dilation)
    return check_geometry(dict(zip(FIELDS, (*x_shape, *dy_shape, kh, kw, sh, sw, pu, pl, dh,
                                            dw_, group))))


def _dy_pad_stage(geo: DeconvGeometry, dy):
    """``dy_pad``: dy zero-padded to every tap position, fp32 (a branch-free GEMM after it)."""
    import tvm
    from tvm import te

    ah, aw = geo.axes()
    hp, wp = ah.tap_extent, aw.tap_extent
    zero = tvm.tirx.const(0, ACC_DTYPE)

    def pad_body(b, p, q, c):
        conds = []
        if ah.pad_before:
            conds.append(p >= ah.pad_before)
        if hp > ah.pad_before + geo.out_h:
            conds.append(p < ah.pad_before + geo.out_h)
        if aw.pad_before:
            conds.append(q >= aw.pad_before)
        if wp > aw.pad_before + geo.out_w:
            conds.append(q < aw.pad_before + geo.out_w)
        val = dy[b, p - ah.pad_before, q - aw.pad_before, c].astype(ACC_DTYPE)
        return te.if_then_else(tvm.tirx.all(*conds), val, zero) if conds else val

    return te.compute((geo.batch, hp, wp, geo.out_c), pad_body, name="dy_pad",
                      tag=tag.stage(TAG, "dy_pad"))


def _acc_stage(geo: DeconvGeometry, dyp, x, flag=None, twin=None):
    """``acc``: the fp32 reduction over ``(b, ih, iw)``, ``[group, OCg, KH, KW, ICg]``.

    With ``flag`` its exact twin instead (:mod:`dsl.ops.fallback`): ``dyp`` is dy itself,
    read only at real rows, so a NaN / inf in x never meets dy_pad's zeros; the ``acc`` made
    with ``twin`` takes its values when ``flag`` is set."""
    import tvm
    from tvm import te

    ah, aw = geo.axes()
    icg, ocg = geo.icg, geo.ocg
    rb = te.reduce_axis((0, geo.batch), name="b")
    rh = te.reduce_axis((0, geo.in_h), name="ih")
    rw = te.reduce_axis((0, geo.in_w), name="iw")

    def acc_body(g, oc, k_h, k_w, ic):
        p, q = rh * ah.stride + k_h * ah.dilation, rw * aw.stride + k_w * aw.dilation
        xv = x[rb, rh, rw, g * icg + ic].astype(ACC_DTYPE)
        if flag is None:
            return te.sum(dyp[rb, p, q, g * ocg + oc] * xv, axis=[rb, rh, rw])
        sp, sq = p - ah.pad_before, q - aw.pad_before
        ok = tvm.tirx.all(sp >= 0, sp < geo.out_h, sq >= 0, sq < geo.out_w)
        a = dyp[rb, clamp_index(sp, geo.out_h), clamp_index(sq, geo.out_w),
                g * ocg + oc].astype(ACC_DTYPE)
        return te.sum(te.if_then_else(ok, a * xv, tvm.tirx.const(0, ACC_DTYPE)),
                      axis=[rb, rh, rw])

    if flag is not None:
        return te.compute(geo.dw_shape, acc_body, name="dw_acc_exact",
                          tag=tag.DECONV_EXACT, attrs=fallback.twin_attrs(flag))
    return te.compute(geo.dw_shape, acc_body, name="dw_acc", tag=tag.stage(TAG, "acc"),
                      attrs=fallback.fast_attrs(twin) if twin is not None else None)
