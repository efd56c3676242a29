"""Exact fallbacks of the operators' fast reductions, for non-finite inputs.

The fast reductions multiply zeros in where the math has no product at all: the zero
padding of a packed operand (a dx tap that falls off dy, a dw tap in x's padding) and the
zero taps of a kernel padded to whole stride phases. ``0 * x`` is 0 for every finite ``x``,
so this is exact unless the other factor is NaN or infinite (``0 * inf`` is NaN).

So each such reduction gets an *exact twin*, the same sum with those terms tested out, and
the kernel a *flag*, whether any element of the tensors that meet the zeros is non-finite.
Both are side stages (:func:`dsl.ops.tag.with_side_stages`); after scheduling,
:mod:`dsl.runtime.run_if` runs the twins only when the flag is set and makes the readers of
the fast reduction take the twin's values then.

Stages (tags ``<op>.nonfinite`` and ``<op>.exact``)
----------------------------------------------------
``<name>_lanes<i>``  ``[*P, L]`` uint32: the largest exponent field (the float32 bits masked
    by :data:`EXPONENT`) of input ``i`` viewed as ``[*P, M, L]`` (``P`` its leading axes, as
    few as make :data:`MIN_ROWS` rows, never its last; ``L`` a divisor of its last axis up to
    16); :data:`EXPONENT` itself where some element is NaN or infinite, the one kind of float
    whose exponent bits are all ones.
``<name>``           ``[1]`` int8: 1 where some ``_lanes`` stage holds :data:`EXPONENT`.

The partials are integer maxima of masked bits, not tests of ``isfinite``: TVM's vectoriser
leaves a select on ``isfinite`` scalar, and LLVM then vectorised the scan across rows with a
gather per 16 floats (15 GB/s on 2 Zen 5 cores against 108 GB/s for the masked maximum: about
a tenth of a 1-D dw's time was this scan).

The rows ``P`` are what the schedules share out across cores: with the first axis alone, a
batch-1 layer's scan of dy was one row, a pass over all of dy on one core while the others
waited (the RGB stem's dw, 3.2 MB of dy, 1.055x on two cores with the rows shared out; a
serial pass costs more the more cores wait on it).
"""

from __future__ import annotations

import math

from dsl.ops import tag

MAX_LANES = 16
# Rows of a partial at least, while leading axes remain and each row keeps MIN_ROW_ELEMS
# elements: enough to share out over many cores in near-equal parts, each row still a run of
# whole lines long enough to stream (not a partial as large as the tensor).
MIN_ROWS = 128
MIN_ROW_ELEMS = 512
EXPONENT = 0x7F800000  # the exponent field of a float32


def nonfinite_flag(op: str, name: str, tensors) -> object:
    """The flag stage ``[1]`` int8 of ``tensors`` (1 when some element is NaN or inf): one
    partial stage per tensor, each folded into the flag by a small reduction (module
    docstring); the last is named ``name``."""
    import tvm
    from tvm import te

    def fold(part, prev, axes):
        def body(_):
            v = te.if_then_else(part[tuple(axes)] == tvm.tirx.const(EXPONENT, "uint32"),
                                tvm.tirx.const(1, "int8"),
                                tvm.tirx.const(0, "int8"))
            return te.max(v if prev is None else tvm.tirx.max(v, prev[0]), axis=axes)
        return body

    flag = None
    for i, t in enumerate(tensors):
        part = _partial(op, f"{name}_lanes{i}", t)
        *rows, lanes = (int(d) for d in part.shape)
        axes = [te.reduce_axis((0, e), name=f"fp{i}_{k}") for k, e in enumerate(rows)]
        axes.append(te.reduce_axis((0, lanes), name=f"fl{i}"))
        last = i == len(tensors) - 1
        flag = te.compute((1,), fold(part, flag, axes), name=name if last else f"{name}_{i}",
                          tag=tag.stage(op, "nonfinite"))
    return flag


def row_axes(shape: list[int]) -> int:
    """How many leading axes of ``shape`` a partial keeps as rows: the first, then the next
    ones while the rows are fewer than :data:`MIN_ROWS` and each would still hold
    :data:`MIN_ROW_ELEMS` elements; never the last axis (0 for a 1-D tensor: one row)."""
    if len(shape) < 2:
        return 0
    total = math.prod(shape)
    k, rows = 1, shape[0]
    while (rows < MIN_ROWS and k < len(shape) - 1
           and total // (rows * shape[k]) >= MIN_ROW_ELEMS):
        rows *= shape[k]
        k += 1
    return k


def _partial(op: str, name: str, t):
    """``[*P, L]`` uint32 partial exponent maxima of ``t`` (module docstring)."""
    import tvm
    from tvm import te

    shape = [int(d) for d in t.shape]
    last = shape[-1]
    lanes = max(d for d in range(1, min(last, MAX_LANES) + 1) if last % d == 0)
    k = row_axes(shape)
    rows = shape[:k] or [1]
    mid = shape[k:-1] if len(shape) > 1 else []
    red = [te.reduce_axis((0, e), name=f"{name}_m{i}") for i, e in enumerate(mid)]
    rj = te.reduce_axis((0, last // lanes), name=f"{name}_j")

    def body(*ix):
        *pp, ln = ix
        idx = [*(pp if k else []), *red, rj * lanes + ln]
        # uint32, not int32: an int64-indexed kernel holds no int32 at all (its tests tell
        # a 32-bit index from these bits by that)
        bits = tvm.tirx.reinterpret("uint32", t[tuple(idx)].astype("float32"))
        return te.max(bits & tvm.tirx.const(EXPONENT, "uint32"), axis=[*red, rj])

    return te.compute((*rows, lanes), body, name=name, tag=tag.stage(op, "nonfinite"))


def twin_attrs(flag) -> dict:
    """The attributes of an exact twin that runs only when ``flag`` is set."""
    return {tag.RUN_IF: flag.op.name}


def fast_attrs(twin) -> dict:
    """The attributes of a fast reduction whose values ``twin`` replaces when it ran (none
    when ``twin`` is None: the reduction has no twin)."""
    return {tag.EXACT_TWIN: twin.op.name} if twin is not None else {}
