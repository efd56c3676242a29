"""TBE's elementwise math: binary (``vadd`` ...), unary (``vexp`` ...) and tensor-scalar
(``vadds`` ...) operations. Each returns one ``te.compute`` of the operand's shape and dtype,
tagged ``"elemwise.<op>"``.

fp16 transcendental and division results are computed in fp32 and rounded once to fp16 (TBE's
``high_precision`` path, and what its fp16 ``vlog``/``vsqrt`` document), so they are within one
fp16 rounding of the exact value.
"""

from __future__ import annotations

from dsl.ops.vector._common import (
    ARITH,
    FLOATS,
    check_impl_mode,
    compute,
    dtype_of,
    operand,
    same_operands,
)
from dsl.ops.vector._common import scalar as as_scalar


def _binary(op: str, lhs, rhs, fn, allowed=ARITH, widen: bool = False):
    shape = same_operands(lhs, rhs, allowed)
    dtype = dtype_of(lhs)

    def body(*i):
        a, b = lhs(*i), rhs(*i)
        if widen and dtype == "float16":
            return fn(a.astype("float32"), b.astype("float32")).astype(dtype)
        return fn(a, b)

    return compute(shape, body, op)


def vadd(lhs, rhs):
    """``res = lhs + rhs``; equal shapes and dtypes (float16, float32, int32)."""
    return _binary("vadd", lhs, rhs, lambda a, b: a + b)


def vsub(lhs, rhs):
    """``res = lhs - rhs``; equal shapes and dtypes (float16, float32, int32)."""
    return _binary("vsub", lhs, rhs, lambda a, b: a - b)


def vmul(lhs, rhs):
    """``res = lhs * rhs``; equal shapes and dtypes (float16, float32, int32)."""
    return _binary("vmul", lhs, rhs, lambda a, b: a * b)


def vdiv(lhs, rhs):
    """``res = lhs / rhs``; equal shapes and dtypes (float16, float32; fp16 divides in fp32)."""
    return _binary("vdiv", lhs, rhs, lambda a, b: a / b, FLOATS, widen=True)


def vmax(lhs, rhs):
    """``res = max(lhs, rhs)``; equal shapes and dtypes (float16, float32, int32)."""
    from tvm import te

    return _binary("vmax", lhs, rhs, te.max)


def vmin(lhs, rhs):
    """``res = min(lhs, rhs)``; equal shapes and dtypes (float16, float32, int32)."""
    from tvm import te

    return _binary("vmin", lhs, rhs, te.min)


def _unary(op: str, raw_tensor, fn, allowed=ARITH, widen: bool = False):
    shape = operand("raw_tensor", raw_tensor, allowed)
    dtype = dtype_of(raw_tensor)

    def body(*i):
        x = raw_tensor(*i)
        if widen and dtype == "float16":
            return fn(x.astype("float32")).astype(dtype)
        return fn(x)

    return compute(shape, body, op)


def vabs(raw_tensor):
    """``res = |x|`` (float16, float32, int32)."""
    from tvm import te

    return _unary("vabs", raw_tensor, te.abs)


def vexp(raw_tensor):
    """``res = e**x`` (float16, float32)."""
    from tvm import te

    return _unary("vexp", raw_tensor, te.exp, FLOATS, widen=True)


def vlog(raw_tensor, impl_mode="high_performance"):
    """``res = ln(x)`` (float16, float32); ``x <= 0`` gives -inf / nan as IEEE log does."""
    from tvm import te

    check_impl_mode(impl_mode)
    return _unary("vlog", raw_tensor, te.log, FLOATS, widen=True)


def vsqrt(raw_tensor, impl_mode="high_performance"):
    """``res = sqrt(x)`` (float16, float32)."""
    from tvm import te

    check_impl_mode(impl_mode)
    return _unary("vsqrt", raw_tensor, te.sqrt, FLOATS, widen=True)


def vrec(raw_tensor, impl_mode="high_performance"):
    """``res = 1 / x`` (float16, float32)."""
    check_impl_mode(impl_mode)
    return _unary("vrec", raw_tensor, lambda x: 1.0 / x, FLOATS, widen=True)


def vrelu(raw_tensor):
    """``res = max(x, 0)`` (float16, float32, int32)."""
    from tvm import te

    return _unary("vrelu", raw_tensor, lambda x: te.max(x, as_scalar("0", 0, dtype_of(x))))


def _tensor_scalar(op: str, raw_tensor, value, fn):
    shape = operand("raw_tensor", raw_tensor, ARITH)
    s = as_scalar("scalar", value, dtype_of(raw_tensor))  # cast to the tensor's dtype, as TBE does
    return compute(shape, lambda *i: fn(raw_tensor(*i), s), op)


def vadds(raw_tensor, scalar):
    """``res = x + scalar``, the scalar cast to ``x``'s dtype (float16, float32, int32)."""
    return _tensor_scalar("vadds", raw_tensor, scalar, lambda a, b: a + b)


def vmuls(raw_tensor, scalar):
    """``res = x * scalar``, the scalar cast to ``x``'s dtype (float16, float32, int32)."""
    return _tensor_scalar("vmuls", raw_tensor, scalar, lambda a, b: a * b)


def vmaxs(raw_tensor, scalar):
    """``res = max(x, scalar)``, the scalar cast to ``x``'s dtype."""
    from tvm import te

    return _tensor_scalar("vmaxs", raw_tensor, scalar, te.max)


def vmins(raw_tensor, scalar):
    """``res = min(x, scalar)``, the scalar cast to ``x``'s dtype."""
    from tvm import te

    return _tensor_scalar("vmins", raw_tensor, scalar, te.min)
