"""Transposes: a layout stage whose input runs along another axis than its output.

``y[i, j] = x[j, i]``, NHWC -> NCHW (``y[n, c, h, w] = x[n, h, w, c]``) and the like store
along ``j`` and load along ``i``. Vectorised along ``j`` alone, each vector loads one
element from each of ``lanes`` rows of ``x`` and the next vector ``lanes`` rows further:
a pass down a column of a 4096 x 4096 matrix touches 4096 pages and 256 KiB of lines,
which the TLB and L1 cannot hold, before the next column comes back to them (130 ms for
64 MiB on one Zen 4 core, 1 GB/s). Here the two axes are tiled, ``[.., i_o, j_o, i_i,
j_i]``: a tile of :data:`TILE` rows of ``x`` by one vector of ``j`` reads whole lines of
a few pages from L1, and stores whole vectors.
"""

from __future__ import annotations

from schedules.patterns.analysis import largest_read
from schedules.patterns.common import Detail, extent, parallel_loops, product
from schedules.toolbox import PARALLEL_MIN_ELEMS, largest_divisor, transpose_blocks

# Steps of the input's contiguous axis a tile holds. One Zen 4 core, tiles of 8 / 16 / 32:
# NCHW -> NHWC 8x64x56x56 0.25 / 0.31 / 0.41 ms, NHWC -> NCHW 8x112x112x32 1.05 / 1.89 /
# 1.54 ms, 64 x 256 x 256 batched 1.47 / 3.45 / 3.10 ms; 4096 x 4096 18.7 / 22.3 / 16.1 ms
# (its rows 16 KiB apart share L1 sets).
TILE = 8
MIN_TILE = 4  # fewer (an image's 3 channels) leave little to tile: the injective rule's


def transposed_axis(f) -> str | None:
    """The output iterator ``i`` that the innermost index of the stage's largest read is,
    when it is not the output's innermost ``j`` and ``j`` indexes that read too (a bare
    iterator each); None otherwise (no transpose, or a gather)."""
    if f.kind != "layout" or not f.spatial or not f.reads:
        return None
    if [sorted(vs) for vs in f.write_vars] != [[v] for v in f.spatial]:
        return None
    big = largest_read(f)
    j = f.spatial[-1]
    last = big.index_vars[-1]
    if len(last) != 1 or str(big.indices[-1]) not in last:
        return None
    i = next(iter(last))
    bare = {str(ix) for ix, vs in zip(big.indices, big.index_vars) if len(vs) == 1}
    if i == j or i not in f.spatial or j not in bare:
        return None
    return i


def schedule_transpose(sch, name: str, facts: dict, target) -> Detail:
    """Tile stage ``name`` along its read's contiguous axis and its own (module
    docstring); the tiles' outer loops across cores."""
    f = facts[name]
    i, j = transposed_axis(f), f.spatial[-1]
    rows = largest_divisor(f.extents[i], TILE)
    lanes = largest_divisor(f.extents[j], target.lanes(f.out_dtype))
    if rows < MIN_TILE or lanes < MIN_TILE:
        raise ValueError(f"{i} ({f.extents[i]}) or {j} ({f.extents[j]}) leaves tiles under "
                         f"{MIN_TILE} steps")
    blk = sch.get_sblock(name)
    by = dict(zip(f.spatial, sch.get_loops(blk)))
    others = [by[v] for v in f.spatial if v not in (i, j)]
    sch.reorder(*others, by[i], by[j])
    i_o, j_o = transpose_blocks(sch, by[i], by[j], rows, lanes)
    outer = [*others, i_o]
    tasks = product(extent(sch, lp) for lp in outer)
    parallel_loops(sch, outer + ([j_o] if tasks < 4 * target.cores else []), target,
                   max(product(f.extents.values()), PARALLEL_MIN_ELEMS))
    return Detail(f"tiles of {rows} steps of {i} (the read's contiguous axis) x {lanes} "
                  f"lanes of {j}")
