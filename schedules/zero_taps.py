"""Skipping the taps that only multiply zero padding, in any scheduled reduction.

A convolution's register-tiled reduction reads a zero-padded copy of its operand (``y_pack``,
the padded dy of a dx, a user's ``te.compute`` pad) so that its inner loops need no bounds
test. At the border, whole taps then multiply nothing but padding: a 3-D dx of 16 x 28 x 28
with 3 x 3 x 3 taps spends 6.5% of its FMAs on zeros (the first and last planes and rows lose a
third of their taps). oneDNN skips them (PyTorch's conv3d dx ran at 100% of the fp32 roof as
counted with them); so does this pass, without touching the inner loops: where the padded
index of such a read depends only on loops outside the register tile (a tap loop and the
task's row or plane), the body of the innermost of those loops runs under
``if lo <= index < hi``, one test per tap, not one per step (3-D dx 1.06x, dw 1.03-1.05x on
one and two Zen 4 cores).

It runs on every kernel after scheduling (:func:`dsl.runtime.build.lower`), found by what the
graph is, not by which operator made it:

* a *padded stage* is a block that stores ``if_then_else(cond, value, 0)`` at its own iteration
  point, ``cond`` a conjunction of which some terms bound one axis by constants
  (``1 <= i and i < 17``): outside those bounds the stage holds exact zeros;
* a *zero guard* of a decomposed reduction block ``C[...] = C[...] + a * b * ...`` (no init
  inside it, which a skipped first step would lose) is a condition that, when false, makes a
  factor zero: the bounds of a padded stage the factor reads (through casts), or a term of
  ``cond`` where the factor is ``if_then_else(cond, v, 0)`` written inline (a user's padded
  read, an exact twin's bounds test);
* each guard is tested on the innermost loop whose variable it uses, when that loop is serial,
  nothing but the reduction block lies below it, it decides on at least :data:`MIN_STEPS`
  steps, and it is not inside the stretch where the register tile's accumulators stay in
  registers (:func:`_tile_loop`), unless the steps it skips there outweigh the tile's
  reloads (:func:`_pays_inside`). A 3-D dx gets its plane and row taps tested, a 3-D dw its
  plane taps, a 5HD dx of 14 x 14 its row taps, a user's NCHW convolution with vectors across
  its output channels its row taps (which :func:`schedules.patterns.contraction.
  _row_taps_first` puts outside the input channels); a 5HD dx of 56 x 56 and a user's
  convolution whose taps lie inside its channel loop keep their tile across the taps
  untested;
* a guard whose innermost loop is one of the register tile's unrolled rows (the W taps of a
  5HD dx whose row tiles straddle the padding, the taps of a dw whose rows are output
  positions) is tested inside that loop, after the serial loops it also uses are peeled where
  it may fail (:func:`schedules.loop_tests.peeled`; a loop of one iteration counts as its
  start, not as a loop the test uses): in each peeled copy those loops are constants, so
  once TVM unrolls the rows every test is a constant and the padding rows' FMAs are gone,
  with no branch in the tile (5HD dx of 14 x 14, batch 8: 1.035-1.047x on one and two Zen 4
  cores; 2-D dilated dx, transposed dx, 3-D dw and the 3-D dx, whose flat chunk of taps x
  channels splits at a tap's first channel, 1.02-1.03x; the rest 1.00-1.02x, none slower;
  a user's 8x512x7x7 NCHW conv2d, whose tile covers a row of 7 positions, its column taps
  so: 15.9 -> 14.4 ms). A loop with other blocks below it (a tile position, the tile's init
  and write-back inside) is peeled too where no iteration of it is left out
  (:func:`_keeps_other_blocks`): a user's 14x14 conv2d, two tiles of 7 a row, 1.05x on one
  and two Zen 4 cores.

A skipped step adds ``0 * w``, which is ``+-0`` for a finite ``w``: the sums are bit for bit the
same. For a NaN or infinite ``w`` the product is NaN where the math has no product at all (the
tap falls in the padding), so skipping is what the convolution means; the dx operators' exact
twins (:mod:`dsl.runtime.run_if`) already give that answer when a weight is not finite.
"""

from __future__ import annotations

from schedules.loop_tests import (
    Peel,
    conjunction,
    conjuncts,
    held_on_grid,
    home_loop,
    loops_using,
    only_block_below,
    peeled,
    realizes,
    steps_below,
    subst,
    walk_blocks,
    with_tests,
)

# Reduction steps one test must decide on at least, so that its branch costs nothing beside
# them (a user's convolution tested every 3 steps, its register tile kept across the taps, ran
# 0.74x as fast on one Zen 4 core).
MIN_STEPS = 16

# A test inside the register tile's stretch costs a load and a store of every accumulator per
# tested body, against one FMA per accumulator per step: about this many steps' worth.
STRETCH_COST_STEPS = 2.0


def skip_zero_taps(func):
    """``func`` with the reduction steps its zero guards rule out skipped a tap at a time (see
    the module docstring); ``func`` itself where nothing applies."""
    tests: dict = {}
    peels: list = []
    pads = _padded_stages(func.body)
    walk_blocks(func.body,
                lambda realize, loops: _block_tests(realize, loops, pads, tests, peels))
    if tests:
        func = with_tests(func, tests)
    return peeled(func, peels) if peels else func


def _padded_stages(body) -> dict:
    """``{buffer: {axis: (lo, hi)}}`` for each buffer every writer of which is a padded stage
    with the same bounds (:func:`pad_bounds`)."""
    writers: dict = {}
    for r in realizes(body):
        for w in r.block.writes:
            writers.setdefault(w.source, []).append(r.block)
    pads = {}
    for buf, blocks in writers.items():
        bounds = [pad_bounds(b) for b in blocks]
        if bounds[0] and all(b == bounds[0] for b in bounds[1:]):
            pads[buf] = bounds[0]
    return pads


def pad_bounds(block) -> dict:
    """``{axis: (lo, hi)}`` for a padded stage ``P[i...] = if_then_else(cond, v, 0)`` stored at
    its own iteration point: the constant bounds ``cond`` puts on each axis (outside them ``P``
    is zero). ``{}`` for any other block."""
    import tvm

    body = block.body
    if not isinstance(body, tvm.tirx.BufferStore) or block.init is not None:
        return {}
    value = body.value
    if not _is_zero_guarded(value):
        return {}
    # axes stored at a plain iteration variable (a panel's ``c // 32, c % 32`` bound none)
    axes = {idx: i for i, idx in enumerate(body.indices) if isinstance(idx, tvm.tirx.Var)}
    bounds: dict = {}
    for term in conjuncts(value.args[0]):
        hit = _axis_bound(term, axes)
        if hit is not None:
            axis, lo, hi = hit
            old_lo, old_hi = bounds.get(axis, (None, None))
            bounds[axis] = (_tighter(max, old_lo, lo), _tighter(min, old_hi, hi))
    return bounds


def _tighter(pick, old, new):
    return new if old is None else old if new is None else pick(old, new)


def _is_zero(expr) -> bool:
    import tvm

    return isinstance(expr, tvm.tirx.IntImm | tvm.tirx.FloatImm) and float(expr.value) == 0.0


def _axis_bound(term, axes: dict):
    """``(axis, lo, hi)`` (one of ``lo``, ``hi`` None) for a term that compares an axis
    variable with a constant (``1 <= i``, ``i < 17``, either side); None otherwise."""
    import tvm

    ops = {tvm.tirx.LE: "<=", tvm.tirx.LT: "<", tvm.tirx.GE: ">=", tvm.tirx.GT: ">"}
    flipped = {"<=": ">=", "<": ">", ">=": "<=", ">": "<"}
    op = ops.get(type(term))
    if op is None:
        return None
    var, const = term.a, term.b
    if not isinstance(var, tvm.tirx.Var):  # ``c OP v``: read as ``v OP' c``
        var, const, op = term.b, term.a, flipped[op]
    if not (isinstance(var, tvm.tirx.Var) and var in axes
            and isinstance(const, tvm.tirx.IntImm)):
        return None
    c = int(const.value)
    lo, hi = {"<=": (None, c + 1), "<": (None, c), ">=": (c, None), ">": (c + 1, None)}[op]
    return axes[var], lo, hi


def _block_tests(realize, loops: list, pads: dict, tests: dict, peels: list) -> None:
    """Add to ``tests`` (loop variable -> conditions) the tests one reduction block's zero
    guards allow on serial loops, and to ``peels`` the one its guards decided inside the
    register tile's unrolled rows allow (:func:`_peel`)."""
    block = realize.block
    binding = {iv.var: v for iv, v in zip(block.iter_vars, realize.iter_values)}
    guards = _zero_guards(block, pads)
    if not guards or not loops:
        return
    tile = _tile_loop(block, binding, loops)
    homes: dict = {}  # loop -> the terms to test on it
    unrolled = []  # the terms an unrolled loop decides
    for guard in guards:
        term = subst(guard, binding)
        if term is None:
            continue
        home = home_loop(term, loops)
        if home is not None and only_block_below(home, block):
            homes.setdefault(home, []).append(term)
        elif home is None:
            unrolled.append(term)
    peel = _peel(unrolled, loops, block)
    if peel is not None:
        peels.append(peel)
    for home, terms in homes.items():
        steps = steps_below(home)
        inside = any(int(lp.extent) > 1
                     for lp in loops[loops.index(tile) + 1:loops.index(home) + 1])
        if steps >= MIN_STEPS and (not inside or _pays_inside(terms, loops, steps)):
            tests.setdefault(home.loop_var, []).extend(terms)


def _peel(terms: list, loops: list, block):
    """The :class:`schedules.loop_tests.Peel` of the ``terms`` whose innermost loop is an
    unrolled one (a register tile's rows): they go inside it, where after unrolling each row's
    test is a constant -- once the serial loops they also use (the tile's position, a tap)
    are peeled where they may fail (:func:`schedules.loop_tests.peeled`). A 5HD dx of 14 x 14
    whose 7-row tiles straddle the W padding drops the FMAs of the padding rows that way.
    None where a term uses a loop of another kind (vectorised, parallel), its loops' bounds
    are not constants, another block lies below its outermost loop, or it holds throughout."""
    import tvm

    if not terms:
        return None
    # a loop of one iteration (a tile position along a row the tile covers whole) is its
    # start: it decides nothing, and counted, the peel would copy the tile's init and
    # write-back below it for nothing (_keeps_other_blocks)
    term = subst(conjunction(terms), {lp.loop_var: lp.min for lp in loops
                                      if isinstance(lp.extent, tvm.tirx.IntImm)
                                      and int(lp.extent) == 1})
    if term is None:
        return None
    used = loops_using(term, loops)
    kinds = (tvm.tirx.ForKind.SERIAL, tvm.tirx.ForKind.UNROLLED)
    if (not used or used[-1].kind != tvm.tirx.ForKind.UNROLLED
            or any(lp.kind not in kinds for lp in used)
            or not all(isinstance(lp.min, tvm.tirx.IntImm)
                       and isinstance(lp.extent, tvm.tirx.IntImm) for lp in used)):
        return None
    ranges = tuple((lp.loop_var, int(lp.min), int(lp.extent)) for lp in used)
    held = held_on_grid(term, list(ranges))
    if held is None or held.all() or not _keeps_other_blocks(held, used, block):
        return None
    return Peel(term, ranges, used[-1].loop_var)


def _keeps_other_blocks(held, used: list, block) -> bool:
    """Whether peeling the loops ``used`` keeps every iteration of those with other blocks
    below them (a tile position, with the tile's init and write-back inside): the peel drops
    the iterations where the term fails throughout, which is right only for a loop whose
    body is the reduction's steps. The home loop (innermost) must be such a loop. A 14 x 14
    user conv2d, two tiles of 7 a row, peels its tile position so (the column taps of each
    row's first and last tile fold)."""
    import numpy as np

    outer = [i for i, lp in enumerate(used) if not only_block_below(lp, block)]
    if not outer:
        return True
    j = outer[-1]
    return j < len(used) - 1 and bool(held.reshape(
        int(np.prod(held.shape[:j + 1])), -1).any(axis=1).all())


def _pays_inside(terms: list, loops: list, steps: int) -> bool:
    """Whether a test of ``terms`` inside the register tile's stretch skips more steps than
    the tile's reloads cost: the share of loop points where their conjunction is false (the
    skipped bodies) times ``steps`` beats :data:`STRETCH_COST_STEPS` (a 5HD dx of 14 x 14, 4.8%
    of its (row, tap) pairs in the padding, 48 steps a body: 1.02-1.04x; at 56 x 56, 1.2%:
    0.97x)."""
    share = _false_share(conjunction(terms), loops)
    return share is not None and share * steps >= STRETCH_COST_STEPS


def _tile_loop(block, binding: dict, loops: list):
    """The innermost serial or parallel loop the accumulator's index uses (the outermost loop
    when none does). Below it a register tile's accumulators stay in registers from step to
    step, which LLVM keeps up only while every step's store is unconditional: under a test it
    loads and stores them around each tested body (a 5HD dx tested per tap row, 48 steps:
    0.97-0.98x on one Zen 4 core for 56 x 56, whose tests skip 1.2% of the steps). At or
    above it, or below it through loops of one iteration only, the tile is loaded and stored
    inside the tested body anyway (a grouped 5HD dw, tested per row of taps so: 1.30-1.35x on
    one and two Zen 4 cores)."""
    import tvm

    indices = [i for i in (subst(i, binding) for i in block.body.indices) if i is not None]
    kinds = (tvm.tirx.ForKind.SERIAL, tvm.tirx.ForKind.PARALLEL)
    inner = [lp for i in indices for lp in loops_using(i, loops) if lp.kind in kinds]
    return max(inner, key=loops.index) if inner else loops[0]


def _zero_guards(block, pads: dict) -> list:
    """Conditions (in the block's variables) each of which, when false, makes the block's
    update term zero: the block is ``C[i] = C[i] + f1 * f2 * ...`` with no init, and a factor
    is a read of a padded stage (its index within the stage's bounds) or an inline
    ``if_then_else(cond, v, 0)`` (each term of ``cond``); [] for any other block."""
    import tvm

    guards = []
    for f in _update_factors(block):
        if isinstance(f, tvm.ir.TensorLoad) and f.source in pads:
            for axis, (lo, hi) in pads[f.source].items():
                index = f.indices[axis]
                dtype = str(index.ty)
                if lo is not None:
                    guards.append(tvm.tirx.LE(tvm.tirx.const(lo, dtype), index))
                if hi is not None:
                    guards.append(tvm.tirx.LT(index, tvm.tirx.const(hi, dtype)))
        elif _is_zero_guarded(f):
            guards.extend(conjuncts(f.args[0]))
    return guards


def _is_zero_guarded(expr) -> bool:
    import tvm

    return (isinstance(expr, tvm.ir.expr.Call) and expr.op.name.endswith("if_then_else")
            and _is_zero(expr.args[2]))


def _update_factors(block) -> list:
    """The factors of the block's update term when it is ``C[i] = C[i] + f1 * f2 * ...``
    with no init (casts looked through); [] otherwise."""
    import tvm

    body = block.body
    if block.init is not None or not isinstance(body, tvm.tirx.BufferStore):
        return []
    value = body.value
    if not isinstance(value, tvm.tirx.Add):
        return []
    for acc, term in ((value.a, value.b), (value.b, value.a)):
        if isinstance(acc, tvm.ir.TensorLoad) and acc.source.same_as(body.buffer):
            return _factors(term)
    return []


def _factors(expr) -> list:
    import tvm

    while isinstance(expr, tvm.tirx.Cast):
        expr = expr.value
    if isinstance(expr, tvm.tirx.Mul):
        return _factors(expr.a) + _factors(expr.b)
    return [expr]



def _false_share(term, loops: list) -> float | None:
    """The share of the points of the loops ``term`` uses at which it is false, counted on
    the grid of their values; None when there is no such grid
    (:func:`schedules.loop_tests.held_on_grid`)."""
    import numpy as np

    mine = loops_using(term, loops)
    if not mine:
        return None
    held = held_on_grid(term, [(lp.loop_var, int(lp.min), int(lp.extent)) for lp in mine])
    return None if held is None else float(1.0 - np.mean(held))
