"""Tests on loops: a condition that only outer loops decide, put on the loop where it is decided
once for its whole body (:func:`with_tests`), and the statement facts that choose that loop.
Used by :mod:`schedules.zero_taps` (taps that multiply only padding)."""

from __future__ import annotations

from schedules.rewrite import rebuild

_BINARY = ("Add", "Sub", "Mul", "FloorDiv", "FloorMod", "Div", "Mod", "Min", "Max", "LT", "LE",
           "GT", "GE", "EQ", "NE", "And", "Or")


def with_tests(func, tests: dict):
    """``func`` with the body of each loop whose variable is a key of ``tests`` run under
    ``if`` the conjunction of that key's conditions."""
    import tvm

    def wrap(loop):
        conds = tests.get(loop.loop_var)
        if conds is None:
            return None
        body = rebuild(loop.body, lambda b: None, wrap)
        cond = conds[0]
        for c in conds[1:]:
            cond = tvm.tirx.And(cond, c)
        return tvm.tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind,
                            tvm.tirx.IfThenElse(cond, body, None), loop.thread_binding,
                            loop.annotations, loop.step)

    return func.with_body(rebuild(func.body, lambda b: None, wrap))


def walk_blocks(stmt, visit, loops=None) -> None:
    """``visit(realize, loops)`` for every SBlockRealize under ``stmt``, ``loops`` the For
    statements around it, outermost first."""
    import tvm

    loops = loops or []
    if isinstance(stmt, tvm.s_tir.SBlockRealize):
        visit(stmt, loops)
        walk_blocks(stmt.block.body, visit, loops)
    elif isinstance(stmt, tvm.tirx.SeqStmt):
        for s in stmt.seq:
            walk_blocks(s, visit, loops)
    elif isinstance(stmt, tvm.tirx.For):
        walk_blocks(stmt.body, visit, [*loops, stmt])
    elif isinstance(stmt, tvm.tirx.IfThenElse):
        walk_blocks(stmt.then_case, visit, loops)
        if stmt.else_case is not None:
            walk_blocks(stmt.else_case, visit, loops)


def realizes(stmt) -> list:
    """Every SBlockRealize under ``stmt`` (the root's included)."""
    out: list = []
    walk_blocks(stmt, lambda realize, loops: out.append(realize))
    return out


def conjuncts(cond) -> list:
    """The terms of ``a and b and ...``."""
    import tvm

    if isinstance(cond, tvm.tirx.And):
        return conjuncts(cond.a) + conjuncts(cond.b)
    return [cond]


def subst(expr, binding: dict):
    """``expr`` with block variables replaced by their bound values (``binding``); None for a
    node kind index and bounds expressions do not use."""
    import tvm

    if isinstance(expr, tvm.tirx.Var):
        return binding.get(expr, expr)
    if isinstance(expr, tvm.tirx.IntImm):
        return expr
    if isinstance(expr, tvm.tirx.Cast):
        inner = subst(expr.value, binding)
        return None if inner is None else tvm.tirx.Cast(expr.dtype, inner)
    name = type(expr).__name__
    if name in _BINARY:
        a, b = subst(expr.a, binding), subst(expr.b, binding)
        return None if a is None or b is None else type(expr)(a, b)
    return None


def used_vars(expr, out: list) -> None:
    """Append every variable ``expr`` uses to ``out``."""
    import tvm
    import tvm_ffi

    tvm_ffi.structural_walk(expr, (tvm.tirx.Var, out.append), order="post")


def loops_using(expr, loops: list) -> list:
    """Those of ``loops`` whose variable ``expr`` uses, in their order."""
    used: list = []
    used_vars(expr, used)
    return [lp for lp in loops if any(v.same_as(lp.loop_var) for v in used)]


def home_loop(index, loops: list):
    """The innermost of ``loops`` whose variable ``index`` uses, if it is a serial loop
    (a test in an unrolled or vectorised loop would split the register tile); else None."""
    import tvm

    inner = loops_using(index, loops)
    if not inner or inner[-1].kind != tvm.tirx.ForKind.SERIAL:
        return None
    return inner[-1]


def only_block_below(loop, block) -> bool:
    """Whether ``block`` is the one block under ``loop`` (skipping the loop's body then skips
    nothing but its steps)."""
    below = realizes(loop.body)
    return len(below) == 1 and below[0].block.same_as(block)


def steps_below(loop) -> int:
    """Iterations of the serial loops under ``loop`` (the unrolled and vectorised register
    tile counts as one step): the work one test decides on."""
    import tvm

    n = 1
    s = loop.body
    while True:
        while isinstance(s, tvm.tirx.IfThenElse):
            s = s.then_case
        if not isinstance(s, tvm.tirx.For):
            return n
        if s.kind == tvm.tirx.ForKind.SERIAL:
            n *= int(s.extent)
        s = s.body
