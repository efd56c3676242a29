"""Fusion of a user's elementwise stages into a shipped operator's schedule (as TBE's cube +
vector fusion does).

A kernel may hold more than the operator: an *epilogue* after its output stage (bias,
residual add, activation-gradient mask, scale, a cast to fp16) and a *prologue* before its
first stages (a cast or scale of ``dy``). Before the operator's rule runs:

* every injective stage that reads an operator stage is ``reverse_compute_inline``-d into it
  (repeatedly, so a chain of them collapses): the operator's output block then writes the
  epilogue's result, and the rule, which schedules that block inside its output tile, fuses
  it for free;
* every injective stage that an operator stage reads is ``compute_inline``-d into its
  consumers when they are all elementwise (the operator's own pack / pad / cast stage), so
  that stage reads ``dy`` through it. A prologue read straight by a reduction is not inlined
  (it would be recomputed, an fp16 -> fp32 conversion included, for every tap that reads
  it: 4-5x slower for dw); it is materialised once by the elementwise rule instead;
* every other injective user stage whose consumers are all elementwise (the ``fwd > 0`` mask
  of a ReLU-gradient select) is ``compute_inline``-d into them first, so that the epilogue
  stage reading it then reads only the operator and kernel inputs and fuses as above.

A rule that keeps its output tile in registers may then call :func:`write_from_tile`: the
operator's output block, epilogue included, is inlined into the tile's write-back, so the
result goes out straight from the registers instead of through the accumulator buffer.

Where TVM refuses an inline (the operator's output is itself a kernel output, the stage reads
the operator at another index, it is a reduction), the stage stays; after the rule,
:func:`schedule_leftovers` gives it the elementwise rule (vectorised innermost axis, parallel
outer loops) or, for a reduction, the generic one. Nothing is left unscheduled, and no inline
changes what is computed (TVM checks each one).

Operator stages are told apart by tag: those whose tag belongs to the anchor's operator
(:func:`dsl.ops.tag.op_of`); every other block of the kernel is the user's.
"""

from __future__ import annotations

from dsl.ops import tag
from schedules import toolbox as tb

RULE = "fusion"


def operator_blocks(workload) -> set[str]:
    """Names of the blocks that belong to the anchor's operator."""
    op = tag.op_of(workload.anchor_tag)
    return {name for t, names in workload.stages.items() if tag.op_of(t) == op
            for name in names}


def _is_spatial(sch, block) -> bool:
    return tb.spatial_count(sch, block) == len(sch.get(block).iter_vars)


def _try_inline(sch, block, own: set[str], workload) -> bool:
    """Inline one user block next to the operator; True if the schedule changed."""
    import tvm

    name = sch.get(block).name_hint
    producers = [sch.get(b).name_hint for b in sch.get_producers(block)]
    consumers = [sch.get(b).name_hint for b in sch.get_consumers(block)]
    into = [p for p in producers if p in own]
    try:
        if into:
            sch.reverse_compute_inline(block)
            workload.note(name, RULE, f"epilogue fused into {into[0]}")
            return True
        into = [c for c in consumers if c in own]
        # into a reduction it would be recomputed for every tap: materialise it once instead
        elementwise_consumers = consumers and all(
            _is_spatial(sch, b) for b in sch.get_consumers(block))
        if into and elementwise_consumers:
            sch.compute_inline(block)
            workload.note(name, RULE, f"prologue inlined into {', '.join(into)}")
            return True
        if elementwise_consumers and not into and not any(p in own for p in producers):
            # a user stage beside the epilogue (a mask ``fwd > 0`` that a select reads):
            # inlined into its consumer, so that consumer reads only the operator and kernel
            # inputs and can then be fused into the operator's output block
            sch.compute_inline(block)
            workload.note(name, RULE, f"inlined into {', '.join(consumers)}, then fused")
            return True
    except tvm.s_tir.ScheduleError:
        pass
    return False


def fuse_into_operator(sch, workload) -> list[str]:
    """Inline the user's injective stages around the operator (see the module docstring);
    returns the names of the user's blocks that remain, for :func:`schedule_leftovers`."""
    own = operator_blocks(workload)
    if not own:
        return []
    changed = True
    while changed:
        changed = False
        failed: set[str] = set()  # retried after any inline: it may have made them legal
        for block in tb.root_blocks(sch):
            name = sch.get(block).name_hint
            if name in own or name in failed or not _is_spatial(sch, block):
                continue
            if _try_inline(sch, block, own, workload):
                changed = True
                break  # block handles are stale after an inline
            failed.add(name)
    return [sch.get(b).name_hint for b in tb.root_blocks(sch)
            if sch.get(b).name_hint not in own]


def schedule_leftovers(sch, workload, names: list[str]) -> None:
    """The elementwise rule for the user's stages that could not be inlined (the generic one
    for a reduction): never an unscheduled stage."""
    for name in names:
        block = sch.get_sblock(name)
        if not sch.get_loops(block):
            continue
        if _is_spatial(sch, block):
            tb.elementwise(sch, block, workload.target)
            workload.note(name, RULE, "not inlinable: elementwise rule (vector lanes, parallel)")
        else:
            tb.vectorize_inner(sch, block)
            tb.parallel_outer(sch, block)
            workload.note(name, RULE, "not inlinable reduction: generic rule")


def write_from_tile(sch, workload, write_back, output, rule: str = RULE) -> bool:
    """Inline the operator's output block ``output`` (with any epilogue fused into it) into the
    register tile's ``write_back`` block, so the tile's accumulators are cast, masked and
    combined with the epilogue's other inputs on their way out, with no round trip through
    the accumulator buffer. Only possible when ``output`` reads that buffer at its own
    index (one stride phase); returns False, changing nothing, when TVM refuses. ``rule``
    is the label the decision is noted under (the calling operator rule's)."""
    import tvm

    name = sch.get(output).name_hint
    try:
        sch.reverse_compute_inline(output)
    except tvm.s_tir.ScheduleError:
        return False
    workload.note(name, rule, f"written from the register tile ({sch.get(write_back).name_hint})")
    return True
