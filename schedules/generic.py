"""The fallback for graphs no operator rule claims: pattern rules, then the last resort.

:func:`schedule_generic` schedules each stage by what it is (elementwise, broadcast,
reduction, contraction; :mod:`schedules.patterns`). A stage no pattern rule takes gets
:func:`schedule_block_generic` (parallel outer loops, vectorised elementwise stages): it
changes no computation order inside a reduction, so it is valid for any compute.
"""

from __future__ import annotations


def spatial_count(sch, block) -> int:
    """Number of spatial block iterators (TE puts them first, so the leading loops)."""
    return sum(1 for iv in sch.get(block).iter_vars if int(iv.iter_type) == 0)


def parallel_outer(sch, block, max_fuse: int = 2, min_extent: int = 2) -> None:
    """Fuse up to ``max_fuse`` outer spatial loops and run them across cores."""
    loops = sch.get_loops(block)
    n_sp = min(spatial_count(sch, block), max_fuse, len(loops))
    if n_sp == 0:
        return
    fused = sch.fuse(*loops[:n_sp]) if n_sp > 1 else loops[0]
    if int(sch.get(fused).extent) >= min_extent:
        sch.parallel(fused)


def vectorize_inner(sch, block, max_lanes: int = 64) -> None:
    """Vectorise the innermost loop of an all-spatial block when it is short enough."""
    loops = sch.get_loops(block)
    if not loops or spatial_count(sch, block) != len(sch.get(block).iter_vars):
        return
    extent = sch.get(loops[-1]).extent
    if hasattr(extent, "value") and 1 < int(extent.value) <= max_lanes and len(loops) > 1:
        sch.vectorize(loops[-1])


def schedule_block_generic(sch, block) -> None:
    """The always-correct last resort for one block."""
    vectorize_inner(sch, block)
    parallel_outer(sch, block)


def schedule_generic(sch, workload) -> None:
    """Pattern rules for every block; the last resort for the blocks none takes."""
    from schedules.patterns import schedule_patterns

    schedule_patterns(sch, workload, schedule_block_generic)
