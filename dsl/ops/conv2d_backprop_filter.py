"""``conv2d_backprop_filter``: dw of a 2-D convolution on the cube layouts (seed 003).

Math (forward ``y = conv2d(x, W, stride, pad, dilation, groups)``, ``Cin_g = Cin/groups``,
``Cout_g = Cout/groups``, ``g = co // Cout_g``)::

    dW[co, ci, kh, kw] = sum_{n, ho, wo} dy[n, co, ho, wo]
                         * x[n, g*Cin_g + ci, ho*sh - pad_top + kh*dh, wo*sw - pad_left + kw*dw]

with ``x`` read as zero outside its bounds: a GEMM whose reduction axis is ``N*Ho*Wo``.

Tensors
-------
input_x : 5-D NC1HWC0 ``(N, ceil(Cin/16), H, W, 16)``, float16 or float32.
out_backprop : 5-D NC1HWC0 ``(N, ceil(Cout/16), Ho, Wo, 16)``, same dtype.
result : 4-D group FracZ ``(G*dx_c1e*KH*KW, dy_c1e, 16, 16)`` of ``res_dtype`` (float32
    default); positions that pair channels of different original groups, or pad channels, are
    exactly zero (TBE leaves cross-group products there; we do not).

Stages (schedules find them by tag)
-----------------------------------
``conv2d_backprop_filter.x_pad``  x zero-padded to every ``o*stride + k*dilation``, fp32:
    5HD (absent when x is fp32 and needs no padding: the reduction reads x in place), or
    NCHW ``[N, Cin, Hp, Wp]`` when Cout is the lane axis (see ``acc``).
``conv2d_backprop_filter.dy_cast``  (float16 inputs, unless depthwise) dy converted to fp32
    once.
``conv2d_backprop_filter.dy_group``  (groups > 1 only) dy regathered per x lane,
    ``[N, C1x, Ho, Wo, Cout_g, 16]`` fp32: lane ``cx0`` of block ``cx1`` holds its group's dy
    channel ``co``, so the reduction reads whole vectors.
``conv2d_backprop_filter.acc``    the fp32 reduction over ``(n, ho, wo)`` into a compact
    ``dw_acc [C1x, KH, KW, CO, 16]`` (Cin lanes last; CO = padded Cout for groups == 1, else
    Cout_g), so grouped and depthwise layers do no cross-group work; or, for a dense layer
    whose Cin pads worse to 16 than its Cout (an RGB stem), ``dw_acc_t [C1y, KH, KW, Cin, 16]``
    with Cout in the lanes.
``conv2d_backprop_filter``        the compact result scattered into group FracZ, cast.
"""

from __future__ import annotations

import json

from dsl.errors import (
    E_CHANNEL,
    E_DTYPE,
    E_DTYPE_MISMATCH,
    E_GROUPS,
    E_SHAPE,
    ceil_div,
    check_elems,
    check_int,
    check_shape,
    fail,
    te_shape,
)
from dsl.ops.conv_geometry import ConvAxis
from dsl.ops.group import C0, GroupLayout, calculate_group
from dsl.ops.layout import FORMAT_5HD, FORMAT_FRACZ, FORMAT_FRACZ_G, pad_cast_5hd_compute, te_all
from dsl.ops.para_dict import parse_conv2d_para

TAG = "conv2d_backprop_filter"
ACC_DTYPE = "float32"


def conv2d_backprop_filter(input_x, out_backprop, filter_sizes, para_dict):
    """dw of a (grouped, strided, dilated, padded) 2-D convolution. See the module docstring.

    Parameters
    ----------
    input_x : te.Tensor
        x in NC1HWC0.
    out_backprop : te.Tensor
        dy in NC1HWC0.
    filter_sizes : sequence of 4 int
        Forward weight NCHW ``(Cout, Cin/groups, KH, KW)``.
    para_dict : dict
        ``strides``, ``padding`` [top, bottom, left, right], ``dilations`` [1, 1, dh, dw],
        ``groups`` (1), ``res_dtype`` ("float32" default, or "float16"), ``kernel_name``.

    Returns
    -------
    te.Tensor
        dw in group FracZ ``(G*dx_c1e*KH*KW, dy_c1e, 16, 16)``.
    """
    import tvm
    from tvm import te

    para = parse_conv2d_para(para_dict, op=TAG, default_res_dtype="float32",
                             allowed=("groups",))
    groups = check_int("para_dict['groups']", para_dict.get("groups", 1), lo=1, code=E_GROUPS)
    w_sizes = check_shape("filter_sizes", filter_sizes, 4)
    x_shape = te_shape("input_x", input_x, 5)
    dy_shape = te_shape("out_backprop", out_backprop, 5)
    dtype = str(input_x.dtype)
    if dtype not in ("float16", "float32"):
        raise fail(E_DTYPE, "input_x.dtype", dtype, "must be float16 or float32")
    if str(out_backprop.dtype) != dtype:
        raise fail(E_DTYPE_MISMATCH, "out_backprop.dtype", str(out_backprop.dtype),
                   f"must equal input_x.dtype={dtype}")
    cout, cin_g, kh, kw = w_sizes
    n, c1x, h, w, x_c0 = x_shape
    if x_c0 != C0 or dy_shape[4] != C0:
        raise fail(E_SHAPE, "input_x.shape" if x_c0 != C0 else "out_backprop.shape",
                   x_shape if x_c0 != C0 else dy_shape, f"must end in C0={C0}")
    cin = cin_g * groups
    if c1x != ceil_div(cin, C0):
        raise fail(E_CHANNEL, "input_x.shape[1]", c1x,
                   f"must be ceil(Cin/16)={ceil_div(cin, C0)} for Cin = filter_sizes[1] * "
                   f"groups = {cin_g} * {groups}")
    if dy_shape[0] != n:
        raise fail(E_SHAPE, "out_backprop.shape[0]", dy_shape[0],
                   f"must equal input_x's batch {n}")
    if dy_shape[1] != ceil_div(cout, C0):
        raise fail(E_CHANNEL, "out_backprop.shape[1]", dy_shape[1],
                   f"must be ceil(Cout/16)={ceil_div(cout, C0)} for filter_sizes[0]={cout}")
    gd = calculate_group((n, cout, 1, 1), (n, cin, h, w), w_sizes, groups, filter_dtype=dtype,
                         names={"w_shape_nchw": "filter_sizes"})
    lay = GroupLayout.from_weight(w_sizes, groups)
    ah = ConvAxis.checked("H", h, dy_shape[2], kh, para.strides[0], para.pads[0], para.pads[1],
                          para.dilations[0])
    aw = ConvAxis.checked("W", w, dy_shape[3], kw, para.strides[1], para.pads[2], para.pads[3],
                          para.dilations[1])
    # group FracZ pads every group to whole 16x16 blocks: small weights can overflow int32
    check_elems("filter_sizes", list(w_sizes), lay.fracz_shape, "the group FracZ dw")
    check_elems("input_x.shape", list(x_shape),
                (n, c1x, ah.x_padded_size, aw.x_padded_size, C0), "the padded x")

    c1y = dy_shape[1]
    cout_lanes = lay.dense and c1y * C0 * cin < c1x * C0 * cout
    if cout_lanes:
        # x is only broadcast, channel by channel: pad just the real channels, NCHW
        def xq_body(b, ci, hp, wp):
            src_h, src_w = hp - ah.pad_before, wp - aw.pad_before
            ok = tvm.tirx.all(src_h >= 0, src_h < h, src_w >= 0, src_w < w)
            val = input_x[b, ci // C0, te.max(te.min(src_h, h - 1), 0),
                          te.max(te.min(src_w, w - 1), 0), ci % C0]
            return te.if_then_else(ok, val.astype(ACC_DTYPE), tvm.tirx.const(0, ACC_DTYPE))

        xq = te.compute((n, cin, ah.x_padded_size, aw.x_padded_size), xq_body,
                        name="dw_x_pad", tag=f"{TAG}.x_pad")
    elif (dtype == ACC_DTYPE and ah.pad_before == aw.pad_before == 0
          and (ah.x_padded_size, aw.x_padded_size) == (h, w)):
        xp = input_x  # nothing to pad or convert (a 1x1 layer): no copy
    else:
        xp = pad_cast_5hd_compute(input_x, (ah.pad_before, aw.pad_before),
                                  (ah.x_padded_size, aw.x_padded_size), ACC_DTYPE,
                                  name="dw_x_pad", tag=f"{TAG}.x_pad")
    co_ext = dy_shape[1] * C0 if lay.dense else lay.cout_g
    rn = te.reduce_axis((0, n), name="n")
    rh = te.reduce_axis((0, ah.n_out), name="ho")
    rw = te.reduce_axis((0, aw.n_out), name="wo")

    dy32 = out_backprop
    if dtype != ACC_DTYPE and (lay.dense or lay.cin_g * lay.cout_g > 1):
        # converted once, not once per broadcast in the reduction (dense) or per lane of the
        # regather (grouped: 16-bit lanes have no vector gather)
        dy32 = te.compute(dy_shape, lambda *i: out_backprop[i].astype(ACC_DTYPE),
                          name="dw_dy_cast", tag=f"{TAG}.dy_cast")
    if lay.dense:
        def dyv_of(cx1, co, cx0):
            return dy32[rn, co // C0, rh, rw, co % C0].astype(ACC_DTYPE)
    else:
        def dyg_body(b, cx1, ho, wo, co, cx0):
            c = cx1 * C0 + cx0
            g, _ = lay.group_of_input_channel(c if cin % C0 == 0 else te.min(c, cin - 1))
            dyc = g * lay.cout_g + co
            return dy32[b, dyc // C0, ho, wo, dyc % C0].astype(ACC_DTYPE)

        # dy regathered per x lane (lane cx0 of block cx1 sees its group's channel co at
        # [..., co, cx0]) so the reduction multiplies whole vectors instead of gathering
        dyg = te.compute((n, c1x, ah.n_out, aw.n_out, lay.cout_g, C0), dyg_body,
                         name="dw_dy_group", tag=f"{TAG}.dy_group")
        def dyv_of(cx1, co, cx0):
            return dyg[rn, cx1, rh, rw, co, cx0]

    def acc_body(cx1, k_h, k_w, co, cx0):
        xv = xp[rn, cx1, rh * ah.stride + k_h * ah.dilation, rw * aw.stride + k_w * aw.dilation,
                cx0]
        return te.sum(dyv_of(cx1, co, cx0) * xv, axis=[rn, rh, rw])

    if cout_lanes:
        # few input channels (an RGB stem): Cout is the lane axis, so the padded lanes of
        # Cin cost nothing; x is broadcast per real input channel
        def acc_t_body(cy1, k_h, k_w, ci, cy0):
            xv = xq[rn, ci, rh * ah.stride + k_h * ah.dilation,
                    rw * aw.stride + k_w * aw.dilation]
            dyv = dy32[rn, cy1, rh, rw, cy0].astype(ACC_DTYPE)
            return te.sum(dyv * xv, axis=[rn, rh, rw])

        acc = te.compute((c1y, kh, kw, cin, C0), acc_t_body, name="dw_acc_t", tag=f"{TAG}.acc")
    else:
        acc = te.compute((c1x, kh, kw, co_ext, C0), acc_body, name="dw_acc", tag=f"{TAG}.acc")

    params = {**para.as_json(), "groups": groups, "group_dict": gd,
              "filter_sizes": list(w_sizes)}
    formats = {input_x.op.name: FORMAT_5HD, out_backprop.op.name: FORMAT_5HD,
               "dw": FORMAT_FRACZ if groups == 1 else FORMAT_FRACZ_G}
    attrs = {"dsl_op": TAG, "dsl_params": json.dumps(params, sort_keys=True),
             "dsl_formats": json.dumps(formats, sort_keys=True)}

    def out_body(row, col1, col0, lane):
        co_orig, ci, k_h, k_w, conds = lay.weight_of_fracz(row, col1, col0, lane)
        if lay.dense:
            c, co = ci, co_orig
        else:
            g = co_orig // lay.cout_g
            c, co = te.min(g * lay.cin_g + ci, c1x * C0 - 1), co_orig % lay.cout_g
        if cout_lanes:
            val = acc[co // C0, k_h, k_w, te.min(c, cin - 1), co % C0]
        else:
            val = acc[c // C0, k_h, k_w, co, c % C0]
        val = val.astype(para.res_dtype)
        ok = te_all(conds)
        if ok is None:
            return val
        return te.if_then_else(ok, val, tvm.tirx.const(0, para.res_dtype))

    return te.compute(lay.fracz_shape, out_body, name="dw", tag=TAG, attrs=attrs)
