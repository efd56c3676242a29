"""The fallback for graphs no operator rule claims: pattern rules, then the last resort.

:func:`schedule_generic` schedules each stage by what it is (elementwise, broadcast,
reduction, contraction; :mod:`schedules.patterns`). A stage no pattern rule takes gets
:func:`schedule_block_generic` (parallel outer loops, vectorised elementwise stages): it
changes no computation order inside a reduction, so it is valid for any compute.
"""

from __future__ import annotations

# the helpers live in the toolbox; imported here too so older imports keep working
from schedules.toolbox import parallel_outer, spatial_count, vectorize_inner  # noqa: F401


def schedule_block_generic(sch, block) -> None:
    """The always-correct last resort for one block."""
    vectorize_inner(sch, block)
    parallel_outer(sch, block)


def schedule_generic(sch, workload) -> None:
    """Pattern rules for every block; the last resort for the blocks none takes."""
    from schedules.patterns import schedule_patterns

    schedule_patterns(sch, workload, schedule_block_generic)
