"""Schedules of the exact fallbacks (:mod:`dsl.ops.fallback`), shared by the operator rules.

The scans are small next to the operators (a weight, or one pass over dy or x): partial flags
with their lanes vectorised and their first axis across cores. The exact twins run only for a
non-finite input (:mod:`dsl.runtime.run_if`): kept simple, every position but the innermost
across cores, and separate from the fast tiles.

A rule that changes the layout of a fast reduction's buffer (``transform_layout``) changes its
twin's the same way (:func:`twin_block`): the readers take the twin's values at the indices
they read the fast buffer at.
"""

from __future__ import annotations

from dsl.ops import tag
from schedules import toolbox as tb


def schedule_fallbacks(sch, workload, op: str, rule: str) -> None:
    """Schedule operator ``op``'s ``nonfinite`` scans and ``exact`` twins under ``rule``."""
    cores = workload.target.cores
    for block in workload.find_all(sch, tag.stage(op, "nonfinite")):
        spatial, red = tb.split_loops(sch, block)
        name = sch.get(block).name_hint
        if len(spatial) >= 2 and red:  # a partial [*P, L]
            *lead, lane = spatial
            sch.reorder(*lead, *red, lane)
            sch.vectorize(lane)
            tb.parallel(sch, lead, cores)
            sch.decompose_reduction(block, red[0])
            workload.note(name, rule, "scan for NaN / inf: lanes vectorised, rows across cores")
        else:
            workload.note(name, rule, "scan for NaN / inf: the flag")
    for block in workload.find_all(sch, tag.stage(op, "exact")):
        name = sch.get(block).name_hint  # decompose_reduction renames it
        spatial, red = tb.split_loops(sch, block)
        # the innermost axis (contiguous in the operands of every twin) in vector lanes
        # inside the taps: explicit vector code rather than loops left to LLVM's vectoriser
        lane = spatial[-1] if len(spatial) > 1 and red and tb.extent(sch, spatial[-1]) <= 64 \
            else None
        if lane is not None:
            sch.reorder(*spatial[:-1], *red, lane)
            sch.vectorize(lane)
        tb.parallel(sch, spatial[:-1] or spatial, cores)
        if lane is not None:
            sch.decompose_reduction(block, red[0])
        workload.note(name, rule,
                      "exact fallback, run only for a NaN / inf input: positions across cores"
                      + (", the innermost in vector lanes" if lane is not None else ""))


def twin_block(sch, block):
    """The exact twin of the fast reduction ``block`` (:mod:`dsl.ops.fallback`), or None."""
    ann = sch.get(block).annotations
    if tag.EXACT_TWIN not in ann:
        return None
    name = str(ann[tag.EXACT_TWIN])
    return next(b for b in tb.root_blocks(sch) if sch.get(b).name_hint in (name, f"{name}_update"))
