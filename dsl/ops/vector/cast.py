"""TBE's conversions: ``cast_to`` and the rounding casts ``round``, ``floor``, ``ceil``,
``trunc`` (float -> int32 by default, as TBE's ``vconv`` rounding modes).

Float -> integer conversions truncate toward zero (``cast_to``) or round as named, then
*saturate* to the target's range (the vector unit's conversions saturate; a plain C cast of an
out-of-range float is undefined). Integer narrowing (int32 -> int8 / uint8) saturates too.
"""

from __future__ import annotations

from dsl.errors import E_TYPE, fail
from dsl.ops.vector._common import ALL, FLOATS, INT_RANGE, check_choice, compute, dtype_of, operand

CAST_SOURCES = (*ALL, "bool")
# The largest float32 below 2**31 (fp32 has 24 mantissa bits): clamping there keeps the
# float -> int32 conversion defined for every input.
_F32_INT32_MAX = 2147483520.0


def _saturate_float(x, dtype: str):
    """Clamp float ``x`` into ``dtype``'s integer range (fp16 cannot exceed int32's)."""
    from tvm import te

    lo, hi = INT_RANGE[dtype]
    src = dtype_of(x)
    if dtype == "int32":
        if src == "float16":
            return x
        hi = _F32_INT32_MAX
    return te.min(te.max(x, te.const(lo, src)), te.const(hi, src))


def _convert(x, dst: str):
    """``x`` (an element expression) converted to ``dst`` with TBE's cast rules."""
    import tvm
    from tvm import te

    src = dtype_of(x)
    if src == dst:
        return x
    if src == "bool":
        return tvm.tirx.Select(x, te.const(1, dst), te.const(0, dst))
    if src in FLOATS and dst in INT_RANGE:
        return _saturate_float(te.trunc(x), dst).astype(dst)
    if src in INT_RANGE and dst in INT_RANGE and dst != "int32":
        lo, hi = INT_RANGE[dst]
        wide = x.astype("int32")
        return te.min(te.max(wide, te.const(lo, "int32")), te.const(hi, "int32")).astype(dst)
    return x.astype(dst)  # float <-> float, int -> float, int8/uint8 -> int32: exact or IEEE


def cast_to(data, dtype, f1628IntegerFlag=True):  # noqa: N803 - TBE's parameter name
    """``res = data`` converted to ``dtype``.

    Parameters
    ----------
    data : te.Tensor, any shape; float16, float32, int32, int8, uint8 or bool
    dtype : {'float16', 'float32', 'int32', 'int8', 'uint8'}
    f1628IntegerFlag : bool
        TBE's promise that float data converted to int8/uint8 is already integral. Results are
        the same either way here: fractions are truncated toward zero, then saturated.

    Returns
    -------
    te.Tensor of ``data``'s shape and ``dtype``. fp16 <-> fp32 round to nearest even; float ->
    integer truncates toward zero and saturates; integer narrowing saturates; bool -> 0 / 1.
    """
    if not isinstance(f1628IntegerFlag, bool):
        raise fail(E_TYPE, "f1628IntegerFlag", f1628IntegerFlag, "must be True or False")
    shape = operand("data", data, CAST_SOURCES)
    check_choice("dtype", dtype, ALL)
    return compute(shape, lambda *i: _convert(data(*i), dtype), "cast_to")


def _rounding(op: str, raw_tensor, dtype, fn):
    shape = operand("raw_tensor", raw_tensor, FLOATS)
    dtype = check_choice("dtype", "int32" if dtype is None else dtype,
                         ("int32", "float16", "float32"))

    def body(*i):
        r = fn(raw_tensor(*i))
        if dtype == "int32":
            return _saturate_float(r, "int32").astype("int32")
        return r.astype(dtype)

    return compute(shape, body, op)


def round(raw_tensor, dtype=None):  # noqa: A001 - TBE's name
    """``res = x`` rounded to the nearest integer, halves to even (float16/float32 -> int32, or
    ``dtype`` 'float16' / 'float32' to keep a float result)."""
    from tvm import te

    return _rounding("round", raw_tensor, dtype, te.round)


def floor(raw_tensor, dtype=None):
    """``res = floor(x)`` (float16/float32 -> int32, or the float ``dtype`` given)."""
    from tvm import te

    return _rounding("floor", raw_tensor, dtype, te.floor)


def ceil(raw_tensor, dtype=None):
    """``res = ceil(x)`` (float16/float32 -> int32, or the float ``dtype`` given)."""
    from tvm import te

    return _rounding("ceil", raw_tensor, dtype, te.ceil)


def trunc(raw_tensor, dtype=None):
    """``res = trunc(x)``, rounded toward zero (float16/float32 -> int32, or a float dtype)."""
    from tvm import te

    return _rounding("trunc", raw_tensor, dtype, te.trunc)
