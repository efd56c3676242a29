"""Column groups: a normalisation over an axis that is not the innermost one.

A softmax over the channels of an NCHW tensor (``m[n, h, w] = max_c x[n, c, h, w]``, ``e =
exp(x - m)``, ``s[n, h, w] = sum_c e``, ``y = e / s``), an L2 normalisation across channels
or a log-softmax over ``dim=1`` reduce over a *middle* axis and feed an injective stage
that broadcasts the result back along it. Scheduled stage by stage, each reduction is a
pass over the whole tensor of its own (an outer reduction, vectors along ``w``) and a
materialised stage between them (softmax's ``exp``) another, each from memory: 8x64x56x56
float32 took four passes of 6.4 MB.

Here the output's loops are ``[lead.., trail.., mid.., w]`` (``mid`` the reduced axes,
``trail`` the axes after them but the innermost ``w``): one task per ``(lead, trail)``
position, and per task every stage of the group is computed at that position for all of
``mid`` with vectors along ``w``: the reductions accumulate a row of ``w`` across the
``mid`` axis, so the group's block of ``mid x w`` is read from L1 or L2 by each later
pass. A row of ``w`` longer than :data:`BLOCK_BYTES` a ``mid`` step is split into blocks
that are tasks too.
"""

from __future__ import annotations

from schedules.patterns.common import extent, product
from schedules.patterns.reduction import _rows_across_cores
from schedules.toolbox import exact_vector_factor

# The longest piece of the innermost axis one task holds, per step of the reduced axes: a
# block of mid x BLOCK_BYTES (64 channels: 64 KiB) stays in L2 between the passes.
BLOCK_BYTES = 1024
# Shorter pieces (many reduced steps: a softmax over 1000 classes of 28 x 28) read a few
# lines of each step a task, and the stages one pass each were faster (2x1000x28x28 on one
# Zen 4 core: 1.63 ms against 1.91 in pieces of 224 bytes; 4x300x28x28 in pieces of 784
# bytes: 0.64 ms against 0.87).
MIN_PIECE_BYTES = 512
# math functions computed by tens of instructions a vector (a polynomial: the fastmath
# lowerings, libm's): worth computing once a vector rather than once a step of mid
POLYNOMIAL_CALLS = ("exp", "log", "tanh", "erf", "pow", "sigmoid", "sin", "cos", "log2",
                    "log10", "exp2", "log1p", "expm1")


def column_axes(facts: dict, out_name: str, red_names: list) -> tuple[list, list] | None:
    """``(mid, trail)``: the output's axes the group's reductions sum over (``c``) and those
    after them (``h, w``), or None where the group is no column group: each reduction read
    by a stage of the group through the output's axes minus the same middle ones, ending in
    the output's innermost axis, which no reduction reduces."""
    f = facts[out_name]
    reduced = {facts[r].out_buffer for r in red_names if facts[r].reduce}
    mids = set()
    for name in [*red_names, out_name]:
        g = facts[name]
        if g.reduce:
            continue  # a reduction reading another (a variance its mean) at its own rows
        for acc in g.reads:
            if acc.buffer not in reduced:
                continue
            read = _bare_iterators(acc)
            if read is None or g.spatial != f.spatial:
                return None
            mids.add(tuple(v for v in f.spatial if v not in read))
    if len(mids) != 1:
        return None
    mid = list(next(iter(mids)))
    pos = [f.spatial.index(v) for v in mid]
    if not mid or pos != list(range(pos[0], pos[0] + len(mid))) or pos[-1] >= len(
            f.spatial) - 1:
        return None
    kept = product(f.extents[v] for v in f.spatial if v not in mid)
    for r in red_names:
        g = facts[r]
        if g.reduce and ([f.extents[v] for v in mid] != [g.extents[v] for v in g.reduce]
                         or product(g.extents[v] for v in g.spatial) != kept):
            return None
    return mid, f.spatial[pos[-1] + 1:]


def _bare_iterators(acc) -> set[str] | None:
    """The iterators of a load whose every index is a bare iterator or 0 on an axis of one
    (a reduction kept with ``keepdims``, as TBE's vector DSL writes it), else None."""
    read = set()
    for ix, vs, dim in zip(acc.indices, acc.index_vars, acc.shape):
        if len(vs) == 1 and str(ix) in vs:
            read.add(str(ix))
        elif vs or int(dim) != 1 or getattr(ix, "value", None) != 0:
            return None
    return read


def schedule_column_group(sch, out_name: str, stages: list, facts: dict, target) -> str:
    """Schedule the column group of ``stages`` (its reductions and the injective stages
    between them, in order) ending in ``out_name`` (see the module docstring). Returns the
    note for ``dsl.explain``."""
    import tvm

    f = facts[out_name]
    mid, trail = column_axes(facts, out_name, stages)
    blk = sch.get_sblock(out_name)
    by = dict(zip(f.spatial, sch.get_loops(blk)))
    lead = [by[v] for v in f.spatial if v not in mid and v not in trail]
    # the trailing axes are one contiguous run of each step of mid (a channel's H x W)
    run = sch.fuse(*[by[v] for v in trail]) if len(trail) > 1 else by[trail[0]]
    w_o, w_i = _split_row(sch, run, f, mid, f.extents[trail[-1]], target)
    piece = extent(sch, w_i)
    outer = [*lead, w_o]
    sch.reorder(*outer, *[by[v] for v in mid], w_i)
    task = _rows_across_cores(sch, outer, f, target)
    across = sch.get(task).kind == tvm.tirx.ForKind.PARALLEL
    for name in reversed(stages):  # consumers first
        sch.compute_at(sch.get_sblock(name), task, preserve_unit_loops=True)
    mid_pos = [f.spatial.index(v) for v in mid]
    for name in stages:
        _vectorize_stage(sch, name, facts[name], mid_pos, target)
    _vectorize(sch, sch.get_loops(blk)[-1], sch.get_loops(blk)[-1 - len(mid):-1], target,
               f.out_dtype, _invariant_call(sch, blk, mid_pos))
    return (f"{', '.join(stages)} over {', '.join(mid)} computed per task of "
            f"{piece} x {' x '.join(str(f.extents[v]) for v in mid)} "
            f"(vectors along {trail[-1]})" + (", the tasks across cores" if across else ""))


def _split_row(sch, loop, f, mid, inner: int, target):
    """``(outer, inner)`` of the trailing run: whole rows of the innermost axis (``inner``
    elements) or a divisor of one, so the reductions computed at a piece are a rectangle of
    the output, not the rows around it; the longest piece of at most :data:`BLOCK_BYTES`, or
    else the shortest of at least :data:`MIN_PIECE_BYTES`, whose block of all of ``mid``
    takes at most a quarter of L2 (the group's materialised stage takes as much again)."""
    n = extent(sch, loop)
    size = _bits(f.out_dtype) // 8
    steps = product(f.extents[v] for v in mid)
    fits = [d for d in range(1, n + 1) if n % d == 0 and (d % inner == 0 or inner % d == 0)
            and steps * d * size <= target.l2_kib * 1024 // 4]
    short = [d for d in fits if d * size <= BLOCK_BYTES]
    piece = max(short, default=0)
    if piece * size < MIN_PIECE_BYTES and piece < n:
        piece = min((d for d in fits if d * size >= MIN_PIECE_BYTES), default=0)
    if not piece:
        raise ValueError(f"{steps} steps of the reduced axes leave no piece of the rows of "
                         f"{MIN_PIECE_BYTES} bytes a task in L2: the stages are faster one "
                         "pass each")
    return sch.split(loop, [None, piece])


def _bits(dtype: str) -> int:
    import tvm

    return tvm.runtime.DataType(dtype).bits


def _vectorize(sch, inner, mid_loops: list, target, dtype: str, inside: bool) -> None:
    """Split ``inner`` (a piece of the row) into vectors that divide it (a row of 56: one
    odd vector LLVM splits into legal ones; a guarded tail TVM's vectoriser would
    scalarise), ``mid_loops`` outside the piece or, ``inside``, between its vectors and
    their lanes (``[.., vectors, mid.., lanes]``)."""
    n = extent(sch, inner)
    v = exact_vector_factor(n, target.lanes(dtype))
    outer, vec = (None, inner) if v in (1, n) else sch.split(inner, [None, v])
    pieces = [outer] if outer is not None else []
    sch.reorder(*(pieces + mid_loops if inside else mid_loops + pieces), vec)
    if v > 1:
        sch.vectorize(vec)


def _invariant_call(sch, blk, mid_pos: list) -> bool:
    """Whether the injective block ``blk`` calls a math function on values the same for
    every step of ``mid`` (a log-softmax's ``log(s[n, h, w])``): with ``mid`` inside each
    vector's loop LLVM computes it once a vector, not once a step (8x21x128x128, one Zen 4
    core: 2.97 -> 1.91 ms). Elsewhere ``mid`` stays outside the piece, which is then read a
    contiguous run at a time (the other order: 0.84-0.91x on softmaxes and norms, a
    channels-first layer norm's ``sqrt`` of its variance included)."""
    from tvm.ir.expr import Call

    from schedules.patterns.analysis import nodes_of, vars_of

    block = sch.get(blk)
    mids = {block.iter_vars[p].var.name for p in mid_pos}
    return any(str(getattr(c.op, "name", "")).rpartition(".")[2] in POLYNOMIAL_CALLS
               and not vars_of(c) & mids for c in nodes_of(block.body, Call))


def _vectorize_stage(sch, name: str, g, mid_pos: list, target) -> None:
    """A stage computed at the task: vectors of its innermost spatial loop (the piece of
    ``w``) innermost, its steps of ``mid`` (a reduction's reduced axes; an injective stage's
    own, at ``mid_pos``) outside the piece (:func:`_vectorize`), a reduction's init split
    off above them."""
    blk = sch.get_sblock(name)
    loops = sch.get_loops(blk)
    n_red = len(g.reduce)
    spatial = loops[len(loops) - n_red - len(g.spatial):len(loops) - n_red]
    mids = loops[len(loops) - n_red:] if n_red else [spatial[p] for p in mid_pos]
    inside = not n_red and _invariant_call(sch, blk, mid_pos)
    _vectorize(sch, spatial[-1], mids, target, g.out_dtype, inside)
    if n_red:
        # vectorised before decompose_reduction: the init block inherits the vector loop
        sch.decompose_reduction(blk, mids[0])
