"""Shared checks of the vector DSL: operand tensors, dtypes, scalars, and the tagged compute.

Every check runs on plain Python values and raises :class:`dsl.errors.DslError` before TVM
compiles anything, as TBE's ``tbe.dsl`` checks its operands when the graph is built.
"""

from __future__ import annotations

import math
import numbers

from dsl.errors import E_DTYPE, E_DTYPE_MISMATCH, E_SHAPE, E_TYPE, E_VALUE, fail, te_shape
from dsl.ops import tag

FLOATS = ("float16", "float32")
ARITH = ("float16", "float32", "int32")  # what TBE's vector unit computes on
ALL = ("float16", "float32", "int32", "int8", "uint8")
# Representable integer range of each integer dtype (scalar checks and saturating casts).
INT_RANGE = {"int32": (-2**31, 2**31 - 1), "int8": (-128, 127), "uint8": (0, 255)}
FLOAT_MAX = {"float16": 65504.0, "float32": 3.4028234663852886e38}  # largest finite values


def dtype_of(x) -> str:
    """The dtype of a tensor, tensor element or scalar expression as a plain string (TVM 0.27
    gives a ``PrimType``, which compares equal to its string but hashes differently)."""
    d = getattr(x, "dtype", None)
    return str(d if d is not None else x.ty)


def operand(param: str, t: object, allowed=ALL) -> tuple[int, ...]:
    """The static shape of tensor operand ``param``, checking it is a TE tensor of a dtype in
    ``allowed`` with positive dimensions."""
    dims = te_shape(param, t)
    if not dims or any(d <= 0 for d in dims):
        raise fail(E_SHAPE, f"{param}.shape", list(dims),
                   "must have rank >= 1 and positive dimensions")
    if dtype_of(t) not in allowed:
        raise fail(E_DTYPE, f"{param}.dtype", dtype_of(t),
                   f"must be one of {', '.join(allowed)}; cast_to() it first")
    return dims


def same_operands(lhs, rhs, allowed=ARITH, names=("lhs", "rhs")) -> tuple[int, ...]:
    """Two tensor operands of one elementwise op: equal dtypes (E65002) and equal shapes.

    TBE's binary ops never promote nor broadcast implicitly: a mixed pair is a bug the caller
    fixes with :func:`cast_to` / :func:`broadcast`, and the message names both operands.
    """
    a, b = names
    sa, sb = operand(a, lhs, allowed), operand(b, rhs, allowed)
    if dtype_of(lhs) != dtype_of(rhs):
        raise fail(E_DTYPE_MISMATCH, f"{a}.dtype, {b}.dtype", (dtype_of(lhs), dtype_of(rhs)),
                   "must be equal; cast one with dsl.cast_to(tensor, dtype)")
    if sa != sb:
        raise fail(E_SHAPE, f"{a}.shape, {b}.shape", (list(sa), list(sb)),
                   "must be equal; expand the smaller with dsl.broadcast(t, shape)")
    return sa


def is_scalar(value: object) -> bool:
    """A Python/numpy number or a TVM scalar expression (``tvm.const(...)``)."""
    import tvm

    if isinstance(value, bool):
        return False
    return isinstance(value, (numbers.Real, tvm.ir.expr.ExprWithOp))


def scalar(param: str, value: object, dtype: str):
    """``value`` as a TVM constant (or expression) of ``dtype``, as TBE casts a scalar operand
    to the tensor's dtype. An integer dtype refuses a fractional or out-of-range number."""
    import tvm

    dtype = str(dtype)
    if isinstance(value, bool) or not is_scalar(value):
        raise fail(E_TYPE, param, value,
                   "must be a number (int or float) or a tvm scalar expression")
    if isinstance(value, tvm.ir.expr.ExprWithOp):
        return value if dtype_of(value) == dtype else value.astype(dtype)
    value = float(value) if isinstance(value, numbers.Real) and \
        not isinstance(value, numbers.Integral) else int(value)
    if dtype in INT_RANGE:
        lo, hi = INT_RANGE[dtype]
        if isinstance(value, float) and not value.is_integer():
            raise fail(E_VALUE, param, value, f"must be a whole number for a {dtype} tensor")
        if not lo <= value <= hi:
            raise fail(E_VALUE, param, value, f"must lie in [{lo}, {hi}] for a {dtype} tensor")
        value = int(value)
    elif dtype in FLOAT_MAX and math.isfinite(value) and abs(value) > FLOAT_MAX[dtype]:
        raise fail(E_VALUE, param, value,
                   f"exceeds {dtype}'s largest finite value {FLOAT_MAX[dtype]:g}; cast the "
                   "tensor to a wider dtype first (inf and nan are accepted as such)")
    return tvm.tirx.const(value, dtype)


def check_choice(param: str, value: object, allowed) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise fail(E_VALUE, param, value, f"must be one of {', '.join(map(repr, allowed))}")
    return value


def check_impl_mode(impl_mode: object) -> str:
    """TBE's ``impl_mode``: accepted for porting; both modes compute the fp32-accurate result
    (a CPU has no faster low-precision path worth a separate kernel)."""
    return check_choice("impl_mode", impl_mode, ("high_performance", "high_precision"))


def compute(shape, fcompute, op: str, pattern: str = tag.ELEMWISE):
    """The stage of vector op ``op``: named ``op``, tagged ``"<pattern>.<op>"`` (or just
    ``pattern`` when the op is named after it, as ``broadcast``)."""
    from tvm import te

    full = pattern if op == pattern else tag.stage(pattern, op)
    return te.compute(tuple(shape), fcompute, name=op, tag=full)
