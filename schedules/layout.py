"""x86 schedule of the layout (transdata) kernels: 5HD and FracZ to and from NCHW.

They only move data, so what matters is touching memory in order across both cores: the
innermost loop (the 16-wide C0 axis on the 5HD / FracZ side, W on the NCHW side) is vectorised
in whole registers of the target, and the outer loops are fused into one parallel loop.
"""

from __future__ import annotations

import schedules
from dsl.ops import tag
from schedules.toolbox import parallel_outer, vectorize_innermost, written_dtype

RULE = "x86 layout copy"


def schedule_copy(sch, block, target, dtype: str = "float32") -> None:
    """Innermost loop split into whole registers (or vectorised whole up to four), up to
    three outer loops fused and parallel."""
    loops = sch.get_loops(block)
    if len(loops) > 1:
        vectorize_innermost(sch, block, target.lanes(dtype), split_above=target.lanes(dtype))
    parallel_outer(sch, block, max_fuse=max(1, min(3, len(loops) - 1)))


def schedule_layout_x86(sch, workload) -> None:
    for stage in tag.LAYOUT_TAGS:
        for block in workload.find_all(sch, stage):
            schedule_copy(sch, block, workload.target, written_dtype(sch, block))
            workload.note(sch.get(block).name_hint, RULE, "copy: registers along C0 or W")


for _tag in tag.LAYOUT_TAGS:
    schedules.register(_tag, "x86")(schedule_layout_x86)
