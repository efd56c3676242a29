"""A vectorisable ``exp``, ``tanh`` and ``log`` for float32 on LLVM targets.

LLVM lowers a vector ``llvm.exp`` to one scalar ``expf`` call per lane (no vector math
library is linked), which made a softmax spend most of its time in libm. This registers a
lowering of ``tirx.exp`` (float32) to straight-line arithmetic that LLVM vectorises:
Cody-Waite range reduction ``x = n ln2 + r`` (``ln2`` split in two so ``r`` is exact), the
Cephes degree-6 polynomial for ``e^r`` on ``|r| <= ln2 / 2`` (about 1 ulp), and ``2^n``
built in the exponent bits in two halves, so results down to the subnormal range and up to
``FLT_MAX`` are exact-rounded scalings. ``x > 88.72..`` gives ``inf``, ``x < -104`` gives 0,
NaN stays NaN. float16 is computed in float32 and rounded once; float64 keeps libm's exp.

``tanh`` likewise: TVM's LLVM rule computes ``(1 - e^-2x) / (1 + e^-2x)`` and its mirror,
two ``exp`` and two divisions a value, whose ``e^-2x`` turns subnormal for ``|x|`` past 44
(each multiply on a subnormal a microcode assist on Intel cores: a GEMM + bias + GELU whose
outputs reach +-30 spent more time in that epilogue than in its products on one Emerald
Rapids core), and which loses relative precision near 0. This one is Cephes' ``tanhf``:
``x (1 + x^2 P(x^2))`` below ``|x| = 0.625``, else ``1 - 2 / (e^2|x| + 1)`` with ``|x|`` clamped
to 10 (``tanh(10)`` rounds to 1), the sign copied back: one ``exp`` and one division, no
subnormal anywhere, within a few ulp.

``log`` likewise (one ``logf`` call a lane before): ``x = 2^e m`` read from the bits (a
subnormal scaled by ``2^23`` first), ``m`` brought into ``[sqrt(1/2), sqrt(2))``, and Cephes'
degree-8 polynomial for ``ln(1 + f)`` on ``f = m - 1`` plus ``e ln2`` in two parts: within 2
ulp over the whole float32 range; ``ln 0 = -inf``, a negative input gives NaN, ``+inf`` and
NaN come back as themselves.

The registration is process-wide (TVM looks intrinsic lowerings up per target kind); it is
made when the pattern rules are loaded, before any kernel of this package is scheduled.
"""

from __future__ import annotations

LOG2E = 1.44269504088896341
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4
POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
        1.6666665459e-1, 5.0000001201e-1)
EXP_MAX, EXP_MIN = 88.72283935546875, -104.0
LOG_SQRTHF = 0.707106781186547524
LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
            1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
            3.3333331174e-1)
TANH_SMALL, TANH_CLAMP = 0.625, 10.0
TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
             -3.33332819422e-1)


def _consts(lanes: int):
    """``(c, f32, i32)``: a constant maker broadcasting to ``lanes`` and the float32 / int32
    types of that width."""
    from tvm import tirx

    sfx = "" if lanes == 1 else f"x{lanes}"

    def c(v, dt="float32"):
        k = tirx.const(v, dt)
        return k if lanes == 1 else tirx.Broadcast(k, lanes)

    return c, f"float32{sfx}", f"int32{sfx}"


def _horner(coefs, x, c):
    """``coefs[0] x^(n-1) + ... + coefs[-1]``."""
    p = c(coefs[0])
    for coef in coefs[1:]:
        p = p * x + c(coef)
    return p


def _nan_through(x, out, c, i32):
    """``out``, but NaN where ``x`` is NaN (tested on the bits: TVM's LLVM code assumes no
    NaN in float compares)."""
    from tvm import tirx

    bits = tirx.bitwise_and(tirx.reinterpret(i32, x), c(0x7FFFFFFF, "int32"))
    return tirx.Select(bits > c(0x7F800000, "int32"), x, out)


def exp_f32(x, lanes: int = 1):
    """``e^x`` for a float32 expression (``lanes`` wide), as vectorisable TIR arithmetic."""
    from tvm import tirx

    c, f32, i32 = _consts(lanes)
    xc = tirx.max(tirx.min(x, c(EXP_MAX)), c(EXP_MIN))
    n = tirx.floor(xc * c(LOG2E) + c(0.5))
    r = xc - n * c(LN2_HI) - n * c(LN2_LO)
    y = _horner(POLY, r, c) * r * r + r + c(1.0)
    ni = tirx.Cast(i32, n)
    n1 = tirx.shift_right(ni, c(1, "int32"))
    n2 = ni - n1

    def pow2(k):
        return tirx.reinterpret(f32, tirx.shift_left(k + c(127, "int32"), c(23, "int32")))

    out = y * pow2(n1) * pow2(n2)
    return _nan_through(x, tirx.Select(x > c(EXP_MAX), c(float("inf")), out), c, i32)


def tanh_f32(x, lanes: int = 1):
    """``tanh(x)`` for a float32 expression (``lanes`` wide), as vectorisable TIR arithmetic
    (see the module docstring)."""
    from tvm import tirx

    c, _, i32 = _consts(lanes)
    ax = tirx.min(tirx.abs(x), c(TANH_CLAMP))
    big = c(1.0) - c(2.0) / (exp_f32(ax * c(2.0), lanes) + c(1.0))
    big = tirx.Select(x < c(0.0), c(0.0) - big, big)
    z = x * x
    small = x * (c(1.0) + z * _horner(TANH_POLY, z, c))  # -0 stays -0
    return _nan_through(x, tirx.Select(ax < c(TANH_SMALL), small, big), c, i32)


def log_f32(x, lanes: int = 1):
    """``ln x`` for a float32 expression (``lanes`` wide), as vectorisable TIR arithmetic
    (see the module docstring)."""
    from tvm import tirx

    c, f32, i32 = _consts(lanes)
    raw = tirx.reinterpret(i32, x)
    tiny = raw < c(0x00800000, "int32")  # subnormal (or zero, or negative: fixed below)
    xs = tirx.Select(tiny, x * c(float(1 << 23)), x)
    bits = tirx.reinterpret(i32, xs)
    e = tirx.shift_right(bits, c(23, "int32")) - c(126, "int32") - tirx.Select(
        tiny, c(23, "int32"), c(0, "int32"))
    # the mantissa in [0.5, 1), then in [sqrt(0.5), sqrt(2)) - 1 with e adjusted
    m = tirx.reinterpret(f32, tirx.bitwise_or(tirx.bitwise_and(bits, c(0x007FFFFF, "int32")),
                                              c(0x3F000000, "int32")))
    low = m < c(LOG_SQRTHF)
    m = tirx.Select(low, m + m, m) - c(1.0)
    ef = tirx.Cast(f32, e - tirx.Select(low, c(1, "int32"), c(0, "int32")))
    z = m * m
    y = m * z * _horner(LOG_POLY, m, c) + ef * c(LN2_LO) - c(0.5) * z
    out = m + y + ef * c(LN2_HI)
    mag = tirx.bitwise_and(raw, c(0x7FFFFFFF, "int32"))
    out = tirx.Select(raw < c(0, "int32"), c(float("nan")), out)  # x < 0 (and -0, next)
    out = tirx.Select(mag == c(0, "int32"), c(float("-inf")), out)
    out = tirx.Select(raw == c(0x7F800000, "int32"), x, out)  # +inf
    return tirx.Select(mag > c(0x7F800000, "int32"), x, out)  # NaN of either sign


def _lowering(f32_fn):
    """The intrinsic lowering of ``f32_fn`` (float32; float16 through float32, rounded once;
    other types left to TVM's own rule)."""
    def lower(op):
        from tvm import tirx

        x = op.args[0]
        dtype = str(op.ty.dtype)
        base, _, lanes = dtype.partition("x")
        n = int(lanes) if lanes else 1
        if base == "float32":
            return f32_fn(x, n)
        if base == "float16":  # computed in float32 (as LLVM would), rounded once
            f32 = "float32" if n == 1 else f"float32x{n}"
            return tirx.Cast(dtype, f32_fn(tirx.Cast(f32, x), n))
        return op  # unchanged: the target-independent rule (libm) lowers it

    return lower


def register() -> None:
    from tvm.tirx.op import register_intrin_lowering

    register_intrin_lowering("tirx.exp", target="llvm", f=_lowering(exp_f32), level=20)
    register_intrin_lowering("tirx.tanh", target="llvm", f=_lowering(tanh_f32), level=20)
    register_intrin_lowering("tirx.log", target="llvm", f=_lowering(log_f32), level=20)


register()
