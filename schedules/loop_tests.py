"""Tests on loops: a condition that only outer loops decide, put on the loop where it is decided
once for its whole body (:func:`with_tests`); one that an unrolled loop decides, put inside it
after the serial loops it also uses are peeled where it may fail, so that it folds to a
constant in every unrolled copy (:func:`peeled`); and the statement facts that choose them.
Used by :mod:`schedules.zero_taps` (taps that multiply only padding)."""

from __future__ import annotations

from dataclasses import dataclass

from schedules.rewrite import rebuild

# Loop points a condition is evaluated over at most (an int32 grid of the loops it uses; a
# convolution's tap and row loops make a few thousand).
GRID_POINTS = 1 << 20

# Runs of one loop :func:`peeled` copies out at most, and copies of a body in all.
PEEL_RUNS = 4
PEEL_COPIES = 16

# Points of the unrolled loops a peeled test's folding is checked at, at most.
FOLD_POINTS = 4096

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
        return tvm.tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind,
                            tvm.tirx.IfThenElse(conjunction(conds), body, None),
                            loop.thread_binding, loop.annotations, loop.step)

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


def conjunction(terms: list):
    """``terms[0] and terms[1] and ...``."""
    import tvm

    cond = terms[0]
    for t in terms[1:]:
        cond = tvm.tirx.And(cond, t)
    return cond


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


def held_on_grid(term, ranges: list):
    """``term`` on the grid of ``ranges`` (``[(var, lo, extent), ...]``): a bool numpy array
    indexed in that order; None when the grid has more than :data:`GRID_POINTS` points or the
    term has a node kind :func:`evaluate` does not know."""
    import numpy as np

    sizes = [n for _, _, n in ranges]
    if int(np.prod(sizes)) > GRID_POINTS:
        return None
    grids = np.meshgrid(*(np.arange(lo, lo + n) for _, lo, n in ranges), indexing="ij")
    held = evaluate(term, {var: g for (var, _, _), g in zip(ranges, grids)})
    return None if held is None else np.broadcast_to(held, tuple(sizes))


_NUMPY_OPS = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "FloorDiv": "floor_divide",
              "FloorMod": "mod", "Min": "minimum", "Max": "maximum", "LT": "less",
              "LE": "less_equal", "GT": "greater", "GE": "greater_equal", "EQ": "equal",
              "NE": "not_equal", "And": "logical_and", "Or": "logical_or"}


def evaluate(expr, values: dict):
    """``expr`` (integer index arithmetic and comparisons over loop variables) on numpy grids
    of their values; None for anything else."""
    import numpy as np
    import tvm

    if isinstance(expr, tvm.tirx.Var):
        return values.get(expr)
    if isinstance(expr, tvm.tirx.IntImm):
        return int(expr.value)
    op = _NUMPY_OPS.get(type(expr).__name__)
    if op is None:
        return None
    a, b = evaluate(expr.a, values), evaluate(expr.b, values)
    if a is None or b is None:
        return None
    return getattr(np, op)(a, b)


@dataclass(frozen=True)
class Peel:
    """A test for :func:`peeled`: ``term`` over the loops ``ranges`` (``[(var, lo, extent),
    ...]``, outermost first), put on the body of the unrolled loop ``home`` (the innermost of
    them); the others, serial, are peeled where the term may fail."""

    term: object
    ranges: tuple
    home: object

    def serial(self) -> list:
        return [var for var, _, _ in self.ranges if not var.same_as(self.home)]


class _NoPeel(Exception):
    """A peel left out: too many copies, a test that would not fold, or a node kind
    :func:`subst` does not know."""


def peeled(func, peels: list):
    """``func`` with each :class:`Peel`'s test where it folds to a constant: every serial loop
    the term uses is split, in order, into runs of iterations over which the term's truth at
    the points of the loops inside is the same: a run where it holds at every point stays a
    loop, untested; one where it fails at every point is left out (its steps read only
    zeros); any other run (up to :data:`PEEL_RUNS` a loop) is copied, with the loop variable
    a constant where the run is one iteration, and peeled further inside; in those copies the
    home loop's body runs under ``if term``, which TVM's ``UnrollLoop`` and ``Simplify`` turn
    into a constant per unrolled copy (checked here with TVM's analyzer, the runs' variables
    bound to their ranges: a flat loop of taps x channels splits at a tap's first channel).
    A peel that would make more than :data:`PEEL_COPIES` copies, or leave a test that does
    not fold, is left out."""
    body = func.body
    for peel in peels:
        try:
            body = _peel(body, peel, {}, {}, [PEEL_COPIES])
        except _NoPeel:
            continue
    return func if body.same_as(func.body) else func.with_body(body)


def _peel(stmt, peel: Peel, fixed: dict, bounds: dict, budget: list):
    """``stmt`` with ``peel`` applied below it; ``fixed``: the serial loop variables already
    split (var -> a constant, or the variable of its run's loop), ``bounds``: those runs'
    variables -> ``(lo, extent)``."""
    import tvm

    todo = [v for v in peel.serial() if not any(v.same_as(f) for f in fixed)]

    def visit_loop(loop):
        if todo and loop.loop_var.same_as(todo[0]):
            return _split_loop(loop, peel, fixed, bounds, budget)
        if not todo and loop.loop_var.same_as(peel.home):
            cond = subst(peel.term, fixed)
            if not _folds(cond, peel, bounds):
                raise _NoPeel
            return tvm.tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind,
                                tvm.tirx.IfThenElse(cond, loop.body, None), loop.thread_binding,
                                loop.annotations, loop.step)
        return None

    return rebuild(stmt, lambda b: None, visit_loop)


def _split_loop(loop, peel: Peel, fixed: dict, bounds: dict, budget: list):
    """One serial loop of ``peel`` split into its runs (see :func:`peeled`)."""
    import numpy as np
    import tvm

    var, lo, n = loop.loop_var, int(loop.min), int(loop.extent)
    dtype = str(var.ty)
    rest = [(v, a, e) for v, a, e in peel.ranges
            if not v.same_as(var) and not any(v.same_as(f) for f in fixed)]
    held = held_on_grid(subst(peel.term, fixed), [(var, lo, n), *rest + _run_ranges(bounds)])
    if held is None:
        raise _NoPeel
    pattern = held.reshape(n, -1)
    starts = [0] + [i for i in range(1, n) if not np.array_equal(pattern[i], pattern[i - 1])]
    if sum(1 for a in starts if 0 < pattern[a].mean() < 1) > PEEL_RUNS:
        raise _NoPeel
    parts = []
    for a, b in zip(starts, [*starts[1:], n]):
        if not pattern[a].any():
            continue
        mixed = not pattern[a].all()
        if mixed:
            budget[0] -= 1
            if budget[0] < 0:
                raise _NoPeel
        if mixed and b - a == 1:
            value = tvm.tirx.const(lo + a, dtype)
            parts.append(_peel(_substitute(loop.body, {var: value}), peel,
                               {**fixed, var: value}, bounds, budget))
            continue
        run = tvm.tirx.Var(var.name, dtype)  # a fresh variable: TVM binds each to one range
        body = _substitute(loop.body, {var: run})
        if mixed:
            body = _peel(body, peel, {**fixed, var: run}, {**bounds, run: (lo + a, b - a)},
                         budget)
        parts.append(tvm.tirx.For(run, tvm.tirx.const(lo + a, dtype),
                                  tvm.tirx.const(b - a, dtype), loop.kind, body,
                                  loop.thread_binding, loop.annotations, loop.step))
    if not parts:
        return tvm.tirx.Evaluate(0)
    return parts[0] if len(parts) == 1 else tvm.tirx.SeqStmt(parts)


def _run_ranges(bounds: dict) -> list:
    return [(v, lo, n) for v, (lo, n) in bounds.items()]


def _folds(cond, peel: Peel, bounds: dict) -> bool:
    """Whether ``cond`` simplifies to a constant at every point of the unrolled loops it uses,
    the runs' variables bound to their ranges (as TVM's ``Simplify`` sees them after
    ``UnrollLoop``)."""
    import itertools

    import numpy as np
    import tvm

    serial = peel.serial()
    unrolled = [(v, lo, n) for v, lo, n in peel.ranges if not any(v.same_as(s) for s in serial)]
    if int(np.prod([n for _, _, n in unrolled])) > FOLD_POINTS:
        return False
    analyzer = tvm.sym.Analyzer()
    for v, (lo, n) in bounds.items():
        analyzer.bind(v, tvm.ir.Range.from_min_extent(lo, n))
    for point in itertools.product(*(range(lo, lo + n) for _, lo, n in unrolled)):
        at = subst(cond, {v: tvm.tirx.const(x, str(v.ty)) for (v, _, _), x in zip(unrolled, point)})
        if not isinstance(analyzer.simplify(at), tvm.tirx.IntImm):
            return False
    return True


def _substitute(stmt, binding: dict):
    """``stmt`` with loop variables replaced (``binding``) where a scheduled function uses
    them: block bindings and predicates, the tests above them, loop bounds, and the bodies of
    the opaque blocks that wrap a partitioned loop (whose statements read the loops
    directly)."""
    import tvm

    def expr(e):
        out = subst(e, binding)
        if out is None:
            raise _NoPeel
        return out

    def opaque(block):
        # a wrapper TVM's loop_partition makes: no iterators, its body reads the loops
        if block.iter_vars:
            return block
        if block.reads or block.writes or block.init is not None or block.alloc_buffers \
                or block.match_buffers:
            raise _NoPeel
        return tvm.s_tir.SBlock([], [], [], block.name_hint, walk(block.body),
                                annotations=block.annotations)

    def walk(s):
        if isinstance(s, tvm.s_tir.SBlockRealize):
            return tvm.s_tir.SBlockRealize([expr(v) for v in s.iter_values],
                                           expr(s.predicate), opaque(s.block))
        if isinstance(s, tvm.tirx.SeqStmt):
            return tvm.tirx.SeqStmt([walk(x) for x in s.seq])
        if isinstance(s, tvm.tirx.For):
            return tvm.tirx.For(s.loop_var, expr(s.min), expr(s.extent), s.kind, walk(s.body),
                                s.thread_binding, s.annotations, s.step)
        if isinstance(s, tvm.tirx.IfThenElse):
            return tvm.tirx.IfThenElse(expr(s.condition), walk(s.then_case),
                                       None if s.else_case is None else walk(s.else_case))
        raise _NoPeel

    return walk(stmt)
