"""Injective stages: elementwise chains inlined, broadcasts, padding and layout stages.

Every non-output stage whose iterators are all spatial is inlined into its consumers (one
pass over memory instead of one per stage), except a stage read by a contraction: there it
would be recomputed once per register tile, so it is materialised once instead, and a stage
calling a math function (``exp``) that a reduction and another stage both read (softmax),
which the row rule computes once per row. What
remains (the outputs, and stages before a contraction) is vectorised along its innermost
(contiguous) axis, trailing axes fused until a vector fills, and the outer axes run
across cores.
"""

from __future__ import annotations

from schedules.patterns.common import extent, parallel_loops, product, vector_width, vectorize_tail


def inline_stages(sch, facts: dict, outputs: set, workload) -> list[str]:
    """Inline every injective non-output stage not feeding a contraction; return the names
    kept (materialised)."""
    from schedules.patterns.analysis import consumers_of

    kept = []
    for name, f in facts.items():
        if not f.injective or name in outputs:
            continue
        users = consumers_of(facts, name)
        if any(facts[u].kind == "contraction" or getattr(facts[u], "extra_where", "") ==
               "window" for u in users):
            kept.append(name)
            continue
        if f.costly and len(users) > 1 and any(facts[u].reduce for u in users):
            # softmax's exp: read by the sum and by the divide; computed once per row instead
            kept.append(name)
            continue
        try:
            sch.compute_inline(sch.get_sblock(name))
        except Exception:  # noqa: BLE001 - TVM refuses (e.g. a reduction reads it twice)
            kept.append(name)
            continue
        workload.note(name, "patterns.inline",
                      f"{f.kind} stage ({f.why}) inlined into {', '.join(users) or 'its user'}")
    return kept


def schedule_injective(sch, name: str, target) -> None:
    """Vectorise the contiguous axis, run the outer axes across cores."""
    blk = sch.get_sblock(name)
    loops = sch.get_loops(blk)
    dtype = str(sch.get(blk).body.buffer.dtype)
    elems = product(extent(sch, lp) for lp in loops)
    lanes = target.lanes(dtype)
    # trailing loops fused until one vector (two when long) fits
    n_tail, inner = 0, 1
    while n_tail < len(loops) and inner < 2 * lanes:
        n_tail += 1
        inner *= extent(sch, loops[-n_tail])
    if n_tail > 1 and extent(sch, loops[-1]) >= vector_width(target, dtype, 1 << 30):
        n_tail = 1
    outer = list(loops[:-n_tail]) if n_tail else list(loops)
    rest = vectorize_tail(sch, list(loops[len(loops) - n_tail:]), target, dtype)
    # the outer part of the vector axis joins the parallel loop when the rows are few
    par = outer + ([rest] if rest is not None and product(
        extent(sch, lp) for lp in outer) < 4 * target.cores else [])
    parallel_loops(sch, par, target, elems)
