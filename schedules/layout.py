"""x86 schedule of the layout (transdata) kernels: 5HD and FracZ to and from NCHW.

They only move data, so what matters is touching memory in order across both cores: the
innermost loop (the 16-wide C0 axis on the 5HD / FracZ side, W on the NCHW side) is vectorised
in whole registers of the target, and the outer loops are fused into one parallel loop.
"""

from __future__ import annotations

import schedules
from schedules.generic import parallel_outer

LAYOUT_TAGS = ("layout.to_5hd", "layout.from_5hd", "layout.to_fracz", "layout.from_fracz")


def schedule_copy(sch, block, target, dtype: str = "float32") -> None:
    loops = sch.get_loops(block)
    if len(loops) > 1:
        inner = loops[-1]
        n = int(sch.get(inner).extent)
        lanes = target.lanes(dtype)
        if n > lanes and n % lanes == 0:
            inner = sch.split(inner, [None, lanes])[-1]
            sch.vectorize(inner)
        elif 1 < n <= 4 * lanes:
            sch.vectorize(inner)
    parallel_outer(sch, block, max_fuse=max(1, min(3, len(loops) - 1)))


def _written_dtype(sch, block) -> str:
    """dtype of the buffer a block writes (lanes per register depend on it)."""
    try:
        return str(sch.get(block).writes[0].source.dtype)
    except (AttributeError, IndexError):
        return "float32"


def schedule_layout_x86(sch, workload) -> None:
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        schedule_copy(sch, block, workload.target, _written_dtype(sch, block))


for _tag in LAYOUT_TAGS:
    schedules.register(_tag, "x86")(schedule_layout_x86)
