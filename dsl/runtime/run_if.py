"""Fallback stages that run only when a flag computed by the kernel is set.

Why: dx is fast because it multiplies every tap by dy's zero padding instead of testing each
tap, which is exact unless a weight is NaN or infinite (``0 * inf`` is NaN where the math has
no product at all). So float dx carries, beside each fast accumulator stage, an *exact twin*
that tests its taps, and a flag stage that scans the weights. The twins and the flag are *side
stages* (:func:`dsl.ops.tag.side_stages`): no output reads them in TE, so the operator's rule
still writes the output straight from its register tile (TVM refuses to inline an output
stage that reads a second computed buffer). The kernel wires them in after scheduling:

* :func:`side_outputs_to_buffers` (from ``Schedule.prim_func``): the side stages are built as
  extra outputs, then become buffers of the kernel, so the arguments are the user's;
* :func:`guard_stages` (from :func:`dsl.runtime.build.lower`): a top-level loop nest whose
  blocks all write the buffer of one stage annotated ``tag.RUN_IF: "<flag>"`` runs inside
  ``if flag[0] != 0`` (stages are found by the buffers they write: ``decompose_reduction``
  renames blocks);
* :func:`take_exact_twins` (also from ``lower``): every block that reads the buffer written
  by a stage annotated ``tag.EXACT_TWIN: "<twin>"`` (its register tile's write-back) first
  copies the twin's value there when the twin's flag is set.

With the flag clear the cost is the scan and one load and branch per element written back.
A kernel compiled without ``lower`` (a test's own ``tvm.compile``) computes the twins always
and never reads them: the fast results, slower. TE has no conditional stage and TVM 0.27 has
no TIR mutator in Python, hence these small rewrites of the root block.
"""

from __future__ import annotations

from dsl.ops.tag import EXACT_TWIN, RUN_IF
from schedules.rewrite import rebuild, with_block


def side_outputs_to_buffers(func, positions):
    """``func`` with its parameters at ``positions`` (side stages built as outputs) moved
    into the root block's buffers."""
    import tvm

    drop = set(positions)
    if not drop:
        return func
    params = list(func.params)
    moved = [params[i] for i in sorted(drop)]
    root = func.body
    block = with_block(root.block, alloc_buffers=[*root.block.alloc_buffers, *moved])
    body = tvm.s_tir.SBlockRealize(root.iter_values, root.predicate, block)
    keep = [p for i, p in enumerate(params) if i not in drop]
    return tvm.tirx.PrimFunc(keep, body, func.ret_type, func.attrs)


def wire_fallbacks(func):
    """:func:`take_exact_twins` then :func:`guard_stages`: ``func`` itself when it has no
    fallback stage."""
    return guard_stages(take_exact_twins(func))


def guard_stages(func):
    """``func`` with each top-level loop nest that computes one :data:`RUN_IF` stage (its init
    and update) wrapped in ``if flag[0] != 0``."""
    import tvm

    root = func.body
    blocks = _blocks(root)
    guards = _twins(blocks)
    if not guards or not isinstance(root, tvm.s_tir.SBlockRealize):
        return func
    buffers = _buffers(blocks)
    top = root.block.body
    stmts = list(top.seq) if isinstance(top, tvm.tirx.SeqStmt) else [top]
    new = [_guarded(s, guards, buffers) for s in stmts]
    if all(a.same_as(b) for a, b in zip(new, stmts)):
        return func
    body = tvm.tirx.SeqStmt(new) if len(new) > 1 else new[0]
    block = with_block(root.block, body=body)
    return func.with_body(tvm.s_tir.SBlockRealize(root.iter_values, root.predicate, block))


def take_exact_twins(func):
    """``func`` where each reader of an :data:`EXACT_TWIN` stage's output first stores the
    twin's value at the index it reads, when the twin's flag is set."""
    import tvm

    blocks = _blocks(func.body)
    buffers = _buffers(blocks)
    twins = _twins(blocks)
    swaps = _fast_buffers(blocks, buffers, twins)
    if not swaps:
        _check_wired(blocks, set())
        return func
    wired: set = set()

    def visit(block):
        if EXACT_TWIN in block.annotations:
            return None  # the fast stage itself (its update reads its own buffer)
        hits = [(r, _twin_region(block, r, exact), exact, flag) for r in block.reads
                for buf, exact, flag in swaps if r.source.same_as(buf)]
        if not hits:
            return None
        wired.update(twin.name for _, _, twin, _ in hits)
        return with_block(
            block, body=tvm.tirx.SeqStmt([*(_copy_if(f, r, t, at) for r, at, t, f in hits),
                                          block.body]),
            reads=[*block.reads, *(tvm.ir.expr.TensorRegion(t, at.region, at.ty)
                                   for _, at, t, _ in hits)],
            writes=[*block.writes, *(r for r, _, _, _ in hits)])

    body = rebuild(func.body, visit)
    _check_wired(blocks, wired)
    return func.with_body(body)


def _fast_buffers(blocks, buffers: dict, twins: dict) -> list:
    """``(buffer, twin, flag)`` for each buffer a fast stage writes: the stage's own, or its
    register tile's cache (``cache_write``; one per part of a ``loop_partition``, each
    holding that part's sub-tile), not an rfactor's partial sums (another rank)."""
    swaps = []
    for b in blocks:
        name = str(b.annotations[EXACT_TWIN]) if EXACT_TWIN in b.annotations else None
        if name not in twins:
            continue
        flag, exact = buffers[twins[name]], buffers[name]
        for w in b.writes:
            dims = _dims(w.source)
            if len(dims) == len(_dims(exact)) and all(
                    d <= e for d, e in zip(dims, _dims(exact))) \
                    and not any(w.source.same_as(s[0]) for s in swaps):
                swaps.append((w.source, exact, flag))
    return swaps


def _twin_region(block, read, twin):
    """Where the twin holds the value ``block`` reads at ``read``: the same index when the
    buffer has the twin's shape; for a part's smaller cache, the index ``block`` (the
    cache's write-back) stores that value at in the fast stage's own buffer."""
    if _dims(read.source) == _dims(twin):
        return read
    out = [w for w in block.writes if _dims(w.source) == _dims(twin)]
    if len(out) != 1 or len(block.reads) != 1:
        raise NotImplementedError(
            f"block {block.name_hint} reads the cache {read.source.name} of a fast stage but "
            "is not its write-back: the exact twin cannot be swapped in")
    return out[0]


def _check_wired(blocks, wired: set) -> None:
    """Every exact twin must have a reader: a schedule that moved its fast stage's buffer to
    another layout without the twin's would silently give back the fast (inexact) values."""
    named = {str(b.annotations[EXACT_TWIN]) for b in blocks if EXACT_TWIN in b.annotations}
    for name in sorted(named & set(_twins(blocks)) - wired):
        raise NotImplementedError(
            f"no block reads the fast stage of exact twin {name} at its own layout: transform "
            "the twin's buffer as the fast one's (schedules.fallback.twin_block)")


def _twins(blocks) -> dict:
    """The buffer of each fallback stage -> the name of its flag (blocks are renamed by
    ``decompose_reduction``; the buffers they write keep the stage's name)."""
    return {_written(b).name: str(b.annotations[RUN_IF]) for b in blocks
            if RUN_IF in b.annotations}


def _dims(buf) -> list[int]:
    return [int(d) for d in buf.shape]


def _copy_if(flag, region, twin, at):
    """``if flag[0] != 0: region.buffer[idx] = twin[at]`` at the point ``region`` reads
    (``at``: the twin's region holding that value)."""
    import tvm

    if any(int(r.extent) != 1 for r in (*region.region, *at.region)):
        raise NotImplementedError(  # no shipped schedule reads a tile at once
            f"a block reads {region.source.name} by region, not element by element: "
            "its exact twin cannot be swapped in")
    idx = [r.min for r in region.region]
    src = [r.min for r in at.region]
    # The reader may read only under a condition of its own (a 5HD lane past the channels
    # is masked by an if_then_else around the load), where the index can lie outside the
    # buffer; the copy is unconditional, so it keeps to both buffers' bounds: a copy past
    # them wrote over the heap (a dw of 2 input channels in 16 lanes, a NaN in dy).
    inside = [_within(i, d) for i, d in (*zip(idx, region.source.shape), *zip(src, twin.shape))]
    cond = tvm.tirx.all(_flag_set(flag), *inside)
    store = tvm.tirx.BufferStore(region.source, tvm.tirx.BufferLoad(twin, src), idx)
    return tvm.tirx.IfThenElse(cond, store, None)


def _within(index, extent):
    """``0 <= index < extent`` (lowering's simplifier drops it where the loop ranges prove
    it, so a kernel whose reader stays in bounds keeps its vectorised copy)."""
    import tvm

    ty = str(index.ty)
    return tvm.tirx.all(tvm.tirx.const(0, ty) <= index, index < tvm.tirx.const(int(extent), ty))


def _written(block):
    """The one buffer ``block`` writes."""
    return block.writes[0].source


def _flag_set(flag):
    import tvm

    zero = tvm.tirx.const(0, str(flag.shape[0].ty))  # int64 in an int64-indexed kernel
    return tvm.tirx.BufferLoad(flag, [zero]) != tvm.tirx.const(0, flag.dtype)


def _guarded(stmt, guards: dict, buffers: dict):
    """``stmt`` wrapped in its flag test when every block in it writes one guarded stage's
    buffer (its init and update); ``stmt`` unchanged otherwise."""
    import tvm

    # (the opaque wrappers of a loop_partition write nothing)
    written = {_written(b).name for b in _blocks(stmt) if b.writes}
    if len(written) != 1 or not written <= set(guards):
        return stmt
    (owner,) = written
    return tvm.tirx.IfThenElse(_flag_set(buffers[guards[owner]]), stmt, None)


def _buffers(blocks) -> dict:
    return {buf.name: buf for b in blocks for buf in b.alloc_buffers}


def _blocks(stmt) -> list:
    """Every SBlock in ``stmt``, outermost first."""
    import tvm

    out, todo = [], [stmt]
    while todo:
        s = todo.pop()
        if s is None:
            continue
        if isinstance(s, tvm.s_tir.SBlockRealize):
            todo.append(s.block)
        elif isinstance(s, tvm.s_tir.SBlock):
            out.append(s)
            todo += [s.body, s.init]
        elif isinstance(s, tvm.tirx.SeqStmt):
            todo += list(s.seq)
        elif isinstance(s, tvm.tirx.IfThenElse):
            todo += [s.then_case, s.else_case]
        elif hasattr(s, "body"):  # For, While, AttrStmt, LetStmt-like and DeclBuffer nodes
            todo.append(s.body)
    return out
