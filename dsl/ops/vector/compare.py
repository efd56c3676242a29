"""TBE's comparison and selection: ``vcmp``, ``vsel``, ``vcmpsel``.

``vcmp`` yields a ``bool`` tensor (``mode='bool'``) or, as the vector unit's compare mask, a
``uint8`` bit mask (``mode='bit'``: byte ``j`` of a row holds elements ``8j .. 8j+7``, element
``8j+k`` in bit ``k``). ``vsel`` accepts either as its condition.
"""

from __future__ import annotations

from dsl.errors import E_DTYPE, E_DTYPE_MISMATCH, E_SHAPE, fail
from dsl.ops import tag
from dsl.ops.vector._common import (
    ARITH,
    FLOATS,
    check_choice,
    compute,
    dtype_of,
    is_scalar,
    operand,
    same_operands,
    scalar,
)

OPERATIONS = ("eq", "ne", "lt", "gt", "le", "ge")


def _cmp(operation: str, a, b):
    import tvm

    ops = {"eq": tvm.tirx.EQ, "ne": tvm.tirx.NE, "lt": tvm.tirx.LT, "gt": tvm.tirx.GT,
           "le": tvm.tirx.LE, "ge": tvm.tirx.GE}
    return ops[operation](a, b)


def _operand_or_scalar(param: str, value, dtype: str, shape):
    """An accessor ``f(*i)`` for a tensor operand of ``shape``/``dtype`` or a scalar."""
    from tvm import te

    if isinstance(value, te.Tensor):
        s = operand(param, value, (dtype,) if dtype else ARITH)
        if s != tuple(shape):
            raise fail(E_SHAPE, f"{param}.shape", list(s), f"must equal {list(shape)}")
        return lambda *i: value(*i)
    c = scalar(param, value, dtype)
    return lambda *i: c


def vcmp(lhs, rhs, operation="lt", mode="bool"):
    """``res = lhs <operation> rhs`` elementwise.

    Parameters
    ----------
    lhs : te.Tensor, float16 / float32 / int32, any shape ``S``
    rhs : te.Tensor of ``lhs``'s shape and dtype, or a scalar (cast to ``lhs.dtype``)
    operation : {'eq', 'ne', 'lt', 'gt', 'le', 'ge'}
    mode : {'bool', 'bit'}
        ``'bool'``: a bool tensor of shape ``S``. ``'bit'``: a uint8 mask of shape
        ``S[:-1] + (S[-1] // 8,)``; ``S[-1]`` must be a multiple of 8.
    """
    check_choice("operation", operation, OPERATIONS)
    check_choice("mode", mode, ("bool", "bit"))
    if is_scalar(rhs):
        shape = operand("lhs", lhs, ARITH)
        c = scalar("rhs", rhs, dtype_of(lhs))
        pred = lambda *i: _cmp(operation, lhs(*i), c)  # noqa: E731
    else:
        shape = same_operands(lhs, rhs, ARITH)
        pred = lambda *i: _cmp(operation, lhs(*i), rhs(*i))  # noqa: E731
    if mode == "bool":
        return compute(shape, pred, "vcmp")
    return _pack_bits(shape, pred)


def _pack_bits(shape, pred):
    import tvm

    if shape[-1] % 8:
        raise fail(E_SHAPE, "lhs.shape", list(shape),
                   "must have a last dimension divisible by 8 for mode='bit'")

    def body(*i):
        head, j = i[:-1], i[-1]
        bits = [tvm.tirx.Select(pred(*head, j * 8 + k), tvm.tirx.const(1 << k, "uint8"),
                                tvm.tirx.const(0, "uint8")) for k in range(8)]
        out = bits[0]
        for b in bits[1:]:
            out = out | b
        return out

    return compute((*shape[:-1], shape[-1] // 8), body, "vcmp_bit", tag.INJECTIVE)


def _condition(condition):
    """The output shape and a predicate ``f(*i) -> bool`` of a bool or bit-mask condition."""
    import tvm

    shape = operand("condition", condition, ("bool", "uint8"))
    if dtype_of(condition) == "bool":
        # compare the loaded bool with false rather than use it bare: TVM 0.27's lowering
        # (InsertHoistIfThenElse) rejects a vectorised Select whose condition is a load from
        # a bool buffer inside a parallel loop
        zero = tvm.tirx.const(0, "int8")
        return shape, lambda *i: tvm.tirx.NE(condition(*i).astype("int8"), zero)
    out = (*shape[:-1], shape[-1] * 8)

    def bit(*i):
        byte = condition(*i[:-1], i[-1] // 8)
        k = (i[-1] % 8).astype("uint8")
        return tvm.tirx.NE(byte >> k & tvm.tirx.const(1, "uint8"), tvm.tirx.const(0, "uint8"))

    return out, bit


def _branch_dtype(lhs, rhs, allowed):
    """The result dtype: the tensor branches' (equal) dtype, float16 when both are scalars."""
    from tvm import te

    tensors = [(n, t) for n, t in (("lhs", lhs), ("rhs", rhs)) if isinstance(t, te.Tensor)]
    dtypes = {dtype_of(t) for _, t in tensors}
    if len(dtypes) > 1:
        raise fail(E_DTYPE_MISMATCH, "lhs.dtype, rhs.dtype", (dtype_of(lhs), dtype_of(rhs)),
                   "must be equal; cast one with dsl.cast_to(tensor, dtype)")
    dtype = dtypes.pop() if dtypes else "float16"
    if dtype not in allowed:
        raise fail(E_DTYPE, f"{tensors[0][0]}.dtype", dtype, f"must be one of {allowed}")
    return dtype


def vsel(condition, lhs, rhs):
    """``res = condition ? lhs : rhs`` elementwise.

    Parameters
    ----------
    condition : te.Tensor
        bool of the result's shape ``S`` (from ``vcmp(..., mode='bool')``), or a uint8 bit mask
        of shape ``S[:-1] + (S[-1] // 8,)`` (from ``mode='bit'``).
    lhs, rhs : te.Tensor of shape ``S`` or scalar
        Tensors share one dtype (float16 / float32 / int32); a scalar is cast to it; with two
        scalars the result is float16, as in TBE.
    """
    shape, cond = _condition(condition)
    dtype = _branch_dtype(lhs, rhs, ARITH)
    a = _operand_or_scalar("lhs", lhs, dtype, shape)
    b = _operand_or_scalar("rhs", rhs, dtype, shape)
    import tvm

    return compute(shape, lambda *i: tvm.tirx.Select(cond(*i), a(*i), b(*i)), "vsel")


def vcmpsel(lhs, rhs=None, operation="lt", slhs=None, srhs=None):
    """``res = (lhs <operation> rhs) ? slhs : srhs`` elementwise, in one stage.

    Defaults as TBE: ``rhs`` None compares with 2.0; ``slhs`` None selects ``lhs``; ``srhs``
    None selects ``rhs`` when it is a tensor, else 0.0. Tensors share ``lhs``'s shape and
    dtype (float16 / float32); scalars are cast to that dtype.
    """
    import tvm
    from tvm import te

    check_choice("operation", operation, OPERATIONS)
    shape = operand("lhs", lhs, FLOATS)
    dtype = dtype_of(lhs)
    rhs = 2.0 if rhs is None else rhs
    slhs = lhs if slhs is None else slhs
    if srhs is None:
        srhs = rhs if not is_scalar(rhs) else 0.0
    parts = []
    for name, v in (("rhs", rhs), ("slhs", slhs), ("srhs", srhs)):
        if isinstance(v, te.Tensor) and dtype_of(v) != dtype:
            raise fail(E_DTYPE_MISMATCH, f"lhs.dtype, {name}.dtype", (dtype, dtype_of(v)),
                       "must be equal; cast one with dsl.cast_to(tensor, dtype)")
        parts.append(_operand_or_scalar(name, v, dtype, shape))
    r, a, b = parts
    return compute(shape, lambda *i: tvm.tirx.Select(_cmp(operation, lhs(*i), r(*i)),
                                                     a(*i), b(*i)), "vcmpsel")
