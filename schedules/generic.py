"""The always-correct fallback schedule: parallel outer loops, vectorised elementwise stages.

It changes no computation order inside a reduction, so it is valid for any compute; it exists
so every operator builds on every target before a tuned rule is written.
"""

from __future__ import annotations

# the helpers live in the toolbox; imported here too so older imports keep working
from schedules.toolbox import parallel_outer, spatial_count, vectorize_inner  # noqa: F401


def schedule_generic(sch, workload) -> None:
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        vectorize_inner(sch, block)
        parallel_outer(sch, block)
