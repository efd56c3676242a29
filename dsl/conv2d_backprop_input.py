"""``conv2d_backprop_input``: dx of a 2-D convolution on the cube layouts (seed 001).

Math (forward ``y = conv2d(x, W, stride, pad, dilation, groups)``, per group ``g`` with
``Cin_g = Cin/groups`` and ``Cout_g = Cout/groups``)::

    dx[n, g*Cin_g + ci, h, w] = sum_{co < Cout_g, kh, kw}
        dy[n, g*Cout_g + co, (h + pad_top - kh*dh) / sh, (w + pad_left - kw*dw) / sw]
        * W[g*Cout_g + co, ci, kh, kw]

over the taps where both divisions are exact and land inside dy.

Tensors
-------
filters : 4-D FracZ (group FracZ when groups > 1), ``(G*dx_c1e*KH*KW, dy_c1e, 16, 16)``,
    float16 or float32 (see :mod:`dsl.group`).
out_backprop : 5-D NC1HWC0, ``(N, ceil(Cout/16), Ho, Wo, 16)``, same dtype as ``filters``.
result : 5-D NC1HWC0, ``(N, ceil(Cin/16), H, W, 16)`` of ``res_dtype``; pad channels are zero.
    Byte-identical to TBE's 4-D ``(N, C1, H*W, 16)``.

Stages (schedules find them by tag)
-----------------------------------
``conv2d_backprop_input.dy_pad``  dy zero-padded so every enumerated tap reads in bounds, fp32.
``conv2d_backprop_input.weight``  weight repacked ``[C1x, KHp, KWp, CO, 16]`` (Cin lanes last),
    zero for the padded taps and pad channels, fp32.
``conv2d_backprop_input.acc``     the fp32 reduction, stride-phase aware (see ConvAxis.dx_taps).
``conv2d_backprop_input``         pad channels zeroed, cast to ``res_dtype``.
"""

from __future__ import annotations

import json

from dsl.conv_geometry import ConvAxis
from dsl.errors import (
    E_CHANNEL,
    E_DTYPE,
    E_DTYPE_MISMATCH,
    E_GROUPS,
    E_SHAPE,
    E_VALUE,
    ceil_div,
    check_int,
    check_shape,
    fail,
)
from dsl.group import C0, GroupLayout, calculate_group, check_group_dict
from dsl.layout import FORMAT_5HD, FORMAT_FRACZ, FORMAT_FRACZ_G, pad_cast_5hd_compute
from dsl.para_dict import check_offset_x, parse_conv2d_para

TAG = "conv2d_backprop_input"
ACC_DTYPE = "float32"


def tensor_shape(param: str, t: object, rank: int) -> tuple[int, ...]:
    """The static shape of a TE tensor argument, checked for rank and positivity."""
    from tvm import te

    if not isinstance(t, te.Tensor):
        raise fail(E_VALUE, param, type(t).__name__, "must be a tvm.te.Tensor (te.placeholder)")
    try:
        dims = [int(d) for d in t.shape]
    except TypeError:
        raise fail(E_SHAPE, f"{param}.shape", list(t.shape),
                   "must be static: symbolic shapes are not supported") from None
    return check_shape(f"{param}.shape", dims, rank)


def conv2d_backprop_input(filters, out_backprop, filter_sizes, input_sizes, para_dict):
    """dx of a (grouped, strided, dilated, padded) 2-D convolution. See the module docstring.

    Parameters
    ----------
    filters : te.Tensor
        FracZ / group FracZ weight.
    out_backprop : te.Tensor
        dy in NC1HWC0.
    filter_sizes : sequence of 4 int
        Forward weight NCHW ``(Cout, Cin/groups, KH, KW)``.
    input_sizes : sequence of 4 int
        dx NCHW ``(N, Cin, H, W)``.
    para_dict : dict
        ``strides`` [sh, sw]; ``padding`` [top, bottom, left, right]; ``dilations``
        [1, 1, dh, dw]; ``res_dtype`` ("float16" default, or "float32"); ``offset_x`` (0);
        ``offset_w`` (None); ``kernel_name``; ``group_dict`` (computed when absent, checked
        when given); ``groups`` (optional; default ``input_sizes[1] // filter_sizes[1]``).

    Returns
    -------
    te.Tensor
        dx, NC1HWC0 ``(N, ceil(Cin/16), H, W, 16)`` of ``res_dtype``.
    """
    from tvm import te

    para = parse_conv2d_para(para_dict, op=TAG, default_res_dtype="float16",
                             allowed=("offset_x", "offset_w", "group_dict", "groups"))
    check_offset_x(para_dict.get("offset_x", 0))
    if para_dict.get("offset_w") is not None:
        raise fail(E_VALUE, "para_dict['offset_w']", para_dict["offset_w"],
                   "must be None: weight offsets (int8 quantisation) are not supported")
    w_sizes = check_shape("filter_sizes", filter_sizes, 4)
    x_sizes = check_shape("input_sizes", input_sizes, 4)
    dy_shape = tensor_shape("out_backprop", out_backprop, 5)
    fz_shape = tensor_shape("filters", filters, 4)
    dtype = str(out_backprop.dtype)
    if dtype not in ("float16", "float32"):
        raise fail(E_DTYPE, "out_backprop.dtype", dtype, "must be float16 or float32")
    if str(filters.dtype) != dtype:
        raise fail(E_DTYPE_MISMATCH, "filters.dtype", str(filters.dtype),
                   f"must equal out_backprop.dtype={dtype}")

    cout, cin_g, kh, kw = w_sizes
    n, cin, h, w = x_sizes
    if "groups" in para_dict:
        groups = check_int("para_dict['groups']", para_dict["groups"], lo=1, code=E_GROUPS)
    elif "group_dict" in para_dict and isinstance(para_dict["group_dict"], dict) \
            and "groups" in para_dict["group_dict"]:
        groups = check_int("para_dict['group_dict']['groups']",
                           para_dict["group_dict"]["groups"], lo=1, code=E_GROUPS)
    else:
        groups = cin // cin_g if cin % cin_g == 0 else 1
    gd = calculate_group((n, cout, 1, 1), x_sizes, w_sizes, groups, filter_dtype=dtype)
    if "group_dict" in para_dict:
        check_group_dict(para_dict["group_dict"], gd)
    lay = GroupLayout.from_weight(w_sizes, groups)

    if dy_shape[0] != n:
        raise fail(E_SHAPE, "out_backprop.shape[0]", dy_shape[0],
                   f"must equal the batch input_sizes[0]={n}")
    if dy_shape[1] != ceil_div(cout, C0) or dy_shape[4] != C0:
        raise fail(E_CHANNEL, "out_backprop.shape", dy_shape,
                   f"must be (N, ceil(Cout/16)={ceil_div(cout, C0)}, Ho, Wo, 16) for "
                   f"filter_sizes[0]=Cout={cout}")
    if fz_shape != lay.fracz_shape:
        raise fail(E_CHANNEL, "filters.shape", fz_shape,
                   f"must be the group FracZ shape {lay.fracz_shape} of filter_sizes={w_sizes} "
                   f"with groups={groups}")
    ah = ConvAxis.checked("H", h, dy_shape[2], kh, para.strides[0], para.pads[0], para.pads[1],
                          para.dilations[0])
    aw = ConvAxis.checked("W", w, dy_shape[3], kw, para.strides[1], para.pads[2], para.pads[3],
                          para.dilations[1])

    c1x, c1y = ceil_div(cin, C0), dy_shape[1]
    dyp = pad_cast_5hd_compute(out_backprop, (ah.dy_pad_before, aw.dy_pad_before),
                               (ah.dy_padded_size, aw.dy_padded_size), ACC_DTYPE,
                               name="dx_dy_pad", tag=f"{TAG}.dy_pad")
    co_ext = c1y * C0 if lay.dense else lay.cout_g  # reduction extent over output channels

    def channel(cx1, cx0):
        """(g, ci) of dx channel cx1*16+cx0, clamped so pad channels index real data."""
        c = cx1 * C0 + cx0
        return lay.group_of_input_channel(c if cin % C0 == 0 else te.min(c, cin - 1))

    def weight_body(cx1, k_h, k_w, co, cx0):
        g, ci = channel(cx1, cx0)
        row, lane = lay.fracz_row_lane(g, ci, te.min(k_h, kh - 1), te.min(k_w, kw - 1))
        col1, col0 = lay.fracz_col(g, co)
        val = filters[row, col1, col0, lane].astype(ACC_DTYPE)
        conds = []
        if ah.padded_kernel != kh:
            conds.append(k_h < kh)
        if aw.padded_kernel != kw:
            conds.append(k_w < kw)
        if cin % C0:
            conds.append(cx1 * C0 + cx0 < cin)
        if lay.dense and cout % C0:
            conds.append(co < cout)
        if not conds:
            return val
        import tvm

        return te.if_then_else(tvm.tirx.all(*conds), val, tvm.tirx.const(0, ACC_DTYPE))

    wt = te.compute((c1x, ah.padded_kernel, aw.padded_kernel, co_ext, C0), weight_body,
                    name="dx_weight", tag=f"{TAG}.weight")

    jh = te.reduce_axis((0, ah.n_taps), name="jh")
    jw = te.reduce_axis((0, aw.n_taps), name="jw")
    if lay.dense:
        rco1 = te.reduce_axis((0, c1y), name="co1")
        rco0 = te.reduce_axis((0, C0), name="co0")
        red = [rco1, jh, jw, rco0]
    else:
        rco = te.reduce_axis((0, lay.cout_g), name="co")
        red = [jh, jw, rco]

    def acc_body(b, cx1, i, j, cx0):
        k_h, row_h, cond_h = ah.dx_taps(i, jh)
        k_w, row_w, cond_w = aw.dx_taps(j, jw)
        if lay.dense:
            dyv = dyp[b, rco1, row_h, row_w, rco0]
            wv = wt[cx1, k_h, k_w, rco1 * C0 + rco0, cx0]
        else:
            g, _ = channel(cx1, cx0)
            dyc = g * lay.cout_g + rco
            dyv = dyp[b, dyc // C0, row_h, row_w, dyc % C0]
            wv = wt[cx1, k_h, k_w, rco, cx0]
        prod = dyv * wv
        conds = [c for c in (cond_h, cond_w) if c is not None]
        if conds:
            import tvm

            prod = te.if_then_else(tvm.tirx.all(*conds), prod, tvm.tirx.const(0, ACC_DTYPE))
        return te.sum(prod, axis=red)

    acc = te.compute((n, c1x, h, w, C0), acc_body, name="dx_acc", tag=f"{TAG}.acc")

    params = {**para.as_json(), "offset_x": 0, "offset_w": None, "group_dict": gd,
              "filter_sizes": list(w_sizes), "input_sizes": list(x_sizes)}
    formats = {filters.op.name: FORMAT_FRACZ if groups == 1 else FORMAT_FRACZ_G,
               out_backprop.op.name: FORMAT_5HD, "dx": FORMAT_5HD}
    attrs = {"dsl_op": TAG, "dsl_params": json.dumps(params, sort_keys=True),
             "dsl_formats": json.dumps(formats, sort_keys=True)}

    def out_body(b, cx1, i, j, cx0):
        val = acc[b, cx1, i, j, cx0].astype(para.res_dtype)
        if cin % C0 == 0:
            return val
        import tvm

        return te.if_then_else(cx1 * C0 + cx0 < cin, val, tvm.tirx.const(0, para.res_dtype))

    return te.compute((n, c1x, h, w, C0), out_body, name="dx", tag=TAG, attrs=attrs)
