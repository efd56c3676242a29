"""The always-correct fallback schedule: parallel outer loops, vectorised elementwise stages.

It changes no computation order inside a reduction, so it is valid for any compute; it exists
so every operator builds on every target before a tuned rule is written.
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


def schedule_generic(sch, workload) -> None:
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        vectorize_inner(sch, block)
        parallel_outer(sch, block)
