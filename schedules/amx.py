"""Intel AMX tiles for the dot-product reductions (bfloat16 ``tdpbf16ps``, int8 ``tdpbssd``
and ``tdpbusd``).

An AMX core holds eight tile registers of up to 16 rows x 64 bytes and multiplies them whole:
``tdpbf16ps C, A, B`` adds to each fp32 ``C[m, n]`` (16 x 16) the ``K`` products
``A[m, k] * B[k, n]``, ``A`` a tile of ``M`` rows x ``K`` bfloat16 and ``B`` one of ``K / 2``
rows x 16 pairs (``vdpbf16ps``'s pair layout); ``tdpbssd`` likewise with signed bytes in
groups of 4 and int32 ``C`` (``tdpbusd``: unsigned x signed, the ``vpdpbusd`` layout). On a
Sapphire Rapids core that is 8192 bfloat16 multiply-adds in 16 cycles, 16 times what AVX-512
does in fp32.

A tile register cannot be a TVM buffer, so the rule here works in two steps:

1. :func:`tile_reduction` (a schedule step) shapes the block's loop nest into register tiles
   of the form ``[m tiles, rows, n tiles, lanes, steps..., k, dot]`` (``mt x nt``
   accumulator tiles with their whole reduction below them), marks a task's loop over its
   tiles with :data:`ANNOTATION` and the loop whose body configures the tiles once (a
   chunk of tasks per core) with :data:`CONFIGURE`;
2. :func:`lower_tiles` (from :func:`dsl.runtime.build.lower`, after every schedule step)
   puts the tile configuration before each :data:`CONFIGURE` loop's body and the release
   after it, and rewrites each tile's nest: the accumulator tiles are zeroed (or loaded),
   every reduction step loads ``mt`` A tiles and ``nt`` B tiles and issues ``mt * nt`` tile
   products, then the accumulators are stored. Addresses and row strides come from the
   block's own index expressions (affine in the nest's loops, checked), so any phase, stride
   or dilation the compute describes is handled and nothing about the operator is assumed.

Linux hands AMX's 8 KB of tile state to a process only on request (``arch_prctl
ARCH_REQ_XCOMP_PERM``), so a function with tiles first makes that request (a syscall,
well under a microsecond); without it the first tile instruction would kill the process.
"""

from __future__ import annotations

from dataclasses import dataclass

ANNOTATION = "dsl.amx_tile"  # on a task's loop over its register tiles
CONFIGURE = "dsl.amx_configure"  # on the loop whose body configures the tiles once
ROWS = 16  # rows of a tile register
ROW_BYTES = 64  # bytes of a tile row
C_TILES = 4  # accumulator tiles of one register tile (the other four hold A and B)
K_GROUPS = 16  # dot groups in a 64-byte tile row: 16 bf16 pairs, 16 int8 quads

# Linux x86-64: arch_prctl's syscall number, ARCH_REQ_XCOMP_PERM and XFEATURE_XTILEDATA
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


@dataclass(frozen=True)
class Instruction:
    """A tile product: the input dtype whose tiles it needs (:meth:`targets.CpuTarget.
    has_tiles`), its LLVM intrinsic, and its ``dot``: the ``A`` elements one 32-bit group of
    a ``B`` row pairs with one ``C`` lane."""

    dtype: str
    llvm: str
    dot: int


# (A dtype, B dtype, accumulator dtype) -> instruction
INSTRUCTIONS = {
    ("bfloat16", "bfloat16", "float32"): Instruction("bfloat16", "llvm.x86.tdpbf16ps", 2),
    ("uint8", "int8", "int32"): Instruction("int8", "llvm.x86.tdpbusd", 4),
    ("int8", "int8", "int32"): Instruction("int8", "llvm.x86.tdpbssd", 4),
}


def instruction(sch, block, target) -> Instruction | None:
    """The tile product ``block`` can use on ``target``, or None: the target must have the
    feature (and tiles), the block must read ``A`` and ``B`` in the instruction's dtypes
    into ``C``, and its last reduction axis must be the instruction's ``dot`` (the layout the
    dot-product stages already give: :mod:`schedules.intrinsics`); the axis before it is
    ``K``, at most :data:`K_GROUPS` per tile row (the caller splits a longer one)."""
    blk = sch.get(block)
    out = blk.writes[0].source
    reads = [r.source for r in blk.reads if r.source.name != out.name]
    if len(reads) != 2 or len(blk.iter_vars) < 3:
        return None
    ins = INSTRUCTIONS.get((str(reads[0].dtype), str(reads[1].dtype), str(out.dtype)))
    if ins is None or not target.has_tiles(ins.dtype):
        return None
    k, d = blk.iter_vars[-2:]
    if int(k.iter_type) != 2 or int(d.iter_type) != 2 or int(d.dom.extent) != ins.dot:
        return None
    return ins


def tile_rows(extent: int) -> tuple[int, int]:
    """``(rows, mt)`` for ``extent`` positions along the tile's row axis: the most rows up to
    16 that divide it (no ragged tile), and two row tiles when they fit evenly."""
    rows = max(d for d in range(1, min(extent, ROWS) + 1) if extent % d == 0)
    return rows, 2 if (extent // rows) % 2 == 0 else 1


@dataclass(frozen=True)
class Tiling:
    """What :func:`tile_reduction` chose: ``rows`` per tile, ``mt x nt`` accumulator tiles,
    and ``write_back``, the block that copies each register tile's accumulators out (the
    place to compute the operator's output from them: :func:`schedules.fusion.write_from_tile`)."""

    rows: int
    mt: int
    nt: int
    write_back: object


def tile_reduction(sch, block, rows_loop, lanes_loop, n_loop, par_loops, cores: int) -> Tiling:
    """Shape ``block`` (spatial ``par_loops`` around ``n_loop``, ``rows_loop``, ``lanes_loop``
    of 16 accumulator lanes, then its reduction, ``k`` and ``dot`` last) into marked
    register tiles whose accumulators go to a tile-sized ``local`` buffer, copied out per
    tile, and run ``par_loops`` across ``cores`` in chunks (:func:`core_chunks`), each
    configuring the tiles once."""
    from schedules import toolbox as tb

    *steps, k, dot = tb.split_loops(sch, block)[1]
    rows, mt = tile_rows(tb.extent(sch, rows_loop))
    nt = 2 if tb.extent(sch, n_loop) % 2 == 0 else 1
    r_o, r_t, r_r = sch.split(rows_loop, [None, mt, rows])
    n_o, n_t = sch.split(n_loop, [None, nt])
    outer = [lp if lp != n_loop else n_o for lp in par_loops]
    sch.reorder(*outer, r_o, r_t, r_r, n_t, lanes_loop, *steps, k, dot)
    fused = sch.fuse(*outer)
    tasks = tb.extent(sch, fused)
    chunks = core_chunks(tasks, cores)
    if chunks < tasks:
        fused, per_chunk = sch.split(fused, [chunks, None])
        sch.annotate(per_chunk, CONFIGURE, 1)
    else:
        sch.annotate(r_o, CONFIGURE, 1)
    sch.parallel(fused)
    sch.annotate(r_o, ANNOTATION, len(steps))
    # the accumulators leave the tiles into L1 (tilestored), not into the whole output
    write_back = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write_back, r_o, preserve_unit_loops=True)
    sch.vectorize(sch.get_loops(write_back)[-1])
    return Tiling(rows, mt, nt, write_back)


def core_chunks(tasks: int, cores: int) -> int:
    """Parallel chunks of ``tasks`` equal tasks: the fewest that share out evenly over
    ``cores`` (a divisor of ``tasks`` and a multiple of ``cores``), else ``tasks``. Each chunk
    configures the tiles once; in one configuration per task, ``ldtilecfg`` and
    ``tilerelease`` took a third of a 1x1 layer's time."""
    return next((d for d in range(cores, tasks, cores) if tasks % d == 0), tasks)


# --- the rewrite ---------------------------------------------------------------------------


def lower_tiles(func):
    """``func`` with each nest marked by :func:`tile_reduction` rewritten into tile
    instructions (see the module docstring), and the tile permission requested first;
    ``func`` itself when nothing is marked."""
    from schedules.rewrite import rebuild

    views: dict = {}  # bfloat16 operand buffer name -> (buffer, raw view), one for all nests

    def configure(loop):
        if CONFIGURE not in loop.annotations:
            return None
        shapes = {}

        def tiles(inner):
            if ANNOTATION not in inner.annotations:
                return None
            new, used = _tile_loop(inner, views)
            clash = {t for t in used if shapes.get(t, used[t]) != used[t]}
            if clash:  # one configuration serves the loop: its nests must agree on shapes
                raise RuntimeError(f"{CONFIGURE}: tiles {sorted(clash)} take two shapes "
                                   "under one configuration")
            shapes.update(used)
            return new

        body = rebuild(_unmarked(loop, CONFIGURE), lambda block: None, tiles)
        return _configured(body, shapes)

    body = rebuild(func.body, lambda block: None, configure)
    if body.same_as(func.body):
        return func
    return func.with_body(_with_permission(body, list(views.values())))


def _unmarked(loop, key: str, body=None):
    """``loop`` without its annotation ``key`` (and with ``body`` instead of its own)."""
    from tvm import tirx

    annotations = {k: v for k, v in loop.annotations.items() if k != key}
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind,
                    loop.body if body is None else body, loop.thread_binding, annotations,
                    loop.step)


def _configured(body, shapes: dict):
    """``body`` between the tile configuration for ``shapes`` (tile -> (rows, bytes per
    row)) and the release of the tiles."""
    from tvm import s_tir, tirx

    cfg = tirx.decl_buffer((64,), "uint8", name="amx_config", scope="local")
    configure = s_tir.SBlockRealize([], True, s_tir.SBlock(
        [], [], [], "amx_configure", tirx.SeqStmt([
            _config(cfg, shapes), _intrin("llvm.x86.ldtilecfg", tirx.address_of(cfg[0]))]),
        alloc_buffers=[cfg]))
    return tirx.SeqStmt([configure, body, _intrin("llvm.x86.tilerelease")])


def _with_permission(body, views=()):
    """``body`` after the request for the tile state and the raw views (``(buffer, view)``
    pairs), inside the root block, whose buffers every statement may use. Each buffer is
    touched there too (the address of its first element, which LLVM drops), so that TVM
    allocates it whole at the root: a buffer computed inside a task's loop would otherwise
    be allocated there and shrunk to the task's part (CompactBufferAllocation), which the
    view's element offsets, taken from the whole buffer, know nothing of."""
    import tvm
    from tvm import s_tir, tirx

    from schedules.rewrite import with_block

    ask = tirx.Evaluate(tirx.call_extern("int64", "syscall", tirx.const(_SYS_ARCH_PRCTL, "int64"),
                                         tirx.const(_ARCH_REQ_XCOMP_PERM, "int64"),
                                         tirx.const(_XFEATURE_XTILEDATA, "int64")))
    pins = [tirx.Evaluate(tirx.address_of(tirx.BufferLoad(buf, [0] * len(buf.shape))))
            for buf, _ in views]
    first = [ask, *pins, *(tirx.DeclBuffer(view, data=buf.data) for buf, view in views)]
    if isinstance(body, s_tir.SBlockRealize):
        block = with_block(body.block, body=tvm.tirx.SeqStmt([*first, body.block.body]))
        return s_tir.SBlockRealize(body.iter_values, body.predicate, block)
    return tvm.tirx.SeqStmt([*first, body])


@dataclass
class _Nest:
    """A marked nest taken apart: its loops by role and its one reduction block."""

    m: object  # For: accumulator tiles along rows
    rows: object
    n: object  # For: accumulator tiles along n
    lanes: object
    steps: list  # For: the reduction steps, outermost first
    k: object
    dot: object
    realize: object  # SBlockRealize of the reduction

    def roles(self) -> dict:
        """Every loop of the nest by role (``s0``, ``s1``, ...: the steps), outermost first."""
        return {"m": self.m, "rows": self.rows, "n": self.n, "lanes": self.lanes,
                **{f"s{i}": s for i, s in enumerate(self.steps)}, "k": self.k, "dot": self.dot}

    def k_bytes(self, ins: Instruction, a_buffer) -> int:
        """Bytes of one ``A`` tile row: ``k`` groups of ``dot`` elements."""
        return int(self.k.extent) * ins.dot * a_buffer.dtype.bits // 8


def _take_apart(loop, n_steps: int) -> _Nest:
    import tvm

    loops, stmt = [], loop
    while isinstance(stmt, tvm.tirx.For):
        loops.append(stmt)
        stmt = stmt.body
    if not isinstance(stmt, tvm.s_tir.SBlockRealize) or len(loops) != 6 + n_steps:
        raise RuntimeError(f"{ANNOTATION}: the marked nest is not [m, rows, n, lanes, "
                           f"{n_steps} steps, k, dot] over one block (a schedule step after "
                           "tile_reduction changed it)")
    m, rows, n, lanes, *rest = loops
    return _Nest(m, rows, n, lanes, rest[:n_steps], rest[-2], rest[-1], stmt)


def _flat(buf, indices):
    """Element offset of ``buf[indices]`` (compact row-major: every buffer here is)."""
    off, stride = 0, 1
    for i, dim in reversed(list(zip(indices, buf.shape))):
        off = off + i * stride
        stride = stride * dim
    return off


def _coefficients(expr, loop_vars) -> list[int]:
    """Constant coefficients of ``expr`` in ``loop_vars`` (it must be affine in them)."""
    import tvm
    from tvm.sym import Analyzer, detect_linear_equation

    got = detect_linear_equation(expr, loop_vars)
    if len(got) != len(loop_vars) + 1:
        raise RuntimeError(f"{ANNOTATION}: index {expr} is not affine in the tile's loops")
    coef = [Analyzer().simplify(c) for c in got[:-1]]
    if not all(isinstance(c, tvm.tirx.IntImm) for c in coef):
        raise RuntimeError(f"{ANNOTATION}: index {expr} has a non-constant step")
    return [int(c) for c in coef]


@dataclass
class _Operand:
    """One operand of the tile product: its buffer, index (in loop variables) and, per
    loop of the nest, its element step."""

    buffer: object
    indices: list
    step: dict  # loop role -> elements


def _operands(nest: _Nest):
    """``(C, A, B)`` of the nest's block ``C[...] = C[...] + cast(A[...]) * cast(B[...])``,
    their indices in loop variables and the element step of each loop."""
    import tvm

    blk = nest.realize.block
    bind = {iv.var: v for iv, v in zip(blk.iter_vars, nest.realize.iter_values)}
    store = blk.body
    value = store.value
    ok = (isinstance(store, tvm.tirx.BufferStore) and isinstance(value, tvm.tirx.Add)
          and isinstance(value.b, tvm.tirx.Mul))
    if not ok:
        raise RuntimeError(f"{ANNOTATION}: block {blk.name_hint} is not C = C + A * B")
    loads = []
    for part in (value.b.a, value.b.b):
        part = part.value if isinstance(part, tvm.tirx.Cast) else part
        if not isinstance(part, tvm.ir.TensorLoad):  # what tirx.BufferLoad makes
            raise RuntimeError(f"{ANNOTATION}: {part} is not a buffer load")
        loads.append((part.source, part.indices))
    roles = nest.roles()
    names = list(roles)
    loop_vars = [roles[r].loop_var for r in names]
    out = []
    # the loops' ranges let a re-laid-out operand's [w // k, .., w % k] fold into the loops;
    # not a loop of one step: the range would fold its variable to 0 and hide its stride
    bounds = {lp.loop_var: tvm.ir.Range.from_min_extent(lp.min, lp.extent)
              for lp in roles.values() if int(lp.extent) > 1}
    for buf, idx in [(store.buffer, store.indices), *loads]:
        idx = [_subst(i, bind, bounds) for i in idx]
        coef = _coefficients(_flat(buf, idx), loop_vars)
        out.append(_Operand(buf, idx, dict(zip(names, coef))))
    c, a, b = out
    if a.step["lanes"] and not b.step["lanes"]:  # A is the operand the lanes do not move
        a, b = b, a
    return [c, a, b], blk.init is not None


def _check_layout(c, a, b, nest: _Nest, ins: Instruction) -> None:
    """The steps the tile instructions take for granted: lanes and ``k x dot`` contiguous in
    a row, rows evenly spaced, each operand independent of the other's axes. A loop of one
    step has no stride to check (a Wo of 3 or 4 makes ``k`` one pair)."""
    roles = nest.roles()
    want = [(c, "lanes", 1), (c, "k", 0), (c, "dot", 0),
            (a, "dot", 1), (a, "k", ins.dot), (a, "lanes", 0), (a, "n", 0),
            (b, "dot", 1), (b, "lanes", ins.dot), (b, "rows", 0), (b, "m", 0)]
    bad = [(op.buffer.name, role, op.step[role], step) for op, role, step in want
           if op.step[role] != step and int(roles[role].extent) > 1]
    # B's rows (one per k) may lie any distance apart: tileloadd takes the stride
    bad += [(b.buffer.name, "k", b.step["k"], "> 0")] \
        if b.step["k"] <= 0 and int(nest.k.extent) > 1 else []
    k_bytes = nest.k_bytes(ins, a.buffer)
    bad += [(a.buffer.name, "k", k_bytes, f"<= {ROW_BYTES} bytes")] if k_bytes > ROW_BYTES else []
    if bad or int(nest.dot.extent) != ins.dot or int(nest.lanes.extent) != ROW_BYTES // 4:
        raise RuntimeError(f"{ANNOTATION}: the operands' layout does not fit the tiles "
                           f"(buffer, loop, step, wanted): {bad}")


def _tile_loop(loop, views: dict):
    """The marked loop over a task's register tiles (:func:`tile_reduction`) with each
    iteration's nest rewritten (:func:`_tile_nest`) and what follows the nest in the loop's
    body (the tile's write-back) kept; and the tile shapes it uses."""
    import tvm
    from tvm import tirx

    body = loop.body
    parts = list(body.seq) if isinstance(body, tvm.tirx.SeqStmt) else [body]
    nest = _take_apart(parts[0], int(loop.annotations[ANNOTATION]))
    tiles, shapes = _tile_nest(nest, views)
    new_body = tirx.SeqStmt([tiles, *parts[1:]]) if len(parts) > 1 else tiles
    return _unmarked(loop, ANNOTATION, new_body), shapes


def _tile_nest(nest: _Nest, views: dict):
    """The tile instructions of one register tile's nest, and the tile shapes they need
    (tile number -> (rows, bytes per row)); the raw views of its bfloat16 operands are
    added to ``views`` (declared once, by :func:`_with_permission`)."""
    from tvm import s_tir, tirx

    (c, a, b), has_init = _operands(nest)
    ins = INSTRUCTIONS[str(a.buffer.dtype), str(b.buffer.dtype), str(c.buffer.dtype)]
    _check_layout(c, a, b, nest, ins)
    mt, nt, rows = int(nest.m.extent), int(nest.n.extent), int(nest.rows.extent)
    k_bytes = nest.k_bytes(ins, a.buffer)
    c_tile = [[m * nt + n for n in range(nt)] for m in range(mt)]
    a_tile = [C_TILES + m for m in range(mt)]
    b_tile = [C_TILES + mt + n for n in range(nt)]
    shapes = {t: (rows, ROW_BYTES) for row in c_tile for t in row}
    shapes.update({t: (rows, k_bytes) for t in a_tile})
    shapes.update({t: (int(nest.k.extent), ROW_BYTES) for t in b_tile})
    raw = [op.buffer for op in (a, b) if str(op.buffer.dtype) == "bfloat16"]
    for buf in raw:
        views.setdefault(buf.name, (buf, _raw_view(buf)))
    at = _addresser(nest, {name: view for name, (_, view) in views.items()})

    steps = [_tile_load(a_tile[m], at(a, m=m), _row_bytes(a)) for m in range(mt)]
    steps += [_tile_load(b_tile[n], at(b, n=n), _row_bytes(b, "k")) for n in range(nt)]
    steps += [_intrin(ins.llvm, c_tile[m][n], a_tile[m], b_tile[n])
              for m in range(mt) for n in range(nt)]
    step_loop = tirx.SeqStmt(steps)
    for s in reversed(nest.steps):
        step_loop = tirx.For(s.loop_var, s.min, s.extent, tirx.ForKind.SERIAL, step_loop)
    first = [_intrin("llvm.x86.tilezero", c_tile[m][n]) if has_init else
             _tile_load(c_tile[m][n], at(c, m, n), _row_bytes(c))
             for m in range(mt) for n in range(nt)]
    last = [_intrin("llvm.x86.tilestored64", c_tile[m][n], at(c, m, n), _row_bytes(c))
            for m in range(mt) for n in range(nt)]
    region = [_region(op, nest) for op in (c, a, b)]
    blk = s_tir.SBlock([], region[1:] + ([region[0]] if not has_init else []), region[:1],
                       f"{nest.realize.block.name_hint}_amx",
                       tirx.SeqStmt(first + [step_loop] + last))
    return s_tir.SBlockRealize([], True, blk), shapes


def _raw_view(buf):
    """A flat view of ``buf``'s memory in an integer dtype of its width: the tiles take raw
    bits, and an access through another dtype keeps TVM's BF16ComputeLegalize from
    widening a bfloat16 buffer the kernel allocates to float32 (the tiles would read fp32
    words as bfloat16 pairs)."""
    from tvm import tirx

    from schedules.patterns.common import product

    return tirx.decl_buffer((product(buf.shape),), f"uint{buf.dtype.bits}",
                            name=f"{buf.name}_bits", data=buf.data)


def _addresser(nest: _Nest, views: dict):
    """``at(op, m, n)``: the address of ``op``'s element at accumulator tile ``(m, n)`` of
    the current reduction step (row, lane and ``k`` 0), through its raw view."""
    from tvm import tirx

    zero = {nest.rows.loop_var: 0, nest.lanes.loop_var: 0, nest.k.loop_var: 0,
            nest.dot.loop_var: 0}

    def at(op, m=0, n=0):
        sub = {**zero, nest.m.loop_var: m, nest.n.loop_var: n}
        view = views.get(op.buffer.name)
        if view is None:
            return tirx.address_of(tirx.BufferLoad(op.buffer, [_subst(i, sub)
                                                               for i in op.indices]))
        flat = _subst(_flat(op.buffer, op.indices), sub)
        return tirx.address_of(tirx.BufferLoad(view, [flat]))

    return at


def _row_bytes(op, axis: str = "rows"):
    """The stride between tile rows of operand ``op`` (along loop ``axis``: ``k`` for
    ``B``), in bytes (int64, as the instruction takes it)."""
    from tvm import tirx

    return tirx.const(op.step[axis] * op.buffer.dtype.bits // 8, "int64")


def _subst(expr, mapping: dict, bounds: dict | None = None):
    """``expr`` with each variable of ``mapping`` replaced by its expression, simplified
    knowing each variable of ``bounds`` lies in its range."""
    from tvm.sym import Analyzer

    ana = Analyzer()
    for var, rng in (bounds or {}).items():
        ana.bind(var, rng)
    for var, value in mapping.items():
        ana.bind(var, value)
    return ana.simplify(expr)


def _region(op, nest: _Nest):
    """The region of ``op.buffer`` the nest touches: per axis, its index with every loop of
    the nest at its first iteration, and the span the loops' steps reach (the block's reads
    and writes, from which TVM sizes the tile's ``local`` buffer)."""
    import tvm
    from tvm import tirx

    loops = list(nest.roles().values())
    first = {lp.loop_var: lp.min for lp in loops}
    ranges = []
    for index in op.indices:
        coef = _coefficients(index, [lp.loop_var for lp in loops])
        low = _subst(index, first)
        reach = [c * (int(lp.extent) - 1) for c, lp in zip(coef, loops)]
        low = low + sum(r for r in reach if r < 0)
        extent = 1 + sum(abs(r) for r in reach)
        ranges.append(tvm.ir.Range.from_min_extent(low, tirx.const(extent, str(index.ty))))
    return tirx.BufferRegion(op.buffer, ranges)


def _intrin(name: str, *args):
    """A void LLVM intrinsic call; ints are the tile numbers (``i8`` immediates)."""
    from tvm import tirx

    conv = [tirx.const(a, "int8") if isinstance(a, int) else a for a in args]
    return tirx.Evaluate(tirx.call_llvm_intrin("void", name, *conv))


def _tile_load(tile: int, ptr, stride):
    return _intrin("llvm.x86.tileloadd64", tile, ptr, stride)


def _config(cfg, shapes: dict):
    """Fill the 64-byte tile configuration: palette 1, then per tile its bytes per row
    (16-bit, from byte 16) and rows (from byte 48); unused tiles stay 0."""
    from tvm import tirx

    data = [0] * 64
    data[0] = 1
    for t, (rows, colsb) in shapes.items():
        data[16 + 2 * t], data[17 + 2 * t] = colsb & 0xFF, colsb >> 8
        data[48 + t] = rows
    return tirx.SeqStmt([tirx.BufferStore(cfg, tirx.const(v, "uint8"), [i])
                         for i, v in enumerate(data)])
