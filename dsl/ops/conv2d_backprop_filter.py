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

Code: :func:`plan` checks every argument (errors before any TE work) and decides the
stages into a frozen :class:`Plan`; :func:`x_stage`, :func:`dy_stage`, the ``acc`` builders and
:func:`scatter` each build one stage from it.
Input dtypes are :data:`DTYPES` (checked in ``_check_dtypes``); every stage computes in
``Plan.acc_dtype`` (:func:`accumulation_dtype` of the input dtype).

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
``conv2d_backprop_filter.nonfinite`` / ``.exact``  (dense layers that read x's padding,
    either lane layout) the fast ``acc`` multiplies the padding's zeros in; a NaN / inf scan
    of dy and ``dw_exact`` (in ``acc``'s layout), the sum with the padding left out, which
    runs instead when the scan finds one (:mod:`dsl.ops.fallback`). Grouped layers select
    dy to zero there.
``conv2d_backprop_filter.acc``    the fp32 reduction over ``(n, ho, wo)`` into a compact
    ``dw_acc [C1x, KH, KW, CO, 16]`` (Cin lanes last; CO = padded Cout for groups == 1, else
    Cout_g), so grouped and depthwise layers do no cross-group work; or, for a dense layer
    whose Cin pads worse to 16 than its Cout (an RGB stem), ``dw_acc_t [C1y, KH, KW, Cin, 16]``
    with Cout in the lanes.
``conv2d_backprop_filter``        the compact result scattered into group FracZ, cast.

bfloat16 on a target with AVX512-BF16 (``GroupLayout.dot_depth``: dense layers with Cin in
the lanes) sums pairs of Wo positions in one ``vdpbf16ps`` step instead, one 512-bit load
holding 16 lanes x 2 products:

``conv2d_backprop_filter.x_pair``  ``dw_x_pair [N, C1x, Hr, Wr, 16, 2]`` bf16: the padded rows
    and columns the reduction reads (every ``step``-th: a 1x1 layer reads every other column
    of a pair), at column ``q`` lane by lane x's columns ``q`` and ``q + stride_w`` (zero in
    the padding).
``conv2d_backprop_filter.dy_pair`` ``dw_dy_pair [N, CO, Ho, ceil(Wo/2), 2]`` bf16: each
    channel's Wo pairs side by side (one 32-bit broadcast), zero past an odd Wo.
``conv2d_backprop_filter.acc``    ``dw_acc`` as above, reduced over ``(n, ho, wo2, pair)``.
``conv2d_backprop_filter.nonfinite`` / ``.exact``  when the pair reduction multiplies zeros
    in (x's padding by dy; the zero dy past an odd Wo by x's next columns), a NaN / inf scan
    of what meets them (dy; ``dw_x_tail``, those x columns) and ``dw_exact``, the sum with the
    padding left out, which runs instead when the scan finds one (:mod:`dsl.ops.fallback`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
from dsl.ops import fallback, tag
from dsl.ops.conv_geometry import ConvAxis, clamp_index
from dsl.ops.group import C0, GroupLayout, calculate_group
from dsl.ops.layout import FORMAT_5HD, FORMAT_FRACZ, FORMAT_FRACZ_G, pad_cast_5hd_compute, te_all
from dsl.ops.para_dict import Conv2dPara, parse_conv2d_para

TAG = tag.CONV2D_BACKPROP_FILTER
ACC_DTYPE = "float32"
DTYPES = ("float16", "float32", "bfloat16")  # of input_x and out_backprop (one dtype for both)


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
    p = plan(input_x, out_backprop, filter_sizes, para_dict)
    met = _met_by_zeros(p, input_x, out_backprop)
    flag = exact = None
    if met:  # the fast reduction multiplies zeros in: a scan of what meets them, and a twin
        flag = fallback.nonfinite_flag(TAG, "dw_nonfinite", met)
        exact = _acc_exact(p, input_x, out_backprop, flag)
    if p.dot > 1:
        acc = _acc_dot(p, x_pairs(p, input_x), dy_pairs(p, out_backprop), exact)
    elif p.cout_lanes:
        acc = _acc_cout_lanes(p, x_stage(p, input_x), dy_stage(p, out_backprop), exact)
    else:
        acc = _acc_cin_lanes(p, x_stage(p, input_x), dy_stage(p, out_backprop), exact)
    dw = scatter(p, acc, _attrs(p, input_x, out_backprop))
    return tag.with_side_stages(dw, [flag, exact]) if met else dw


def _met_by_zeros(p: Plan, input_x, out_backprop) -> list:
    """What the fast reduction multiplies by zeros the math has no product for, on dense
    layers (grouped ones select dy to zero in x's padding instead): all of dy when some tap
    reads x's padding and, for the pair reduction (``p.dot > 1``), the x columns that the
    zero dy past an odd Wo meets (``dw_x_tail [N, C1x, H, KW, 16]``, those of them inside
    x). A NaN / inf there must not reach dw."""
    from tvm import te

    if not p.lay.dense:
        return []
    aw = p.aw
    met = []
    if _reads_padding(p):
        met.append(out_backprop)
    if p.dot > 1 and aw.n_out % p.dot:
        first = aw.n_out * aw.stride - aw.pad_before  # the column tap kw = 0 of the pad meets
        cols = [first + k * aw.dilation for k in range(aw.kernel)]
        cols = [c for c in cols if 0 <= c < aw.n_in]
        if cols:
            met.append(te.compute(
                (p.n, p.c1x, p.ah.n_in, len(cols), C0),
                lambda b, c1, h, i, c0: input_x[b, c1, h, cols[0] + i * aw.dilation, c0],
                name="dw_x_tail", tag=tag.stage(TAG, "nonfinite")))
    return met


# --- check and plan --------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """A checked dw call and the decisions every stage reads (see the module docstring).

    ``cout_lanes`` puts Cout in the vector lanes instead of Cin (a dense layer whose Cin pads
    worse to 16 than its Cout, e.g. an RGB stem).
    """

    para: Conv2dPara
    dtype: str  # of input_x and out_backprop
    groups: int
    group_dict: dict
    lay: GroupLayout
    w_sizes: tuple[int, int, int, int]  # (Cout, Cin/groups, KH, KW)
    x_shape: tuple[int, int, int, int, int]  # (N, C1x, H, W, 16)
    dy_shape: tuple[int, int, int, int, int]  # (N, C1y, Ho, Wo, 16)
    ah: ConvAxis
    aw: ConvAxis
    cout_lanes: bool
    acc_dtype: str  # every stage computes in it (see accumulation_dtype)
    dot: int = 1  # Wo positions per lane of one dot-product step (GroupLayout.dot_depth)

    @property
    def n(self) -> int:
        return self.x_shape[0]

    @property
    def c1x(self) -> int:
        return self.x_shape[1]

    @property
    def c1y(self) -> int:
        return self.dy_shape[1]

    @property
    def cin(self) -> int:
        return self.lay.cin

    @property
    def cout(self) -> int:
        return self.w_sizes[0]

    @property
    def co_ext(self) -> int:
        """Output channels of the compact acc: padded Cout (dense) or Cout_g."""
        return self.c1y * C0 if self.lay.dense else self.lay.cout_g


def plan(input_x, out_backprop, filter_sizes, para_dict) -> Plan:
    """Check every argument (raising :class:`dsl.DslError` before any TE work) and plan the
    stages. Same arguments as :func:`conv2d_backprop_filter`."""
    para = parse_conv2d_para(para_dict, op=TAG, default_res_dtype="float32",
                             allowed=("groups",))
    groups = check_int("para_dict['groups']", para_dict.get("groups", 1), lo=1, code=E_GROUPS)
    w_sizes = check_shape("filter_sizes", filter_sizes, 4)
    x_shape = te_shape("input_x", input_x, 5)
    dy_shape = te_shape("out_backprop", out_backprop, 5)
    dtype = _check_dtypes(input_x, out_backprop)
    _check_shapes(w_sizes, x_shape, dy_shape, groups)
    (cout, cin_g, kh, kw), (n, c1x, h, w, _) = w_sizes, x_shape
    gd = calculate_group((n, cout, 1, 1), (n, cin_g * groups, h, w), w_sizes, groups,
                         filter_dtype=dtype, names={"w_shape_nchw": "filter_sizes"})
    lay = GroupLayout.from_weight(w_sizes, groups)
    ah = ConvAxis.checked("H", h, dy_shape[2], kh, para.strides[0], para.pads[0], para.pads[1],
                          para.dilations[0])
    aw = ConvAxis.checked("W", w, dy_shape[3], kw, para.strides[1], para.pads[2], para.pads[3],
                          para.dilations[1])
    # group FracZ pads every group to whole 16x16 blocks: small weights can overflow int32
    check_elems("filter_sizes", list(w_sizes), lay.fracz_shape, "the group FracZ dw")
    check_elems("input_x.shape", list(x_shape),
                (n, c1x, ah.x_padded_size, aw.x_padded_size, C0), "the padded x")
    cout_lanes = lay.dense and dy_shape[1] * C0 * lay.cin < c1x * C0 * cout
    return Plan(para, dtype, groups, gd, lay, w_sizes, x_shape, dy_shape, ah, aw, cout_lanes,
                accumulation_dtype(dtype), dot_depth(dtype, lay, cout_lanes))


def dot_depth(dtype: str, lay: GroupLayout, cout_lanes: bool) -> int:
    """Wo positions per lane of one dot-product step for this dw
    (:meth:`GroupLayout.dot_depth`; the few-channel layout has Cout in the lanes)."""
    return lay.dot_depth(dtype, cin_lanes=not cout_lanes)


def accumulation_dtype(dtype: str) -> str:
    """The dtype the stages convert the inputs to and accumulate in, for an input ``dtype``
    (of :data:`DTYPES`): float32 for float16, bfloat16 and float32 inputs."""
    return ACC_DTYPE


def _check_dtypes(input_x, out_backprop) -> str:
    dtype = str(input_x.dtype)
    if dtype not in DTYPES:
        raise fail(E_DTYPE, "input_x.dtype", dtype, f"must be one of {', '.join(DTYPES)}")
    if str(out_backprop.dtype) != dtype:
        raise fail(E_DTYPE_MISMATCH, "out_backprop.dtype", str(out_backprop.dtype),
                   f"must equal input_x.dtype={dtype}")
    return dtype


def _check_shapes(w_sizes, x_shape, dy_shape, groups: int) -> None:
    """C0 blocks, x's channel blocks for ``Cin = Cin/groups * groups``, dy's batch and blocks."""
    cout, cin_g = w_sizes[0], w_sizes[1]
    n, c1x, x_c0 = x_shape[0], x_shape[1], x_shape[4]
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


def _attrs(p: Plan, input_x, out_backprop) -> dict:
    params = {**p.para.as_json(), "groups": p.groups, "group_dict": p.group_dict,
              "filter_sizes": list(p.w_sizes)}
    formats = {input_x.op.name: FORMAT_5HD, out_backprop.op.name: FORMAT_5HD,
               "dw": FORMAT_FRACZ if p.groups == 1 else FORMAT_FRACZ_G}
    return tag.kernel_attrs(TAG, params, formats)


# --- stages ----------------------------------------------------------------------------------

def x_stage(p: Plan, input_x):
    """``x_pad``: x zero-padded to every ``o*stride + k*dilation``, in ``p.acc_dtype``; NCHW
    with only the real channels when Cout is the lane axis; x itself when nothing is to do."""
    import tvm
    from tvm import te

    ah, aw, acc = p.ah, p.aw, p.acc_dtype
    if p.cout_lanes:
        h, w = ah.n_in, aw.n_in

        # x is only broadcast, channel by channel: pad just the real channels, NCHW
        def xq_body(b, ci, hp, wp):
            src_h, src_w = hp - ah.pad_before, wp - aw.pad_before
            ok = tvm.tirx.all(src_h >= 0, src_h < h, src_w >= 0, src_w < w)
            val = input_x[b, ci // C0, clamp_index(src_h, h), clamp_index(src_w, w), ci % C0]
            return te.if_then_else(ok, val.astype(acc), tvm.tirx.const(0, acc))

        return te.compute((p.n, p.cin, ah.x_padded_size, aw.x_padded_size), xq_body,
                          name="dw_x_pad", tag=tag.stage(TAG, "x_pad"))
    if (p.dtype == acc and ah.pad_before == aw.pad_before == 0
            and (ah.x_padded_size, aw.x_padded_size) == (ah.n_in, aw.n_in)):
        return input_x  # nothing to pad or convert (a 1x1 layer): no copy
    return pad_cast_5hd_compute(input_x, (ah.pad_before, aw.pad_before),
                                (ah.x_padded_size, aw.x_padded_size), acc,
                                name="dw_x_pad", tag=tag.stage(TAG, "x_pad"))


def dy_stage(p: Plan, out_backprop):
    """``dy_cast`` and, for groups > 1, ``dy_group``: dy as the reduction reads it."""
    from tvm import te

    lay, acc = p.lay, p.acc_dtype
    dy32 = out_backprop
    if p.dtype != acc and (lay.dense or lay.cin_g * lay.cout_g > 1):
        # converted once, not once per broadcast in the reduction (dense) or per lane of the
        # regather (grouped: 16-bit lanes have no vector gather)
        dy32 = te.compute(p.dy_shape, lambda *i: out_backprop[i].astype(acc),
                          name="dw_dy_cast", tag=tag.stage(TAG, "dy_cast"))
    if lay.dense:
        return dy32

    def dyg_body(b, cx1, ho, wo, co, cx0):
        c = cx1 * C0 + cx0
        g, _ = lay.group_of_input_channel(c if p.cin % C0 == 0 else te.min(c, p.cin - 1))
        dyc = g * lay.cout_g + co
        return dy32[b, dyc // C0, ho, wo, dyc % C0].astype(acc)

    # dy regathered per x lane (lane cx0 of block cx1 sees its group's channel co at
    # [..., co, cx0]) so the reduction multiplies whole vectors instead of gathering
    return te.compute((p.n, p.c1x, p.ah.n_out, p.aw.n_out, lay.cout_g, C0), dyg_body,
                      name="dw_dy_group", tag=tag.stage(TAG, "dy_group"))


def _reads_padding(p: Plan) -> bool:
    """Whether some tap of the layer reads x's padding (:func:`_real_x` is not None)."""
    return any(ax.pad_before or (ax.n_out - 1) * ax.stride + (ax.kernel - 1) * ax.dilation
               >= ax.pad_before + ax.n_in for ax in (p.ah, p.aw))


def _real_x(p: Plan, rh, rw, k_h, k_w):
    """The condition that ``(ho, wo)`` at tap ``(kh, kw)`` reads a real x element, not x_pad's
    padding; None when no read of this layer reaches the padding. The reductions skip padded
    reads by it (a select of dy, which is broadcast or loaded once per step) instead of
    multiplying the padding's zeros in, so a NaN / Inf in dy reaches exactly the dw taps the
    math pairs it with (0 * Inf is NaN)."""
    import tvm

    conds = []
    for ax, o, k in ((p.ah, rh, k_h), (p.aw, rw, k_w)):
        last = (ax.n_out - 1) * ax.stride + (ax.kernel - 1) * ax.dilation
        if ax.pad_before:
            conds.append(o * ax.stride + k * ax.dilation >= ax.pad_before)
        if last >= ax.pad_before + ax.n_in:
            conds.append(o * ax.stride + k * ax.dilation < ax.pad_before + ax.n_in)
    return tvm.tirx.all(*conds) if conds else None


def _skip_padding(p: Plan, dy, real):
    import tvm
    from tvm import te

    if real is None:
        return dy
    return te.if_then_else(real, dy, tvm.tirx.const(0, p.acc_dtype))


def _reduce_axes(p: Plan):
    """The reduction ``(n, ho, wo)`` of the GEMM."""
    from tvm import te

    return (te.reduce_axis((0, p.n), name="n"), te.reduce_axis((0, p.ah.n_out), name="ho"),
            te.reduce_axis((0, p.aw.n_out), name="wo"))


def _acc_cin_lanes(p: Plan, xp, dyv, exact=None):
    """``acc``: ``dw_acc [C1x, KH, KW, CO, 16]``, Cin in the lanes. With its ``exact`` twin
    (dense layers) it multiplies x's zero padding in; without, it selects dy to zero there."""
    from tvm import te

    ah, aw, acc = p.ah, p.aw, p.acc_dtype
    rn, rh, rw = _reduce_axes(p)

    def acc_body(cx1, k_h, k_w, co, cx0):
        if p.lay.dense:
            dy = dyv[rn, co // C0, rh, rw, co % C0].astype(acc)
        else:
            dy = dyv[rn, cx1, rh, rw, co, cx0]
        xv = xp[rn, cx1, rh * ah.stride + k_h * ah.dilation, rw * aw.stride + k_w * aw.dilation,
                cx0]
        if exact is None:
            dy = _skip_padding(p, dy, _real_x(p, rh, rw, k_h, k_w))
        return te.sum(dy * xv, axis=[rn, rh, rw])

    return te.compute((p.c1x, p.lay.kh, p.lay.kw, p.co_ext, C0), acc_body, name="dw_acc",
                      tag=tag.stage(TAG, "acc"),
                      attrs=fallback.fast_attrs(exact))


def _acc_cout_lanes(p: Plan, xq, dy32, exact=None):
    """``acc``: ``dw_acc_t [C1y, KH, KW, Cin, 16]``. Few input channels (an RGB stem): Cout is
    the lane axis, so the padded lanes of Cin cost nothing; x is broadcast per channel. With
    its ``exact`` twin it multiplies x's zero padding in, as :func:`_acc_cin_lanes` does."""
    from tvm import te

    ah, aw = p.ah, p.aw
    rn, rh, rw = _reduce_axes(p)

    def acc_t_body(cy1, k_h, k_w, ci, cy0):
        xv = xq[rn, ci, rh * ah.stride + k_h * ah.dilation, rw * aw.stride + k_w * aw.dilation]
        dyv = dy32[rn, cy1, rh, rw, cy0].astype(p.acc_dtype)
        if exact is None:
            dyv = _skip_padding(p, dyv, _real_x(p, rh, rw, k_h, k_w))
        return te.sum(dyv * xv, axis=[rn, rh, rw])

    return te.compute((p.c1y, p.lay.kh, p.lay.kw, p.cin, C0), acc_t_body, name="dw_acc_t",
                      tag=tag.stage(TAG, "acc"),
                      attrs=fallback.fast_attrs(exact))


def x_pairs(p: Plan, input_x):
    """``x_pair [N, C1x, Hr, Wr, 16, 2]`` (``p.dot`` = 2): x's padded rows and columns that the
    reduction reads, one in every :func:`_read_steps` (a 1x1 or dilated layer reads every
    other column of a pair, a strided 1x1 every other row), each lane pairing x's columns
    ``q`` and ``q + stride_w`` that one Wo pair meets, zero where the column is padding or
    past x."""
    import tvm
    from tvm import te

    ah, aw = p.ah, p.aw
    step_h, step_w = _read_steps(p)
    last_h = (ah.n_out - 1) * ah.stride + (ah.kernel - 1) * ah.dilation
    last_w = (_wo_pairs(p) - 1) * p.dot * aw.stride + (aw.kernel - 1) * aw.dilation

    def body(b, c1, i, q, c0, j):
        src_h = i * step_h - ah.pad_before
        src_w = q * step_w + j * aw.stride - aw.pad_before
        ok = tvm.tirx.all(src_h >= 0, src_h < ah.n_in, src_w >= 0, src_w < aw.n_in)
        val = input_x[b, c1, clamp_index(src_h, ah.n_in), clamp_index(src_w, aw.n_in), c0]
        return te.if_then_else(ok, val, tvm.tirx.const(0, p.dtype))

    shape = (p.n, p.c1x, last_h // step_h + 1, last_w // step_w + 1, C0, p.dot)
    return te.compute(shape, body, name="dw_x_pair", tag=tag.DW_X_PAIR)


def _read_steps(p: Plan) -> tuple[int, int]:
    """The padded rows and pair columns the pair reduction reads, ``o * stride + k *
    dilation`` (columns: ``o`` a Wo pair, stride ``dot * stride_w``), are the multiples of
    ``(step_h, step_w)``: the gcd of the two steps (the stride alone for one tap)."""
    def step(stride, ax):
        return stride if ax.kernel == 1 else math.gcd(stride, ax.dilation)

    return step(p.ah.stride, p.ah), step(p.dot * p.aw.stride, p.aw)


def _read_index(o, stride: int, k, ax: ConvAxis, step: int):
    """``(o * stride + k * dilation) / step`` in :func:`x_pairs`' rows or columns, written
    affine (``step`` divides both terms; ``k`` is 0 for one tap)."""
    tap = k * (ax.dilation // step) if ax.kernel > 1 else 0
    return o * (stride // step) + tap


def dy_pairs(p: Plan, out_backprop):
    """``dy_pair [N, CO, Ho, Wo/2, 2]`` (``p.dot`` = 2, CO the padded Cout): each channel's
    Wo pairs side by side, zero past an odd Wo."""
    import tvm
    from tvm import te

    wo = p.aw.n_out

    def body(b, co, ho, w2, j):
        col = w2 * p.dot + j
        val = out_backprop[b, co // C0, ho, te.min(col, wo - 1), co % C0]
        return te.if_then_else(col < wo, val, tvm.tirx.const(0, p.dtype))

    return te.compute((p.n, p.co_ext, p.ah.n_out, _wo_pairs(p), p.dot), body,
                      name="dw_dy_pair", tag=tag.DW_DY_PAIR)


def _wo_pairs(p: Plan) -> int:
    return ceil_div(p.aw.n_out, p.dot)


def _acc_dot(p: Plan, xq, dyq, exact):
    """``acc`` through the dot-product instruction: ``dw_acc [C1x, KH, KW, CO, 16]``, the
    last reduction axis the ``p.dot`` positions of a pair (``dot_intrinsic`` finds it)."""
    from tvm import te

    ah, aw, acc = p.ah, p.aw, p.acc_dtype
    rn = te.reduce_axis((0, p.n), name="n")
    rh = te.reduce_axis((0, ah.n_out), name="ho")
    rw = te.reduce_axis((0, _wo_pairs(p)), name="wo2")
    rj = te.reduce_axis((0, p.dot), name="wo_dot")
    step_h, step_w = _read_steps(p)

    def acc_body(cx1, k_h, k_w, co, cx0):
        dy = dyq[rn, co, rh, rw, rj].astype(acc)
        xv = xq[rn, cx1, _read_index(rh, ah.stride, k_h, ah, step_h),
                _read_index(rw, p.dot * aw.stride, k_w, aw, step_w), cx0, rj].astype(acc)
        return te.sum(dy * xv, axis=[rn, rh, rw, rj])

    return te.compute((p.c1x, p.lay.kh, p.lay.kw, p.co_ext, C0), acc_body, name="dw_acc",
                      tag=tag.stage(TAG, "acc"),
                      attrs=fallback.fast_attrs(exact))


def _acc_exact(p: Plan, input_x, out_backprop, flag):
    """The exact twin of the fast reductions (run only when ``flag`` is set): the same sum
    from the inputs themselves, terms whose x is padding left out."""
    import tvm
    from tvm import te

    ah, aw, acc = p.ah, p.aw, p.acc_dtype
    rn, rh, rw = _reduce_axes(p)

    def term(k_h, k_w, ci, co):
        src_h = rh * ah.stride + k_h * ah.dilation - ah.pad_before
        src_w = rw * aw.stride + k_w * aw.dilation - aw.pad_before
        xv = input_x[rn, ci // C0, clamp_index(src_h, ah.n_in), clamp_index(src_w, aw.n_in),
                     ci % C0]
        dy = out_backprop[rn, co // C0, rh, rw, co % C0]
        real = _real_x(p, rh, rw, k_h, k_w)
        prod = dy.astype(acc) * xv.astype(acc)
        if real is not None:
            prod = te.if_then_else(real, prod, tvm.tirx.const(0, acc))
        return te.sum(prod, axis=[rn, rh, rw])

    if p.cout_lanes:  # the layout of dw_acc_t
        shape = (p.c1y, p.lay.kh, p.lay.kw, p.cin, C0)

        def body(cy1, k_h, k_w, ci, cy0):
            return term(k_h, k_w, ci, cy1 * C0 + cy0)
    else:
        shape = (p.c1x, p.lay.kh, p.lay.kw, p.co_ext, C0)

        def body(cx1, k_h, k_w, co, cx0):
            return term(k_h, k_w, cx1 * C0 + cx0, co)

    return te.compute(shape, body, name="dw_exact", tag=tag.DW_EXACT,
                      attrs=fallback.twin_attrs(flag))


def scatter(p: Plan, acc, attrs: dict):
    """The anchor ``dw``: the compact acc scattered into group FracZ, cast to res_dtype;
    cross-group and pad-channel positions exactly zero."""
    import tvm
    from tvm import te

    lay, res_dtype = p.lay, p.para.res_dtype

    def out_body(row, col1, col0, lane):
        co_orig, ci, k_h, k_w, conds = lay.weight_of_fracz(row, col1, col0, lane)
        if lay.dense:
            c, co = ci, co_orig
        else:
            g = co_orig // lay.cout_g
            c, co = te.min(g * lay.cin_g + ci, p.c1x * C0 - 1), co_orig % lay.cout_g
        if p.cout_lanes:
            val = acc[co // C0, k_h, k_w, te.min(c, p.cin - 1), co % C0]
        else:
            val = acc[c // C0, k_h, k_w, co, c % C0]
        val = val.astype(res_dtype)
        ok = te_all(conds)
        if ok is None:
            return val
        return te.if_then_else(ok, val, tvm.tirx.const(0, res_dtype))

    return te.compute(lay.fracz_shape, out_body, name="dw", tag=TAG, attrs=attrs)
