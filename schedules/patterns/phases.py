"""Contractions over a zero-inserted operand, split into stride phases.

The input gradient of a strided convolution, as users write it (and as topi's
``conv2d_transpose`` does), convolves a *zero-inserted* copy of dy::

    dil[.., u, ..] = dy[.., (u - q) // s, ..]  where (u - q) % s == 0 (and in bounds), else 0
    dx[.., i, ..]  = sum_r dil[.., i + r + c, ..] * w[.., r, ..]

Along each such axis only one tap in ``s`` meets a non-zero: a 2-D stride-2 dx does four
times its work, and the zero-inserted operand is ``s**2`` times the size of dy.

:func:`split_phases` rewrites the graph before it is built (:meth:`dsl.runtime.schedule.
Schedule.prim_func`): with ``i = s*iq + p`` (phase ``p``) the taps that meet a non-zero are
``r = s*t + rho(p)``, ``rho(p) = (q - p - c) mod s``, and the read becomes
``P[.., iq + t + e(p), ..]`` (``iq - t + ..`` where the taps are read reversed) over the
*compressed* operand ``P[.., m, ..] = dil[.., s*m + q, ..]`` (``e(p) = (p + rho(p) + c - q) /
s``, exact). Per phase that is a dense contraction (``dx_phase_*``, scheduled by the
contraction rule; the taps of the other operands a phase reads, ``w[.., K - 1 - (s*t +
rho)]``, in a stage of their own, :func:`_sliced`); one injective stage interleaves them into
the output (``s**d`` phases for ``d`` zero-inserted axes; a phase without taps is zero;
:func:`schedule_interleave`).

The operand is found by what it is: an injective stage (through any injective producers:
padding, the zero insertion itself) whose value, inlined, tests ``(u + k) % s == 0`` on an
axis ``u`` it reads at ``i + r + c`` or ``i - r + c`` (an output axis and a reduction axis).
Written inline in the sum instead (``if_then_else((h + p - r) % s == 0 and .., dy[.., (h + p
- r) // s, ..], 0)``: a gather), the term is first outlined into such a stage over ``u = h -
r + p`` (:func:`_outlined`). ``P`` is the operand's value at ``u = s*m + q``; where the
simplifier cannot remove every ``% s`` and ``// s`` of ``m`` from it, or the reduction is not
a sum, nothing changes.

A summand that also reads other operands at the output position (a max pool's gradient:
``dy`` and the pooled ``y`` gathered at ``(h + p - r) // s``, ``x[.., h, w]`` compared with
``y``) has no stage over ``u`` alone; it is split directly (:func:`_direct`): each phase's
taps substituted into the summand, a phase of at most :data:`EXPAND_TAPS` steps written out
term by term (computed inside the interleave). Either way the whole summand must be
provably zero at every tap off each phase's residue (:func:`_zero_off_residue`). A sum with
no residue test but a guard on its taps (a stride-1 max pool's gradient, a padding written
inside the sum) of at most that many steps is written out the same way
(:func:`_expand_guarded`).
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules.patterns.analysis import nodes_of
from schedules.patterns.common import product
from schedules.toolbox import lead_loops

# Tags of the stages the split makes (the user's output keeps its own name and tag).
OPERAND_TAG = "phases.operand"      # the compressed operand P
PHASE_TAG = "phases.phase"          # one phase's contraction
ASSEMBLE_TAG = "phases.assemble"    # the interleave, where the user's output had no tag
SLICE_TAG = "phases.slice"          # a phase's taps of another operand
GATHERED_TAG = "phases.gathered"    # an inline gather outlined into a stage


@dataclass(frozen=True)
class Axis:
    """One zero-inserted axis: the operand's axis ``dim`` is read at ``out + sign * red + c``
    (an output and a reduction iterator, ``sign`` 1 or -1) and holds a non-zero where
    ``(u - q) % s == 0``."""

    dim: int
    out: int  # index of the output axis
    red: int  # index of the reduction axis
    c: int
    s: int
    q: int
    out_extent: int
    red_extent: int
    sign: int = 1

    def rho(self, p: int) -> int:
        return self.sign * (self.q - p - self.c) % self.s

    def taps(self, p: int) -> int:
        return max(0, -(-(self.red_extent - self.rho(p)) // self.s))

    def rows(self, p: int) -> int:
        return max(0, -(-(self.out_extent - p) // self.s))

    def offset(self, p: int) -> int:
        return (p + self.sign * self.rho(p) + self.c - self.q) // self.s

    def span(self) -> tuple[int, int]:
        """The compressed indices ``m = iq + sign * t + offset`` the phases read (first,
        last)."""
        live = [p for p in range(self.s) if self.taps(p) and self.rows(p)]
        back = 0 if self.sign > 0 else 1  # taps step m back from the phase's offset
        lo = min(self.offset(p) - back * (self.taps(p) - 1) for p in live)
        hi = max(self.offset(p) + self.rows(p) - 1 + (1 - back) * (self.taps(p) - 1)
                 for p in live)
        return lo, hi


def _is_load(e) -> bool:
    import tvm

    return isinstance(e, tvm.ir.expr.Call) and getattr(e.op, "name", "") == "te.tensor_load"


def _injective(t) -> bool:
    import tvm
    from tvm import te

    op = t.op
    return (isinstance(op, te.ComputeOp) and op.num_outputs == 1
            and not isinstance(op.body[0], tvm.tirx.Reduce))


def rewrite(expr, var_map: dict, load=None):
    """``expr`` with variables replaced (``var_map``: Var -> expr) and each tensor load
    ``t[idx]`` replaced by ``load(t, idx)`` where that returns an expression (indices
    rewritten first)."""
    import tvm
    import tvm_ffi

    def on_var(v, _m):
        return var_map.get(v, v)

    def on_call(c, m):
        if not _is_load(c):
            return m.default_mutate(c)
        idx = [m.mutate(i) for i in c.args[1:]]
        new = load(c.args[0], idx) if load is not None else None
        return new if new is not None else c.args[0](*idx)

    return tvm_ffi.structural_mutate(expr, [(tvm.tirx.Var, on_var),
                                            (tvm.ir.expr.Call, on_call)])


# Stage reads :func:`value_at` inlines at most: a chain that reads its producer twice per
# stage doubles with each one, and the zero insertion sits a stage or two before the sum.
INLINE_LIMIT = 32

# A phase of :func:`_direct` whose reduction has at most this many steps (a 3x3 stride-2
# pool's 2 x 2) is written out as a sum of its terms: no reduction loop of four steps.
EXPAND_TAPS = 9


def value_at(t, idx, budget: list | None = None):
    """The value of injective stage ``t`` at ``idx``, its injective producers inlined, the
    first :data:`INLINE_LIMIT` reads of them (the rest read as they are)."""
    budget = [INLINE_LIMIT] if budget is None else budget
    body = rewrite(t.op.body[0], {a.var: i for a, i in zip(t.op.axis, idx)})

    def inline(u, ix):
        if not _injective(u) or budget[0] <= 0:
            return None
        budget[0] -= 1
        return value_at(u, ix, budget)

    return rewrite(body, {}, inline)


def _offset(expr, var) -> int | None:
    """``k`` where ``expr`` is ``var + k``, else None."""
    import tvm

    diff = tvm.sym.Analyzer().simplify(expr - var)
    return int(diff.value) if isinstance(diff, tvm.tirx.IntImm) and \
        not any(v.same_as(var) for v in nodes_of(diff, tvm.tirx.Var)) else None


def zero_inserted(t) -> dict[int, tuple[int, int]]:
    """``{axis: (s, q)}``: the axes of stage ``t`` whose inlined value tests
    ``(u - q) % s == 0`` (the zero insertion of a strided operand)."""
    import tvm

    axes = [tvm.tirx.Var(f"u{k}", "int32") for k in range(len(t.shape))]
    found: dict[int, tuple[int, int]] = {}
    for mod in nodes_of(value_at(t, axes), tvm.tirx.FloorMod):
        if not isinstance(mod.b, tvm.tirx.IntImm) or int(mod.b.value) < 2:
            continue
        s = int(mod.b.value)
        for k, u in enumerate(axes):
            k_off = _offset(mod.a, u)
            k_off = _offset(-mod.a, u) if k_off is None else k_off
            if k_off is not None and found.get(k, (s,))[0] == s:
                found[k] = (s, -k_off % s)
    return found


def _uses(expr, var) -> bool:
    import tvm

    return any(v.same_as(var) for v in nodes_of(expr, tvm.tirx.Var))


def _linear_terms(index, out_vars, red_vars) -> tuple[int, int, int, int] | None:
    """``(out axis, reduction axis, c, sign)`` where ``index`` is ``out + sign * red + c``
    (``sign`` 1 or -1), else None."""
    outs = [k for k, v in enumerate(out_vars) if _uses(index, v)]
    reds = [k for k, v in enumerate(red_vars) if _uses(index, v)]
    if len(outs) != 1 or len(reds) != 1:
        return None
    for sign in (1, -1):
        c = _offset(index - sign * red_vars[reds[0]], out_vars[outs[0]])
        if c is not None:
            return outs[0], reds[0], c, sign
    return None


@dataclass(frozen=True)
class Plan:
    """How to split output ``y``: its reduction reads the zero-inserted stage ``operand``
    (once) along ``axes``."""

    y: object
    operand: object
    axes: tuple[Axis, ...]


def _is_sum(red) -> bool:
    import tvm

    comb = red.combiner
    return (len(comb.result) == 1 and isinstance(comb.result[0], tvm.tirx.Add)
            and len(comb.identity_element) == 1
            and float(comb.identity_element[0].value) == 0.0)


def plan(y) -> Plan | None:
    """The :class:`Plan` for output ``y``, or None where it is no sum over a zero-inserted
    operand read at ``i + r + c``."""
    import tvm
    from tvm import te

    op = y.op
    if not isinstance(op, te.ComputeOp) or op.num_outputs != 1:
        return None
    red = op.body[0]
    if not isinstance(red, tvm.tirx.Reduce) or not _is_sum(red):
        return None
    out_vars, red_vars = [a.var for a in op.axis], [a.var for a in red.axis]
    loads = [c for c in nodes_of(red.source[0], tvm.ir.expr.Call) if _is_load(c)]
    for load in loads:
        t = load.args[0]
        if not _injective(t) or sum(c.args[0].op.same_as(t.op) for c in loads) != 1:
            continue
        axes = []
        for dim, (s, q) in zero_inserted(t).items():
            terms = _linear_terms(load.args[1 + dim], out_vars, red_vars)
            if terms is None or int(red.axis[terms[1]].dom.min) != 0:
                continue
            o, r, c, sign = terms
            axes.append(Axis(dim, o, r, c, s, q, int(op.axis[o].dom.extent),
                             int(red.axis[r].dom.extent), sign))
        outs, reds = [a.out for a in axes], [a.red for a in axes]
        alone = all(not _uses(load.args[1 + k], out_vars[a.out])
                    and not _uses(load.args[1 + k], red_vars[a.red])
                    for a in axes for k in range(len(t.shape)) if k != a.dim)
        if axes and len(set(outs)) == len(outs) == len(set(reds)) and alone:
            return Plan(y, t, tuple(axes))
    return None


def _if_then_else(expr) -> list:
    """The ``if_then_else(cond, a, b)`` calls of ``expr``."""
    import tvm

    return [c for c in nodes_of(expr, tvm.ir.expr.Call)
            if "if_then_else" in str(getattr(c.op, "name", "")) and len(c.args) == 3]


def _guarded_gathers(expr) -> list:
    """The ``if_then_else(cond, value, 0)`` terms of ``expr`` whose condition tests a
    residue ``(...) % s == 0``: a zero-inserted operand written inline."""
    import tvm

    return [c for c in _if_then_else(expr)
            if isinstance(c.args[2], (tvm.tirx.IntImm, tvm.tirx.FloatImm))
            and c.args[2].value == 0 and nodes_of(c.args[0], tvm.tirx.FloorMod)]


def _outlined(y):
    """``y`` with a zero-inserted operand written inline in its sum (``if_then_else((h + p -
    r) % s == 0 and .., dy[.., (h + p - r) // s, ..], 0)``) read from a stage of its own
    (``T[.., u, ..]`` at ``u = h - r + p``), which :func:`plan` then finds; None where there
    is none, or the term is not a function of such sums alone."""
    import tvm

    op = y.op
    red = op.body[0]
    out_vars, red_vars = [a.var for a in op.axis], [a.var for a in red.axis]
    for term in _guarded_gathers(red.source[0]):
        pairs = []  # (out axis, red axis, c, sign): per residue test, then per plain window
        sums = [m.a for m in nodes_of(term.args[0], tvm.tirx.FloorMod)]
        sums += [ix for c in nodes_of(term, tvm.ir.expr.Call) if _is_load(c) for ix in c.args[1:]]
        for found in (_linear_terms(e, out_vars, red_vars) for e in sums):
            if found is not None and found[:2] not in [p[:2] for p in pairs]:
                pairs.append(found)
        made = _gather_stage(op, term, pairs) if pairs else None
        if made is not None:
            return _reading(op, term, *made)
    return None


def _reading(op, term, stage, index):
    """Sum ``op`` with its inline term ``term`` read as ``stage[index]``."""
    from tvm import te

    red = op.body[0]
    new_red = [te.reduce_axis((r.dom.min, r.dom.min + r.dom.extent), r.var.name)
               for r in red.axis]

    def body(*ax):
        var_map = {**{a.var: x for a, x in zip(op.axis, ax)},
                   **{r.var: n.var for r, n in zip(red.axis, new_red)}}
        src = _replace(red.source[0], term, stage(*index))
        return te.sum(rewrite(src, var_map), axis=new_red)

    return te.compute(op.output(0).shape, body, name=op.name, tag=op.tag, attrs=op.attrs)


def _replace(expr, old, new):
    """``expr`` with the node ``old`` replaced by ``new``."""
    import tvm
    import tvm_ffi

    def on_call(c, m):
        return new if c.same_as(old) else m.default_mutate(c)

    return tvm_ffi.structural_mutate(expr, [(tvm.ir.expr.Call, on_call)])


def _gather_stage(op, term, pairs):
    """``(T, index)``: a stage ``T`` over the iterators ``term`` uses, each (output,
    reduction) pair of ``pairs`` merged into one axis ``u = out + sign * red + c`` (its
    values from 0), and the index that reads ``term`` back from it; None where ``term``
    depends on a pair's iterators other than through ``u`` (written with ``out = u - sign *
    red - c``, ``red`` must cancel)."""
    import tvm
    from tvm import te

    red = op.body[0]
    out_vars, red_vars = [a.var for a in op.axis], [a.var for a in red.axis]
    ext = {**{a.var: int(a.dom.extent) for a in op.axis},
           **{r.var: int(r.dom.extent) for r in red.axis}}
    if any(int(r.dom.min) != 0 for r in red.axis):
        return None
    sums = [tvm.tirx.Var(f"u{k}", "int32") for k in range(len(pairs))]
    merged = {out_vars[o]: u - sign * red_vars[r] - c for (o, r, c, sign), u in zip(pairs, sums)}
    value = tvm.sym.Analyzer().simplify(rewrite(term, merged))
    gone = [out_vars[o] for o, *_ in pairs] + [red_vars[r] for _, r, *_ in pairs]
    if any(_uses(value, v) for v in gone):
        return None
    free = sorted((v for v in [*out_vars, *red_vars] if _uses(value, v)),
                  key=lambda v: _first_use(term, v))
    lows, index = [], [*free]
    for o, r, c, sign in pairs:
        r_ext = ext[red_vars[r]]
        lows.append(c + min(0, sign * (r_ext - 1)))
        index.append(out_vars[o] + sign * red_vars[r] + c - lows[-1])
    shape = [ext[v] for v in free] + [
        ext[out_vars[o]] + ext[red_vars[r]] - 1 for o, r, *_ in pairs]

    def body(*g):
        at = {**dict(zip(free, g)), **{u: g[len(free) + k] + lo
                                       for k, (u, lo) in enumerate(zip(sums, lows))}}
        return rewrite(value, at)

    return te.compute(shape, body, name="gathered", tag=GATHERED_TAG), index


def _first_use(expr, var) -> int:
    """Position of the first tensor index of ``expr`` that uses ``var`` (loads in order)."""
    import tvm

    pos = 0
    for load in (c for c in nodes_of(expr, tvm.ir.expr.Call) if _is_load(c)):
        for ix in load.args[1:]:
            if _uses(ix, var):
                return pos
            pos += 1
    return pos


def _residue_free(expr, variables) -> bool:
    """No ``%`` or ``//`` in ``expr`` uses any of ``variables``."""
    import tvm

    ops = [*nodes_of(expr, tvm.tirx.FloorMod), *nodes_of(expr, tvm.tirx.FloorDiv)]
    return not any(_uses(o, v) for o in ops for v in variables)


def _operand(pl: Plan):
    """``P[.., m, ..]``: the operand at ``s*(m + lo) + q`` on each zero-inserted axis (its
    non-zeros only), or None where its value still depends on ``m`` by ``%`` or ``//``."""
    import tvm
    from tvm import te

    t = pl.operand
    shape, lo = list(t.shape), {}
    for a in pl.axes:
        first, last = a.span()
        shape[a.dim], lo[a.dim] = last - first + 1, first
    zero = tvm.tirx.const(0, t.dtype)

    def body(*m):
        idx, inside = list(m), []
        for a in pl.axes:
            idx[a.dim] = a.s * (m[a.dim] + lo[a.dim]) + a.q
            inside += [idx[a.dim] >= 0, idx[a.dim] < t.shape[a.dim]]
        value = te.if_then_else(te.all(*inside), value_at(t, idx), zero)
        return tvm.sym.Analyzer().simplify(value)

    p = te.compute(shape, body, name=f"{t.op.name}_compressed", tag=OPERAND_TAG)
    free = _residue_free(p.op.body[0], [p.op.axis[a.dim].var for a in pl.axes])
    return (p, lo) if free else None


def _is_zero(e) -> bool:
    """Whether ``e`` is zero whatever its variables (a zero, a choice between zeros, a
    product with a zero factor, a cast of one)."""
    import tvm

    if isinstance(e, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return e.value == 0
    if isinstance(e, tvm.tirx.Cast):
        return _is_zero(e.value)
    if isinstance(e, tvm.tirx.Mul):
        return _is_zero(e.a) or _is_zero(e.b)
    if isinstance(e, tvm.tirx.Select):
        return _is_zero(e.true_value) and _is_zero(e.false_value)
    if "if_then_else" in str(getattr(getattr(e, "op", None), "name", "")):
        return _is_zero(e.args[1]) and _is_zero(e.args[2])
    return False


def _phase_domain(op, axes, phase):
    """``(by_out, by_red, shape, reduce axes)`` of sum ``op``'s phase ``phase``: each split
    output axis ``rows(p)`` long, each split reduction axis over the phase's ``taps(p)``."""
    from tvm import te

    red = op.body[0]
    by_out = {a.out: (a, p) for a, p in zip(axes, phase)}
    by_red = {a.red: (a, p) for a, p in zip(axes, phase)}
    shape = [by_out[k][0].rows(by_out[k][1]) if k in by_out else ax.dom.extent
             for k, ax in enumerate(op.axis)]
    raxes = [te.reduce_axis((0, by_red[k][0].taps(by_red[k][1])), f"{r.var.name}_t")
             if k in by_red else te.reduce_axis((r.dom.min, r.dom.min + r.dom.extent),
                                                r.var.name)
             for k, r in enumerate(red.axis)]
    return by_out, by_red, shape, raxes


def _phase(pl: Plan, operand, lo: dict, phase: tuple[int, ...]):
    """The dense contraction of one phase: output ``[.., iq, ..]`` over taps ``t``."""
    import tvm
    from tvm import te

    op = pl.y.op
    red = op.body[0]
    by_out, by_red, shape, raxes = _phase_domain(op, pl.axes, phase)

    def load(u, idx):
        if not u.op.same_as(pl.operand.op):
            return None
        new = list(idx)
        for a in pl.axes:
            new[a.dim] = tvm.tirx.floordiv(idx[a.dim] - a.q, a.s) - lo[a.dim]
        return operand(*new)

    def body(*ax):
        var_map = {}
        for k, a in enumerate(op.axis):
            var_map[a.var] = (by_out[k][0].s * ax[k] + by_out[k][1]) if k in by_out else ax[k]
        for k, r in enumerate(red.axis):
            a, p = by_red.get(k, (None, 0))
            var_map[r.var] = raxes[k].var if a is None else a.s * raxes[k].var + a.rho(p)
        src = tvm.sym.Analyzer().simplify(rewrite(red.source[0], var_map, load))
        extents = {**{x: int(e) for x, e in zip(ax, shape)},
                   **{r.var: int(r.dom.extent) for r in raxes}}
        if all(int(r.dom.extent) == 1 for r in raxes):
            # one tap (a depthwise or pooling phase): no reduction left, a plain product
            return tvm.sym.Analyzer().simplify(
                rewrite(src, {r.var: tvm.tirx.const(0, "int32") for r in raxes}))
        return te.sum(_sliced(src, extents, suffix), axis=raxes)

    suffix = "phase_" + "_".join(str(p) for p in phase)
    return te.compute(shape, body, name=f"{op.name}_{suffix}", tag=PHASE_TAG)


def _sliced(src, extents: dict, suffix: str):
    """``src`` with each load whose indices are each a function of one iterator (distinct
    ones), not all bare (a phase's taps of the weights, ``w[.., K - 1 - (s*t + rho)]``),
    read from a stage of its own over those iterators instead: the contraction rule packs
    only operands indexed by bare iterators."""
    import tvm
    from tvm import te

    def load(u, idx):
        used = [[v for v in extents if _uses(i, v)] for i in idx]
        if any(len(vs) > 1 for vs in used) or all(isinstance(i, tvm.tirx.Var) for i in idx):
            return None
        axes = [vs[0] for vs in used if vs]
        if len(axes) != len(set(axes)):
            return None
        stage = te.compute([extents[v] for v in axes], lambda *g: u(*(
            rewrite(i, dict(zip(axes, g))) for i in idx)), name=f"{u.op.name}_{suffix}",
            tag=SLICE_TAG)
        return stage(*axes)

    return rewrite(src, {}, load)


def _assemble(pl: Plan, phases: dict):
    """The output: each position from its phase's contraction (zero for a phase without
    taps), the user's name, tag and attributes kept."""
    import itertools

    import tvm
    from tvm import te

    op = pl.y.op
    zero = tvm.tirx.const(0, pl.y.dtype)

    def value(ax, phase):
        t = phases.get(phase)
        if t is None:
            return zero
        idx = list(ax)
        for a in pl.axes:
            idx[a.out] = tvm.tirx.floordiv(ax[a.out], a.s)
        return t(*idx)

    def body(*ax):
        choices = list(itertools.product(*(range(a.s) for a in pl.axes)))
        out = value(ax, choices[-1])
        for phase in reversed(choices[:-1]):
            test = te.all(*(tvm.tirx.floormod(ax[a.out], a.s) == p
                            for a, p in zip(pl.axes, phase)))
            out = te.if_then_else(test, value(ax, phase), out)
        return out

    return te.compute(pl.y.shape, body, name=op.name, tag=op.tag or ASSEMBLE_TAG,
                      attrs=op.attrs)


def split(y):
    """``y`` split into stride phases (see the module docstring), or None where it is not
    a sum over a zero-inserted operand or the split does not come out exact."""
    import itertools

    pl = plan(y)
    if pl is None:
        inline = _outlined(y)
        pl = plan(inline) if inline is not None else None
    made = _operand(pl) if pl is not None else None
    if made is None:
        direct = _direct(y)
        return direct if direct is not None else _expand_guarded(y)
    if not _zero_off_residue(pl.y, pl.axes, pl.operand):
        return None
    operand, lo = made
    phases = {}
    for phase in itertools.product(*(range(a.s) for a in pl.axes)):
        if all(a.taps(p) and a.rows(p) for a, p in zip(pl.axes, phase)):
            t = _phase(pl, operand, lo, phase)
            if not _residue_free(t.op.body[0], [a.var for a in t.op.axis]):
                return None
            phases[phase] = t
    return _assemble(pl, phases)


def _residue_axes(y) -> tuple[Axis, ...]:
    """The axes of a sum whose guarded gathers test ``(out + sign * red + c) % s == 0`` on
    an (output, reduction) pair, one pair an axis (as :class:`Axis` with ``q = 0``; ``dim``
    unused); empty where the tests name no such pairs or a pair twice."""
    import tvm

    op = y.op
    red = op.body[0]
    out_vars, red_vars = [a.var for a in op.axis], [a.var for a in red.axis]
    axes: dict = {}
    for term in _guarded_gathers(red.source[0]):
        for mod in nodes_of(term.args[0], tvm.tirx.FloorMod):
            found = _linear_terms(mod.a, out_vars, red_vars)
            if found is None or not isinstance(mod.b, tvm.tirx.IntImm) or mod.b.value < 2:
                continue
            o, r, c, sign = found
            a = Axis(len(axes), o, r, c, int(mod.b.value), 0, int(op.axis[o].dom.extent),
                     int(red.axis[r].dom.extent), sign)
            if axes.setdefault((o, r), a) != a:
                return ()
    pairs = list(axes)
    if len({o for o, _ in pairs}) != len(pairs) or len({r for _, r in pairs}) != len(pairs):
        return ()
    return tuple(axes.values())


def _at_phase(y, axes, phase, taps, tap_vars, operand=None):
    """The summand of sum ``y`` at output phase ``phase`` (``out = s*oq + p``) along each
    axis of ``axes`` with its reduction iterator at ``s*t + taps[k]`` (``t`` from
    ``tap_vars``), simplified: a function of ``oq`` and ``t`` (and of the iterators of
    axes not in ``axes``). ``operand``: a stage whose value is inlined (the zero-inserted
    one), so its zeros show."""
    import tvm

    op = y.op
    red = op.body[0]
    var_map = {}
    for a, p, rho, t in zip(axes, phase, taps, tap_vars):
        var_map[op.axis[a.out].var] = a.s * op.axis[a.out].var + p
        var_map[red.axis[a.red].var] = a.s * t + rho

    def load(u, idx):
        return value_at(u, idx) if operand is not None and u.op.same_as(operand.op) else None

    return tvm.sym.Analyzer().simplify(rewrite(red.source[0], var_map, load))


def _zero_off_residue(y, axes, operand=None) -> bool:
    """Whether the summand of sum ``y`` is provably zero wherever one axis's tap is off its
    phase's residue (``red`` not at ``s*t + rho(p)``), whatever the other axes hold: only
    then may a phase skip those taps. A term added outside the zero-inserted product is
    not. One axis at a time (``s*s`` substitutions each, not ``s**(2d)``)."""
    import tvm

    t = tvm.tirx.Var("t", "int32")
    for a in axes:
        for p in range(a.s):
            for off in range(a.s):
                if off != a.rho(p) and not _is_zero(_at_phase(y, [a], [p], [off], [t],
                                                              operand)):
                    return False
    return True


def _direct(y):
    """The phase split of a sum whose summand gathers at ``(out + sign * red + c) // s``
    under a residue test and reads other operands at the output position itself (a max
    pool's gradient: ``dy`` and ``y`` gathered, ``x[.., i, j]`` compared with ``y``), which
    :func:`_outlined` cannot put in a stage over ``u`` alone: each phase's taps substituted
    straight into the summand, which must then be provably zero at every tap off the
    phase's residue and free of ``%`` and ``//`` of the phase's iterators. None otherwise."""
    import itertools

    op = y.op
    axes = _residue_axes(y) if op.num_outputs == 1 and _is_sum(op.body[0]) else ()
    if not axes or any(int(r.dom.min) != 0 for r in op.body[0].axis):
        return None
    if not _zero_off_residue(y, axes):
        return None
    phases = {}
    for phase in itertools.product(*(range(a.s) for a in axes)):
        if all(a.taps(p) and a.rows(p) for a, p in zip(axes, phase)):
            t = _direct_phase(y, axes, phase)
            if not _residue_free(t.op.body[0], [a.var for a in t.op.axis]):
                return None
            phases[phase] = t
    return _assemble(Plan(y, None, axes), phases)


def _direct_phase(y, axes, phase):
    """One phase of :func:`_direct`: output ``[.., oq, ..]`` over its taps ``t`` (no
    reduction where each axis has one tap)."""
    import tvm
    from tvm import te

    op = y.op
    red = op.body[0]
    _, by_red, shape, raxes = _phase_domain(op, axes, phase)

    def body(*ax):
        src = _at_phase(y, axes, phase, [a.rho(p) for a, p in zip(axes, phase)],
                        [raxes[a.red].var for a in axes])
        var_map = {**{a.var: x for a, x in zip(op.axis, ax)},
                   **{r.var: n.var for k, (r, n) in enumerate(zip(red.axis, raxes))
                      if k not in by_red}}
        src = tvm.sym.Analyzer().simplify(rewrite(src, var_map))
        if product(int(r.dom.extent) for r in raxes) > EXPAND_TAPS:
            return te.sum(src, axis=raxes)
        return _expanded(src, raxes)

    suffix = "phase_" + "_".join(str(p) for p in phase)
    return te.compute(shape, body, name=f"{op.name}_{suffix}", tag=PHASE_TAG)


def _expanded(src, raxes):
    """``sum(src)`` over the few steps of ``raxes`` written out term by term: an injective
    value, which the interleave computes in place."""
    import itertools

    import tvm

    total = None
    for steps in itertools.product(*(range(int(r.dom.extent)) for r in raxes)):
        term = tvm.sym.Analyzer().simplify(rewrite(src, {
            r.var: tvm.tirx.const(k, "int32") for r, k in zip(raxes, steps)}))
        total = term if total is None else total + term
    return total


def _guarded_by(expr, variables) -> bool:
    """Whether ``expr`` holds an ``if_then_else`` whose condition tests one of
    ``variables``."""
    return any(_uses(c.args[0], v) for c in _if_then_else(expr) for v in variables)


def _expand_guarded(y):
    """A sum of at most :data:`EXPAND_TAPS` steps whose summand reads under a test of its
    reduction iterators (a stride-1 max pool's gradient: ``dy[.., i + p - r]`` where it is
    in bounds and ``x`` equals the window's maximum), which no phase splits: written out
    term by term, an injective stage. None for anything else."""
    from tvm import te

    op = y.op
    red = op.body[0] if op.num_outputs == 1 else None
    if red is None or not _is_sum(red) or any(int(r.dom.min) != 0 for r in red.axis) or \
            product(int(r.dom.extent) for r in red.axis) > EXPAND_TAPS or \
            not _guarded_by(red.source[0], [r.var for r in red.axis]):
        return None

    def body(*ax):
        src = rewrite(red.source[0], {a.var: x for a, x in zip(op.axis, ax)})
        return _expanded(src, red.axis)

    return te.compute(op.output(0).shape, body, name=op.name, tag=op.tag, attrs=op.attrs)


def _computes(tensors) -> list:
    """Every compute ``tensors`` reach, producers first."""
    from tvm import te

    seen, order = set(), []

    def visit(op):
        if op in seen:
            return
        seen.add(op)
        for t in op.input_tensors:
            visit(t.op)
        if isinstance(op, te.ComputeOp):
            order.append(op)

    for t in tensors:
        visit(t.op)
    return order


def _rebuilt(op, new: dict):
    """Injective stage ``op`` reading the replaced stages ``new`` (op -> tensor) instead."""
    from tvm import te

    def body(*ax):
        var_map = {a.var: x for a, x in zip(op.axis, ax)}
        return rewrite(op.body[0], var_map, lambda u, idx: new[u.op](*idx)
                       if u.op in new else None)

    return te.compute(op.output(0).shape, body, name=op.name, tag=op.tag, attrs=op.attrs)


def split_phases(tensors: list) -> list:
    """``tensors`` (a kernel's arguments) with each sum over a zero-inserted operand replaced
    by its phase split (:func:`split`) and the injective stages after it rebuilt to read
    the split; a sum that a reduction reads downstream is left whole."""
    ops = _computes(tensors)
    users: dict = {}
    for op in ops:
        for t in op.input_tensors:
            users.setdefault(t.op, []).append(op)

    known: dict = {}

    def injective_after(op) -> bool:
        if op not in known:
            known[op] = all(_injective(u.output(0)) and injective_after(u)
                            for u in users.get(op, ()))
        return known[op]

    new: dict = {}
    for op in ops:
        if op.num_outputs != 1:
            continue
        if any(t.op in new for t in op.input_tensors):
            new[op] = _rebuilt(op, new)
        elif not _injective(op.output(0)) and injective_after(op):
            made = split(op.output(0))
            if made is not None:
                new[op] = made
    return [new.get(t.op, t) if t.op.num_outputs == 1 else t for t in tensors]


# The most phases an interleaved axis may have where some load also reads it bare.
MIXED_MAX = 4


def interleaved(f) -> dict[str, int]:
    """``{iterator: s}`` where a load of injective block ``f`` reads that iterator as ``v //
    s`` (and ``v % s``; one ``s`` per iterator): the stage interleaves ``s`` phases along it
    (the assembly of :func:`split`, a pixel shuffle, a nearest upsample). Where other loads
    read ``v`` bare (a max-pool's gradient, ``dy[.., i // 2, j // 2]`` where ``x[.., i, j]``
    is the maximum), only for ``s <=`` :data:`MIXED_MAX`: each phase's bare reads become
    strided loads, which LLVM groups into whole loads and shuffles for a few phases, not
    for sixteen. Empty when it does not."""
    import tvm

    found: dict[str, int] = {}
    for acc in f.reads:
        for ix in acc.indices:
            for div in nodes_of(ix, tvm.tirx.FloorDiv):
                if isinstance(div.a, tvm.tirx.Var) and isinstance(div.b, tvm.tirx.IntImm):
                    found.setdefault(div.a.name, int(div.b.value))
    return {v: s for v, s in found.items() if v in f.spatial and s > 1
            and (v not in bare_reads(f) or s <= MIXED_MAX)}


def bare_reads(f) -> set[str]:
    """The iterators some load of block ``f`` reads bare (``x[.., v]``)."""
    return {v for acc in f.reads for ix, names in zip(acc.indices, acc.index_vars)
            for v in names if str(ix) == v}


def schedule_interleave(sch, name: str, facts: dict, target) -> str:
    """Each interleaved iterator split by its ``s``, the phase loop unrolled right inside
    its quotient: once unrolled, each phase's ``v % s`` is a constant and its select folds
    away, so the body is one plain copy per phase (``y[.., s*vq + p] = phase[.., vq]``).
    Along the innermost axis the quotient loop stays serial for LLVM, whose vectoriser
    turns such a group of strided stores into shuffles and whole stores; along an outer
    axis the innermost is vectorised as usual."""
    from schedules.patterns.common import extent, parallel_loops, product, vectorize_tail

    f = facts[name]
    axes = interleaved(f)
    blk = sch.get_sblock(name)
    loops = sch.get_loops(blk)
    elems = product(extent(sch, lp) for lp in loops)
    by_var = dict(zip(f.spatial, loops))
    for v, s in axes.items():
        _, phase = sch.split(by_var[v], [None, s])
        sch.unroll(phase)
    # each split before it adds one loop, so the outermost one's quotient keeps its place
    first = min(f.spatial.index(v) for v in axes)
    loops = sch.get_loops(blk)
    inner = f.spatial[-1]
    if inner not in axes:
        vectorize_tail(sch, [loops[-1]], target, f.out_dtype)
    # the loops outside the first phase loop run across cores; the innermost axis's
    # quotient loop stays LLVM's to vectorise
    prefix = first if f.spatial[first] == inner else first + 1
    par = list(loops[:prefix])
    nxt = _next_quotient(f, axes, first, inner)
    if nxt is not None and target.cores > 1:
        # one image of 112 rows is 56 row-pair tasks: too few for 48 cores, so the next
        # interleaved axis's quotient joins them, above the first one's phase loop
        quot = loops[prefix + 1]
        sizes = [product(extent(sch, lp) for lp in par), extent(sch, quot)]
        if lead_loops(sizes, target.cores, least=1) == 2:
            sch.reorder(quot, loops[prefix])
            par.append(quot)
    parallel_loops(sch, par, target, elems)
    return f"{' x '.join(f'{s} phases along {v}' for v, s in axes.items())}, unrolled"


def _next_quotient(f, axes: dict, first: int, inner: str) -> str | None:
    """The interleaved iterator right after the first one (its quotient loop just below the
    first one's phase loop), where it is not the innermost axis; else None."""
    nxt = f.spatial[first + 1] if first + 1 < len(f.spatial) else None
    return nxt if nxt in axes and nxt != inner and f.spatial[first] != inner else None
