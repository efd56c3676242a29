"""TBE's ``broadcast``: a scalar or a tensor expanded to a larger shape (numpy's rules)."""

from __future__ import annotations

from dsl.errors import E_DTYPE, E_SHAPE, fail
from dsl.ops import tag
from dsl.ops.vector._common import ALL, check_choice, compute, dtype_of, is_scalar, operand, scalar


def broadcast(var, shape, output_dtype=None):
    """``res[i] = var[i']`` with ``i'`` the index ``i`` clamped to 0 on every size-1 axis.

    Parameters
    ----------
    var : te.Tensor or scalar
        A tensor of rank <= ``len(shape)``, its shape right-aligned with ``shape`` (a leading
        axis it lacks counts as size 1); each of its dimensions equals ``shape``'s or is 1. A
        scalar fills the whole result.
    shape : list or tuple of positive ints
    output_dtype : str, optional
        The scalar's dtype (default float16, as TBE); for a tensor it must be None or the
        tensor's own dtype (broadcast never converts: use cast_to).
    """
    from tvm import te

    from dsl.errors import check_shape

    out = check_shape("shape", shape, range(1, 9))
    if not isinstance(var, te.Tensor) and is_scalar(var):
        dtype = check_choice("output_dtype", output_dtype or "float16", ALL)
        c = scalar("var", var, dtype)
        return compute(out, lambda *i: c, "broadcast", tag.BROADCAST)
    src = operand("var", var, ALL)
    if output_dtype is not None and output_dtype != dtype_of(var):
        raise fail(E_DTYPE, "output_dtype", output_dtype,
                   f"must be None or var's dtype {dtype_of(var)} for a tensor; cast_to() it "
                   "first")
    if len(src) > len(out) or any(s not in (1, o) for s, o in zip(src[::-1], out[::-1])):
        raise fail(E_SHAPE, "var.shape, shape", (list(src), list(out)),
                   "must broadcast: var's dimensions, right-aligned, each equal shape's or 1")
    lead = len(out) - len(src)

    def body(*i):
        return var(*[0 if s == 1 else i[lead + k] for k, s in enumerate(src)])

    return compute(out, body, "broadcast", tag.BROADCAST)
