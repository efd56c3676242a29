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
    float16 or float32 (see :mod:`dsl.ops.group`).
out_backprop : 5-D NC1HWC0, ``(N, ceil(Cout/16), Ho, Wo, 16)``, same dtype as ``filters``.
result : 5-D NC1HWC0, ``(N, ceil(Cin/16), H, W, 16)`` of ``res_dtype``; pad channels are zero.
    Byte-identical to TBE's 4-D ``(N, C1, H*W, 16)``.

Stages (schedules find them by tag)
-----------------------------------
dx is computed per output phase ``(ph, pw)`` (positions ``(q_h*sh + ph, q_w*sw + pw)``): each
phase reads only the taps that hit it, at dy rows affine in ``q`` (no zero-inserted dy, no
multiplication by zero taps), so strided dx does exactly the forward's multiply-adds.

``conv2d_backprop_input.dy_pad``  dy zero-padded so every listed tap reads in bounds, fp32:
    5HD ``[N, C1y, Hp, Wp, 16]`` when groups == 1 (absent when dy is fp32 and needs no padding:
    the reduction reads dy in place); grouped layers regather it per dx lane as
    ``[N, C1x, Hp, Wp, Cout_g, 16]`` (lane ``cx0`` of block ``cx1`` holds its group's dy
    channel ``co``) so the reduction reads whole vectors.
``conv2d_backprop_input.dy_cast``  (grouped with Cin_g*Cout_g > 1, float16 inputs) dy in fp32
    first: the regather moves single lanes, and 16-bit lanes have no vector gather.
``conv2d_backprop_input.weight``  weight repacked ``[C1x, KH, KW, CO, 16]`` (Cin lanes last;
    CO = padded Cout for groups == 1, else Cout_g), zero for pad channels, fp32.
``conv2d_backprop_input.acc``     one fp32 reduction per phase with taps, ``[N, C1x, Hq, Wq, 16]``,
    named ``dx_acc`` (stride 1) or ``dx_acc_<ph>_<pw>``; phases no tap reaches have none.
    For a dense layer whose Cin pads worse to 16 than its Cout (an RGB stem) the vector runs
    along W instead: ``dx_acc_w*`` ``[N, Cin, Hq, Wq']`` (``Wq`` rounded up to 16), reading
    dy_pad as ``[N, Cout, Hp, Wp]`` and the weight stage as ``[Cin, KH, KW, Cout]``.
``conv2d_backprop_input``         the phases interleaved, pad channels zeroed, cast to
    ``res_dtype``.
"""

from __future__ import annotations

import json

from dsl.errors import (
    E_CHANNEL,
    E_DTYPE,
    E_DTYPE_MISMATCH,
    E_GROUPS,
    E_SHAPE,
    E_VALUE,
    ceil_div,
    check_elems,
    check_int,
    check_shape,
    fail,
    te_shape,
)
from dsl.ops.conv_geometry import ConvAxis
from dsl.ops.group import C0, GroupLayout, calculate_group, check_group_dict
from dsl.ops.layout import FORMAT_5HD, FORMAT_FRACZ, FORMAT_FRACZ_G, pad_cast_5hd_compute
from dsl.ops.para_dict import check_offset_x, parse_conv2d_para

TAG = "conv2d_backprop_input"
ACC_DTYPE = "float32"




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
    import tvm
    from tvm import te

    para = parse_conv2d_para(para_dict, op=TAG, default_res_dtype="float16",
                             allowed=("offset_x", "offset_w", "group_dict", "groups"))
    check_offset_x(para_dict.get("offset_x", 0))
    if para_dict.get("offset_w") is not None:
        raise fail(E_VALUE, "para_dict['offset_w']", para_dict["offset_w"],
                   "must be None: weight offsets (int8 quantisation) are not supported")
    w_sizes = check_shape("filter_sizes", filter_sizes, 4)
    x_sizes = check_shape("input_sizes", input_sizes, 4)
    dy_shape = te_shape("out_backprop", out_backprop, 5)
    fz_shape = te_shape("filters", filters, 4)
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
    gd = calculate_group((n, cout, 1, 1), x_sizes, w_sizes, groups, filter_dtype=dtype,
                         names={"input_size_nchw": "input_sizes", "w_shape_nchw": "filter_sizes"})
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
    # input_sizes can fit int32 while its 5HD result (C padded to 16) does not
    check_elems("input_sizes", list(x_sizes), (n, ceil_div(cin, C0), h, w, C0), "the 5HD dx")

    c1x, c1y = ceil_div(cin, C0), dy_shape[1]
    phases_h, phases_w = axis_phases(ah), axis_phases(aw)
    pad_h, size_h = dy_padding(ah, phases_h)
    pad_w, size_w = dy_padding(aw, phases_w)
    co_ext = c1y * C0 if lay.dense else lay.cout_g  # reduction extent over output channels

    def channel(cx1, cx0):
        """(g, ci) of dx channel cx1*16+cx0, clamped so pad channels index real data."""
        c = cx1 * C0 + cx0
        return lay.group_of_input_channel(c if cin % C0 == 0 else te.min(c, cin - 1))

    # few input channels (an RGB stem): Cin in the lanes would be mostly padding, so the
    # lanes run along W instead: dy and the weight go to NCHW-like layouts, dx positions are
    # the vector, the weight is broadcast per (ci, tap, co)
    positions = lay.dense and c1y * C0 * cin < c1x * C0 * cout
    if positions:
        # each phase computes a whole number of 16-wide rows (the extra columns read dy's
        # zero padding and are never picked), so no vector is ragged
        size_w = max([size_w] + [ceil_div(count, C0) * C0 + c + pad_w
                                 for count, _, taps, c in phases_w if taps])

        def dyt_body(b, co, hp, wp):
            src_h, src_w = hp - pad_h, wp - pad_w
            val = out_backprop[b, co // C0, te.max(te.min(src_h, ah.n_out - 1), 0),
                               te.max(te.min(src_w, aw.n_out - 1), 0), co % C0]
            ok = tvm.tirx.all(src_h >= 0, src_h < ah.n_out, src_w >= 0, src_w < aw.n_out)
            return te.if_then_else(ok, val.astype(ACC_DTYPE), tvm.tirx.const(0, ACC_DTYPE))

        dyp = te.compute((n, cout, size_h, size_w), dyt_body, name="dx_dy_pad",
                         tag=f"{TAG}.dy_pad")
    elif lay.dense and dtype == ACC_DTYPE and pad_h == pad_w == 0 and \
            (size_h, size_w) == (ah.n_out, aw.n_out):
        dyp = out_backprop  # nothing to pad or convert (a 1x1 layer): no copy
    elif lay.dense:
        dyp = pad_cast_5hd_compute(out_backprop, (pad_h, pad_w), (size_h, size_w), ACC_DTYPE,
                                   name="dx_dy_pad", tag=f"{TAG}.dy_pad")
    else:
        dy32 = out_backprop
        if dtype != ACC_DTYPE and lay.cin_g * lay.cout_g > 1:
            # the regather below moves single lanes, and 16-bit lanes have no vector gather
            dy32 = te.compute(dy_shape, lambda *i: out_backprop[i].astype(ACC_DTYPE),
                              name="dx_dy_cast", tag=f"{TAG}.dy_cast")

        def dyg_body(b, cx1, hp, wp, co, cx0):
            g, _ = channel(cx1, cx0)
            dyc = g * lay.cout_g + co
            src_h, src_w = hp - pad_h, wp - pad_w
            val = dy32[b, dyc // C0, te.max(te.min(src_h, ah.n_out - 1), 0),
                       te.max(te.min(src_w, aw.n_out - 1), 0), dyc % C0]
            ok = tvm.tirx.all(src_h >= 0, src_h < ah.n_out, src_w >= 0, src_w < aw.n_out)
            return te.if_then_else(ok, val.astype(ACC_DTYPE), tvm.tirx.const(0, ACC_DTYPE))

        # dy regathered per dx lane: lane cx0 of block cx1 finds its group's dy channel co at
        # [..., co, cx0], so the reduction loads whole vectors instead of gathering lanes
        dyp = te.compute((n, c1x, size_h, size_w, lay.cout_g, C0), dyg_body, name="dx_dy_pad",
                         tag=f"{TAG}.dy_pad")

    def weight_body(cx1, k_h, k_w, co, cx0):
        g, ci = channel(cx1, cx0)
        row, lane = lay.fracz_row_lane(g, ci, k_h, k_w)
        col1, col0 = lay.fracz_col(g, co)
        val = filters[row, col1, col0, lane].astype(ACC_DTYPE)
        conds = []
        if cin % C0:
            conds.append(cx1 * C0 + cx0 < cin)
        if lay.dense and cout % C0:
            conds.append(co < cout)
        if not conds:
            return val
        return te.if_then_else(tvm.tirx.all(*conds), val, tvm.tirx.const(0, ACC_DTYPE))

    if positions:
        def weight_p_body(ci, k_h, k_w, co):
            row, lane = lay.fracz_row_lane(0, ci, k_h, k_w)
            return filters[row, co // C0, co % C0, lane].astype(ACC_DTYPE)

        wt = te.compute((cin, kh, kw, cout), weight_p_body, name="dx_weight",
                        tag=f"{TAG}.weight")
    else:
        wt = te.compute((c1x, kh, kw, co_ext, C0), weight_body, name="dx_weight",
                        tag=f"{TAG}.weight")

    def phase_acc(ph, pw):
        """acc of the dx positions (q_h*sh + ph, q_w*sw + pw): every tap index is affine."""
        (nq_h, k0_h, nt_h, c_h), (nq_w, k0_w, nt_w, c_w) = phases_h[ph], phases_w[pw]
        st_h, st_w = ah.tap_step, aw.tap_step
        dr_h, dr_w = st_h * ah.dilation // ah.stride, st_w * aw.dilation // aw.stride
        jh = te.reduce_axis((0, nt_h), name="jh")
        jw = te.reduce_axis((0, nt_w), name="jw")
        if lay.dense:
            rco1 = te.reduce_axis((0, c1y), name="co1")
            rco0 = te.reduce_axis((0, C0), name="co0")
            red = [rco1, jh, jw, rco0]
        else:
            rco = te.reduce_axis((0, lay.cout_g), name="co")
            red = [jh, jw, rco]

        def body(b, cx1, qh, qw, cx0):
            row_h = qh + (c_h + pad_h) - jh * dr_h
            row_w = qw + (c_w + pad_w) - jw * dr_w
            k_h, k_w = k0_h + jh * st_h, k0_w + jw * st_w
            if lay.dense:
                dyv = dyp[b, rco1, row_h, row_w, rco0]
                wv = wt[cx1, k_h, k_w, rco1 * C0 + rco0, cx0]
            else:
                dyv = dyp[b, cx1, row_h, row_w, rco, cx0]
                wv = wt[cx1, k_h, k_w, rco, cx0]
            return te.sum(dyv * wv, axis=red)

        suffix = "" if len(phases_h) * len(phases_w) == 1 else f"_{ph}_{pw}"
        if not positions:
            return te.compute((n, c1x, nq_h, nq_w, C0), body, name=f"dx_acc{suffix}",
                              tag=f"{TAG}.acc")
        rco = te.reduce_axis((0, cout), name="co")

        def body_p(b, ci, qh, qw):
            row_h = qh + (c_h + pad_h) - jh * dr_h
            row_w = qw + (c_w + pad_w) - jw * dr_w
            return te.sum(dyp[b, rco, row_h, row_w]
                          * wt[ci, k0_h + jh * st_h, k0_w + jw * st_w, rco],
                          axis=[rco, jh, jw])

        return te.compute((n, cin, nq_h, ceil_div(nq_w, C0) * C0), body_p,
                          name=f"dx_acc_w{suffix}", tag=f"{TAG}.acc")

    accs = {(ph, pw): phase_acc(ph, pw) for ph in range(len(phases_h))
            for pw in range(len(phases_w)) if phases_h[ph][2] and phases_w[pw][2]}

    params = {**para.as_json(), "offset_x": 0, "offset_w": None, "group_dict": gd,
              "filter_sizes": list(w_sizes), "input_sizes": list(x_sizes)}
    formats = {filters.op.name: FORMAT_FRACZ if groups == 1 else FORMAT_FRACZ_G,
               out_backprop.op.name: FORMAT_5HD, "dx": FORMAT_5HD}
    attrs = {"dsl_op": TAG, "dsl_params": json.dumps(params, sort_keys=True),
             "dsl_formats": json.dumps(formats, sort_keys=True)}

    def out_body(b, cx1, i, j, cx0):
        sh, sw = len(phases_h), len(phases_w)
        val = tvm.tirx.const(0, ACC_DTYPE)
        for (ph, pw), acc in accs.items():
            # clamped: a vectorised select may evaluate both arms
            qh = te.min(i // sh, phases_h[ph][0] - 1) if sh > 1 else i
            qw = te.min(j // sw, phases_w[pw][0] - 1) if sw > 1 else j
            if positions:
                pick = acc[b, te.min(cx1 * C0 + cx0, cin - 1), qh, qw]
            else:
                pick = acc[b, cx1, qh, qw, cx0]
            conds = ([i % sh == ph] if sh > 1 else []) + ([j % sw == pw] if sw > 1 else [])
            val = te.if_then_else(tvm.tirx.all(*conds), pick, val) if conds else pick
        if cin % C0:
            val = te.if_then_else(cx1 * C0 + cx0 < cin, val, tvm.tirx.const(0, ACC_DTYPE))
        return val.astype(para.res_dtype)

    return te.compute((n, c1x, h, w, C0), out_body, name="dx", tag=TAG, attrs=attrs)


def axis_phases(ax: ConvAxis) -> list[tuple[int, int, int, int]]:
    """Per output phase ``p < stride`` of one axis (dx positions ``q*stride + p``):
    ``(positions, first tap k0, taps, c)`` where tap ``k0 + j*tap_step`` of position ``q``
    reads dy row ``q + c - j*tap_step*dilation/stride`` (unpadded). Only the taps that hit are
    listed, so a phase no tap reaches has 0 taps and no work."""
    out = []
    for p in range(ax.stride):
        count = ceil_div(ax.n_in - p, ax.stride) if p < ax.n_in else 0
        t = p + ax.pad_before
        ks = [k for k in range(ax.kernel) if (t - k * ax.dilation) % ax.stride == 0]
        if not ks or not count:
            out.append((count, 0, 0, 0))
            continue
        out.append((count, ks[0], len(ks), (t - ks[0] * ax.dilation) // ax.stride))
    return out


def dy_padding(ax: ConvAxis, phases) -> tuple[int, int]:
    """(zero rows before dy, padded length) so every listed tap of every phase reads in
    bounds; the rows outside dy are the taps that fall off the forward output."""
    lo, hi = 0, ax.n_out - 1
    dr = ax.tap_step * ax.dilation // ax.stride
    for count, _, taps, c in phases:
        if taps:
            lo = min(lo, c - (taps - 1) * dr)
            hi = max(hi, count - 1 + c)
    return -lo, hi + 1 - lo
