"""A lowering pass: a vector load whose lanes read a few short contiguous windows becomes
those window loads and one shuffle.

A strided depthwise convolution kept in its NC* layout vectorises along a row whose lanes do
not read consecutive elements: its grad_weight reads x at ``o * 2 + k`` (a stride-2 ramp),
its grad_input reads dy at ``(i + pad) // 2 - j`` (each element twice) and the taps' weights
at ``(i + pad) % 2 + 2 j`` (two values, alternating). Lowered, each is a gather, which LLVM
builds from one scalar load and insert per lane (some 18 shuffle micro-ops a 16-lane
vector). Every lane of such a load is a constant offset from lane 0's element, and the
offsets span a few vectors at most, so the same lanes come from whole loads of the windows
that hold them and one ``Shuffle`` (``vpermt2ps``, ``vpermps`` on AVX-512)::

    x[Ramp(b, 2, 16)]       ->  shuffle(x[b : b + 16], x[b + 15 : b + 31], [0, 2, .., 30])
    y[b + Ramp(0, 1, 16) // 2]  ->  shuffle(y[b : b + 8], [0, 0, 1, 1, .., 7, 7])

The windows cover only offsets some lane reads (the last one ends at the highest), so the
rewrite reads no element the gather did not. It applies only inside loops a schedule marks
with :data:`KEY` (``sch.annotate(loop, KEY, 1)``), where it was measured; every other kernel
is left as TVM lowers it, and the mark itself is removed.
"""

from __future__ import annotations

KEY = "pragma_dsl_lane_shuffle"
MAX_WINDOWS = 4  # window loads per gather, at most (more: the shuffles cost what they save)


def _lanes(expr) -> int:
    return int(expr.ty.dtype.lanes)


def _lane(expr, lane: int, defs: dict):
    """Lane ``lane`` of the vector index ``expr`` as a scalar expression (vector variables
    bound in ``defs``, name -> (var, value), looked through: TVM's common-subexpression pass
    binds parts of an index); None where the expression is of a kind this pass does not take
    apart."""
    from tvm import tirx

    if _lanes(expr) == 1:
        return expr
    if isinstance(expr, tirx.Var):
        var, value = defs.get(expr.name, (None, None))
        return _lane(value, lane, defs) if var is not None and var.same_as(expr) else None
    if isinstance(expr, tirx.Ramp):
        return expr.base + expr.stride * lane
    if isinstance(expr, tirx.Broadcast):
        return expr.value
    ops = (tirx.Add, tirx.Sub, tirx.Mul, tirx.FloorDiv, tirx.FloorMod, tirx.Min, tirx.Max)
    if isinstance(expr, ops):
        a, b = _lane(expr.a, lane, defs), _lane(expr.b, lane, defs)
        return None if a is None or b is None else type(expr)(a, b)
    return None


def _offsets(index, analyzer, defs: dict) -> tuple | None:
    """``(base, offsets)``: lane 0's element and every lane's constant offset from it."""
    from tvm import tirx

    base = _lane(index, 0, defs)
    if base is None:
        return None
    base = analyzer.simplify(base)
    offsets = []
    for lane in range(_lanes(index)):
        e = _lane(index, lane, defs)
        d = None if e is None else analyzer.simplify(e - base)
        if not isinstance(d, tirx.IntImm):
            return None
        offsets.append(int(d.value))
    return base, offsets


def windows(offsets: list[int]) -> tuple[int, list[int]] | None:
    """``(width, starts)``: windows of ``width`` consecutive offsets (a vector's lanes, or
    the largest power of two inside a shorter span) that together hold every offset, each inside
    ``[min, max]``; None when the lanes are consecutive already, or need more than
    :data:`MAX_WINDOWS` windows."""
    lo, hi, n = min(offsets), max(offsets), len(offsets)
    if offsets == list(range(offsets[0], offsets[0] + n)):
        return None
    # whole power-of-two vectors (a 9-lane window would be legalised as 8 + 1)
    width = min(n, 1 << ((hi - lo + 1).bit_length() - 1))
    if width < 2:
        return None
    starts: list[int] = []
    for off in sorted(set(offsets)):
        if starts and off < starts[-1] + width:
            continue
        starts.append(min(off, hi - width + 1))
        if len(starts) > MAX_WINDOWS:
            return None
    return width, starts


def _as_shuffle(load, analyzer, defs: dict):
    """``load`` (a gather) as window loads and one shuffle; None where it is no such gather."""
    from tvm.tirx import BufferLoad, IntImm, Ramp, Shuffle

    if len(load.indices) != 1 or _lanes(load.indices[0]) == 1 or \
            getattr(load, "predicate", None) is not None:
        return None
    found = _offsets(load.indices[0], analyzer, defs)
    if found is None:
        return None
    base, offsets = found
    plan = windows(offsets)
    if plan is None:
        return None
    width, starts = plan
    itype = str(base.ty.dtype)
    rows = [BufferLoad(load.source, [Ramp(base + IntImm(itype, s), IntImm(itype, 1), width)])
            for s in starts]
    picks = []
    for off in offsets:
        w = next(k for k, s in enumerate(starts) if s <= off < s + width)
        picks.append(IntImm("int32", w * width + off - starts[w]))
    # a shuffle picks no more lanes than its vectors hold: a short window repeats
    rows += [rows[0]] * (-(-len(offsets) // width) - len(rows))
    return Shuffle(rows, picks)


def rewrite(func):
    """``func`` with the gathers inside loops marked :data:`KEY` as window loads and shuffles,
    and the marks removed."""
    import tvm_ffi
    from tvm.ir.expr import TensorLoad
    from tvm.sym import Analyzer
    from tvm.tirx import AttrStmt, Bind

    analyzer = Analyzer()

    def on_attr(attr):
        if attr.attr_key != KEY:
            return attr
        defs = {}

        def on_bind(bind):
            if _lanes(bind.var) > 1:
                defs[bind.var.name] = (bind.var, bind.value)
            return bind

        def on_load(load):
            shuffled = _as_shuffle(load, analyzer, defs)
            return load if shuffled is None else shuffled

        tvm_ffi.structural_map(attr.body, [(Bind, on_bind)], order="pre")
        return tvm_ffi.structural_map(attr.body, [(TensorLoad, on_load)], order="post")

    body = tvm_ffi.structural_map(func.body, [(AttrStmt, on_attr)], order="post")
    return func if body.same_as(func.body) else func.with_body(body)


def lane_shuffle_pass():
    """:func:`rewrite` as a TIR function pass."""
    from tvm.tirx.transform import prim_func_pass

    return prim_func_pass(lambda f, _mod, _ctx: rewrite(f), opt_level=0,
                          name="dsl.LaneGathersToShuffles")
