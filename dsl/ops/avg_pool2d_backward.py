"""``avg_pool2d_backward``: the input gradient of 2-D average pooling (seed 004).

The seed's formula is garbled; the operator follows PyTorch's ``avg_pool2d`` backward, which
aclnnAvgPool2dBackward matches. Per axis (H shown; W alike), with kernel ``k``, stride ``s``,
padding ``p`` and input size ``H``::

    window oh:  start(oh) = oh*s - p,   end(oh) = min(start(oh) + k, H + p)   (end exclusive)
    Ho = floor((H + 2p - k + (s - 1 if ceil_mode else 0)) / s) + 1,
         minus 1 when ceil_mode and (Ho - 1)*s >= H + p (a last window must start inside the
         input or the left padding)

    y[oh, ow]  = sum_{h in [max(start,0), min(end,H)), w likewise} x[h, w] / D(oh, ow)
    D(oh, ow)  = divisor_override                                  if divisor_override != 0
               = (end_h - start_h) * (end_w - start_w)              if count_include_pad
               = (min(end_h,H) - max(start_h,0)) * (... W ...)       otherwise

    dx[h, w]   = sum over the windows (oh, ow) containing (h, w) of dy[oh, ow] / D(oh, ow)

``count_include_pad`` windows are clipped at the padded border ``H + p`` (so a ceil-mode window
hanging past it counts only the rows up to it), as in PyTorch.

Gather form: window ``oh`` contains ``h`` iff ``oh*s <= h + p < oh*s + k``. With ``t = h + p``
the only candidates are ``oh = t // s - j`` for ``j < ceil(k / s)``, the ``j``-th one valid iff
``t % s + j*s < k`` -- always when ``s`` divides ``k``, so that guard is emitted only otherwise.
The scaled dy is zero-padded by whole rows/columns so every candidate reads in bounds. When an
axis has fewer windows than candidates (global-like pooling) its windows are enumerated
directly, ``oh = j < Ho``, each guarded by the containment test.

Tensors
-------
grad_output : NCHW ``(N, C, Ho, Wo)`` or CHW ``(C, Ho, Wo)``; 5HD ``(N, C1, Ho, Wo, 16)`` for
    :func:`avg_pool2d_backward_5hd`. float32, float16 or bfloat16.
self : the forward input, same layout as the result, ``(N, C, H, W)`` / ``(C, H, W)`` /
    ``(N, C1, H, W, 16)``; supplies shape and dtype only (its values are not read, as in the
    real operator, so it is not a kernel argument).
result : gradInput, same shape and dtype as ``self``. In 5HD a channel lane is pooled
    independently, so zero pad channels in grad_output stay zero.

Stages (schedules find them by tag)
-----------------------------------
``avg_pool2d_backward.scale``  dy / D in float32, zero-padded rows/columns (one division per dy
    element instead of one per (dx element, window)).
``avg_pool2d_backward.acc``    the float32 gather-sum; for NCHW with ``sW > 1`` laid out
    ``(..., H, ceil(W/sW), sW)`` (W split into stride phases). Absent for float32 without
    phases: the output is then the sum itself.
``avg_pool2d_backward``        the result in the dtype of ``self``.

Decisions where the seed is silent
----------------------------------
* The seed's garbled formula (a k*k mean, no padding rules) is replaced by PyTorch's semantics,
  including ceil_mode's last-window rule and count_include_pad's clipping at ``H + p``.
* The seed's 3-D "NCL" input is PyTorch's unbatched ``(C, H, W)``.
* ``divisor_override`` may be any non-zero int64, negative included (the A2/A3 range; the
  older products' [-255, 255] is not enforced); 0 means none, as the seed says.
* The seed's 65535-channel limit (a limit of the device) is not enforced: any C computes.
* Accumulation is float32 (float64 for float64 tensors, an extension for ``gradcheck``), the
  result rounded once to the dtype of ``self``.

``cube_math_type`` (0 KEEP_DTYPE, 1 ALLOW_FP32_DOWN_PRECISION, 2 USE_FP16, 3 USE_HF32) selects
the cube unit's precision on the device, where the operator can run as a depthwise transposed
convolution. Here there is no cube multiply: every mode computes in float32, which is at least
as precise as each mode permits. The combinations the seed marks unsupported on the bfloat16
(Atlas A2/A3) products are refused: USE_FP16 with bfloat16, USE_HF32 with a non-float32 input.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dsl.errors import (
    E_CHANNEL,
    E_DTYPE,
    E_DTYPE_MISMATCH,
    E_GEOMETRY_IN,
    E_GEOMETRY_OUT,
    E_RANGE,
    E_SHAPE,
    E_VALUE,
    SUPPORTED_FLOATS,
    ceil_div,
    check_bool,
    check_int,
    check_ints,
    check_shape,
    fail,
    te_shape,
)
from dsl.ops import tag
from dsl.ops.group import C0
from dsl.ops.layout import FORMAT_5HD

TAG = tag.AVG_POOL2D_BACKWARD
ACC_DTYPE = "float32"
CUBE_MATH_TYPES = {0: "KEEP_DTYPE", 1: "ALLOW_FP32_DOWN_PRECISION", 2: "USE_FP16",
                   3: "USE_HF32"}
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOATS = (*SUPPORTED_FLOATS, "float64")  # float64 accumulates in float64 (gradcheck)


def _min(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    from tvm import te

    return te.min(a, b)


def _max(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    from tvm import te

    return te.max(a, b)


@dataclass(frozen=True)
class PoolAxis:
    """One spatial axis of the pooling: sizes, kernel, stride, padding (plain ints)."""

    n_in: int
    n_out: int
    kernel: int
    stride: int
    pad: int
    n_pos: int = 0  # positions the gather visits, when more than n_in (rounded-up phases)

    @staticmethod
    def out_size(n_in: int, kernel: int, stride: int, pad: int, ceil_mode: bool) -> int:
        """PyTorch's ``pooling_output_shape`` with dilation 1 (may be < 1; callers check)."""
        n_out = (n_in + 2 * pad - kernel + (stride - 1 if ceil_mode else 0)) // stride + 1
        if ceil_mode and (n_out - 1) * stride >= n_in + pad:
            n_out -= 1  # the extra window would start in the right padding: drop it
        return n_out

    def count(self, o, include_pad: bool):
        """Rows of window ``o`` in its divisor (ints or TE expressions)."""
        start = o * self.stride - self.pad
        if include_pad:
            return _min(start + self.kernel, self.n_in + self.pad) - start
        return _min(start + self.kernel, self.n_in) - _max(start, 0)

    @property
    def direct(self) -> bool:
        """Enumerate every window (``oh = j``) when there are fewer windows than candidates
        ``ceil(kernel / stride)`` (global-like pooling): no dy padding, fewer zero adds."""
        return self.n_out < ceil_div(self.kernel, self.stride)

    @property
    def n_taps(self) -> int:
        """Windows enumerated per input position: ``min(ceil(kernel / stride), n_out)``."""
        return self.n_out if self.direct else ceil_div(self.kernel, self.stride)

    @property
    def guarded(self) -> bool:
        """Whether some enumerated windows miss the position (when the stride does not divide
        the kernel, or when every window is enumerated)."""
        return self.direct or self.kernel % self.stride != 0

    @property
    def pad_before(self) -> int:
        """Zero rows before row 0 of the scaled dy so the lowest candidate reads in bounds."""
        return 0 if self.direct else max(0, self.n_taps - 1 - self.pad // self.stride)

    @property
    def padded_size(self) -> int:
        if self.direct:
            return self.n_out
        highest = (max(self.n_in, self.n_pos) - 1 + self.pad) // self.stride
        return self.pad_before + max(self.n_out, highest + 1)

    def tap(self, i, j) -> tuple[object, list]:
        """Row of the padded scaled dy read by the ``j``-th enumerated window of input position
        ``i``, and the conditions (none when always true) that the window really contains
        ``i``. Works on ints and TE expressions (``//`` and ``%`` floor in both)."""
        t = i + self.pad
        if self.direct:
            return j, [t - j * self.stride >= 0, t - j * self.stride < self.kernel]
        row = t // self.stride - j + self.pad_before
        return row, ([t % self.stride + j * self.stride < self.kernel] if self.guarded else [])


@dataclass(frozen=True)
class AvgPool2dGeometry:
    """The checked, normalised parameters of one avg_pool2d backward call."""

    layout: str  # "NCHW" (also CHW) or "NC1HWC0"
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]  # grad_output's shape
    dtype: str
    h: PoolAxis
    w: PoolAxis
    ceil_mode: bool
    count_include_pad: bool
    divisor_override: int
    cube_math_type: int

    def as_json(self) -> dict:
        """Everything that determines the kernel (cube_math_type does not; see module doc)."""
        return {"layout": self.layout, "self_shape": list(self.in_shape),
                "grad_output_shape": list(self.out_shape), "dtype": self.dtype,
                "kernel_size": [self.h.kernel, self.w.kernel],
                "stride": [self.h.stride, self.w.stride], "padding": [self.h.pad, self.w.pad],
                "ceil_mode": self.ceil_mode, "count_include_pad": self.count_include_pad,
                "divisor_override": self.divisor_override}


def check_avg_pool2d_backward(grad_output_shape, grad_output_dtype, self_shape, self_dtype,
                              kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override, cube_math_type=0, *,
                              layout: str = "NCHW") -> AvgPool2dGeometry:
    """Check a call on plain Python values (before any TVM work) and normalise it.

    Raises :class:`dsl.DslError` with the codes of :mod:`dsl.errors`: E60005 wrong Python type,
    E60003 wrong rank / length / non-positive size, E60011 value out of range (sizes, pad >
    kernel/2, cube_math_type), E60006 / E65002 dtypes, E60012 unsupported
    cube_math_type for the dtype, E60025 output size < 1, E60002 / E60024 grad_output not the
    shape the forward produced.
    """
    five = layout == FORMAT_5HD
    ranks = (5,) if five else (3, 4)
    x_shape = check_shape("self.shape", self_shape, ranks)
    dy_shape = check_shape("grad_output.shape", grad_output_shape, ranks)
    dtype = str(self_dtype)
    if dtype not in FLOATS:
        raise fail(E_DTYPE, "self.dtype", dtype, f"must be one of {', '.join(FLOATS)}")
    if str(grad_output_dtype) != dtype:
        raise fail(E_DTYPE_MISMATCH, "grad_output.dtype", str(grad_output_dtype),
                   f"must equal self.dtype={dtype}")
    window = _check_window(kernel_size, stride, padding)
    ceil_mode = check_bool("ceil_mode", ceil_mode, name_type=True)
    count_include_pad = check_bool("count_include_pad", count_include_pad, name_type=True)
    divisor = check_int("divisor_override", divisor_override, lo=INT64_MIN, hi=INT64_MAX)
    cube = _check_cube_math_type(cube_math_type, dtype)
    c_axis, h_axis = _check_channels(x_shape, dy_shape, five)
    ah, aw = _pooled_axes(x_shape, dy_shape, c_axis, h_axis, window, ceil_mode)
    return AvgPool2dGeometry(
        layout=FORMAT_5HD if five else "NCHW", in_shape=x_shape, out_shape=dy_shape,
        dtype=dtype, h=ah, w=aw, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
        divisor_override=divisor, cube_math_type=cube)


def _check_window(kernel_size, stride, padding):
    """``((kH, kW), (sH, sW), (pH, pW))``: short forms expanded, pads at most half a kernel."""
    ks = check_ints("kernel_size", kernel_size, (1, 2), lo=1)
    ss = check_ints("stride", stride, (0, 1, 2), lo=1)
    ps = check_ints("padding", padding, (1, 2), lo=0)
    kh, kw = ks * 2 if len(ks) == 1 else ks
    sh, sw = (kh, kw) if not ss else (ss * 2 if len(ss) == 1 else ss)
    ph, pw = ps * 2 if len(ps) == 1 else ps
    for axis, p, k in (("H", ph, kh), ("W", pw, kw)):
        if p > k // 2:  # PyTorch: "pad should be at most half of effective kernel size"
            raise fail(E_RANGE, "padding", list(ps),
                       f"pad {axis}={p} must be at most half the kernel ({k} // 2 = {k // 2})")
    return (kh, kw), (sh, sw), (ph, pw)


def _check_cube_math_type(cube_math_type, dtype: str) -> int:
    """0-3, refusing the combinations the seed marks unsupported for the dtype."""
    cube = check_int("cube_math_type", cube_math_type, lo=0, hi=3)
    if cube == 2 and dtype == "bfloat16":
        raise fail(E_VALUE, "cube_math_type", cube,
                   "2 (USE_FP16) is not supported for bfloat16 inputs; use 0 or 1")
    if cube == 3 and dtype != "float32":
        raise fail(E_VALUE, "cube_math_type", cube,
                   f"3 (USE_HF32) is supported only for float32 inputs, not {dtype}; use 0 or 1")
    return cube


def _check_channels(x_shape, dy_shape, five: bool) -> tuple[int, int]:
    """The 5HD block (any channel count: the seed's 65535 is a device limit); returns the
    (channel, H) axes of the layout."""
    if five:
        if x_shape[4] != C0 or dy_shape[4] != C0:
            raise fail(E_SHAPE, "self.shape" if x_shape[4] != C0 else "grad_output.shape",
                       x_shape if x_shape[4] != C0 else dy_shape,
                       f"must be 5HD (N, C1, H, W, {C0})")
        c_axis, h_axis = 1, 2
    else:
        c_axis, h_axis = len(x_shape) - 3, len(x_shape) - 2
    return c_axis, h_axis


def _pooled_axes(x_shape, dy_shape, c_axis, h_axis, window, ceil_mode):
    """The (H, W) :class:`PoolAxis` pair, checking grad_output is the forward's output."""
    (kh, kw), (sh, sw), (ph, pw) = window
    h_in, w_in = x_shape[h_axis], x_shape[h_axis + 1]
    ho = PoolAxis.out_size(h_in, kh, sh, ph, ceil_mode)
    wo = PoolAxis.out_size(w_in, kw, sw, pw, ceil_mode)
    if ho < 1 or wo < 1:
        raise fail(E_GEOMETRY_OUT, "self.shape", x_shape,
                   f"input {h_in}x{w_in} with kernel {kh}x{kw}, stride {sh}x{sw}, padding "
                   f"{ph}x{pw} gives output {ho}x{wo}: output size is too small")
    if len(dy_shape) != len(x_shape):
        raise fail(E_SHAPE, "grad_output.shape", dy_shape,
                   f"must have the rank of self.shape={x_shape}")
    if dy_shape[:c_axis] != x_shape[:c_axis]:
        raise fail(E_SHAPE, "grad_output.shape", dy_shape,
                   f"batch must equal self's: {x_shape[:c_axis]}")
    if dy_shape[c_axis] != x_shape[c_axis]:
        raise fail(E_CHANNEL, "grad_output.shape", dy_shape,
                   f"channels (axis {c_axis}) must equal self's {x_shape[c_axis]}")
    if dy_shape[h_axis:h_axis + 2] != (ho, wo):
        raise fail(E_GEOMETRY_IN, "grad_output.shape", dy_shape,
                   f"spatial size must be the pooled size ({ho}, {wo}) of self {h_in}x{w_in} "
                   f"(kernel {kh}x{kw}, stride {sh}x{sw}, padding {ph}x{pw}, "
                   f"ceil_mode={ceil_mode})")
    return PoolAxis(h_in, ho, kh, sh, ph), PoolAxis(w_in, wo, kw, sw, pw)


# --- stages ----------------------------------------------------------------------------------

def _compute(dy, geo: AvgPool2dGeometry):
    """The stages, for either layout. Index tuples are ``(*lead, h, w, *tail)``: lead is
    (N, C) / (C,) / (N, C1), tail is () or (C0,), so one gather serves both layouts."""
    h_axis = 2 if geo.layout == FORMAT_5HD else len(geo.in_shape) - 2
    ah, aw = geo.h, geo.w
    # NCHW with a W stride: gather in phases, acc[..., h, q, r] = dx[..., h, q*sW + r], so the
    # vector lanes (q) read consecutive dy columns and share one guard; (q, r) flattened is w,
    # so the output stage still reads acc contiguously. 5HD vectorises C0 and needs none.
    phases = aw.stride if geo.layout != FORMAT_5HD and aw.stride > 1 and not aw.direct else 1
    if phases > 1:
        aw = replace(aw, n_pos=ceil_div(aw.n_in, phases) * phases)
    scaled = _scale_stage(dy, geo, h_axis, ah, aw)
    formats = {dy.op.name: geo.layout, "grad_input": geo.layout}
    attrs = tag.kernel_attrs(TAG, geo.as_json(), formats, layout=geo.layout, w_phases=phases)
    return _output(geo, _gather(scaled, h_axis, ah, aw), phases, attrs)


def _split(idx, h_axis: int):
    """``(lead, h, w, tail)`` of an index tuple."""
    return idx[:h_axis], idx[h_axis], idx[h_axis + 1], idx[h_axis + 2:]


def _acc_dtype(geo: AvgPool2dGeometry) -> str:
    """float32, or float64 for float64 tensors (an extension for ``gradcheck``)."""
    return "float64" if geo.dtype == "float64" else ACC_DTYPE


def _scale_stage(dy, geo: AvgPool2dGeometry, h_axis: int, ah: PoolAxis, aw: PoolAxis):
    """``scale``: dy / D in float32 with zero rows / columns around it."""
    import tvm
    from tvm import te

    acc_t = _acc_dtype(geo)
    zero = tvm.tirx.const(0, acc_t)

    def scale_body(*idx):
        lead, r, q, tail = _split(idx, h_axis)
        conds, src = [], []
        for pos, ax in ((r, ah), (q, aw)):
            o = pos - ax.pad_before
            lo, hi = ax.pad_before > 0, ax.padded_size > ax.pad_before + ax.n_out
            conds += ([o >= 0] if lo else []) + ([o < ax.n_out] if hi else [])
            # clamped so the load is in bounds even where a vectoriser evaluates both arms
            src.append(_max(_min(o, ax.n_out - 1), 0) if lo or hi else o)
        val = dy[(*lead, *src, *tail)].astype(acc_t)
        if geo.divisor_override:
            val = val / tvm.tirx.const(float(geo.divisor_override), acc_t)
        else:
            div = ah.count(src[0], geo.count_include_pad) * aw.count(src[1],
                                                                     geo.count_include_pad)
            val = val / div.astype(acc_t)
        return tvm.tirx.Select(tvm.tirx.all(*conds), val, zero) if conds else val

    scaled_shape = (*geo.out_shape[:h_axis], ah.padded_size, aw.padded_size,
                    *geo.out_shape[h_axis + 2:])
    return te.compute(scaled_shape, scale_body, name="grad_scaled", tag=tag.stage(TAG, "scale"))


def _gather(scaled, h_axis: int, ah: PoolAxis, aw: PoolAxis):
    """The body of the gather-sum: dx at an index is the sum of its windows' scaled dy."""
    import tvm
    from tvm import te

    zero = tvm.tirx.const(0, str(scaled.dtype))
    jh = te.reduce_axis((0, ah.n_taps), name="jh")
    jw = te.reduce_axis((0, aw.n_taps), name="jw")

    def gather(*idx):
        lead, i, j, tail = _split(idx, h_axis)
        row, cond_h = ah.tap(i, jh)
        col, cond_w = aw.tap(j, jw)
        val = scaled[(*lead, row, col, *tail)]
        conds = cond_h + cond_w
        if conds:  # indices are in bounds either way, so a Select (no branch) is safe
            val = tvm.tirx.Select(tvm.tirx.all(*conds), val, zero)
        return te.sum(val, axis=[jh, jw])

    return gather


def _output(geo: AvgPool2dGeometry, gather, phases: int, attrs: dict):
    """``acc`` (absent for float32 without phases) and the anchor ``grad_input``."""
    from tvm import te

    if phases == 1:
        if geo.dtype == _acc_dtype(geo):
            return te.compute(geo.in_shape, gather, name="grad_input", tag=TAG, attrs=attrs)
        acc = te.compute(geo.in_shape, gather, name="grad_acc", tag=tag.stage(TAG, "acc"))
        return te.compute(geo.in_shape, lambda *idx: acc[idx].astype(geo.dtype),
                          name="grad_input", tag=TAG, attrs=attrs)
    wq = ceil_div(geo.in_shape[-1], phases)
    acc = te.compute((*geo.in_shape[:-1], wq, phases),
                     lambda *idx: gather(*idx[:-2], idx[-2] * phases + idx[-1]),
                     name="grad_acc", tag=tag.stage(TAG, "acc"))
    return te.compute(
        geo.in_shape,
        lambda *idx: acc[(*idx[:-1], idx[-1] // phases, idx[-1] % phases)].astype(geo.dtype),
        name="grad_input", tag=TAG, attrs=attrs)


def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override, cube_math_type=0):
    """gradInput of ``avg_pool2d`` in NCHW or CHW. See the module docstring for the math.

    Parameters
    ----------
    grad_output : te.Tensor
        dy, NCHW ``(N, C, Ho, Wo)`` or CHW ``(C, Ho, Wo)``; float32, float16 or bfloat16.
    self : te.Tensor
        The forward input, ``(N, C, H, W)`` or ``(C, H, W)``, dtype of grad_output.
        Only its shape and dtype are used.
    kernel_size : sequence of 1 or 2 int
        ``[k]`` (kH = kW) or ``[kH, kW]``, each >= 1.
    stride : sequence of 0, 1 or 2 int
        ``[]`` (= kernel_size), ``[s]`` or ``[sH, sW]``, each >= 1.
    padding : sequence of 1 or 2 int
        ``[p]`` or ``[pH, pW]``, each in ``[0, kernel // 2]``.
    ceil_mode, count_include_pad : bool
    divisor_override : int
        0: unused; otherwise every window's divisor (negative allowed).
    cube_math_type : int
        0-3, checked against the dtype as the seed says; does not change the float32 math.

    Returns
    -------
    te.Tensor
        gradInput, the shape and dtype of ``self``; tag ``avg_pool2d_backward``.
    """
    geo = check_avg_pool2d_backward(
        te_shape("grad_output", grad_output), str(grad_output.dtype), te_shape("self", self),
        str(self.dtype), kernel_size, stride, padding, ceil_mode, count_include_pad,
        divisor_override, cube_math_type)
    return _compute(grad_output, geo)


def avg_pool2d_backward_5hd(grad_output, self, kernel_size, stride, padding, ceil_mode,
                            count_include_pad, divisor_override, cube_math_type=0):
    """:func:`avg_pool2d_backward` on the cube layout NC1HWC0.

    ``grad_output`` is ``(N, C1, Ho, Wo, 16)`` and ``self`` / the result ``(N, C1, H, W, 16)``;
    the other parameters and the math are those of :func:`avg_pool2d_backward`, applied to each
    of the ``C1 * 16`` channel lanes.
    """
    geo = check_avg_pool2d_backward(
        te_shape("grad_output", grad_output), str(grad_output.dtype), te_shape("self", self),
        str(self.dtype), kernel_size, stride, padding, ceil_mode, count_include_pad,
        divisor_override, cube_math_type, layout=FORMAT_5HD)
    return _compute(grad_output, geo)
