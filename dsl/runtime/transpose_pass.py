"""A lowering pass: runs of strided vector gathers become row loads and register shuffles.

A transposing copy (a weight pack ``[co, ci, kh, kw] -> [co // 16, ci, kh, kw, co % 16]``,
an NCHW -> NHWC re-layout) is scheduled in blocks whose ``T`` steps along the source's rows
are unrolled and whose ``L`` lanes (along the destination's rows) are vectorised
(:func:`schedules.toolbox.transpose_blocks`). Lowered, such a block is ``T`` stores, each a
gather of ``L`` elements ``K`` apart::

    dst[d_t : d_t + L] = src[b + t : b + t + L * K : K]        t = 0 .. T-1

LLVM builds each gather from ``L`` scalar loads and inserts (``vinsertps``): some 18 shuffle
micro-ops a 16-lane vector, which bound the copy on the shuffle ports. The same block read as
``L`` row vectors of ``T`` lanes (``src[b + l * K : b + l * K + T]``) and transposed in
registers takes whole loads and a few shuffles a vector; written here as one TIR ``Shuffle``
per output vector, LLVM picks the instructions for the target (``vpermt2ps`` and
``vinsertf64x4`` on AVX-512). Transposing 16 rows of fp32 in runs of 8 columns, one Zen 4
core: 2304 columns (in L2) 1.35x faster, 18432 columns (1.2 MB) 3.5x; the 14x14x256 NCHW
conv2d, whose weight pack is such a copy, 1.04x.

The rewrite is exact: the row loads read the very elements the gathers read, before any of
the run's stores, and the pass takes only runs whose source is another buffer than their
destination, with no predicate and constant steps. A padded copy's run stores each gather
under its row's bounds test, ``if_then_else(cond, gather, 0)`` with one scalar ``cond`` for
the whole run (a few-channel dx's dy in W rows); it becomes ``if cond: loads, shuffles else:
zeros``, so no row is read where the test fails.
"""

from __future__ import annotations

MIN_RUN = 4    # gathers in a run worth a transpose (fewer: the inserts cost little)
MAX_RUN = 16   # row vectors of at most this many lanes (one register on AVX-512)


def _gather(stmt):
    """``(dst, src, base, stride, lanes)`` of ``dst[..] = src[Ramp(base, K, L)]`` (a store
    of a whole gathered vector) with a constant ``K > 1``; None for any other statement."""
    from tvm.ir.expr import TensorLoad
    from tvm.tirx import BufferStore, IntImm, Ramp

    if not isinstance(stmt, BufferStore) or not isinstance(stmt.value, TensorLoad):
        return None
    load = stmt.value
    if len(stmt.indices) != 1 or len(load.indices) != 1 or \
            getattr(stmt, "predicate", None) is not None or \
            getattr(load, "predicate", None) is not None:
        return None
    idx = load.indices[0]
    if not isinstance(idx, Ramp) or not isinstance(idx.stride, IntImm) or \
            idx.stride.value <= 1 or _same_memory(stmt.buffer, load.source):
        return None
    return stmt.buffer, load.source, idx.base, idx.stride.value, int(idx.lanes)


def _unguard(stmt):
    """``(cond, fill, store)`` of ``dst[..] = if_then_else(cond, v, fill)`` whose ``cond`` is
    one scalar (a padded copy's row test, the same for every lane) and whose ``fill`` is a
    broadcast constant: ``store`` is ``dst[..] = v``. ``(None, None, stmt)`` for any other
    statement."""
    from tvm.ir.expr import Call
    from tvm.tirx import Broadcast, BufferStore, FloatImm, IntImm

    value = getattr(stmt, "value", None)
    if not isinstance(stmt, BufferStore) or not isinstance(value, Call) or \
            not value.op.name.endswith("if_then_else"):
        return None, None, stmt
    cond, then, fill = value.args
    if int(cond.ty.dtype.lanes) != 1 or not isinstance(fill, Broadcast) or \
            not isinstance(fill.value, (FloatImm, IntImm)):
        return None, None, stmt
    return cond, fill, BufferStore(stmt.buffer, then, stmt.indices)


def _same_memory(a, b) -> bool:
    return a.same_as(b) or a.data.same_as(b.data)


def _run_length(stmts, start: int, analyzer) -> int:
    """How many statements from ``start`` gather consecutive columns of the same rows."""
    import tvm_ffi

    cond, fill, store = _unguard(stmts[start])
    first = _gather(store)
    if first is None:
        return 0
    _, src, base, stride, lanes = first
    n = 1
    while start + n < len(stmts) and n < MAX_RUN:
        c, f, store = _unguard(stmts[start + n])
        if (c is None) != (cond is None) or (cond is not None and not (
                tvm_ffi.structural_equal(c, cond) and tvm_ffi.structural_equal(f, fill))):
            break
        g = _gather(store)
        if g is None or not g[1].same_as(src) or g[3:] != (stride, lanes):
            break
        step = analyzer.simplify(g[2] - base)
        if not hasattr(step, "value") or step.value != n:
            break
        n += 1
    return n


def _as_shuffles(stmts, tag: int) -> list:
    """The ``T`` gathers of ``stmts`` as ``L`` row loads bound to vector variables, then
    one shuffle of them per store; a run under one guard (:func:`_unguard`) as ``if cond:
    (loads, shuffles) else: (fills)``, so no row is read where the guard is false."""
    from tvm.tirx import BufferStore, IfThenElse, SeqStmt

    cond, fill, _ = _unguard(stmts[0])
    if cond is None:
        return _shuffled(stmts, tag)
    plain = [_unguard(s)[2] for s in stmts]
    fills = [BufferStore(s.buffer, fill, s.indices) for s in stmts]
    return [IfThenElse(cond, SeqStmt(_shuffled(plain, tag)), SeqStmt(fills))]


def _shuffled(stmts, tag: int) -> list:
    from tvm.tirx import Bind, BufferLoad, BufferStore, IntImm, Ramp, Shuffle, Var

    _, src, base, stride, lanes = _gather(stmts[0])
    t = len(stmts)
    scalar = str(src.dtype).split("x")[0]
    itype = str(base.ty.dtype)
    one = IntImm(itype, 1)
    rows = [Var(f"transpose{tag}_row{r}", f"{scalar}x{t}") for r in range(lanes)]
    binds = [Bind(v, BufferLoad(src, [Ramp(base + IntImm(itype, r * stride), one, t)]))
             for r, v in enumerate(rows)]
    stores = [BufferStore(s.buffer, Shuffle(rows, [r * t + k for r in range(lanes)]),
                          s.indices) for k, s in enumerate(stmts)]
    return [*binds, *stores]


def rewrite(func):
    """``func`` with every run of :data:`MIN_RUN` or more consecutive-column gathers (a power
    of two of them, at most :data:`MAX_RUN`) transposed in registers."""
    import tvm_ffi
    from tvm.sym import Analyzer
    from tvm.tirx import SeqStmt

    analyzer = Analyzer()
    counter = [0]

    def on_seq(seq):
        stmts, out, i, changed = list(seq.seq), [], 0, False
        while i < len(stmts):
            n = _run_length(stmts, i, analyzer)
            t = 1 << (n.bit_length() - 1) if n else 0
            if t >= MIN_RUN:
                counter[0] += 1
                out.extend(_as_shuffles(stmts[i:i + t], counter[0]))
                i, changed = i + t, True
            else:
                out.append(stmts[i])
                i += 1
        if not changed:
            return seq
        return out[0] if len(out) == 1 else SeqStmt(out)  # a guarded run may be all of it

    body = tvm_ffi.structural_map(func.body, [(SeqStmt, on_seq)], order="post")
    return func if body.same_as(func.body) else func.with_body(body)


def transpose_pass():
    """:func:`rewrite` as a TIR function pass."""
    from tvm.tirx.transform import prim_func_pass

    return prim_func_pass(lambda f, _mod, _ctx: rewrite(f), opt_level=0,
                          name="dsl.GatherToShuffles")
