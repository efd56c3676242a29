"""What a TIR block *is*, read from its structure (iterator kinds, buffer accesses).

Users write plain ``te.compute`` without tags, so the pattern rules classify each block of
the scheduled ``PrimFunc`` from the block itself:

* ``injective``: every iterator spatial. ``elementwise`` when every read indexes its buffer
  with the block's iterators in order (a broadcast read uses a subset of them, in order);
  ``padding`` when the value is guarded (``if_then_else`` / ``Select``) around a load;
  ``layout`` for any other index arithmetic (transposes, reshapes, windows).
* ``contraction``: a sum of a product of two loads, each missing a spatial iterator the
  other has (so every loaded value is reused across a tile): matmul, batched matmul,
  convolutions (a windowed index such as ``h * s + r`` on one operand).
  An operand that reads an iterator only by group (``o // K``: a grouped convolution's input
  channel block) counts as lacking it.
* ``reduction``: any other block with reduction iterators (sums, max, sum of squares), over
  the innermost axis of its largest input, over outer axes, or over a *window* moving with
  the output's innermost axis (``x[.., i + ry, j + rx]``: a depthwise convolution).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm_ffi

SPATIAL, REDUCE = 0, 2


def nodes_of(expr, kind) -> list:
    """Every node of type ``kind`` in ``expr`` (post order)."""
    out = []
    tvm_ffi.structural_walk(expr, (kind, out.append), order="post")
    return out


def loads_of(expr) -> list:
    """Every buffer load in ``expr`` (post order)."""
    from tvm.ir.expr import TensorLoad

    return nodes_of(expr, TensorLoad)


def vars_of(expr) -> set[str]:
    from tvm.ir.prim.expr import Var

    return {v.name for v in nodes_of(expr, Var)}


def stride_in(index, var: str) -> int | None:
    """Stride of ``index`` in iterator ``var`` (0 when it does not use it, None when not
    linear)."""
    from tvm.ir.prim.expr import Var
    from tvm.sym.pattern import detect_linear_equation

    vs = [v for v in nodes_of(index, Var) if v.name == var]
    if not vs:
        return 0
    res = detect_linear_equation(index, [vs[0]])
    if len(res) != 2 or not hasattr(res[0], "value"):
        return None
    return int(res[0].value)


def _is_guarded(expr) -> bool:
    from tvm.ir.expr import Call
    from tvm.ir.prim.expr import Select

    if nodes_of(expr, Select):
        return True
    return any(getattr(c.op, "name", "") == "tirx.if_then_else" or
               "if_then_else" in str(getattr(c.op, "name", "")) for c in nodes_of(expr, Call))


def transcendental(expr) -> bool:
    """True if ``expr`` calls a math function (exp, log, tanh...): worth computing once."""
    from tvm.ir.expr import Call

    return any("if_then_else" not in str(getattr(c.op, "name", "")) and
               "reinterpret" not in str(getattr(c.op, "name", "")) for c in nodes_of(expr, Call))


@dataclass
class Access:
    """One buffer load: the buffer's name, shape and each index's variables."""

    buffer: str
    shape: tuple
    dtype: str
    indices: list          # PrimExpr per dimension
    index_vars: list       # set of iterator names per dimension
    grouped: dict = field(default_factory=dict)  # iterator -> K where only ``i // K`` reads

    def pure(self) -> bool:
        """Every index is a bare iterator."""
        return all(len(vs) == 1 and str(ix) in vs for ix, vs in zip(self.indices,
                                                                     self.index_vars))

    def all_vars(self) -> set[str]:
        return set().union(*self.index_vars) if self.index_vars else set()

    def reuse_vars(self) -> set[str]:
        """The iterators that move this load: every one but those it reads only by group
        (``o // K``: a grouped conv2d's input channel block), whose value is the same across
        each group of ``K`` iterations, as a tile inside one group sees."""
        return self.all_vars() - set(self.grouped)


@dataclass
class BlockFacts:
    """Structure of one block child of the root."""

    name: str
    spatial: list          # iterator names, spatial, in order
    reduce: list           # iterator names, reduction, in order
    extents: dict          # iterator name -> int extent
    out_buffer: str
    out_shape: tuple
    out_dtype: str
    write_vars: list       # iterator names indexing the output, per dimension
    reads: list = field(default_factory=list)   # Access per load (self-reads excluded)
    kind: str = "unknown"  # elementwise | broadcast | padding | layout | contraction | reduction
    why: str = ""
    operands: tuple = ()   # contraction: (Access, Access)
    # contraction: the product is cast(a) * cast(b), each load widened to the output's dtype
    # (what a dot-product instruction computes)
    operands_cast: bool = False
    costly: bool = False   # calls a math function (exp, log, ...)
    copy: bool = False     # elementwise, its value one load of a buffer its shape and dtype

    @property
    def injective(self) -> bool:
        return self.kind in ("elementwise", "broadcast", "padding", "layout")


def reads_trailing(acc: Access, tail: list, extents: dict) -> bool:
    """Whether ``acc`` reads the iterators ``tail`` as its last dimensions, bare and in
    order, each but the first whole (``extents``): one contiguous run of memory over them."""
    k = len(tail)
    return (len(acc.indices) >= k and [str(ix) for ix in acc.indices[-k:]] == list(tail)
            and all(acc.shape[t - k] == extents[tail[t]] for t in range(1, k)))


def indexed_by(acc: Access, names) -> bool:
    """Whether any dimension of ``acc`` is indexed by one of the iterators ``names``."""
    return bool(set().union(*acc.index_vars) & set(names)) if acc.index_vars else False


def _access(load) -> Access:
    buf = load.source
    return Access(buf.name, tuple(int(d) for d in buf.shape), str(buf.dtype), list(load.indices),
                  [vars_of(ix) for ix in load.indices], _grouped(load.indices))


def _grouped(indices) -> dict:
    """``{iterator: K}`` for each iterator these indices use only as ``iterator // K``
    (``K`` a constant above 1, the same everywhere)."""
    from tvm.ir.prim.expr import FloorDiv, IntImm, Var

    divs: dict = {}
    for ix in indices:
        for d in nodes_of(ix, FloorDiv):
            if isinstance(d.a, Var) and isinstance(d.b, IntImm) and int(d.b.value) > 1:
                divs.setdefault(d.a.name, set()).add(int(d.b.value))
    out = {}
    for name, ks in divs.items():
        bare = sum(1 for ix in indices for v in nodes_of(ix, Var) if v.name == name)
        inside = sum(1 for ix in indices for d in nodes_of(ix, FloorDiv)
                     if isinstance(d.a, Var) and d.a.name == name)
        if len(ks) == 1 and bare == inside:
            out[name] = ks.pop()
    return out


def block_facts(sch, block) -> BlockFacts:
    """Classify one block (see the module docstring)."""
    stmt = sch.get(block)
    sp = [iv.var.name for iv in stmt.iter_vars if int(iv.iter_type) == SPATIAL]
    rd = [iv.var.name for iv in stmt.iter_vars if int(iv.iter_type) == REDUCE]
    ext = {}
    for iv in stmt.iter_vars:
        e = iv.dom.extent
        ext[iv.var.name] = int(e) if hasattr(e, "value") else -1
    body = stmt.body
    store_buf = getattr(body, "buffer", None)
    if store_buf is None:
        store_buf = getattr(body, "source", None)
    if store_buf is None or not hasattr(body, "value") or not hasattr(body, "indices"):
        return BlockFacts(stmt.name_hint, sp, rd, ext, "", (), "", [], kind="opaque",
                          why="its body is not a single buffer store")
    out = BlockFacts(stmt.name_hint, sp, rd, ext, store_buf.name,
                     tuple(int(d) for d in store_buf.shape), str(store_buf.dtype),
                     [vars_of(ix) for ix in body.indices])
    out.reads = [_access(ld) for ld in loads_of(body.value) if ld.source.name != store_buf.name]
    out.costly = transcendental(body.value)
    if any(e < 0 for e in ext.values()):
        out.kind, out.why = "opaque", "an iterator has a symbolic extent"
    elif not rd:
        _classify_injective(out, body)
    else:
        _classify_reduction(out, body)
    return out


def _classify_injective(f: BlockFacts, body) -> None:
    pure_out = all(len(vs) == 1 for vs in f.write_vars) and \
        [next(iter(vs)) for vs in f.write_vars] == f.spatial
    if _is_guarded(body.value):
        f.kind, f.why = "padding", "a guarded (if_then_else / select) load: a padding stage"
        return
    if not pure_out:
        f.kind, f.why = "layout", "its output index is not the bare iterators"
        return
    order = {v: i for i, v in enumerate(f.spatial)}
    kind = "elementwise"
    for acc in f.reads:
        if not acc.pure():
            f.kind, f.why = "layout", f"reads {acc.buffer} through index arithmetic"
            return
        pos = [order[str(ix)] for ix in acc.indices if str(ix) in order]
        if pos != sorted(pos):
            f.kind, f.why = "layout", f"reads {acc.buffer} with permuted axes (a transpose)"
            return
        if len(pos) < len(f.spatial):
            kind = "broadcast"
    f.kind = kind
    f.why = ("every iterator spatial, every read indexed by the output's iterators" if
             kind == "elementwise" else "every iterator spatial, a read broadcast along an axis")
    from tvm.ir.expr import TensorLoad

    f.copy = (kind == "elementwise" and isinstance(body.value, TensorLoad)
              and (f.reads[0].shape, f.reads[0].dtype) == (f.out_shape, f.out_dtype))
    if f.copy:
        f.why = "a copy of " + f.reads[0].buffer


def _summand(value, out_name: str):
    """``t`` where ``value`` is ``out + t`` (either way round), else None."""
    from tvm.ir.prim.expr import Add

    if not isinstance(value, Add):
        return None
    return value.b if loads_of(value.a) and loads_of(value.a)[0].source.name == out_name \
        else value.a


def _product_operands(value, out_name: str):
    """``(a, b)`` loads if ``value`` is ``out + a * b`` (casts allowed), else None."""
    from tvm.ir.prim.expr import Cast, Mul

    prod = _summand(value, out_name)
    while isinstance(prod, Cast):
        prod = prod.value
    if not isinstance(prod, Mul):
        return None
    la, lb = loads_of(prod.a), loads_of(prod.b)
    if len(la) != 1 or len(lb) != 1:
        return None
    return la[0], lb[0]


def _each_widened(value, out_name: str, dtype: str) -> bool:
    """Whether ``value`` is ``out + cast(a) * cast(b)``, each factor one load cast to
    ``dtype`` from a narrower type."""
    from tvm.ir.prim.expr import Cast, Mul

    prod = _summand(value, out_name)
    if not isinstance(prod, Mul):
        return False
    return all(isinstance(x, Cast) and str(x.ty.dtype) == dtype and len(loads_of(x)) == 1
               and str(loads_of(x)[0].source.dtype) != dtype for x in (prod.a, prod.b))


def _elems(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def largest_read(f: BlockFacts) -> Access | None:
    """The block's largest input (the one a reduction's loop order is chosen for)."""
    return max(f.reads, key=lambda acc: _elems(acc.shape), default=None)


def _classify_reduction(f: BlockFacts, body) -> None:
    ops = _product_operands(body.value, f.out_buffer)
    if ops is not None:
        a, b = _access(ops[0]), _access(ops[1])
        red = set(f.reduce)
        sp = {v for v in f.spatial if f.extents[v] > 1}
        only_a, only_b = (sp & a.all_vars()) - b.reuse_vars(), (sp & b.all_vars()) - a.reuse_vars()
        if red & a.all_vars() and red & b.all_vars() and only_a and only_b:
            f.kind, f.operands = "contraction", (a, b)
            f.operands_cast = _each_widened(body.value, f.out_buffer, f.out_dtype)
            windowed = any(len(vs) > 1 for acc in (a, b) for vs in acc.index_vars)
            f.why = ("a sum of products of two operands, each reused along an axis the "
                     "other lacks" + (" (a windowed index: a convolution)" if windowed else ""))
            return
    f.kind = "reduction"
    # the largest input decides (a matrix-vector product is led by the matrix)
    big = largest_read(f)
    inner = big.index_vars[-1] if big is not None and big.index_vars else set()
    where = "innermost" if inner & set(f.reduce) else "outer"
    if _windowed_along_output(f, big):
        where = "window"
    f.why = (f"reduction iterators {f.reduce} over a window of its input" if where == "window"
             else f"reduction iterators {f.reduce} over the {where} axis of its input")
    f.extra_where = where  # type: ignore[attr-defined]


# Output strides along the row a window reduction is vectorised at: a vector of a stride-2
# window loads two and keeps every other lane (one permute), still far ahead of one lane at a
# time.
WINDOW_STRIDES = (1, 2)


def _windowed_along_output(f: BlockFacts, big: Access) -> bool:
    """Whether ``big``'s innermost index moves by one (or by a stride in
    :data:`WINDOW_STRIDES`) with the output's innermost iterator, and some index of it is a
    window: an output iterator plus a reduction of more than one step (``x[.., i + ry, j +
    rx]`` NCHW or ``x[.., i + ry, j + rx, c]`` NHWC: a depthwise conv2d, a window sum or max;
    :mod:`schedules.patterns.window`)."""
    last = f.write_vars[-1] if f.write_vars else set()
    red, sp = set(f.reduce), set(f.spatial)
    taps = [r for vs in big.index_vars if vs & sp for r in vs & red if f.extents[r] > 1]
    if not taps or len(last) != 1:
        return False
    return stride_in(big.indices[-1], next(iter(last))) in WINDOW_STRIDES


def root_blocks(sch) -> list:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def all_facts(sch) -> dict:
    """``{block name: BlockFacts}`` for every block under the root, in program order."""
    return {sch.get(b).name_hint: block_facts(sch, b) for b in root_blocks(sch)}


def consumers_of(facts: dict, name: str) -> list[str]:
    buf = facts[name].out_buffer
    return [n for n, f in facts.items() if n != name and any(a.buffer == buf for a in f.reads)]


def output_blocks(sch) -> set[str]:
    """Names of the blocks that write a kernel output."""
    return {sch.get(b).name_hint for b in sch.get_output_blocks(sch.get_sblock("root"))}
