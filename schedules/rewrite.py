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
