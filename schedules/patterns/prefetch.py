"""Software prefetch for row kernels whose passes take turns at memory and arithmetic.

A row group (softmax, layer-norm, RMS-norm) reads a row from memory in its first pass and
then works on that row from L1: softmax's ``exp`` pass does no memory traffic at all, so the
memory system idles while the core computes, and the next row's first pass then waits on
memory while the arithmetic units idle. The hardware prefetchers do not bridge the gap: they
follow misses, and the compute pass has none. Measured on Zen 3 (2 cores, softmax over
8192 x 4096 float32): the passes serialised cost 12.1 GB/s; with the next row prefetched
during the ``exp`` pass and the output row prefetched for writing, 17.8 GB/s (84% of the
machine's copy bandwidth), the memory traffic then overlapping the arithmetic.

:func:`prefetch_next_rows` adds, at the top of one loop of a later pass (the *host* loop: the
innermost serial loop around its vector loop), one ``llvm.prefetch`` per cache line so that
the host's iterations together cover the next row of every streamed input (into L2: the
current row keeps L1) and, when the host is not the output's own pass, the output's current
row for writing (so its stores do not wait on read-for-ownership misses). Prefetches never
fault; an address past the last row is clamped to the buffer's last element anyway.
"""

from __future__ import annotations

from schedules.patterns.common import extent, product

LINE_BYTES = 64
LOCALITY_L2 = 2  # llvm.prefetch locality 2: prefetcht1 on x86 (into L2, not L1)


def host_loops(sch, block, row) -> list:
    """The loops of ``block`` between ``row`` and its vector loop, when the innermost of them
    with more than one iteration is serial (the *host*); [] for a block without one (a
    per-row scalar stage) or outside ``row``."""
    import tvm

    loops = sch.get_loops(block)
    at = [sch.get(lp).same_as(sch.get(row)) for lp in loops]
    if True not in at:
        return []
    inner = loops[at.index(True) + 1:]
    kinds = [sch.get(lp).kind for lp in inner]
    if tvm.tirx.ForKind.VECTORIZED not in kinds:
        return []
    inner = inner[:kinds.index(tvm.tirx.ForKind.VECTORIZED)]
    multi = [lp for lp in inner if extent(sch, lp) > 1]
    if not multi or sch.get(multi[-1]).kind != tvm.tirx.ForKind.SERIAL:
        return []
    return inner[:inner.index(multi[-1]) + 1]


def line_plan(row_elems: int, n_iter: int, elem_bytes: int) -> tuple[int, list[int]]:
    """How ``n_iter`` iterations cover a row of ``row_elems`` elements: iteration ``j``
    prefetches elements ``j * step + k`` for ``k`` in the returned offsets, one per line,
    plus its share's last element when shares or rows do not end on a line (so the line
    it ends in is fetched too)."""
    per_line = max(1, LINE_BYTES // elem_bytes)
    step = -(-row_elems // n_iter)
    offsets = list(range(0, step, per_line))
    if (step % per_line or row_elems % per_line) and step - 1 not in offsets:
        offsets.append(step - 1)
    return step, offsets


def _prefetch(flat, flat_index, write: bool):
    """``llvm.prefetch`` of element ``flat_index`` of the flat view ``flat``."""
    from tvm import tirx

    addr = tirx.call_intrin("handle", "tirx.address_of", tirx.BufferLoad(flat, [flat_index]))
    i32 = [tirx.const(v, "int32") for v in (int(write), LOCALITY_L2, 1)]  # 1: data cache
    return tirx.Evaluate(tirx.call_llvm_intrin("void", "llvm.prefetch.p0", addr, *i32))


def _row_prefetches(buf, row_elems: int, row, j, n_iter: int, ahead: int, write: bool):
    """Iteration ``j``'s share (of ``n_iter``) of row ``row + ahead`` of ``buf``, whose
    leading axes are the rows (``row_elems`` elements each): a flat view's declaration,
    then one prefetch per cache line."""
    from tvm import tirx

    numel = product(buf.shape)
    flat = tirx.decl_buffer((numel,), buf.dtype, f"{buf.name}_flat", data=buf.data)
    dt = str(row.ty)
    step, offsets = line_plan(row_elems, n_iter, buf.dtype.bits // 8)
    start = (row + ahead) * tirx.const(row_elems, dt) + j * tirx.const(step, dt)
    last = tirx.const(numel - 1, dt)  # past the last row: prefetch a valid address anyway
    return [tirx.DeclBuffer(flat, data=buf.data),
            *(_prefetch(flat, tirx.min(start + tirx.const(k, dt), last), write)
              for k in offsets)]


def prefetch_next_rows(sch, loops: list, row, reads: list, writes: list) -> None:
    """Insert the prefetches at the top of the last of ``loops`` (from :func:`host_loops`).

    ``reads`` and ``writes`` are ``(buffer, row_elems)`` pairs: inputs whose next row is
    fetched, outputs whose current row is fetched for writing. ``row`` is the loop over the
    rows (the buffers' leading axes, fused). The host's iterations within one row are
    numbered across all of ``loops``, so each covers its own part of the row."""
    from tvm import tirx

    fors = [sch.get(lp) for lp in loops]
    j, n_iter = tirx.const(0, str(fors[-1].loop_var.ty)), 1
    for f in fors:
        j = j * f.extent + (f.loop_var - f.min)
        n_iter *= int(f.extent)
    row_var = sch.get(row).loop_var
    calls = [c for buf, elems in reads
             for c in _row_prefetches(buf, elems, row_var, j, n_iter, 1, False)]
    calls += [c for buf, elems in writes
              for c in _row_prefetches(buf, elems, row_var, j, n_iter, 0, True)]
    host = fors[-1]
    new = tirx.For(host.loop_var, host.min, host.extent, host.kind,
                   tirx.SeqStmt([*calls, host.body]), host.thread_binding, host.annotations)
    sch.state.replace(sch.get_sref(loops[-1]), new)
