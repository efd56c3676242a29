"""``convolution_backward``: gradients of a 1-D/2-D/3-D convolution, transposed or not (seed 002).

Math
----
Forward (``transposed=False``), per spatial axis the :class:`dsl.conv_geometry.ConvAxis` map,
``g = co // Cout_g``::

    y[n, co, o] = sum_{ci < Cin_g, k} x[n, g*Cin_g + ci, o*s - pad_before + k*d] * W[co, ci, k]
                  + bias[co]

    grad_input[n, g*Cin_g+ci, i] = sum_{co in group g, (o, k): o*s = i + pad_before - k*d}
                                   grad_output[n, co, o] * W[co, ci, k]
    grad_weight[co, ci, k]      = sum_{n, o} grad_output[n, co, o] * x[n, g*Cin_g+ci, o*s-pb+k*d]
    grad_bias[co]               = sum_{n, o} grad_output[n, co, o]

(``o``, ``i``, ``k`` are multi-indices over the spatial axes; ``x`` reads zero outside its
bounds.) A transposed forward (``transposed=True``, weight ``[Cin, Cout/groups, *k]``) is the
adjoint of the plain convolution whose *input* is the transposed conv's output (size
``(L-1)*s - pb - pa + (k-1)*d + output_padding + 1``) and whose *output* is the transposed conv's
input, with ``pad_after' = pa - output_padding`` (may be negative: those rows are never read).
So with that underlying convolution (``X`` = grad_output, ``Y`` = input)::

    grad_input  = conv_forward(grad_output, W)            (a plain convolution)
    grad_weight = the non-transposed grad_weight with x := grad_output, dy := input
    grad_bias[c] = sum_{n, o} grad_output[n, c, o]

Every index goes through ``ConvAxis``: ``dx_taps`` for the stride-phase gather of the plain
grad_input (a strided dx visits ``ceil(k / step)`` taps, never zero-inserted rows), and
``x_padded_size`` / ``dy_pad_before`` / ``dy_padded_size`` for the padded copies.

Tensors (all plain layouts)
---------------------------
grad_output : ``(N, Cout, *out)``  NCL / NCHW / NCDHW, float32, float16, bfloat16 or float64
              (float64 accumulates in float64, not float32: for ``gradcheck``-grade results).
input       : ``(N, Cin, *in)``    same rank; N or Cin may be 0 only in the numpy API.
weight      : ``(Cout, Cin/groups, *k)``, or ``(Cin, Cout/groups, *k)`` when transposed.
grad_input  : ``input.shape``,  dtype ``promote(input, grad_output)``.
grad_weight : ``weight.shape``, dtype ``promote(weight, grad_output)``.
grad_bias   : ``(Cout,)`` (ND), dtype of grad_output.

``promote`` follows the seed ("the higher-precision of the two"): equal dtypes stay; float32
with anything is float32; float16 with bfloat16 (neither is more precise) is float32, as in
``torch.promote_types``.

cube_math_type (emulating the Atlas A2 cube, which every mode supports)
-----------------------------------------------------------------------
The cube operands (grad_output / input / weight as each product reads them) are rounded once,
each according to its own dtype, then multiplied and accumulated in float32; the result is
cast to the output dtype.

* 0 KEEP_DTYPE: no rounding.
* 1 ALLOW_FP32_DOWN_PRECISION and 3 USE_HF32: float32 operands rounded to HF32; float16 and
  bfloat16 operands stay as they are.
* 2 USE_FP16: float32 and bfloat16 operands rounded to float16 (IEEE round-to-nearest-even,
  overflow to inf, as a hardware cast does); float16 stays.

HF32 rule implemented: sign and the 8-bit exponent kept, the mantissa rounded to its top 10
explicit bits (11 with the implicit bit) by round-to-nearest, ties-to-even on the 13 dropped
bits; a carry may bump the exponent (the largest finite values round to inf); inf and NaN pass
unchanged; subnormals round the same way. grad_bias is a vector reduction, not a cube product:
it is never rounded (float32 accumulation of grad_output as given).

Decisions where the seed is silent
----------------------------------
* A 4-value 2-D ``padding`` is ``[top, bottom, left, right]`` (the order of seed 001's
  ``para_dict['padding']``); ``nd`` values pad both sides of each axis.
* ``output_padding`` must be ``< max(stride, dilation)`` per axis when transposed (PyTorch's
  rule: a larger value adds rows no input reaches); it is ignored when not transposed.
* ``bias_sizes`` may be None when ``output_mask[2]`` is False (the seed requires it only
  when grad_bias is computed); when given it is checked.
* The three inputs may have different dtypes (the seed's promotion rules imply it).
* Empty input (N or C = 0): grad_input is empty, grad_weight zero (empty when C = 0) and
  grad_bias the sum of grad_output (zero when N = 0), the math of ``y = conv(x, W) + bias``.
  PyTorch returns a zero grad_bias for C = 0 too, although grad_output is then not empty; we
  keep the math. The weight may be empty only along the dimension that counts input channels.
* Atlas A2 behaviour throughout: KEEP_DTYPE accepts float32 and bfloat16 (the training-series
  restrictions of the seed are hardware limits, not part of the operator).

Stages (schedules find them by tag ``convolution_backward.<stage>``)
-------------------------------------------------------------------
``y_pack``  Y (grad_output, or input when transposed) channels-last ``[N, *rows, Cy]`` fp32,
            zero rows before/after for the dx taps, rounded.
``x_pack``  X (input, or grad_output when transposed) channels-last ``[N, *x_padded, Cx]``.
``y_rep``   Y expanded for the plain grad_input ``[N, *rows, Cy_g, Cx]`` (see below).
``x_rep``   X expanded for lanes over Cy ``[N, *x_padded, Cx_g, Cy]`` (see below).
``w_adj``   weight for the plain grad_input ``[*k_padded, Cout_g, Cin]`` (zero extra taps), its
            taps in reverse order (the order dx visits them).
``w_fwd``   weight for the transposed grad_input ``[*k, Cin_g', Cy]``.
``dx_acc`` / ``fwd_acc``  fp32 ``[N, *spatial, C]`` (channels innermost: the vector axis).
``dw_acc``  fp32 ``[*k, Cy, Cx_g]``.  ``db_acc``  fp32 ``[C]``.
``grad_input`` / ``grad_weight`` / ``grad_bias``  the outputs (back to plain layout, cast).

Exact depthwise (``Plan.nc_dx``, ``Plan.nc_dw``)
------------------------------------------------
When every channel is its own group on both sides (``groups == Cin == Cout``), the layer is not
transposed and no stride shares a factor with its dilation (so every dx tap of a position is in
one stride phase), each channel is an independent convolution: vectors along the innermost
spatial axis need no channel-last layout, so a gradient can skip the packs and the
layout-restoring transposes (two copies of each tensor). grad_input does so where dy's or dx's
rows are whole 4-float vectors (``nc_dx``): ``nc_y_pad`` (dy zero-padded for dx's taps, NC*,
rows padded to ``NC_ROW`` floats), ``nc_w_pad [C, *padded_kernel]`` (the taps, zero taps
rounding a strided kernel up to whole phases) and ``nc_dx_acc [N, C, *in]`` (``sum_j
y_pad[n, c, row(i, j)] * w_pad[c, k(i, j)]``, the stride-phase gather of
:meth:`dsl.conv_geometry.ConvAxis.dx_taps`). grad_weight does so where dy's rows are whole
4-float vectors or at most ``NC_ROW`` long (``nc_dw``): ``nc_x_pad`` (x padded likewise; by
stride phase, ``[.., s, pitch]``, where dy's rows are ``NC_ROW`` or longer, so dw's lanes read
it contiguously) and ``nc_dw_acc [C, *k]`` (``sum_{n,o} dy[n, c, o] * x_pad[n, c, o*s +
k*d]``); a short row (14, 7) is padded to 4, 8 or 16 lanes (``nc_dy_rows``), summed per lane
(``nc_dw_lanes [C, *k, lanes]``) and only its real lanes summed into ``nc_dw_acc``, so the
lanes past the row never meet a zero operand (0 * inf is NaN). Strided, dx's lanes read dy
twice each (``(i + pad) // s``) and the taps in turn (``(i + pad) % s``), and a short dw row
reads x every s-th element: the schedule marks those loops for
:mod:`dsl.runtime.lane_shuffle_pass`. ``Plan.nc_depthwise``: every requested gradient in
NC*; otherwise one kernel mixes the two layouts (a 14x14 layer: dw in NC*, dx channel-last,
whose lanes hold channels). Multiplier > 1 depthwise layers keep the channel-last stages.

Expanded packs (grouped, few channels per group)
------------------------------------------------
Every reduction keeps channels innermost and the schedules vectorise over them. In a grouped
convolution the lane ``c`` of the plain grad_input reads Y's channel
``(c // Cx_g) * Cy_g + co``: a broadcast when a group fills the vector, a per-lane gather when
``Cx_g`` is smaller (lanes straddle groups; ``x (256, 8, 8, 8)``, weight ``(16, 2, 3, 3)``,
``groups=4`` ran at 3.5 GFLOP/s on a Zen 3 core). So when ``Cx_g < REP_BELOW`` it reads
``y_rep[n, *rows, co, c] = y_pack[n, *rows, (c // Cx_g) * Cy_g + co]`` instead, ``Cx_g`` times
the plain pack (built once, one scalar broadcast per group), whose lanes are adjacent memory.
Likewise, with lanes over Cy, ``x_rep[n, *xp, ci, c] = x_pack[n, *xp, (c // Cy_g) * Cx_g + ci]``
(``Cy_g`` times the plain pack) serves the transposed grad_input when ``Cy_g < REP_BELOW`` and
grad_weight when ``Cx_g < REP_DW_BELOW`` and ``Cy_g < REP_BELOW`` (otherwise one side's group
fills at least half a vector: lanes over it are contiguous and the other operand is a
broadcast; the plain packs then serve grad_weight better, see ``REP_DW_BELOW``). The exact
depthwise map (``Cx_g = Cy_g = 1``: channel ``c`` reads ``c``) is contiguous already. The gate
reads only the graph, never the target (computes stay target-independent): ``REP_BELOW = 8``
is the fp32 lane count of AVX2, the narrowest vector the x86 rules tile for; a wider target
keeps groups of 8-15 channels on the plain packs, its lanes split inside one group (the
schedule's rule), and the expansion stays under 8 times the plain pack. The kernel's size check
counts the expanded packs.

Y in place
----------
A dense grad_weight whose X has at least ``DW_Y_IN_PLACE_FROM`` channels keeps X's channels
in the lanes, so each reduction step broadcasts one Y value per register-tile row: it reads Y
in its own ``[N, Cy, *o]`` layout (a few rows, each along its output positions) instead of a
channel-last ``y_pack``, which would cost one more pass over Y through memory. Measured on 2
Zen 5 cores: conv1d dw 386 -> 450 GFLOP/s, conv3d dw 441 -> 473, transposed conv2d dw 390 ->
441. A kernel that also computes the plain grad_input keeps the pack (dx reads it padded).

All requested gradients build into one kernel: separate loop nests (one parallel region each)
that share the packed operands, so grad_input and grad_weight read grad_output's packed copy
once between them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from dsl.errors import (
    E_CHANNEL,
    E_GEOMETRY_IN,
    E_GROUPS,
    E_RANGE,
    E_SHAPE,
    E_TYPE,
    E_VALUE,
    MAX_ELEMS,
    SUPPORTED_FLOATS,
    check_bool,
    check_dtype,
    check_int,
    check_ints,
    fail,
    te_shape,
)
from dsl.ops import fallback, tag
from dsl.ops.conv_geometry import ConvAxis, clamp_index

TAG = tag.CONVOLUTION_BACKWARD
ACC_DTYPE = "float32"
KEEP_DTYPE, ALLOW_FP32_DOWN_PRECISION, USE_FP16, USE_HF32 = 0, 1, 2, 3
CUBE_MATH_TYPES = {KEEP_DTYPE: "KEEP_DTYPE", ALLOW_FP32_DOWN_PRECISION:
                   "ALLOW_FP32_DOWN_PRECISION", USE_FP16: "USE_FP16", USE_HF32: "USE_HF32"}
FORMATS = {1: "NCL", 2: "NCHW", 3: "NCDHW"}
AXIS_NAMES = {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}
INT32_MAX = 2**31 - 1
# The NC* depthwise pads' row pitch in floats: a whole vector on every x86 width.
NC_ROW = 16
# ... whose output rows are whole SSE vectors: grad_weight sums a row in vector lanes
NC_LANES = 4
# Per-group channel counts below this read an expanded pack (module docstring, "Expanded
# packs"): the fp32 lanes of AVX2, the narrowest vector the x86 rules tile for.
REP_BELOW = 8
# grad_weight expands X only below this many input channels per group: from half a vector up,
# its lanes go over Cx/g (contiguous inside a group, Y broadcast), which reuses the plain pack
# far better than lanes over Cy (measured: Cx/g = Cy/g = 4 at 28x28, 3.8 ms plain vs 12 ms).
REP_DW_BELOW = REP_BELOW // 2
# grad_weight reads Y in place from this many channels of X up (module docstring, "Y in place"):
# its lanes then go over Cx on every x86 width (twice the fp32 lanes of AVX2, see the rule's
# dw lanes), so Y is the broadcast operand, read along its rows.
DW_Y_IN_PLACE_FROM = 2 * REP_BELOW


FLOATS = (*SUPPORTED_FLOATS, "float64")  # float64: accumulated in float64 (gradcheck)


def promote(a: str, b: str) -> str:
    """The higher-precision of two float dtypes (float16 with bfloat16 gives float32)."""
    if a == b:
        return a
    return "float64" if "float64" in (a, b) else "float32"


def acc_dtype(dtypes) -> str:
    """The accumulation dtype: float64 when any tensor is float64, else float32."""
    return "float64" if "float64" in dtypes else ACC_DTYPE


def operand_rounding(dtype: str, cube_math_type: int) -> str | None:
    """How a cube operand of ``dtype`` is rounded: ``None``, ``"hf32"`` or ``"float16"``."""
    if cube_math_type in (ALLOW_FP32_DOWN_PRECISION, USE_HF32) and dtype == "float32":
        return "hf32"
    if cube_math_type == USE_FP16 and dtype in ("float32", "bfloat16"):
        return "float16"
    return None


@dataclass(frozen=True)
class Plan:
    """A checked call: the user's parameters and the underlying plain convolution.

    The underlying convolution has input ``X`` (``Cx`` channels, ``axes[a].n_in`` long) and
    output ``Y`` (``Cy`` channels, ``axes[a].n_out`` long), weight ``[Cy, Cx/groups, *k]``.
    """

    nd: int
    transposed: bool
    groups: int
    output_mask: tuple[bool, bool, bool]
    cube_math_type: int
    grad_output_shape: tuple[int, ...]
    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    dtypes: tuple[str, str, str]  # grad_output, input, weight
    stride: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]  # (before, after) per spatial axis
    dilation: tuple[int, ...]
    output_padding: tuple[int, ...]
    axes: tuple[ConvAxis, ...]

    @property
    def out_dtypes(self) -> tuple[str, str, str]:
        go, x, w = self.dtypes
        return promote(x, go), promote(w, go), go

    @property
    def acc_dtype(self) -> str:
        return acc_dtype(self.dtypes)

    @property
    def empty(self) -> bool:
        return 0 in self.input_shape[:2]

    @property
    def cx(self) -> int:
        return (self.grad_output_shape if self.transposed else self.input_shape)[1]

    @property
    def cy(self) -> int:
        return (self.input_shape if self.transposed else self.grad_output_shape)[1]

    @property
    def cxg(self) -> int:
        return self.weight_shape[1]

    @property
    def cyg(self) -> int:
        return self.cy // self.groups

    @property
    def lanes_cross_groups(self) -> bool:
        """Grouped, and not the exact depthwise map ``c -> c`` (one channel per group on both
        sides): a vector of channels then reads the other side's channels through a per-lane
        group map unless the group fills it (see "Expanded packs" in the module docstring)."""
        return self.groups > 1 and not (self.cxg == 1 and self.cyg == 1)

    @property
    def rep_dx(self) -> bool:
        """The plain grad_input reads ``y_rep`` (lanes over Cin, groups of ``Cin_g``)."""
        return self.need_adjoint and self.lanes_cross_groups and self.cxg < REP_BELOW

    @property
    def rep_fwd(self) -> bool:
        """The transposed grad_input reads ``x_rep`` (lanes over Cy, groups of ``Cy_g``)."""
        return self.need_forward and self.lanes_cross_groups and self.cyg < REP_BELOW

    @property
    def rep_dw(self) -> bool:
        """grad_weight reads ``x_rep`` with lanes over Cy: neither side fills a vector."""
        return (self.output_mask[1] and self.lanes_cross_groups and self.cxg < REP_DW_BELOW
                and self.cyg < REP_BELOW)

    @property
    def dw_y_in_place(self) -> bool:
        """grad_weight reads Y where it is (``[N, Cy, *o]``), not from ``y_pack``: a dense
        layer whose X fills the lanes, Y's values taken as they are (no rounding, no cast), and
        no plain grad_input that needs the pack anyway."""
        y_dtype = self.dtypes[1 if self.transposed else 0]
        return (self.output_mask[1] and self.groups == 1 and self.cx >= DW_Y_IN_PLACE_FROM
                and not self.need_adjoint and y_dtype == self.acc_dtype
                and operand_rounding(y_dtype, self.cube_math_type) is None)

    @property
    def nc_depthwise(self) -> bool:
        """Every requested gradient of an exact depthwise layer in the NC* layout (``nc_*``
        stages): no channel-last packs or transposes (:attr:`nc_dx`, :attr:`nc_dw`)."""
        return (self._nc_exact_depthwise and (not self.output_mask[0] or self.nc_dx)
                and (not self.output_mask[1] or self.nc_dw))

    @property
    def nc_dx(self) -> bool:
        """grad_input of an exact depthwise layer (each channel its own group, both sides; not
        transposed; no stride sharing a factor with its dilation) in the NC* layout, where dy's
        or dx's rows are whole 4-float vectors. Rows of neither (a 14x14 layer) keep the
        channel-last stages, which put channels in the lanes (2x faster measured there)."""
        return self._nc_exact_depthwise and (self.axes[-1].n_out % NC_LANES == 0
                                             or self.axes[-1].n_in % NC_LANES == 0)

    @property
    def nc_dw(self) -> bool:
        """grad_weight of an exact depthwise layer in the NC* layout, where dy's rows are
        whole 4-float vectors or fit one ``NC_ROW`` vector (:attr:`nc_dw_lanes`)."""
        n_out = self.axes[-1].n_out
        return self._nc_exact_depthwise and (n_out % NC_LANES == 0 or n_out <= NC_ROW)

    @property
    def nc_dw_lanes(self) -> int:
        """Lanes of the NC* grad_weight's partial sums when dy's rows are no whole 4-float
        vectors (0 when they are): the row padded to the next of 4, 8 or 16 floats. The lanes
        past the row sum products of nothing real and are left out of the final sum, so they
        need no zero operands (0 * inf is NaN) and every lane is a whole vector."""
        n_out = self.axes[-1].n_out
        if not self.nc_dw or n_out % NC_LANES == 0:
            return 0
        return next(w for w in (NC_LANES, 2 * NC_LANES, NC_ROW) if w >= n_out)

    @property
    def _nc_exact_depthwise(self) -> bool:
        return (self.groups > 1 and self.cx == self.groups and self.cy == self.groups
                and not self.transposed and all(a.tap_step == a.stride for a in self.axes))

    @property
    def need_adjoint(self) -> bool:
        """grad_input as the adjoint of the plain convolution (not transposed)."""
        return self.output_mask[0] and not self.transposed

    @property
    def need_forward(self) -> bool:
        """grad_input as a plain forward convolution of grad_output (transposed)."""
        return self.output_mask[0] and self.transposed

    def as_json(self) -> dict:
        return {"nd": self.nd, "transposed": self.transposed, "groups": self.groups,
                "output_mask": list(self.output_mask), "cube_math_type": self.cube_math_type,
                "grad_output": list(self.grad_output_shape), "input": list(self.input_shape),
                "weight": list(self.weight_shape), "dtypes": list(self.dtypes),
                "stride": list(self.stride), "padding": [list(p) for p in self.pads],
                "dilation": list(self.dilation), "output_padding": list(self.output_padding)}


def plan(grad_output_shape, grad_output_dtype, input_shape, input_dtype, weight_shape,
         weight_dtype, bias_sizes, stride, padding, dilation, transposed, output_padding,
         groups, output_mask, cube_math_type=0) -> Plan:
    """Check every parameter and shape relation of the seed on plain values; see the module
    docstring. Raises :class:`dsl.DslError` (nothing is compiled before this passes)."""
    transposed = check_bool("transposed", transposed, numpy_bool=True)
    mask = _check_mask(output_mask)
    cmt = check_int("cube_math_type", cube_math_type, lo=0, hi=3)
    groups = check_int("groups", groups, lo=1, hi=INT32_MAX, code=E_GROUPS)
    w = check_ints("weight.shape", weight_shape, (3, 4, 5), lo=0, code=E_SHAPE)
    nd = len(w) - 2
    go = check_ints("grad_output.shape", grad_output_shape, len(w), lo=0, code=E_SHAPE)
    x = check_ints("input.shape", input_shape, len(w), lo=0, code=E_SHAPE)
    dtypes = (check_dtype("grad_output.dtype", grad_output_dtype, FLOATS),
              check_dtype("input.dtype", input_dtype, FLOATS),
              check_dtype("weight.dtype", weight_dtype, FLOATS))
    stride, pads, dil, opad = _check_spatial(nd, stride, padding, dilation, output_padding,
                                             transposed)
    _check_empty(go, x, w, transposed)
    _check_channels(go, x, w, groups, transposed)
    axes = _axes(go, x, w, stride, pads, dil, opad, transposed)
    _check_bias(bias_sizes, mask, w, groups, transposed)
    p = Plan(nd, transposed, groups, mask, cmt, go, x, w, dtypes, stride, pads, dil, opad,
             tuple(axes))
    _check_sizes(p)
    return p


def _check_mask(output_mask) -> tuple[bool, bool, bool]:
    if isinstance(output_mask, (str, bytes)) or not isinstance(output_mask, Sequence):
        if hasattr(output_mask, "tolist"):
            output_mask = output_mask.tolist()
        else:
            raise fail(E_TYPE, "output_mask", output_mask,
                       "must be a list of 3 bools [grad_input, grad_weight, grad_bias]")
    if len(output_mask) != 3:
        raise fail(E_SHAPE, "output_mask", output_mask,
                   "must have 3 elements [grad_input, grad_weight, grad_bias]")
    return tuple(check_bool(f"output_mask[{i}]", m, numpy_bool=True)
                 for i, m in enumerate(output_mask))


def _check_spatial(nd, stride, padding, dilation, output_padding, transposed):
    """``(stride, pads, dilation, output_padding)``; pads as ``(before, after)`` per axis."""
    stride = check_ints("stride", stride, nd, lo=1, hi=INT32_MAX)
    pad_lens = (nd, 4) if nd == 2 else (nd,)
    pad = check_ints("padding", padding, pad_lens, lo=0, hi=INT32_MAX)
    pads = tuple((p, p) for p in pad) if len(pad) == nd else ((pad[0], pad[1]), (pad[2], pad[3]))
    dil = check_ints("dilation", dilation, nd, lo=1, hi=INT32_MAX)
    opad = check_ints("output_padding", output_padding, nd, lo=0, hi=INT32_MAX)
    if transposed:
        for a in range(nd):
            if opad[a] >= max(stride[a], dil[a]):
                raise fail(E_RANGE, f"output_padding[{a}]", opad[a],
                           f"must be smaller than max(stride[{a}], dilation[{a}]) = "
                           f"{max(stride[a], dil[a])}: larger values add output rows no input "
                           "reaches")
    return stride, pads, dil, opad


def _check_empty(go, x, w, transposed) -> None:
    """Zero-size dims: only input N or C (the seed), and what they force elsewhere."""
    x_empty_c = x[1] == 0
    w_c_dim = 0 if transposed else 1  # the weight dim that counts input channels
    for i, d in enumerate(w):
        if d == 0 and not (i == w_c_dim and x_empty_c):
            raise fail(E_SHAPE, f"weight.shape[{i}]", d,
                       "must be >= 1: the weight may not be empty (only input N or C may be 0)")
    for i, d in enumerate(x[2:]):
        if d == 0:
            raise fail(E_SHAPE, f"input.shape[{i + 2}]", d,
                       "must be >= 1: only input N or C may be 0")
    for i, d in enumerate(go):
        if d == 0 and not (i == 0 and x[0] == 0):
            raise fail(E_SHAPE, f"grad_output.shape[{i}]", d,
                       "must be >= 1 (grad_output may be empty only through input N = 0)")


def _check_channels(go, x, w, groups, transposed) -> None:
    """Batch, channel and group relations of grad_output, input and weight."""
    if go[0] != x[0]:
        raise fail(E_SHAPE, "grad_output.shape[0]", go[0],
                   f"must equal the batch input.shape[0]={x[0]}")
    if transposed:
        if x[1] != w[0]:
            raise fail(E_CHANNEL, "input.shape[1]", x[1],
                       f"must equal weight.shape[0]={w[0]} (transposed weight is "
                       f"[Cin, Cout/groups, *k])")
        if w[0] % groups:
            raise fail(E_GROUPS, "groups", groups,
                       f"must divide weight.shape[0]={w[0]} (the input channels)")
        if go[1] != w[1] * groups:
            raise fail(E_CHANNEL, "grad_output.shape[1]", go[1],
                       f"must equal weight.shape[1] * groups = {w[1]} * {groups}")
    else:
        if x[1] != w[1] * groups:
            raise fail(E_CHANNEL, "input.shape[1]", x[1],
                       f"must equal weight.shape[1] * groups = {w[1]} * {groups} "
                       f"= {w[1] * groups}")
        if w[0] % groups:
            raise fail(E_GROUPS, "groups", groups,
                       f"must divide weight.shape[0]={w[0]} (the output channels)")
        if go[1] != w[0]:
            raise fail(E_CHANNEL, "grad_output.shape[1]", go[1],
                       f"must equal weight.shape[0]={w[0]}")


def _axes(go, x, w, stride, pads, dil, opad, transposed) -> list[ConvAxis]:
    """The underlying plain convolution's axes (its input is grad_output when transposed)."""
    names = AXIS_NAMES[len(w) - 2]
    axes = []
    for a in range(len(w) - 2):
        k, s, d, (pb, pa) = w[2 + a], stride[a], dil[a], pads[a]
        if transposed:
            expect = (x[2 + a] - 1) * s - pb - pa + (k - 1) * d + opad[a] + 1
            if expect < 1:
                raise fail(E_GEOMETRY_IN, f"padding ({names[a]})", (pb, pa),
                           f"leaves a transposed output {names[a]} of {expect} < 1; pad less")
            if go[2 + a] != expect:
                raise fail(E_GEOMETRY_IN, f"grad_output {names[a]}", go[2 + a],
                           f"must be (in-1)*stride - pad_before - pad_after + (k-1)*dilation"
                           f" + output_padding + 1 = ({x[2 + a]}-1)*{s} - {pb} - {pa} + "
                           f"({k}-1)*{d} + {opad[a]} + 1 = {expect}")
            axes.append(ConvAxis.checked(names[a], go[2 + a], x[2 + a], k, s, pb,
                                         pa - opad[a], d, out_param="input"))
        else:
            axes.append(ConvAxis.checked(names[a], x[2 + a], go[2 + a], k, s, pb, pa, d,
                                         out_param="grad_output"))
    return axes


def _check_bias(bias_sizes, mask, w, groups, transposed) -> None:
    bias_expect = w[1] * groups if transposed else w[0]
    if bias_sizes is None:
        if mask[2]:
            raise fail(E_VALUE, "bias_sizes", None,
                       f"is required when output_mask[2] (grad_bias) is True: pass "
                       f"[{bias_expect}]")
        return
    b = check_ints("bias_sizes", bias_sizes, 1, lo=0, code=E_SHAPE)
    if b[0] != bias_expect:
        rule = ("weight.shape[1] * groups" if transposed else "weight.shape[0]")
        raise fail(E_CHANNEL, "bias_sizes", list(b),
                   f"must be [{rule}] = [{bias_expect}] ({FORMATS[len(w) - 2]} "
                   f"{'transposed' if transposed else 'plain'} convolution)")


def _check_sizes(p: Plan) -> None:
    """Every buffer the kernel allocates must be int64-indexable."""
    n = p.input_shape[0]
    sizes = {"grad_output": math.prod(p.grad_output_shape), "input": math.prod(p.input_shape),
             "weight": math.prod(p.weight_shape),
             "padded X": n * p.cx * math.prod(a.x_padded_size for a in p.axes),
             "padded Y": n * p.cy * math.prod(a.dy_padded_size for a in p.axes)}
    if p.rep_dx:
        sizes["expanded Y"] = sizes["padded Y"] * p.cxg
    if p.rep_fwd or p.rep_dw:
        sizes["expanded X"] = sizes["padded X"] * p.cyg
    for what, total in sizes.items():
        if total > MAX_ELEMS:
            raise fail(E_SHAPE, what, total,
                       f"has {total} elements; at most {MAX_ELEMS} fit the kernels' int64 "
                       "indexing: split the batch")


# --- TE ------------------------------------------------------------------------------------

def _hf32(v):
    """Round a float32 TIR value to HF32 (see the module docstring for the rule)."""
    from tvm import tirx

    u = "uint32"
    bits = tirx.reinterpret(u, v)
    lsb = (bits >> tirx.const(13, u)) & tirx.const(1, u)
    rounded = (bits + tirx.const(0xFFF, u) + lsb) & tirx.const(0xFFFFE000, u)
    special = (bits & tirx.const(0x7F800000, u)) == tirx.const(0x7F800000, u)
    return tirx.reinterpret(ACC_DTYPE, tirx.Select(special, bits, rounded))


def _operand(v, dtype: str, cube_math_type: int, acc: str = ACC_DTYPE):
    """A cube operand as the ``acc`` value the product sees (rounded per cube_math_type)."""
    r = operand_rounding(dtype, cube_math_type)
    if r == "hf32":
        return _hf32(v.astype(ACC_DTYPE)).astype(acc)
    if r == "float16":
        return v.astype(ACC_DTYPE).astype("float16").astype(acc)
    return v.astype(acc)




def _all(conds):
    from tvm import tirx

    conds = [c for c in conds if c is not None]
    return tirx.all(*conds) if conds else None


def _guard(cond, val, dtype: str):
    from tvm import te, tirx

    return val if cond is None else te.if_then_else(cond, val, tirx.const(0, dtype))


def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,  # noqa: A002
                         transposed, output_padding, groups, output_mask, cube_math_type=0):
    """Gradients of a 1-D/2-D/3-D (transposed) convolution as TE tensors.

    Parameters
    ----------
    grad_output : te.Tensor
        ``(N, Cout, *out)`` NCL / NCHW / NCDHW; float32, float16 or bfloat16.
    input : te.Tensor
        The forward input ``(N, Cin, *in)``, same rank.
    weight : te.Tensor
        ``(Cout, Cin/groups, *k)``; ``(Cin, Cout/groups, *k)`` when ``transposed``.
    bias_sizes : sequence of 1 int or None
        ``[weight.shape[0]]`` (``[weight.shape[1] * groups]`` when transposed); may be None
        when ``output_mask[2]`` is False.
    stride, dilation : sequence of ``nd`` int (>= 1)
    padding : sequence of ``nd`` int (both sides), or for 2-D 4 ints
        ``[top, bottom, left, right]``.
    transposed : bool
    output_padding : sequence of ``nd`` int
        Extra rows at the end of a transposed output (``< max(stride, dilation)``); ignored
        when not transposed.
    groups : int
    output_mask : sequence of 3 bool
        Which of ``(grad_input, grad_weight, grad_bias)`` to compute.
    cube_math_type : int
        0 KEEP_DTYPE, 1 ALLOW_FP32_DOWN_PRECISION, 2 USE_FP16, 3 USE_HF32 (module docstring).

    Returns
    -------
    tuple
        ``(grad_input, grad_weight, grad_bias)`` te.Tensors, None where the mask is False.
        Build them together: ``dsl.auto_schedule([t for t in res if t is not None])``.
    """
    go_shape = te_shape("grad_output", grad_output)
    x_shape = te_shape("input", input)
    w_shape = te_shape("weight", weight)
    p = plan(go_shape, str(grad_output.dtype), x_shape, str(input.dtype), w_shape,
             str(weight.dtype), bias_sizes, stride, padding, dilation, transposed,
             output_padding, groups, output_mask, cube_math_type)
    if p.empty:
        raise fail(E_SHAPE, "input.shape", x_shape,
                   "has N or C = 0: no kernel is needed; dsl.aclnn.convolution_backward "
                   "returns the (empty / zero) gradients of such a call without compiling")
    return _build(p, grad_output, input, weight)


def _build(p: Plan, grad_output, input, weight):  # noqa: A002
    """The stages of every requested gradient, in one graph (see the module docstring)."""
    xt, yt = (grad_output, input) if p.transposed else (input, grad_output)
    attrs = _attrs(p, grad_output, input, weight)
    fb = _Fallbacks.of(p, yt, weight)
    if p.nc_depthwise:
        return fb.attach(_build_nc_depthwise(p, grad_output, input, weight, attrs, fb))
    nc_dx = p.need_adjoint and p.nc_dx
    dw_packed = p.output_mask[1] and not p.nc_dw  # grad_weight on the channel-last stages
    yp = _y_pack(p, yt) if _adjoint_reads_y_pack(p) or (
        dw_packed and not p.dw_y_in_place) else None
    yr = _y_rep(p, yt) if p.rep_dx else None
    xp = _x_pack(p, xt) if ((p.need_forward and not p.rep_fwd)
                            or (dw_packed and not p.rep_dw)) else None
    xr = _x_rep(p, xt) if p.rep_fwd or (dw_packed and p.rep_dw) else None
    outs = [None, None, None]
    if nc_dx:
        outs[0] = _grad_input_nc(p, _nc_y_pad(p, grad_output), grad_output, weight, attrs, fb)
    elif p.need_adjoint:
        outs[0] = _grad_input_adjoint(p, yr if p.rep_dx else yp, yt, weight, attrs, fb)
    if p.need_forward:
        outs[0] = _grad_input_forward(p, xr if p.rep_fwd else xp, weight, attrs, fb)
    if dw_packed:
        outs[1] = _grad_weight(p, yt if p.dw_y_in_place else yp, xr if p.rep_dw else xp,
                               attrs, fb)
    elif p.output_mask[1]:
        outs[1] = _grad_weight_nc(p, grad_output, input, attrs, fb)
    if p.output_mask[2]:
        outs[2] = _grad_bias(p, grad_output, attrs)
    return fb.attach(tuple(outs))


def _x_padded(p: Plan) -> bool:
    """Whether some read of the x pack (dw, the transposed dx) reaches its zero rows."""
    return any(a.pad_before or a.x_padded_size > a.pad_before + a.n_in for a in p.axes)


def _y_padded(p: Plan) -> bool:
    """Whether some dx tap reads the y pack's zero rows or a zero tap of a kernel padded to
    whole stride phases."""
    return any(a.dy_pad_before or a.dy_padded_size > a.dy_pad_before + a.n_out
               or a.padded_kernel != a.kernel for a in p.axes)


@dataclass
class _Fallbacks:
    """The exact twins of the fast reductions that multiply zeros in (:mod:`dsl.ops.fallback`)
    and the flag they run on: a scan of every tensor whose values meet those zeros (the weight
    for grad_input, Y for grad_weight and for a padded kernel's zero taps)."""

    flag: object = None
    needs: tuple = ()  # the acc stages (tags) that get a twin
    twins: dict = field(default_factory=dict)  # output index -> twin tensors

    @classmethod
    def of(cls, p: Plan, yt, weight) -> _Fallbacks:
        if p.acc_dtype != ACC_DTYPE:
            return cls()
        scans, needs = [], []
        if p.output_mask[0] and p.need_forward and _x_padded(p):
            scans.append(weight)
            needs.append(tag.CB_FWD_ACC)
        if p.output_mask[0] and (p.need_adjoint or p.nc_dx) and _y_padded(p):
            scans.append(weight)
            if any(a.padded_kernel != a.kernel for a in p.axes):
                scans.append(yt)  # Y meets the zero taps too
            needs += [tag.CB_DX_ACC, tag.CB_NC_DX_ACC]
        if p.output_mask[1] and _x_padded(p):
            scans.append(yt)
            needs += [tag.CB_DW_ACC, tag.CB_NC_DW_ACC]
        unique = [t for i, t in enumerate(scans) if not any(t.op.same_as(u.op)
                                                            for u in scans[:i])]
        if not unique:
            return cls()
        return cls(fallback.nonfinite_flag(TAG, "cb_nonfinite", unique), tuple(needs))

    def acc(self, out: int, stage: str, shape, make_body, name: str):
        """The fast reduction ``name`` (``make_body(False)``) and, when ``stage`` needs one,
        its exact twin (``make_body(True)``), recorded for output ``out``."""
        from tvm import te

        if stage not in self.needs:
            return te.compute(shape, make_body(False), name=name, tag=stage)
        twin = te.compute(shape, make_body(True), name=f"{name}_exact", tag=tag.CB_EXACT,
                          attrs=fallback.twin_attrs(self.flag))
        self.twins.setdefault(out, []).append(twin)
        return te.compute(shape, make_body(False), name=name, tag=stage,
                          attrs=fallback.fast_attrs(twin))

    def attach(self, outs: tuple) -> tuple:
        for i, twins in self.twins.items():
            tag.with_side_stages(outs[i], [self.flag, *twins])
        return outs


def _attrs(p: Plan, grad_output, input, weight) -> dict:  # noqa: A002
    go_fmt = FORMATS[p.nd]
    formats = {grad_output.op.name: go_fmt, input.op.name: go_fmt, weight.op.name: go_fmt,
               "grad_input": go_fmt, "grad_weight": go_fmt, "grad_bias": "ND"}
    return tag.kernel_attrs(TAG, p.as_json(), formats)


def _group(p: Plan, c, per_group: int):
    """The group of channel ``c`` (``per_group`` channels per group); 0 when ungrouped."""
    return 0 if p.groups == 1 else c // per_group


# --- packs ---------------------------------------------------------------------------------

def _adjoint_reads_y_pack(p: Plan) -> bool:
    return p.need_adjoint and not p.rep_dx and not p.nc_dx


def _y_offsets(p: Plan, padded: bool | None = None) -> tuple[int, ...]:
    """Zero rows before Y in its pack: the dx taps' (only when the adjoint reads the pack;
    ``padded`` overrides that)."""
    if padded is None:
        padded = _adjoint_reads_y_pack(p)
    return tuple(a.dy_pad_before if padded else 0 for a in p.axes)


def _y_rows(p: Plan, padded: bool | None = None) -> tuple[int, ...]:
    if padded is None:
        padded = _adjoint_reads_y_pack(p)
    return tuple(a.dy_padded_size if padded else a.n_out for a in p.axes)


def _y_pack(p: Plan, yt):
    """``y_pack``: Y channels-last ``[N, *rows, Cy]``, zero rows for the dx taps."""
    return _pad_pack(p, yt, _y_offsets(p), _y_rows(p), tuple(a.n_out for a in p.axes),
                     (p.cy,), lambda c: c, "cb_y_pack", "y_pack")


def _y_rep(p: Plan, yt):
    """``y_rep``: Y expanded for the plain grad_input, ``[N, *rows, Cy_g, Cx]`` with
    ``y_rep[.., co, c] = y_pack[.., group(c) * Cy_g + co]`` (zero rows for the dx taps)."""
    return _pad_pack(p, yt, _y_offsets(p, True), _y_rows(p, True),
                     tuple(a.n_out for a in p.axes), (p.cyg, p.cx),
                     lambda co, c: c // p.cxg * p.cyg + co, "cb_y_rep", "y_rep")


def _x_pack(p: Plan, xt):
    """``x_pack``: X channels-last ``[N, *x_padded, Cx]``."""
    return _pad_pack(p, xt, tuple(a.pad_before for a in p.axes),
                     tuple(a.x_padded_size for a in p.axes), tuple(a.n_in for a in p.axes),
                     (p.cx,), lambda c: c, "cb_x_pack", "x_pack")


def _x_rep(p: Plan, xt):
    """``x_rep``: X expanded for lanes over Cy, ``[N, *x_padded, Cx_g, Cy]`` with
    ``x_rep[.., ci, c] = x_pack[.., group(c) * Cx_g + ci]``."""
    return _pad_pack(p, xt, tuple(a.pad_before for a in p.axes),
                     tuple(a.x_padded_size for a in p.axes), tuple(a.n_in for a in p.axes),
                     (p.cxg, p.cy), lambda ci, c: c // p.cyg * p.cxg + ci, "cb_x_rep",
                     "x_rep")


def _pad_pack(p: Plan, t, offsets, sizes, valid, channels: tuple[int, ...], source, name: str,
              stage: str, channels_first: bool = False, phases: int = 1, attrs=None):
    """``t [N, C, *s]`` channels-last ``[N, *sizes, *channels]`` (``channels_first``:
    ``[N, *channels, *sizes]``) as rounded fp32 cube operands: row ``r`` of axis ``a`` holds
    ``t``'s row ``r - offsets[a]``, zero outside ``[0, valid[a])``; channel indices ``cs`` read
    ``t``'s channel ``source(*cs)``. ``phases > 1`` (``channels_first`` only): the innermost
    axis stored as ``[phases, sizes[-1]]``, element ``(f, q)`` holding padded row ``q *
    phases + f`` (each stride phase contiguous)."""
    from tvm import te

    dtype, cmt = str(t.dtype), p.cube_math_type
    n_ch = len(channels)

    def body(b, *rest):
        if channels_first:
            cs, r = rest[:n_ch], list(rest[n_ch:])
            if phases > 1:
                f, q = r[-2:]
                r = [*r[:-2], q * phases + f]
        else:
            r, cs = rest[:len(sizes)], rest[len(sizes):]
        c = source(*cs)
        src = [ri - off for ri, off in zip(r, offsets)]
        conds = []
        for s_, off, size, n_valid in zip(src, offsets, sizes, valid):
            if off:
                conds.append(s_ >= 0)
            if size > off + n_valid:
                conds.append(s_ < n_valid)
        ok = _all(conds)
        if ok is not None:  # clamp so the guarded-off read stays in bounds
            src = [clamp_index(s_, n_valid) for s_, n_valid in zip(src, valid)]
        return _guard(ok, _operand(t[(b, c, *src)], dtype, cmt, p.acc_dtype), p.acc_dtype)

    if phases > 1:
        sizes = (*sizes[:-1], phases, sizes[-1])
    shape = (*channels, *sizes) if channels_first else (*sizes, *channels)
    return te.compute((p.input_shape[0], *shape), body, name=name, tag=tag.stage(TAG, stage),
                      attrs=attrs)


# --- exact depthwise: NC* throughout --------------------------------------------------------

def _build_nc_depthwise(p: Plan, grad_output, input, weight, attrs, fb):  # noqa: A002
    """Each channel is its own convolution: vectors along the innermost spatial axis need no
    channel-last copy, so dx and dw read NC* operands (dy padded for dx's taps, x padded for
    dw's) and write NC* results, with no layout transposes on either side."""
    outs = [None, None, None]
    if p.output_mask[0]:
        outs[0] = _grad_input_nc(p, _nc_y_pad(p, grad_output), grad_output, weight, attrs, fb)
    if p.output_mask[1]:
        outs[1] = _grad_weight_nc(p, grad_output, input, attrs, fb)
    if p.output_mask[2]:
        outs[2] = _grad_bias(p, grad_output, attrs)
    return tuple(outs)


def _nc_y_pad(p: Plan, grad_output):
    """``nc_y_pad``: dy zero-padded for dx's taps, NC*, rows of whole ``NC_ROW`` pitches."""
    return _pad_pack(p, grad_output, _y_offsets(p, True), _pitch(_y_rows(p, True)),
                     tuple(a.n_out for a in p.axes), (p.cy,), lambda c: c, "cb_nc_y_pad",
                     "nc_y_pad", channels_first=True)


def _pitch(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The innermost padded size rounded up to whole 16-float rows (zero columns past the
    data), so copying a padded row takes whole vectors on every x86 width."""
    return (*sizes[:-1], -(-sizes[-1] // NC_ROW) * NC_ROW)


def _grad_input_nc(p: Plan, yp, grad_output, weight, attrs, fb):
    """``nc_dx_acc [N, C, *in]``: ``sum_j y_pad[n, c, row(i, j)] * w_pad[c, k(i, j)]`` (the
    stride-phase gather of ``dx_taps``; stride 1: tap ``j`` is kernel tap ``k = j``, its row
    affine in ``i``), then cast. Its exact twin reads ``grad_output`` and ``weight`` themselves:
    the pads are computed inside the fast tile's task, so they can have no second reader."""
    from tvm import te

    axes, w_dtype, cmt = p.axes, str(weight.dtype), p.cube_math_type

    def make_body(exact: bool):
        jr = [te.reduce_axis((0, a.n_taps), name=f"j{i}") for i, a in enumerate(axes)]

        def body(b, c, *i):
            taps = [a.dx_taps(ii, j) for ii, j, a in zip(i, jr, axes)]
            if exact:
                ks = _in_kernel([k for k, _, _ in taps], axes)
                w = _operand(weight[(c, 0, *ks)], w_dtype, cmt, p.acc_dtype)
                rows = [clamp_index(row - a.dy_pad_before, a.n_out) for (_, row, _), a in
                        zip(taps, axes)]
                y = _operand(grad_output[(b, c, *rows)], str(grad_output.dtype), cmt,
                             p.acc_dtype)
                return te.sum(_guard(_real_y(p, taps), y * w, p.acc_dtype), axis=jr)
            prod = yp[(b, c, *(row for _, row, _ in taps))] * wp[(c, *(k for k, _, _ in taps))]
            return te.sum(prod, axis=jr)
        return body

    wp = _nc_weight_taps(p, weight)

    acc = fb.acc(0, tag.CB_NC_DX_ACC, (p.input_shape[0], p.cx, *(a.n_in for a in axes)),
                 make_body, "cb_nc_dx_acc")
    gi_dtype = p.out_dtypes[0]
    return te.compute(p.input_shape, lambda *idx: acc[idx].astype(gi_dtype),
                      name="grad_input", tag=tag.stage(TAG, "grad_input"), attrs=attrs)


def _nc_weight_taps(p: Plan, weight):
    """``nc_w_pad [C, *padded_kernel]``: the weight as dx's taps read it, rounded, with the
    zero taps that round a strided kernel up to whole stride phases (a tiny stage: the taps
    of a lane's phase then need no bounds test in the vector loop)."""
    from tvm import te

    axes, w_dtype, cmt = p.axes, str(weight.dtype), p.cube_math_type

    def body(c, *k):
        ok = _all([kk < a.kernel for kk, a in zip(k, axes) if a.padded_kernel != a.kernel])
        return _guard(ok, _operand(weight[(c, 0, *_in_kernel(k, axes))], w_dtype, cmt,
                                   p.acc_dtype),
                      p.acc_dtype)

    return te.compute((p.cx, *(a.padded_kernel for a in axes)), body, name="cb_nc_w_pad",
                      tag=tag.CB_NC_W_PAD)


def _in_kernel(ks, axes) -> list:
    """Taps ``ks`` of kernels padded to whole stride phases clamped into the real kernel, so
    a read that a select discards stays in bounds."""
    from tvm import te

    return [te.min(k, a.kernel - 1) if a.padded_kernel != a.kernel else k
            for k, a in zip(ks, axes)]


def _grad_weight_nc(p: Plan, grad_output, input, attrs, fb):  # noqa: A002
    """``nc_dw_acc [C, *k]``: ``sum_{n, o} dy[n, c, o] * x_pad[n, c, o*s + k*d]``, then cast
    to ``grad_weight [C, 1, *k]``. Where dy's rows are no whole 4-float vectors the sum
    goes through per-lane partial sums (:func:`_nc_dw_lanes`). Its exact twin reads
    ``input`` itself (as dx's twin)."""
    from tvm import te

    axes, go_dtype, cmt, lanes = p.axes, str(grad_output.dtype), p.cube_math_type, p.nc_dw_lanes
    xp = _nc_x_pad(p, input, lanes)
    part = _nc_dw_lanes(p, _nc_dy_rows(p, grad_output, lanes), xp, lanes) if lanes else None

    def make_body(exact: bool):
        if part is not None and not exact:
            rl = te.reduce_axis((0, axes[-1].n_out), name="lane")
            return lambda c, *k: te.sum(part[(c, *k, rl)], axis=rl)
        rn = te.reduce_axis((0, p.input_shape[0]), name="n")
        orr = [te.reduce_axis((0, a.n_out), name=f"o{i}") for i, a in enumerate(axes)]

        def body(c, *k):
            dy = _operand(grad_output[(rn, c, *orr)], go_dtype, cmt, p.acc_dtype)
            xpos = [oo * a.stride + kk * a.dilation for oo, kk, a in zip(orr, k, axes)]
            if exact:
                src = [clamp_index(q - a.pad_before, a.n_in) for q, a in zip(xpos, axes)]
                x = _operand(input[(rn, c, *src)], str(input.dtype), cmt, p.acc_dtype)
                return te.sum(_guard(_real_x(p, xpos), dy * x, p.acc_dtype), axis=[rn, *orr])
            x = _nc_x_at(p, xp, rn, c, [*xpos[:-1], (orr[-1], k[-1] * axes[-1].dilation)])
            return te.sum(dy * x, axis=[rn, *orr])
        return body

    acc = fb.acc(1, tag.CB_NC_DW_ACC, (p.cy, *(a.kernel for a in axes)), make_body,
                 "cb_nc_dw_acc")
    gw_dtype = p.out_dtypes[1]
    return te.compute(p.weight_shape, lambda c, ci, *k: acc[(c, *k)].astype(gw_dtype),
                      name="grad_weight", tag=tag.stage(TAG, "grad_weight"), attrs=attrs)


def _nc_x_pad(p: Plan, input, lanes: int = 0):  # noqa: A002
    """``nc_x_pad``: x zero-padded for dw's taps, NC*, rows of whole ``NC_ROW`` pitches, long
    enough for every one of ``lanes`` (past the row too) to read its taps. A strided
    innermost axis of dy rows of ``NC_ROW`` or more is stored by stride phase (``[s,
    pitch]``, :func:`_nc_x_at`), so dw's lanes read x contiguously: read every s-th element,
    each tap's 16-lane vector was two loads and a shuffle, twice the loads of its FMAs
    (8x144x56x56 stride 2 on one Zen 4 core: 2.0 -> 1.6 ms). Shorter rows gather from one
    window anyway, and their phase copy is mostly borders (14 -> 7: 0.28 -> 0.33 ms). Its
    ``ROW_INTERIOR`` attribute gives the columns where every phase holds real x (the
    schedule copies those in whole vectors)."""
    axes = p.axes
    sizes = [a.x_padded_size for a in axes]
    last = axes[-1]
    sizes[-1] = max(sizes[-1], (lanes - 1) * last.stride + (last.kernel - 1) * last.dilation + 1)
    phases, attrs = _x_phases(p), None
    if phases > 1:
        sizes[-1] = -(-sizes[-1] // phases)
        lo = -(-last.pad_before // phases)  # q * s + f - pad >= 0 for every phase f
        hi = (last.n_in + last.pad_before - phases) // phases + 1  # ... and < n_in
        attrs = {tag.ROW_INTERIOR: [lo, max(lo, hi)]}
    return _pad_pack(p, input, tuple(a.pad_before for a in axes), _pitch(tuple(sizes)),
                     tuple(a.n_in for a in axes), (p.cx,), lambda c: c, "cb_nc_x_pad",
                     "nc_x_pad", channels_first=True, phases=phases, attrs=attrs)


def _x_phases(p: Plan) -> int:
    """Stride phases of :func:`_nc_x_pad`'s innermost axis (1: stored plain)."""
    last = p.axes[-1]
    return last.stride if max(p.nc_dw_lanes, last.n_out) >= NC_ROW else 1


def _nc_x_at(p: Plan, xp, n, c, pos):
    """``x_pad[n, c, *rows, o * s + k * d]`` read from :func:`_nc_x_pad`, ``pos`` being
    ``(*rows, (o, k * d))``; stored by phase: phase ``k * d % s``, column ``o + k * d // s``."""
    s, phases = p.axes[-1].stride, _x_phases(p)
    *rows, (o, kd) = pos
    if phases == 1:
        return xp[(n, c, *rows, o * s + kd)]
    return xp[(n, c, *rows, kd % s, o + kd // s)]


def _nc_dy_rows(p: Plan, grad_output, lanes: int):
    """``nc_dy_rows [N, C, *out[:-1], lanes]``: dy with each row zero-padded to ``lanes``."""
    n_out = tuple(a.n_out for a in p.axes)
    return _pad_pack(p, grad_output, (0,) * p.nd, (*n_out[:-1], lanes), n_out, (p.cy,),
                     lambda c: c, "cb_nc_dy_rows", "nc_dy_rows", channels_first=True)


def _nc_dw_lanes(p: Plan, dy_rows, xp, lanes: int):
    """``nc_dw_lanes [C, *k, lanes]``: ``sum_{n, o'} dy_rows[n, c, o', l] * x_pad[n, c,
    (o', l)*s + k*d]`` over the outer output axes ``o'``, one partial sum per lane ``l`` of
    the innermost axis. Lanes past the row (``l >= n_out``) read a zero dy and whatever x is
    there; :func:`_grad_weight_nc` sums only the real ones."""
    from tvm import te

    axes = p.axes
    rn = te.reduce_axis((0, p.input_shape[0]), name="n")
    orr = [te.reduce_axis((0, a.n_out), name=f"o{i}") for i, a in enumerate(axes[:-1])]

    def body(c, *kl):
        *k, lane = kl
        xpos = [oo * a.stride + kk * a.dilation for oo, kk, a in zip(orr, k, axes)]
        x = _nc_x_at(p, xp, rn, c, [*xpos, (lane, k[-1] * axes[-1].dilation)])
        return te.sum(dy_rows[(rn, c, *orr, lane)] * x, axis=[rn, *orr])

    return te.compute((p.cy, *(a.kernel for a in axes), lanes), body, name="cb_nc_dw_lanes",
                      tag=tag.CB_NC_DW_LANES)


# --- the exact twins' tests ----------------------------------------------------------------

def _real_x(p: Plan, pos):
    """Row ``pos`` (per axis) of the x pack holds a real x element, not padding."""
    return _all([c for q, a in zip(pos, p.axes)
                 for c in (q >= a.pad_before, q < a.pad_before + a.n_in)])


def _real_y(p: Plan, taps):
    """dx taps ``(k, row, _)`` (per axis) read a real Y element with a real kernel tap."""
    conds = []
    for (k, row, _), a in zip(taps, p.axes):
        conds += [row >= a.dy_pad_before, row < a.dy_pad_before + a.n_out]
        if a.padded_kernel != a.kernel:
            conds.append(k < a.kernel)
    return _all(conds)


# --- grad_input ----------------------------------------------------------------------------

def _reversed_taps(ks, axes) -> list:
    """Kernel taps ``ks`` <-> their positions in ``w_adj``, which holds each axis's padded
    taps last first (the map is its own inverse)."""
    return [a.padded_kernel - 1 - k for k, a in zip(ks, axes)]


def _grad_input_adjoint(p: Plan, yp, yt, weight, attrs, fb):
    """``w_adj`` and ``dx_acc``: the plain grad_input, a stride-phase gather of dx taps. The
    exact twin reads Y (``yt``) itself where the fast stage reads ``y_pack``, so the pack may
    have no other reader and be computed inside the fast stage's tasks
    (:func:`schedules.convolution_backward.pack_in_task`)."""
    from tvm import te

    axes, cyg, cxg = p.axes, p.cyg, p.cxg
    w_dtype, cmt = str(weight.dtype), p.cube_math_type

    def wa_body(*idx):
        # taps stored last first, in the order dx visits them (dx_body): a dx whose dy row
        # grows by one per tap then reads both operands contiguously across (tap, channel)
        *kr, co, c = idx
        k = _reversed_taps(kr, axes)
        conds = [(kk < a.kernel) if a.padded_kernel != a.kernel else None
                 for kk, a in zip(k, axes)]
        ok = _all(conds)
        ks = [te.min(kk, a.kernel - 1) if a.padded_kernel != a.kernel else kk
              for kk, a in zip(k, axes)]
        ci = c if p.groups == 1 else c % cxg
        val = weight[(_group(p, c, cxg) * cyg + co, ci, *ks)]
        return _guard(ok, _operand(val, w_dtype, cmt, p.acc_dtype), p.acc_dtype)

    wa = te.compute((*(a.padded_kernel for a in axes), cyg, p.cx), wa_body, name="cb_w_adj",
                    tag=tag.stage(TAG, "w_adj"))
    def make_body(exact: bool):
        jr = [te.reduce_axis((0, a.n_taps), name=f"j{i}") for i, a in enumerate(axes)]
        rco = te.reduce_axis((0, cyg), name="co")

        def dx_body(b, *rest):
            *i, c = rest
            # taps from the last: the dy row then grows with the reduction index, so the
            # index has no negative term and LLVM folds each broadcast's row offset into
            # its address (with -j it kept 32-bit wrap-around arithmetic per row in the
            # inner loop: conv1d dx 365 -> 433 GFLOP/s on 2 Zen 5 cores)
            taps = [a.dx_taps(ii, a.n_taps - 1 - j) for ii, j, a in zip(i, jr, axes)]
            ks, rows = [k for k, _, _ in taps], [row for _, row, _ in taps]
            conds = [cond for _, _, cond in taps]
            if exact:
                conds.append(_real_y(p, taps))
            co = rco if p.groups == 1 else _group(p, c, cxg) * cyg + rco
            if p.rep_dx:  # y_rep [N, *rows, Cy_g, Cx]: the lanes (c) read adjacent memory
                y = yp[(b, *rows, rco, c)]
            elif exact:  # Y's own row (clamped: a padding row is guarded off by _real_y)
                src = [clamp_index(row - a.dy_pad_before, a.n_out)
                       for row, a in zip(rows, axes)]
                y = _operand(yt[(b, co, *src)], str(yt.dtype), cmt, p.acc_dtype)
            else:
                y = yp[(b, *rows, co)]
            prod = y * wa[(*_reversed_taps(ks, axes), rco, c)]
            return te.sum(_guard(_all(conds), prod, p.acc_dtype), axis=[*jr, rco])
        return dx_body

    acc = fb.acc(0, tag.CB_DX_ACC, (p.input_shape[0], *(a.n_in for a in axes), p.cx),
                 make_body, "cb_dx_acc")
    return _grad_input_out(p, acc, attrs)


def _grad_input_forward(p: Plan, xp, weight, attrs, fb):
    """``w_fwd`` and ``fwd_acc``: the transposed conv's grad_input, a plain convolution."""
    from tvm import te

    axes, cxg, w_dtype, cmt = p.axes, p.cxg, str(weight.dtype), p.cube_math_type
    wf = te.compute((*(a.kernel for a in axes), cxg, p.cy),
                    lambda *idx: _operand(weight[(idx[-1], idx[-2], *idx[:-2])], w_dtype,
                                          cmt, p.acc_dtype),
                    name="cb_w_fwd", tag=tag.stage(TAG, "w_fwd"))
    def make_body(exact: bool):
        kr = [te.reduce_axis((0, a.kernel), name=f"k{i}") for i, a in enumerate(axes)]
        rci = te.reduce_axis((0, cxg), name="ci")

        def fwd_body(b, *rest):
            *o, c = rest
            pos = [oo * a.stride + kk * a.dilation for oo, kk, a in zip(o, kr, axes)]
            if p.rep_fwd:  # x_rep [N, *x_padded, Cx_g, Cy]
                x = xp[(b, *pos, rci, c)]
            else:
                x = xp[(b, *pos, rci if p.groups == 1 else _group(p, c, p.cyg) * cxg + rci)]
            prod = x * wf[(*kr, rci, c)]
            if exact:
                prod = _guard(_real_x(p, pos), prod, p.acc_dtype)
            return te.sum(prod, axis=[*kr, rci])
        return fwd_body

    acc = fb.acc(0, tag.CB_FWD_ACC, (p.input_shape[0], *(a.n_out for a in axes), p.cy),
                 make_body, "cb_fwd_acc")
    return _grad_input_out(p, acc, attrs)


def _grad_input_out(p: Plan, acc, attrs):
    """``grad_input``: the channels-last acc back to ``input.shape``, cast."""
    from tvm import te

    gi_dtype = p.out_dtypes[0]
    return te.compute(p.input_shape, lambda b, c, *s: acc[(b, *s, c)].astype(gi_dtype),
                      name="grad_input", tag=tag.stage(TAG, "grad_input"), attrs=attrs)


# --- grad_weight and grad_bias -------------------------------------------------------------

def _grad_weight(p: Plan, yp, xp, attrs, fb):
    """``dw_acc [*k, Cy, Cx_g]`` over ``(n, *o)``, then ``grad_weight`` in weight layout.
    ``yp``: ``y_pack``, or Y itself (``[N, Cy, *o]``) where :attr:`Plan.dw_y_in_place`."""
    from tvm import te

    axes, y_off, cxg, gw_dtype = p.axes, _y_offsets(p), p.cxg, p.out_dtypes[1]
    def make_body(exact: bool):
        rn = te.reduce_axis((0, p.input_shape[0]), name="n")
        orr = [te.reduce_axis((0, a.n_out), name=f"o{i}") for i, a in enumerate(axes)]

        def dw_body(*idx):
            *k, c, ci = idx
            ypos = [oo + off for oo, off in zip(orr, y_off)]
            xpos = [oo * a.stride + kk * a.dilation for oo, kk, a in zip(orr, k, axes)]
            if p.rep_dw:  # x_rep [N, *x_padded, Cx_g, Cy]
                x = xp[(rn, *xpos, ci, c)]
            else:
                x = xp[(rn, *xpos, ci if p.groups == 1 else _group(p, c, p.cyg) * cxg + ci)]
            y = yp[(rn, c, *orr)] if p.dw_y_in_place else yp[(rn, *ypos, c)]
            prod = y * x
            if exact:
                prod = _guard(_real_x(p, xpos), prod, p.acc_dtype)
            return te.sum(prod, axis=[rn, *orr])
        return dw_body

    acc = fb.acc(1, tag.CB_DW_ACC, (*(a.kernel for a in axes), p.cy, cxg), make_body,
                 "cb_dw_acc")
    return te.compute(p.weight_shape, lambda c, ci, *k: acc[(*k, c, ci)].astype(gw_dtype),
                      name="grad_weight", tag=tag.stage(TAG, "grad_weight"), attrs=attrs)


def _grad_bias(p: Plan, grad_output, attrs):
    """``db_acc``: fp32 sum of grad_output over ``(n, *o)`` (never rounded), then cast."""
    from tvm import te

    c_out, gb_dtype = p.grad_output_shape[1], p.out_dtypes[2]
    rn = te.reduce_axis((0, p.input_shape[0]), name="bn")
    orr = [te.reduce_axis((0, d), name=f"bo{i}") for i, d in
           enumerate(p.grad_output_shape[2:])]
    db = te.compute((c_out,),
                    lambda c: te.sum(grad_output[(rn, c, *orr)].astype(p.acc_dtype),
                                     axis=[rn, *orr]),
                    name="cb_db_acc", tag=tag.stage(TAG, "db_acc"))
    return te.compute((c_out,), lambda c: db[c].astype(gb_dtype), name="grad_bias",
                      tag=tag.stage(TAG, "grad_bias"), attrs=attrs)
