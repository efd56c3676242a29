"""Pattern rules: schedule any TE graph by what each stage *is* (dlight-style).

``schedule_patterns`` is what :func:`schedules.generic.schedule_generic` runs for a graph no
operator rule claims. It classifies every block from its TIR structure
(:mod:`schedules.patterns.analysis`; tags are not needed, users write plain ``te.compute``),
inlines injective stages into their consumers (:func:`~schedules.patterns.injective.
inline_stages`), then offers each remaining block to the rules of :data:`RULES` in order;
the first rule that matches it *and* applies cleanly (tried on a copy of the schedule first)
schedules it. A block no rule takes gets the old generic treatment (vectorise the innermost
loop, parallel outer loops), which is always correct, and a warning, once per pattern.

Every decision is recorded with ``workload.note(stage, rule, why)``; ``dsl.explain`` prints
them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from schedules.patterns import (  # noqa: F401
    column_group,
    contraction,
    fastmath,
    injective,
    phases,
    reduction,
    transpose,
    window,
)
from schedules.patterns.analysis import all_facts, consumers_of, output_blocks
from schedules.patterns.common import attempt, product

GENERIC = "generic.last_resort"


@dataclass(frozen=True)
class PatternRule:
    """One rule: ``match(facts, name, outputs) -> (blocks, why) | None``, then
    ``apply(sch, blocks, facts, target)`` (it may return a detail for the note);
    ``when(target)`` gates it per target."""

    name: str
    match: object
    apply: object
    when: object = staticmethod(lambda target: target.vector_bits >= 128)


def _epilogue(facts, name, outputs):
    users = consumers_of(facts, name)
    if name in outputs or len(users) != 1:
        return None
    u = facts[users[0]]
    if u.kind not in ("elementwise", "broadcast"):
        return None
    return users[0]


def _match_contraction_epilogue(facts, name, outputs):
    f = facts[name]
    if f.kind != "contraction":
        return None
    epi = _epilogue(facts, name, outputs)
    if epi is None:
        return None
    return [name, epi], (f"{f.why}; the {facts[epi].kind} consumer {epi} is fused into the "
                         "register tile's write-back")


def _match_contraction(facts, name, outputs):
    f = facts[name]
    return ([name], f.why) if f.kind == "contraction" else None


def _apply_contraction(sch, names, facts, target):
    return contraction.schedule_contraction(sch, names[0], facts, target,
                                     epilogue=names[1] if len(names) > 1 else None)


def _row_reductions(facts, name, outputs=()):
    """Reduction blocks an injective stage reads, closed over reductions reading them (and
    over the materialised injective stages between them, softmax's exp)."""
    by_buf = {f.out_buffer: n for n, f in facts.items()}
    group, todo = [], [name]
    while todo:
        for acc in facts[todo.pop()].reads:
            src = by_buf.get(acc.buffer)
            if src is None or src in group or src in outputs:
                continue
            if facts[src].kind == "reduction" or (facts[src].injective and any(
                    facts[n].kind == "reduction" for n in group + [name])):
                group.append(src)
                todo.append(src)
    order = list(facts)
    return sorted(group, key=order.index)


def _match_row_group(facts, name, outputs):
    f = facts[name]
    if not f.injective or any(facts[u].reduce for u in consumers_of(facts, name)):
        return None  # the group is matched at its last stage (softmax's divide, not its exp)
    group = _row_reductions(facts, name, outputs)
    reds = [r for r in group if facts[r].kind == "reduction"]
    if not reds or any(getattr(facts[r], "extra_where", "") != "innermost" for r in reds):
        return None
    reds = group
    return [*reds, name], (f"reductions {reds} over the innermost axis feed {name} per row: "
                           "rows across cores, each reduction computed at its row "
                           "(rfactor-vectorised), the consumer fused in")


def _match_column_group(facts, name, outputs):
    f = facts[name]
    if not f.injective or any(facts[u].reduce for u in consumers_of(facts, name)):
        return None
    group = _row_reductions(facts, name, outputs)
    reds = [r for r in group if facts[r].kind == "reduction"]
    if not reds or any(getattr(facts[r], "extra_where", "") != "outer" for r in reds):
        return None
    axes = column_group.column_axes(facts, name, group)
    if axes is None:
        return None
    return [*group, name], (f"reductions {reds} over {', '.join(axes[0])} feed {name}, "
                            f"broadcast along it: per task a block of "
                            f"{', '.join(axes[0])} x {axes[1][-1]}, the consumer fused in")


def _apply_column_group(sch, names, facts, target):
    return column_group.schedule_column_group(sch, names[-1], names[:-1], facts, target)


def _apply_row_group(sch, names, facts, target):
    return reduction.schedule_row_group(sch, names[-1], names[:-1], facts, target)


def _match_reduction(where):
    def match(facts, name, outputs):
        f = facts[name]
        if f.kind not in ("reduction", "contraction"):
            return None
        # a window reduction the window rule refused is vectorised along its output
        found = getattr(f, "extra_where", "")
        if f.kind == "reduction" and found != where and (found, where) != ("window", "outer"):
            return None
        how = ("rows across cores" if where == "innermost"
               else "vectors along the contiguous output axis")
        return [name], f"{f.why}: {how}"
    return match


def _match_tap_sums(facts, name, outputs):
    """A window reduction into the window's taps (a depthwise weight gradient): a few taps,
    a reduction longer than the output, and every read contiguous along the reduction's
    innermost iterator (NCHW) or along the output's innermost axis, the channels (NHWC)."""
    from schedules.patterns.analysis import stride_in

    f = facts[name]
    if not _window(f) or not f.reads:
        return None
    taps = reduction.tap_axes(f)
    n_taps = product(f.extents[v] for v in taps)
    if not taps or n_taps > reduction.MAX_TAPS or \
            product(f.extents[v] for v in f.reduce) <= product(f.extents[v] for v in f.spatial):
        return None
    along = reduction.tap_lanes_axis(f)
    # along a reduction iterator, a strided read is re-laid by phase (a stride-2 dw)
    steps = (1, 2, 3) if along in f.reduce else (1,)
    if along is None or not all(acc.indices and stride_in(acc.indices[-1], along) in steps
                                for acc in f.reads):
        return None
    return [name], (f"{f.why}: the {n_taps} taps {taps} of a sum, every read contiguous "
                    f"along {along}")


def _window(f) -> bool:
    return f.kind == "reduction" and getattr(f, "extra_where", "") == "window"


def _match_window_epilogue(facts, name, outputs):
    epi = _epilogue(facts, name, outputs) if _window(facts[name]) else None
    if epi is None:
        return None
    return [name, epi], (f"{facts[name].why}, windowed along the output's innermost axis; "
                         f"the {facts[epi].kind} consumer {epi} is fused into the tile's "
                         "write-back")


def _match_window(facts, name, outputs):
    f = facts[name]
    if not _window(f):
        return None
    return [name], (f"{f.why}, windowed along the output's innermost axis (a depthwise "
                    "convolution or a window sum)")


def _apply_window(sch, names, facts, target):
    return window.schedule_window(sch, names[0], facts, target,
                                  epilogue=names[1] if len(names) > 1 else None)


def _match_interleave(facts, name, outputs):
    """Several stages interleaved along some axes (the phases of :mod:`.phases`), or one
    spread along the output's innermost axis (``x[.., j // s]``: a nearest upsample, a pixel
    shuffle, a max-pool's gradient beside the bare reads of its input); a stage that reads
    ``v // s`` only along outer axes gains nothing over the plain injective rule, nor does
    one that also reads them bare."""
    f = facts[name]
    axes = phases.interleaved(f) if f.injective else {}
    inner = f.spatial[-1] in axes
    mixed = bool(set(axes) & phases.bare_reads(f))
    if not axes or ((len(f.reads) < 2 or mixed) and not inner):
        return None
    what = ("spreads inputs beside bare reads of the same axes" if mixed else
            f"interleaves {len(f.reads)} stages" if len(f.reads) > 1 else "spreads its input")
    return [name], f"{f.kind}: {what}, read at v // s along {', '.join(axes)}"


def _match_injective(facts, name, outputs):
    f = facts[name]
    if not f.injective:
        return None
    kept = "" if name in outputs else " (materialised: a contraction reads it)"
    return [name], f"{f.kind}: {f.why}{kept}; vectorised along the contiguous axis"


def _match_transpose(facts, name, outputs):
    i = transpose.transposed_axis(facts[name])
    if i is None:
        return None
    return [name], (f"{facts[name].why}: stored along {facts[name].spatial[-1]}, read along "
                    f"{i}")


RULES = (
    PatternRule("patterns.contraction+epilogue", _match_contraction_epilogue,
                _apply_contraction),
    PatternRule("patterns.contraction", _match_contraction, _apply_contraction),
    PatternRule("patterns.row_reduction", _match_row_group, _apply_row_group),
    PatternRule("patterns.column_group", _match_column_group, _apply_column_group),
    PatternRule("patterns.tap_sums", _match_tap_sums,
                lambda sch, n, facts, t: reduction.schedule_tap_sums(sch, n[0], facts, t)),
    PatternRule("patterns.window+epilogue", _match_window_epilogue, _apply_window),
    PatternRule("patterns.window", _match_window, _apply_window),
    PatternRule("patterns.inner_reduction", _match_reduction("innermost"),
                lambda sch, n, facts, t: reduction.schedule_inner_reduction(sch, n[0], facts,
                                                                            t)),
    PatternRule("patterns.outer_reduction", _match_reduction("outer"),
                lambda sch, n, facts, t: reduction.schedule_outer_reduction(sch, n[0], facts,
                                                                            t)),
    PatternRule("patterns.interleave", _match_interleave,
                lambda sch, n, facts, t: phases.schedule_interleave(sch, n[0], facts, t)),
    PatternRule("patterns.transpose", _match_transpose,
                lambda sch, n, facts, t: transpose.schedule_transpose(sch, n[0], facts, t)),
    PatternRule("patterns.injective", _match_injective,
                lambda sch, n, facts, t: injective.schedule_injective(sch, n[0], t)),
)

_WARNED: set = set()


def schedule_patterns(sch, workload, last_resort) -> None:
    """Schedule every block of ``sch`` by pattern; ``last_resort(sch, block)`` takes the rest.
    """
    target = workload.target
    facts = all_facts(sch)
    outputs = output_blocks(sch)
    injective.inline_stages(sch, facts, outputs, workload)
    facts = all_facts(sch)
    done: set[str] = set()
    for rule in RULES:
        if not rule.when(target):
            continue
        for name in list(facts):
            if name in done:
                continue
            claim = rule.match(facts, name, outputs)
            if claim is None or any(n in done for n in claim[0]):
                continue
            names, why = claim
            ok, detail = attempt(sch, rule.apply, names, facts, target)
            if ok:
                done.update(names)
                for n in names:
                    workload.note(n, rule.name, f"{why}; {detail}" if detail else why)
                for n in getattr(detail, "also", ()):
                    done.add(n)
                    workload.note(n, rule.name, f"{facts[n].kind} ({facts[n].why}): computed "
                                  f"inside {names[0]}'s loops")
    for name, f in facts.items():
        if name in done:
            continue
        last_resort(sch, sch.get_sblock(name))
        why = f"not recognised as any pattern rule's stage ({f.kind}: {f.why})"
        workload.note(name, GENERIC, why)
        key = (f.kind, f.why)
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(f"stage '{name}' fell to the generic schedule: {why}; expect it "
                          "to run far below the machine's speed", stacklevel=3)
