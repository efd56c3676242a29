"""Rebuilding the statements of a scheduled s_tir function: the passes that run after every
schedule step (:func:`dsl.runtime.run_if.wire_fallbacks`, :func:`schedules.amx.lower_tiles`)
replace blocks or loops deep inside it and rebuild only the containers above a change."""

from __future__ import annotations


def with_block(b, **changes):
    """A copy of SBlock ``b`` with ``changes`` (keyword fields of its constructor)."""
    import tvm

    fields = {"iter_vars": b.iter_vars, "reads": b.reads, "writes": b.writes,
              "name_hint": b.name_hint, "body": b.body, "init": b.init,
              "alloc_buffers": b.alloc_buffers, "match_buffers": b.match_buffers,
              "annotations": b.annotations, **changes}
    return tvm.s_tir.SBlock(**fields)


def rebuild(stmt, visit, visit_loop=None):
    """``stmt`` with every SBlock ``b`` replaced by ``visit(b)`` and, with ``visit_loop``,
    every For ``f`` by ``visit_loop(f)`` before its body is visited (None keeps either), the
    containers above a change rebuilt (the node kinds a scheduled s_tir function has)."""
    import tvm

    if visit_loop is not None and isinstance(stmt, tvm.tirx.For):
        new = visit_loop(stmt)
        if new is not None:
            return new

    if isinstance(stmt, tvm.s_tir.SBlockRealize):
        block = rebuild(stmt.block, visit, visit_loop)
        return stmt if block.same_as(stmt.block) else tvm.s_tir.SBlockRealize(
            stmt.iter_values, stmt.predicate, block)
    if isinstance(stmt, tvm.s_tir.SBlock):
        body = rebuild(stmt.body, visit, visit_loop)
        block = stmt if body.same_as(stmt.body) else with_block(stmt, body=body)
        return visit(block) or block
    if isinstance(stmt, tvm.tirx.SeqStmt):
        seq = [rebuild(s, visit, visit_loop) for s in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else \
            tvm.tirx.SeqStmt(seq)
    if isinstance(stmt, tvm.tirx.For):
        body = rebuild(stmt.body, visit, visit_loop)
        return stmt if body.same_as(stmt.body) else tvm.tirx.For(
            stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
            stmt.annotations, stmt.step)
    if isinstance(stmt, tvm.tirx.IfThenElse):
        then = rebuild(stmt.then_case, visit, visit_loop)
        other = rebuild(stmt.else_case, visit, visit_loop) if stmt.else_case is not None else None
        if then.same_as(stmt.then_case) and (other is None or other.same_as(stmt.else_case)):
            return stmt
        return tvm.tirx.IfThenElse(stmt.condition, then, other)
    return stmt


def drop_proven_guards(func):
    """``func`` where every injective block whose value is ``if_then_else(cond, a, b)`` with
    ``cond`` true over the block's whole iteration domain stores ``a`` instead: a padding
    stage of zero padding (``te.if_then_else(i >= 0 and i < H, x[i], 0)``, what generic conv
    code writes for ``padding=0``) is then a plain copy, which the pattern rules inline into
    its reader instead of copying the input (a user's 1x1 conv2d with such a stage, 8 x 40
    -> 240 channels at 28 x 28: 0.83x PyTorch on one Zen 4 core, its copy made again in
    every tile's task)."""
    import tvm

    def visit(block):
        store = block.body
        if not isinstance(store, tvm.tirx.BufferStore) or any(
                int(iv.iter_type) != 0 for iv in block.iter_vars):
            return None
        value = store.value
        if not (isinstance(value, tvm.ir.expr.Call)
                and str(getattr(value.op, "name", "")).endswith("if_then_else")):
            return None
        ana = tvm.sym.Analyzer()
        for iv in block.iter_vars:
            ana.bind(iv.var, iv.dom)
        if not ana.can_prove(value.args[0]):
            return None
        new = tvm.tirx.BufferStore(store.buffer, value.args[1], store.indices)
        return with_block(block, body=new)

    body = rebuild(func.body, visit)
    return func if body.same_as(func.body) else tvm.tirx.PrimFunc(
        func.params, body, func.ret_type, func.attrs)
