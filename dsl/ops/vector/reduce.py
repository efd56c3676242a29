"""TBE's reductions ``reduce_sum``, ``reduce_max``, ``reduce_min`` over one or more axes.

The reduction stage is tagged ``"reduce.<op>"``. An fp16 sum accumulates in fp32 and is
rounded to fp16 once, by a second (elementwise) stage: summing thousands of fp16 values in fp16
would lose the low digits of every term.
"""

from __future__ import annotations

import numbers

from dsl.errors import E_TYPE, E_VALUE, fail
from dsl.ops import tag
from dsl.ops.vector._common import ARITH, compute, dtype_of, operand


def _axes(axis, rank: int) -> tuple[int, ...]:
    """Sorted non-negative axes from an int, a list/tuple of ints, or None (every axis)."""
    if axis is None:
        return tuple(range(rank))
    items = [axis] if isinstance(axis, numbers.Integral) and not isinstance(axis, bool) \
        else axis
    if not isinstance(items, (list, tuple)) or not items or any(
            isinstance(a, bool) or not isinstance(a, numbers.Integral) for a in items):
        raise fail(E_TYPE, "axis", axis, "must be an int or a non-empty list/tuple of ints")
    out = []
    for a in items:
        if not -rank <= int(a) < rank:
            raise fail(E_VALUE, "axis", axis, f"each axis must lie in [{-rank}, {rank - 1}]")
        out.append(int(a) % rank)
    if len(set(out)) != len(out):
        raise fail(E_VALUE, "axis", axis, "must not name an axis twice")
    return tuple(sorted(out))


def _reduce(op: str, raw_tensor, axis, keepdims, combine, acc_dtype=None):
    from tvm import te

    if not isinstance(keepdims, bool):
        raise fail(E_TYPE, "keepdims", keepdims, "must be True or False")
    shape = operand("raw_tensor", raw_tensor, ARITH)
    axes = _axes(axis, len(shape))
    kept = [d for k, d in enumerate(shape) if k not in axes]
    out_shape = [1 if k in axes else d for k, d in enumerate(shape)] if keepdims else kept
    out_shape = out_shape or [1]  # TBE reduces every axis to shape (1,)
    rvars = [te.reduce_axis((0, shape[k]), name=f"r{k}") for k in axes]
    acc = acc_dtype or dtype_of(raw_tensor)

    def body(*i):
        spatial = list(i) if keepdims else list(i)[: len(kept)]
        it_s, it_r, idx = iter(spatial), iter(rvars), []
        for k in range(len(shape)):
            if k in axes:
                idx.append(next(it_r))
                if keepdims:
                    next(it_s)
            else:
                idx.append(next(it_s))
        return combine(raw_tensor(*idx).astype(acc), axis=rvars)

    red = compute(out_shape, body, op, tag.REDUCE)
    if acc == dtype_of(raw_tensor):
        return red
    return compute(out_shape, lambda *i: red(*i).astype(dtype_of(raw_tensor)), f"{op}_cast")


def reduce_sum(raw_tensor, axis, keepdims=False):
    """``res = sum of x over axis`` (float16 accumulated in fp32; float32; int32).

    Parameters
    ----------
    raw_tensor : te.Tensor of shape ``S``
    axis : int, list/tuple of ints, or None
        Axes to reduce; negative counts from the end; None reduces every axis.
    keepdims : bool
        Keep each reduced axis as size 1 (rank kept); else drop it (a full reduction gives
        shape ``(1,)``, as TBE).
    """
    from tvm import te

    acc = "float32" if str(getattr(raw_tensor, "dtype", "")) == "float16" else None
    return _reduce("reduce_sum", raw_tensor, axis, keepdims, te.sum, acc)


def reduce_max(raw_tensor, axis, keepdims=False, priority_flag=False):
    """``res = max of x over axis`` (axes and shape as :func:`reduce_sum`). ``priority_flag``
    (TBE's precision-vs-speed switch) is accepted; the result is exact either way."""
    from tvm import te

    if not isinstance(priority_flag, bool):
        raise fail(E_TYPE, "priority_flag", priority_flag, "must be True or False")
    return _reduce("reduce_max", raw_tensor, axis, keepdims, te.max)


def reduce_min(raw_tensor, axis, keepdims=False, priority_flag=False):
    """``res = min of x over axis`` (axes and shape as :func:`reduce_sum`)."""
    from tvm import te

    if not isinstance(priority_flag, bool):
        raise fail(E_TYPE, "priority_flag", priority_flag, "must be True or False")
    return _reduce("reduce_min", raw_tensor, axis, keepdims, te.min)
