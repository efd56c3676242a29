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

Code: :func:`plan` checks every argument (errors before any TE work) and decides the
stages into a frozen :class:`Plan`; :func:`dy_stage`, :func:`weight_stage`, :func:`phase_acc`
and :func:`interleave` each build one stage from it.
Input dtypes are :data:`DTYPES` (checked in ``_check_dtypes``); every stage computes in
``Plan.acc_dtype`` (:func:`accumulation_dtype` of the input dtype).

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
    CO = padded Cout for groups == 1, else Cout_g), zero for pad channels, fp32, each axis's
    taps stored last first (index ``k`` holds tap ``KH - 1 - k``): the reduction visits a
    phase's taps last first, so its dy row and its weight index both grow with the step
    (:func:`stored_tap`).
``conv2d_backprop_input.acc``     one fp32 reduction per phase with taps, ``[N, C1x, Hq, Wq, 16]``,
    named ``dx_acc`` (stride 1) or ``dx_acc_<ph>_<pw>``; phases no tap reaches have none.
    For a dense layer whose Cin pads worse to 16 than its Cout (an RGB stem) the vector runs
    along W instead: ``dx_acc_w*`` ``[N, Cin, Hq, Wq']`` (``Wq`` rounded up to 16), reading
    dy_pad as ``[N, Cout, Hp, Wp]`` and the weight stage as ``[Cin, KH, KW, Cout]``.
``conv2d_backprop_input.wsum``    (int8) weight sums per dx channel, ``[C1x, 16]``: over every
    tap (``dx_wsum``, ``offset_x != 0``) and over each phase's taps (``dx_wsum_taps*``, VNNI).
``conv2d_backprop_input``         the phases interleaved, pad channels zeroed, cast to
    ``res_dtype``.

int8 on a target with AVX-512 VNNI (``GroupLayout.dot_depth``; dense layers with Cin in the lanes):
dy_pad holds the unsigned bytes ``dy + 128`` (padding ``offset_x + 128``) that ``vpdpbusd``
multiplies with signed weight bytes, the weight stage is ``[C1x, KH, KW, CO/4, 16, 4]`` int8
(one 512-bit load is 16 lanes x 4 Cout), the reduction's last axis is those 4 Cout
(tensorized by the schedule), and ``interleave`` takes ``(offset_x + 128) * dx_wsum_taps``
off each phase: exact, as ``sum (u - (offset_x + 128)) * W`` over a phase's taps is the
signed sum.

On a target with AMX (:func:`tile_products`) the dot-product layouts stage dy in blocks of
``k0`` = one 64-byte tile row, ``[N, C1k, Hp, Wp, k0]`` (32 bf16 or 64 int8 channels; Cout
padded to the block in dy and the weight), and int8 dy as the signed bytes it is, the padding
``offset_x`` (``tdpbssd``): no shift, and no weight sums at all unless ``offset_x != 0`` on a
strided layer, where the stride holes read ``offset_x`` too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dsl.errors import (
    E_CHANNEL,
    E_DTYPE,
    E_DTYPE_MISMATCH,
    E_GROUPS,
    E_RANGE,
    E_SHAPE,
    E_VALUE,
    ceil_div,
    check_elems,
    check_int,
    check_shape,
    fail,
    te_shape,
)
from dsl.ops import fallback, tag
from dsl.ops.conv_geometry import ConvAxis, clamp_index
from dsl.ops.group import C0, C0_INT8, GroupLayout, Int8DxLayout, calculate_group, check_group_dict
from dsl.ops.layout import FORMAT_5HD, FORMAT_FRACZ, FORMAT_FRACZ_G, pad_cast_5hd_compute
from dsl.ops.para_dict import Conv2dPara, check_offset_x, parse_conv2d_para

TAG = tag.CONV2D_BACKPROP_INPUT
ACC_DTYPE = "float32"
DTYPES = ("float16", "float32", "bfloat16", "int8")  # of filters and out_backprop (one dtype)
RES_DTYPES = ("float16", "float32", "bfloat16", "int32")  # int32 for (and only for) int8


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

    p = plan(filters, out_backprop, filter_sizes, input_sizes, para_dict)
    dyp = dy_stage(p, out_backprop)
    wt = weight_stage(p, filters)
    phases = [(ph, pw) for ph in range(len(p.phases_h)) for pw in range(len(p.phases_w))
              if p.phases_h[ph][2] and p.phases_w[pw][2]]
    has_twins = p.acc_dtype != "int32" and bool(phases)  # integers are always finite
    if has_twins:
        flag = fallback.nonfinite_flag(TAG, "dx_w_nonfinite", [filters])
        # a dense twin reads dy itself: the pad then has only the fast phases as readers,
        # which a schedule may compute it inside (schedules.conv2d_backprop_input:
        # pad_in_task, positions_in_tasks); not a user's prologue, which is inlined only
        # where no reduction reads it (schedules.fusion)
        own = out_backprop if p.lay.dense and p.dot <= 1 and isinstance(
            out_backprop.op, te.PlaceholderOp) else None
        exact = [phase_acc(p, dyp, wt, *k, flag=flag, dy=own) for k in phases]
        accs = {k: phase_acc(p, dyp, wt, *k, twin=e) for k, e in zip(phases, exact)}
    else:
        accs = {k: phase_acc(p, dyp, wt, *k) for k in phases}
    # signed bytes where every position's phase reads every tap (stride 1): the padding
    # already reads offset_x, there are no stride holes, so the sum is the whole of dx
    whole = p.signed and len(phases) == len(p.phases_h) * len(p.phases_w) and all(
        (p.phases_h[ph][2], p.phases_w[pw][2]) == (p.lay.kh, p.lay.kw) for ph, pw in phases)
    wsum = wsum_stage(p, wt) if p.offset_x and not whole else None
    dx = interleave(p, accs, _attrs(p, filters, out_backprop), wsum,
                    _phase_wsums(p, wt, accs, wsum) if _phase_shift(p) and not whole
                    else None)
    return tag.with_side_stages(dx, [flag, *exact]) if has_twins else dx


# --- check and plan --------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """A checked dx call and the decisions every stage reads (see the module docstring).

    ``phases_h`` / ``phases_w`` are :func:`axis_phases` of each axis; ``pad_*`` / ``size_*``
    the zero rows before dy and its padded length (:func:`dy_padding`); ``positions`` puts dx
    positions (W) in the vector lanes instead of Cin (an RGB stem).
    """

    para: Conv2dPara
    dtype: str  # of filters and out_backprop
    groups: int
    group_dict: dict
    lay: GroupLayout
    w_sizes: tuple[int, int, int, int]  # (Cout, Cin/groups, KH, KW)
    x_sizes: tuple[int, int, int, int]  # (N, Cin, H, W)
    dy_shape: tuple[int, ...]
    ah: ConvAxis
    aw: ConvAxis
    phases_h: tuple[tuple[int, int, int, int], ...]
    phases_w: tuple[tuple[int, int, int, int], ...]
    pad_h: int
    size_h: int
    pad_w: int
    size_w: int
    positions: bool
    acc_dtype: str  # every stage computes in it (see accumulation_dtype)
    offset_x: int = 0  # int8 only: what the stride holes and the padding of dy read
    qlay: Int8DxLayout | None = None  # int8 only: the int8 dx FracZ of ``filters``
    dot: int = 1  # Cout per lane of one dot-product step (GroupLayout.dot_depth)
    signed: bool = False  # int8 dot layout for signed x signed bytes (AMX tdpbssd)
    k0: int = C0  # dy channels per staged block of the dot layout: 16, or a 64-byte tile row

    @property
    def n(self) -> int:
        return self.x_sizes[0]

    @property
    def cin(self) -> int:
        return self.x_sizes[1]

    @property
    def cout(self) -> int:
        return self.w_sizes[0]

    @property
    def c1x(self) -> int:
        return ceil_div(self.cin, C0)

    @property
    def c1y(self) -> int:
        """dy channel blocks of 16 as the stages read them (int8 dy comes in blocks of 32)."""
        return ceil_div(self.cout, C0)

    @property
    def c0y(self) -> int:
        """C0 of ``out_backprop``: 32 for int8 (TBE's CUBE_MKN int8 k0), else 16."""
        return C0_INT8 if self.dtype == "int8" else C0

    @property
    def c1k(self) -> int:
        """dy channel blocks of ``k0`` the dot-product stages read (``c1y`` unless AMX)."""
        return ceil_div(self.cout, self.k0)

    @property
    def co_ext(self) -> int:
        """Reduction extent over output channels: padded Cout (dense; to a whole block of
        ``k0``) or Cout_g."""
        return self.c1k * self.k0 if self.lay.dense else self.lay.cout_g


def plan(filters, out_backprop, filter_sizes, input_sizes, para_dict) -> Plan:
    """Check every argument (raising :class:`dsl.DslError` before any TE work) and plan the
    stages. Same arguments as :func:`conv2d_backprop_input`."""
    para = _check_para(para_dict)
    w_sizes = check_shape("filter_sizes", filter_sizes, 4)
    x_sizes = check_shape("input_sizes", input_sizes, 4)
    dy_shape = te_shape("out_backprop", out_backprop, 5)
    fz_shape = te_shape("filters", filters, 4)
    dtype = _check_dtypes(filters, out_backprop, para.res_dtype)
    offset_x = _check_offset_x(para_dict, dtype)
    groups = _groups(para_dict, x_sizes[1], w_sizes[1])
    gd = calculate_group((x_sizes[0], w_sizes[0], 1, 1), x_sizes, w_sizes, groups,
                         filter_dtype=dtype,
                         names={"input_size_nchw": "input_sizes", "w_shape_nchw": "filter_sizes"})
    if "group_dict" in para_dict:
        check_group_dict(para_dict["group_dict"], gd)
    lay = GroupLayout.from_weight(w_sizes, groups)
    qlay = Int8DxLayout.from_weight(w_sizes, groups) if dtype == "int8" else None
    _check_shapes(w_sizes, x_sizes, dy_shape, fz_shape, qlay or lay)
    (n, cin, h, w), (_, _, kh, kw) = x_sizes, w_sizes
    ah = ConvAxis.checked("H", h, dy_shape[2], kh, para.strides[0], para.pads[0], para.pads[1],
                          para.dilations[0])
    aw = ConvAxis.checked("W", w, dy_shape[3], kw, para.strides[1], para.pads[2], para.pads[3],
                          para.dilations[1])
    # input_sizes can fit int32 while its 5HD result (C padded to 16) does not
    check_elems("input_sizes", list(x_sizes), (n, ceil_div(cin, C0), h, w, C0), "the 5HD dx")
    p = _decide(para, dtype, groups, gd, lay, w_sizes, x_sizes, dy_shape, ah, aw)
    dot = dot_depth(dtype, lay, p.positions)
    tiles = dot > 1 and tile_products(dtype)
    return replace(p, offset_x=offset_x, qlay=qlay, dot=dot, signed=tiles and dtype == "int8",
                   k0=C0 * dot if tiles else C0)


def tile_products(dtype: str) -> bool:
    """Whether the current target runs ``dtype``'s dot products on AMX tiles. Then dy is
    staged in blocks of one 64-byte tile row (32 bf16 or 64 int8 channels: a tile product
    as deep as the unit takes; at 16 channels it did half or a quarter of the work in the
    same 16 cycles), and int8 dy as the signed bytes it is (``tdpbssd``: no ``+ 128`` shift,
    so no weight-sum correction when ``offset_x`` is 0)."""
    import targets

    return targets.current().has_tiles(dtype)


def dot_depth(dtype: str, lay: GroupLayout, positions: bool) -> int:
    """Cout per lane of one dot-product step for this dx (:meth:`GroupLayout.dot_depth`; the
    few-channel ``positions`` layout has W, not Cin, in the lanes)."""
    return lay.dot_depth(dtype, cin_lanes=not positions)


def _check_para(para_dict) -> Conv2dPara:
    para = parse_conv2d_para(para_dict, op=TAG, default_res_dtype="float16", res_dtypes=RES_DTYPES,
                             allowed=("offset_x", "offset_w", "group_dict", "groups"))
    if para_dict.get("offset_w") is not None:
        raise fail(E_VALUE, "para_dict['offset_w']", para_dict["offset_w"],
                   "must be None: weight offsets (int8 quantisation) are not supported")
    return para


def accumulation_dtype(dtype: str) -> str:
    """The dtype the stages convert the inputs to and accumulate in, for an input ``dtype``
    (of :data:`DTYPES`): float32 for float16, bfloat16 and float32 inputs; int32 for int8
    (exact: every product and sum of a real layer fits)."""
    return "int32" if dtype == "int8" else ACC_DTYPE


def _check_dtypes(filters, out_backprop, res_dtype: str) -> str:
    dtype = str(out_backprop.dtype)
    if dtype not in DTYPES:
        raise fail(E_DTYPE, "out_backprop.dtype", dtype, f"must be one of {', '.join(DTYPES)}")
    if str(filters.dtype) != dtype:
        raise fail(E_DTYPE_MISMATCH, "filters.dtype", str(filters.dtype),
                   f"must equal out_backprop.dtype={dtype}")
    if (dtype == "int8") != (res_dtype == "int32"):
        raise fail(E_DTYPE, "para_dict['res_dtype']", res_dtype,
                   "must be 'int32' for int8 inputs (TBE's int8 dx), and only for int8 inputs"
                   if dtype == "int8" else "must be float16, float32 or bfloat16 for "
                   f"{dtype} inputs ('int32' belongs to int8 inputs)")
    return dtype


def _check_offset_x(para_dict: dict, dtype: str) -> int:
    """``offset_x``: the int8 input's quantisation offset in [-128, 127]; 0 for float inputs."""
    if dtype != "int8":
        return check_offset_x(para_dict.get("offset_x", 0))
    return check_int("para_dict['offset_x']", para_dict.get("offset_x", 0), lo=-128, hi=127,
                     code=E_RANGE)


def _groups(para_dict: dict, cin: int, cin_g: int) -> int:
    """``groups`` as given, else ``group_dict['groups']``, else ``Cin / (Cin/groups)``."""
    if "groups" in para_dict:
        return check_int("para_dict['groups']", para_dict["groups"], lo=1, code=E_GROUPS)
    gd = para_dict.get("group_dict")
    if "group_dict" in para_dict and isinstance(gd, dict) and "groups" in gd:
        return check_int("para_dict['group_dict']['groups']", gd["groups"], lo=1,
                         code=E_GROUPS)
    return cin // cin_g if cin % cin_g == 0 else 1


def _check_shapes(w_sizes, x_sizes, dy_shape, fz_shape, lay: GroupLayout) -> None:
    """dy's batch and channel blocks, and the weight's (group) FracZ shape."""
    cout, n = w_sizes[0], x_sizes[0]
    if dy_shape[0] != n:
        raise fail(E_SHAPE, "out_backprop.shape[0]", dy_shape[0],
                   f"must equal the batch input_sizes[0]={n}")
    c0y = C0_INT8 if isinstance(lay, Int8DxLayout) else C0
    if dy_shape[1] != ceil_div(cout, c0y) or dy_shape[4] != c0y:
        raise fail(E_CHANNEL, "out_backprop.shape", dy_shape,
                   f"must be (N, ceil(Cout/{c0y})={ceil_div(cout, c0y)}, Ho, Wo, {c0y}) for "
                   f"filter_sizes[0]=Cout={cout}")
    if fz_shape != lay.fracz_shape:
        raise fail(E_CHANNEL, "filters.shape", fz_shape,
                   f"must be the group FracZ shape {lay.fracz_shape} of filter_sizes={w_sizes} "
                   f"with groups={lay.groups}")


def _decide(para, dtype, groups, gd, lay, w_sizes, x_sizes, dy_shape, ah, aw) -> Plan:
    """The stage decisions of a checked call: phases, dy padding, which axis the lanes run."""
    cout, cin = w_sizes[0], x_sizes[1]
    phases_h, phases_w = axis_phases(ah), axis_phases(aw)
    pad_h, size_h = dy_padding(ah, phases_h)
    pad_w, size_w = dy_padding(aw, phases_w)
    # few input channels (an RGB stem): Cin in the lanes would be mostly padding, so the
    # lanes run along W instead: dy and the weight go to NCHW-like layouts, dx positions are
    # the vector, the weight is broadcast per (ci, tap, co)
    positions = lay.dense and ceil_div(cout, C0) * cin < ceil_div(cin, C0) * cout
    if positions:
        # each phase computes a whole number of 16-wide rows (the extra columns read dy's
        # zero padding and are never picked), so no vector is ragged
        size_w = max([size_w] + [ceil_div(count, C0) * C0 + c + pad_w
                                 for count, _, taps, c in phases_w if taps])
    return Plan(para, dtype, groups, gd, lay, w_sizes, x_sizes, dy_shape, ah, aw,
                tuple(phases_h), tuple(phases_w), pad_h, size_h, pad_w, size_w, positions,
                accumulation_dtype(dtype))


def _attrs(p: Plan, filters, out_backprop) -> dict:
    params = {**p.para.as_json(), "offset_x": p.offset_x, "offset_w": None,
              "group_dict": p.group_dict, "filter_sizes": list(p.w_sizes),
              "input_sizes": list(p.x_sizes)}
    formats = {filters.op.name: FORMAT_FRACZ if p.groups == 1 else FORMAT_FRACZ_G,
               out_backprop.op.name: FORMAT_5HD, "dx": FORMAT_5HD}
    return tag.kernel_attrs(TAG, params, formats)


# --- stages ----------------------------------------------------------------------------------

def _channel(p: Plan, cx1, cx0):
    """(g, ci) of dx channel cx1*16+cx0, clamped so pad channels index real data."""
    from tvm import te

    c = cx1 * C0 + cx0
    return p.lay.group_of_input_channel(c if p.cin % C0 == 0 else te.min(c, p.cin - 1))


def _padded_dy(p: Plan, dy, b, ch, hp, wp, mode: str = "acc"):
    """dy channel ``ch`` at padded row / column ``(hp, wp)`` (the read is clamped so it stays
    in bounds where both arms are evaluated), staged as ``mode`` says:

    ``"acc"``: in ``p.acc_dtype``, zero in the padding; int8 as ``dy - offset_x``, so the
    padding's 0 is the ``offset_x`` TBE reads there, and the stride holes (never read) are
    added back as ``offset_x * sum(W)`` in :func:`interleave`.
    ``"unsigned"`` (int8 for ``vpdpbusd``): ``dy + 128`` as uint8, the padding
    ``offset_x + 128`` (the same values shifted by ``offset_x + 128``).
    ``"raw"`` (bfloat16, and int8 for AMX ``tdpbssd``): dy as it comes, the padding
    ``offset_x`` (0 for float inputs): exactly what TBE reads there."""
    import tvm
    from tvm import te

    ah, aw, c0y = p.ah, p.aw, p.c0y
    src_h, src_w = hp - p.pad_h, wp - p.pad_w
    raw = dy[b, ch // c0y, clamp_index(src_h, ah.n_out), clamp_index(src_w, aw.n_out),
             ch % c0y]
    ok = tvm.tirx.all(src_h >= 0, src_h < ah.n_out, src_w >= 0, src_w < aw.n_out)
    if mode == "raw":
        return te.if_then_else(ok, raw, tvm.tirx.const(p.offset_x, p.dtype))
    if mode == "unsigned":
        val = (raw.astype("int32") + 128).astype("uint8")
        return te.if_then_else(ok, val, tvm.tirx.const(p.offset_x + 128, "uint8"))
    val = raw.astype(p.acc_dtype)
    if p.offset_x:
        val = val - tvm.tirx.const(p.offset_x, p.acc_dtype)
    return te.if_then_else(ok, val, tvm.tirx.const(0, p.acc_dtype))


def dy_stage(p: Plan, out_backprop):
    """``dy_pad`` (and ``dy_cast``): dy in ``p.acc_dtype``, zero-padded so every listed tap
    reads in bounds, in the layout the reduction reads; dy itself when nothing is to do."""
    from tvm import te

    if p.positions:
        def dyt_body(b, co, hp, wp):
            return _padded_dy(p, out_backprop, b, co, hp, wp)

        return te.compute((p.n, p.cout, p.size_h, p.size_w), dyt_body, name="dx_dy_pad",
                          tag=tag.stage(TAG, "dy_pad"))
    if p.dot > 1:
        return _dy_dot(p, out_backprop)
    if p.qlay is not None and p.lay.dense:
        return _dy_int8_dense(p, out_backprop)
    if p.lay.dense and p.dtype == p.acc_dtype and p.pad_h == p.pad_w == 0 and \
            (p.size_h, p.size_w) == (p.ah.n_out, p.aw.n_out):
        return out_backprop  # nothing to pad or convert (a 1x1 layer): no copy
    if p.lay.dense:
        return pad_cast_5hd_compute(out_backprop, (p.pad_h, p.pad_w), (p.size_h, p.size_w),
                                    p.acc_dtype, name="dx_dy_pad", tag=tag.stage(TAG, "dy_pad"))
    return _dy_regather(p, out_backprop)


def _dy_int8_dense(p: Plan, out_backprop):
    """int8 dy (blocks of 32) padded and re-blocked to ``[N, C1y, Hp, Wp, 16]`` int32 (minus
    ``offset_x``), the 5HD the dense reduction reads; pad channels meet zero weights. Every
    block of 16 lies inside one of dy's blocks of 32 (which hold at least as many channels),
    so the read needs no clamp, and without one each block is a contiguous run."""
    from tvm import te

    def body(b, c1, hp, wp, c0):
        return _padded_dy(p, out_backprop, b, c1 * C0 + c0, hp, wp)

    return te.compute((p.n, p.c1y, p.size_h, p.size_w, C0), body, name="dx_dy_pad",
                      tag=tag.stage(TAG, "dy_pad"))


def _dy_dot(p: Plan, out_backprop):
    """dy for a dot-product instruction (``p.dot > 1``), ``[N, C1k, Hp, Wp, k0]`` (blocks of
    ``p.k0`` channels: 16, or a whole AMX tile row): the ``dot`` Cout a lane sums per step
    are adjacent, one 32-bit broadcast. bfloat16 stays bfloat16 (``vdpbf16ps``, AMX); int8
    is padded and re-blocked as the unsigned bytes ``dy + 128`` (the padding ``offset_x +
    128``) that ``vpdpbusd`` takes, and :func:`interleave` takes ``(offset_x + 128) *
    sum(W)`` over each phase's taps off again; or, with ``p.signed`` (AMX), as the signed
    bytes they are (the padding ``offset_x``). Channels past Cout are zero (they meet zero
    weights; zero, not a copy of a real channel, so a NaN there reaches no dx)."""
    import tvm
    from tvm import te

    bf16 = p.qlay is None
    if bf16 and p.k0 == C0:  # pairs of dy channels as they come, padded with zeros
        if p.pad_h == p.pad_w == 0 and (p.size_h, p.size_w) == (p.ah.n_out, p.aw.n_out):
            return out_backprop
        return pad_cast_5hd_compute(out_backprop, (p.pad_h, p.pad_w), (p.size_h, p.size_w),
                                    p.dtype, name="dx_dy_pad", tag=tag.stage(TAG, "dy_pad"))

    blocks = p.dy_shape[1]  # 5HD blocks of p.c0y channels out_backprop holds

    def body(b, c1, hp, wp, c0):
        ch = c1 * p.k0 + c0
        # clamped only where the blocks reach past the buffer: a clamp on every read hides
        # that each 5HD block's run of lanes is contiguous (LLVM gathered it byte by byte)
        read = ch if p.c1k * p.k0 <= blocks * p.c0y else \
            te.min(ch // p.c0y, blocks - 1) * p.c0y + ch % p.c0y
        val = _padded_dy(p, out_backprop, b, read, hp, wp,
                         "raw" if bf16 or p.signed else "unsigned")
        if p.cout % p.k0 == 0 or not bf16:  # int8 is finite: its pad channels may copy
            return val
        return te.if_then_else(ch < p.cout, val, tvm.tirx.const(0, p.dtype))

    run = math.gcd(p.k0, p.c0y)
    return te.compute((p.n, p.c1k, p.size_h, p.size_w, p.k0), body, name="dx_dy_pad",
                      tag=tag.stage(TAG, "dy_pad"),
                      attrs={tag.SOURCE_RUN: run} if run < p.k0 else None)


def _dy_regather(p: Plan, out_backprop):
    """Grouped dy regathered per dx lane: lane cx0 of block cx1 finds its group's dy channel
    co at ``[..., co, cx0]``, so the reduction loads whole vectors instead of gathering."""
    from tvm import te

    lay, acc = p.lay, p.acc_dtype
    dy32 = out_backprop
    if p.dtype != acc and lay.cin_g * lay.cout_g > 1:
        # the regather below moves single lanes, and 16-bit lanes have no vector gather
        dy32 = te.compute(p.dy_shape, lambda *i: out_backprop[i].astype(acc),
                          name="dx_dy_cast", tag=tag.stage(TAG, "dy_cast"))

    def dyg_body(b, cx1, hp, wp, co, cx0):
        g, _ = _channel(p, cx1, cx0)
        return _padded_dy(p, dy32, b, g * lay.cout_g + co, hp, wp)

    # lanes of one group read one dy channel: runs of gcd(Cin/g, 16) equal lanes
    run = math.gcd(lay.cin_g, C0)
    return te.compute((p.n, p.c1x, p.size_h, p.size_w, lay.cout_g, C0), dyg_body,
                      name="dx_dy_pad", tag=tag.stage(TAG, "dy_pad"),
                      attrs={tag.LANE_RUN: run} if run > 1 else None)


def weight_stage(p: Plan, filters):
    """``weight``: the FracZ weight repacked for the reduction, in ``p.acc_dtype``:
    ``[Cin, KH, KW, Cout]`` (positions) or ``[C1x, KH, KW, CO, 16]`` with zero pad channels,
    the taps of each axis stored last first (:func:`stored_tap`);
    with ``p.dot > 1`` ``[C1x, KH, KW, CO/dot, 16, dot]`` in the input dtype: one 512-bit
    load holds the 16 lanes x ``dot`` products the instruction sums."""
    from tvm import te

    lay, acc = p.lay, p.acc_dtype
    if p.positions:
        def weight_p_body(ci, s_h, s_w, co):
            k_h, k_w = lay.kh - 1 - s_h, lay.kw - 1 - s_w
            if p.qlay is not None:
                return filters[p.qlay.fracz_index(co, ci, k_h, k_w)].astype(acc)
            row, lane = lay.fracz_row_lane(0, ci, k_h, k_w)
            return filters[row, co // C0, co % C0, lane].astype(acc)

        return te.compute((p.cin, lay.kh, lay.kw, p.cout), weight_p_body, name="dx_weight",
                          tag=tag.stage(TAG, "weight"))

    def weight_body(cx1, s_h, s_w, co, cx0):
        return _weight_value(p, filters, cx1, lay.kh - 1 - s_h, lay.kw - 1 - s_w, co, cx0, acc)

    def weight_dot_body(cx1, s_h, s_w, co_o, cx0, co_i):
        return _weight_value(p, filters, cx1, lay.kh - 1 - s_h, lay.kw - 1 - s_w,
                             co_o * p.dot + co_i, cx0, p.dtype)

    if p.dot > 1:  # the instruction's layout
        return te.compute((p.c1x, lay.kh, lay.kw, p.co_ext // p.dot, C0, p.dot),
                          weight_dot_body, name="dx_weight", tag=tag.stage(TAG, "weight"))
    return te.compute((p.c1x, lay.kh, lay.kw, p.co_ext, C0), weight_body, name="dx_weight",
                      tag=tag.stage(TAG, "weight"))


def _weight_value(p: Plan, filters, cx1, k_h, k_w, co, cx0, dtype: str):
    """W of dx channel ``cx1*16 + cx0`` and group Cout ``co`` at tap ``(k_h, k_w)`` in
    ``dtype``; zero for pad channels."""
    import tvm
    from tvm import te

    lay = p.lay
    g, ci = _channel(p, cx1, cx0)
    # a pad Cout (up to the stage's block of k0, which may pass the FracZ's columns) reads a
    # real one, in bounds, and is masked below
    pad_cout = lay.dense and p.co_ext > p.cout
    co_c = te.min(co, p.cout - 1) if pad_cout else co
    if p.qlay is not None:  # int8 dx FracZ
        val = filters[p.qlay.fracz_index(g * lay.cout_g + co_c, ci, k_h, k_w)].astype(dtype)
    else:
        row, lane = lay.fracz_row_lane(g, ci, k_h, k_w)
        col1, col0 = lay.fracz_col(g, co_c)
        val = filters[row, col1, col0, lane].astype(dtype)
    conds = []
    if p.cin % C0:
        conds.append(cx1 * C0 + cx0 < p.cin)
    if pad_cout:
        conds.append(co < p.cout)
    if not conds:
        return val
    return te.if_then_else(tvm.tirx.all(*conds), val, tvm.tirx.const(0, dtype))


def phase_acc(p: Plan, dyp, wt, ph: int, pw: int, flag=None, twin=None, dy=None):
    """``acc`` of the dx positions ``(q_h*sh + ph, q_w*sw + pw)``: every tap index is affine
    in ``q`` and the reduction step ``(jh, jw)``.

    It multiplies the taps that fall outside dy by dy's zero padding, which is exact unless a
    weight is NaN or infinite. So float dx also has, per phase, an ``exact`` twin (made with
    ``flag``, :func:`dsl.ops.fallback.nonfinite_flag`) where those taps add nothing; it runs
    only when ``flag`` is set, and the ``acc`` made with ``twin`` takes its values then (both
    :mod:`dsl.runtime.run_if`). ``dy`` (a dense layout's twin): read dy itself, the row and
    column clamped into it (the twin's guard drops what lies outside), instead of ``dyp``."""
    from tvm import te

    (nq_h, k0_h, nt_h, c_h), (nq_w, k0_w, nt_w, c_w) = p.phases_h[ph], p.phases_w[pw]
    st_h, st_w = p.ah.tap_step, p.aw.tap_step
    dr_h, dr_w = st_h * p.ah.dilation // p.ah.stride, st_w * p.aw.dilation // p.aw.stride
    jh = te.reduce_axis((0, nt_h), name="jh")
    jw = te.reduce_axis((0, nt_w), name="jw")

    def tap(qh, qw):
        """(dy row, dy column, weight-stage kh, kw) that step (jh, jw) of position (qh, qw)
        reads: step ``j`` is tap number ``nt - 1 - j`` of the phase (last first), so both
        indices grow with the step; with the first tap first the dy row fell as the step
        grew, and LLVM recomputed every broadcast's address in 32-bit wrap-around arithmetic
        (shifts and extracts beside each FMA) once the rows came from a fused task loop."""
        return (qh + (c_h + p.pad_h - (nt_h - 1) * dr_h) + jh * dr_h,
                qw + (c_w + p.pad_w - (nt_w - 1) * dr_w) + jw * dr_w,
                stored_tap(p.lay.kh, k0_h, nt_h, st_h, jh),
                stored_tap(p.lay.kw, k0_w, nt_w, st_w, jw))

    suffix = "" if len(p.phases_h) * len(p.phases_w) == 1 else f"_{ph}_{pw}"
    kind = _Acc("dx_acc", tag.stage(TAG, "acc"), lambda row_h, row_w, v: v, {})
    if flag is not None:
        def real(row_h, row_w, v):
            import tvm

            ok = tvm.tirx.all(row_h >= p.pad_h, row_h < p.pad_h + p.ah.n_out,
                              row_w >= p.pad_w, row_w < p.pad_w + p.aw.n_out)
            return tvm.tirx.if_then_else(ok, v, tvm.tirx.const(0, p.acc_dtype))

        kind = _Acc("dx_exact", tag.DX_EXACT, real, fallback.twin_attrs(flag))
    elif twin is not None:
        kind = replace(kind, attrs=fallback.fast_attrs(twin))
    if dy is not None:
        dyp = _UnpaddedDy(p, dy)
    if p.positions:
        return _acc_positions(p, dyp, wt, tap, (jh, jw), (nq_h, nq_w), suffix, kind)
    return _acc_lanes(p, dyp, wt, tap, (jh, jw), (nq_h, nq_w), suffix, kind)


@dataclass(frozen=True)
class _UnpaddedDy:
    """dy indexed like the padded ``dx_dy_pad``, ``[N, C1y, Hp, Wp, C0]`` or (positions)
    ``[N, Cout, Hp, Wp]`` (in ``p.acc_dtype``): the row and column clamped into dy, so the
    read stays in bounds; the caller's guard supplies the padding's zero."""

    p: Plan
    dy: object

    def __getitem__(self, idx):
        p = self.p
        if len(idx) == 4:  # positions: one dy channel, from its 5HD block and lane
            b, ch, hp, wp = idx
            c1, c0 = ch // p.c0y, ch % p.c0y
        else:
            b, c1, hp, wp, c0 = idx
        return self.dy[b, c1, clamp_index(hp - p.pad_h, p.ah.n_out),
                       clamp_index(wp - p.pad_w, p.aw.n_out), c0].astype(p.acc_dtype)


def stored_tap(k: int, k0: int, n: int, step: int, j):
    """The weight stage's index along an axis of ``k`` taps for step ``j`` of a run of ``n``
    taps ``k0, k0 + step, ...`` visited last first: tap ``k0 + (n - 1 - j) * step``, stored
    at ``k - 1 - tap`` (:func:`weight_stage`), so the index grows with ``j``."""
    return (k - 1 - k0 - (n - 1) * step) + j * step


@dataclass(frozen=True)
class _Acc:
    """Name, tag, product filter ``(dy row, dy column, product) -> term`` and attrs of a
    phase's reduction: the fast ``acc`` or its ``exact`` fallback."""

    name: str
    tag: str
    term: object
    attrs: dict


def _acc_lanes(p: Plan, dyp, wt, tap, jhw, nq, suffix: str, kind: _Acc):
    """Cin in the lanes: ``dx_acc* [N, C1x, Hq, Wq, 16]``."""
    from tvm import te

    if p.dot > 1:  # the last reduction axis is the dot-product instruction's
        rco1 = te.reduce_axis((0, p.c1k), name="co1")
        rco_o = te.reduce_axis((0, p.k0 // p.dot), name="co0")
        rco_i = te.reduce_axis((0, p.dot), name="co_dot")
        red = [rco1, *jhw, rco_o, rco_i]
    elif p.lay.dense:
        rco1 = te.reduce_axis((0, p.c1y), name="co1")
        rco0 = te.reduce_axis((0, C0), name="co0")
        red = [rco1, *jhw, rco0]
    else:
        rco = te.reduce_axis((0, p.lay.cout_g), name="co")
        red = [*jhw, rco]

    def body(b, cx1, qh, qw, cx0):
        row_h, row_w, k_h, k_w = tap(qh, qw)
        if p.dot > 1:
            dyv = dyp[b, rco1, row_h, row_w, rco_o * p.dot + rco_i].astype(p.acc_dtype)
            wv = wt[cx1, k_h, k_w, rco1 * (p.k0 // p.dot) + rco_o, cx0,
                    rco_i].astype(p.acc_dtype)
        elif p.lay.dense:
            dyv = dyp[b, rco1, row_h, row_w, rco0]
            wv = wt[cx1, k_h, k_w, rco1 * C0 + rco0, cx0]
        else:
            dyv = dyp[b, cx1, row_h, row_w, rco, cx0]
            wv = wt[cx1, k_h, k_w, rco, cx0]
        return te.sum(kind.term(row_h, row_w, dyv * wv), axis=red)

    return te.compute((p.n, p.c1x, *nq, C0), body, name=f"{kind.name}{suffix}", tag=kind.tag,
                      attrs=kind.attrs)


def _acc_positions(p: Plan, dyp, wt, tap, jhw, nq, suffix: str, kind: _Acc):
    """W positions in the lanes: ``dx_acc_w* [N, Cin, Hq, Wq']``, ``Wq`` rounded up to 16."""
    from tvm import te

    rco = te.reduce_axis((0, p.cout), name="co")

    def body_p(b, ci, qh, qw):
        row_h, row_w, k_h, k_w = tap(qh, qw)
        prod = dyp[b, rco, row_h, row_w] * wt[ci, k_h, k_w, rco]
        return te.sum(kind.term(row_h, row_w, prod), axis=[rco, *jhw])

    return te.compute((p.n, p.cin, nq[0], ceil_div(nq[1], C0) * C0), body_p,
                      name=f"{kind.name}_w{suffix}", tag=kind.tag, attrs=kind.attrs)


def wsum_stage(p: Plan, wt, taps=None, suffix: str = ""):
    """``wsum`` (int8): ``sum_{co, kh, kw} W[co, c, kh, kw]`` per dx channel (over its group's
    Cout), ``[C1x, 16]`` or ``[Cin]`` (positions). With ``offset_x != 0`` every tap that reads
    no real dy element reads ``offset_x``, so ``offset_x * wsum`` restores them. ``taps``
    ``((kh0, nh, step_h), (kw0, nw, step_w))`` sums one phase's taps only (``dx_wsum<suffix>``,
    the shift of the unsigned dy that ``vpdpbusd`` reads)."""
    from tvm import te

    (k0_h, n_h, st_h), (k0_w, n_w, st_w) = taps or ((0, p.lay.kh, 1), (0, p.lay.kw, 1))
    rkh = te.reduce_axis((0, n_h), name="wkh")
    rkw = te.reduce_axis((0, n_w), name="wkw")
    k_h = stored_tap(p.lay.kh, k0_h, n_h, st_h, rkh)
    k_w = stored_tap(p.lay.kw, k0_w, n_w, st_w, rkw)
    name, stage = f"dx_wsum{suffix}", tag.DX_WSUM
    if p.positions:
        rco = te.reduce_axis((0, p.cout), name="wco")
        return te.compute((p.cin,), lambda ci: te.sum(wt[ci, k_h, k_w, rco], axis=[rkh, rkw, rco]),
                          name=name, tag=stage)
    rco = te.reduce_axis((0, p.co_ext), name="wco")

    def body(cx1, cx0):
        if p.dot > 1:
            w = wt[cx1, k_h, k_w, rco // p.dot, cx0, rco % p.dot].astype(p.acc_dtype)
        else:
            w = wt[cx1, k_h, k_w, rco, cx0]
        return te.sum(w, axis=[rkh, rkw, rco])

    return te.compute((p.c1x, C0), body, name=name, tag=stage)


def _phase_wsums(p: Plan, wt, accs: dict, wsum) -> dict:
    """Per phase of ``accs``, the weight sum over its taps (int8 with ``dot > 1``): each phase
    reads ``offset_x + 128`` more per tap than the signed dy, which :func:`interleave` takes
    off. A phase with every tap shares ``wsum``."""
    out = {}
    for ph, pw in accs:
        (_, k0_h, nt_h, _), (_, k0_w, nt_w, _) = p.phases_h[ph], p.phases_w[pw]
        taps = ((k0_h, nt_h, p.ah.tap_step), (k0_w, nt_w, p.aw.tap_step))
        if wsum is not None and (nt_h, nt_w) == (p.lay.kh, p.lay.kw):
            out[ph, pw] = wsum
        else:
            suffix = "" if len(accs) == 1 else f"_{ph}_{pw}"
            out[ph, pw] = wsum_stage(p, wt, taps, f"_taps{suffix}")
    return out


def _phase_shift(p: Plan) -> int:
    """What each int8 dot-product phase sum reads more per tap than ``dy - offset_x``: its
    staged dy's shift, ``offset_x + 128`` (unsigned, ``vpdpbusd``) or ``offset_x``
    (signed, AMX), which :func:`interleave` takes off with the phase's weight sums; 0 when
    there is nothing to take off (no dot layout, or signed with ``offset_x`` 0)."""
    if p.dot == 1 or p.qlay is None:
        return 0
    return p.offset_x + (0 if p.signed else 128)


def interleave(p: Plan, accs: dict, attrs: dict, wsum=None, phase_wsums=None):
    """The anchor ``dx``: the phases interleaved, plus ``offset_x * wsum`` (int8), minus
    :func:`_phase_shift` ``* phase_wsums[phase]`` (int8 dot products), pad channels
    zeroed, cast to res_dtype."""
    import tvm
    from tvm import te

    zero = tvm.tirx.const(0, p.acc_dtype)

    def out_body(b, cx1, i, j, cx0):
        val = pick(b, cx1, i, j, cx0)
        if wsum is not None:
            ws = wsum[te.min(cx1 * C0 + cx0, p.cin - 1)] if p.positions else wsum[cx1, cx0]
            val = val + tvm.tirx.const(p.offset_x, p.acc_dtype) * ws
        if p.cin % C0:
            val = te.if_then_else(cx1 * C0 + cx0 < p.cin, val, zero)
        return val.astype(p.para.res_dtype)

    def pick(b, cx1, i, j, cx0):
        sh, sw = len(p.phases_h), len(p.phases_w)
        val = zero
        for (ph, pw), acc in accs.items():
            # clamped: a vectorised select may evaluate both arms
            qh = te.min(i // sh, p.phases_h[ph][0] - 1) if sh > 1 else i
            qw = te.min(j // sw, p.phases_w[pw][0] - 1) if sw > 1 else j
            if p.positions:
                got = acc[b, te.min(cx1 * C0 + cx0, p.cin - 1), qh, qw]
            else:
                got = acc[b, cx1, qh, qw, cx0]
            if phase_wsums is not None:
                shift = tvm.tirx.const(_phase_shift(p), p.acc_dtype)
                got = got - shift * phase_wsums[ph, pw][cx1, cx0]
            conds = ([i % sh == ph] if sh > 1 else []) + ([j % sw == pw] if sw > 1 else [])
            val = te.if_then_else(tvm.tirx.all(*conds), got, val) if conds else got
        return val

    n, _, h, w = p.x_sizes
    return te.compute((n, p.c1x, h, w, C0), out_body, name="dx", tag=TAG, attrs=attrs)


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
