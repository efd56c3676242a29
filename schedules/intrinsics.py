"""Dot-product instructions as tensor intrinsics, for ``sch.tensorize``.

A dot-product step is 16 lanes of a 512-bit accumulator, each adding the ``depth`` products of
one broadcast group of ``A`` with its own group of ``B``::

    C[i] += sum_{k < depth} A[k] * B[i, k]        (i < 16)

Two instructions are registered, with ``C`` in ``local`` scope, where a register tile keeps
its accumulators (TVM's own ``dot_16x4_vnni`` wants a global ``C`` and passes LLVM
``<16 x i32>`` operands, which LLVM's verifier now refuses):

- ``vpdpbusd`` (AVX-512 VNNI, depth 4: ``A`` unsigned bytes, ``B`` signed bytes, int32
  lanes), called as an LLVM intrinsic;
- ``vdpbf16ps`` (AVX512-BF16, depth 2: bfloat16 pairs, fp32 lanes). LLVM's intrinsic takes
  ``<32 x bfloat>`` vectors, and TVM 0.27 turns every bfloat16 value into ``uint16`` before
  LLVM, so no TIR expression can pass one: the instruction lives in a small LLVM IR function
  (:data:`_VDPBF16PS_LL`) that takes the operands' raw bits and bitcasts them. The schedule hands it
  to TVM's code generator with the loop pragma ``pragma_import_llvm``
  (:func:`llvm_import`), which links it in and inlines it, so the call costs nothing.

A schedule asks :func:`dot_intrinsic` which one a reduction block can use on a target: the
target must have the instruction (:meth:`targets.CpuTarget.dot_depth`) and the block's
innermost reduction must be that many elements of those dtypes; anything else keeps its
multiply-adds.
"""

from __future__ import annotations

import functools

LANES = 16  # int32 / fp32 lanes of one 512-bit register

# (A dtype, B dtype, accumulator dtype) -> (dtype dot_depth is asked for, LLVM intrinsic or
# imported function, the vector type of A's broadcast groups). LLVM's vpdpbusd takes
# <16 x i32>, <64 x i8>, <64 x i8>.
_BY_DTYPES = {
    ("uint8", "int8", "int32"): ("int8", "llvm.x86.avx512.vpdpbusd.512", "uint8x64"),
    ("bfloat16", "bfloat16", "float32"): ("bfloat16", "dsl_vdpbf16ps_16x2", None),
}

# C + (A pair broadcast) . B for 16 fp32 lanes. TVM hands bfloat16 over as its uint16 storage
# (the pair as one i32), so the function only bitcasts; the loads stay TVM's, with the alias
# facts that let LLVM keep the accumulators in registers. `internal` keeps the symbol out of
# the kernel library; TVM marks imported functions always-inline.
_VDPBF16PS_LL = r"""
define internal <16 x float> @dsl_vdpbf16ps_16x2(<16 x float> %c, i32 %pair,
                                                  <32 x i16> %b) alwaysinline {
  %one = insertelement <16 x i32> poison, i32 %pair, i64 0
  %all = shufflevector <16 x i32> %one, <16 x i32> poison, <16 x i32> zeroinitializer
  %av = bitcast <16 x i32> %all to <32 x bfloat>
  %bv = bitcast <32 x i16> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %c, <32 x bfloat> %av,
                                                           <32 x bfloat> %bv)
  ret <16 x float> %r
}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>,
                                                       <32 x bfloat>)
"""

_LLVM_IMPORTS = {"dsl_vdpbf16ps_16x2": _VDPBF16PS_LL}


def _desc(a_dtype: str, b_dtype: str, c_dtype: str, depth: int, swapped: bool = False):
    """What a dot-product step computes (the pattern ``tensorize`` matches). ``A`` and ``B``
    ask for no alignment: they may be a kernel's own arguments (a 1x1 dx reads ``dy`` as it
    comes), which TVM declares aligned to their element only. ``swapped``: the product
    written ``B * A`` (tensorize matches the expression as written)."""
    from tvm.script import tirx as T

    if swapped:
        @T.prim_func(s_tir=True)
        def desc_ba(a: T.Buffer((depth,), a_dtype, offset_factor=1, align=1),
                    b: T.Buffer((LANES, depth), b_dtype, offset_factor=1, align=1),
                    c: T.Buffer((LANES,), c_dtype, offset_factor=1, scope="local")) -> None:
            with T.sblock("root"):
                T.reads(c[0:LANES], b[0:LANES, 0:depth], a[0:depth])
                T.writes(c[0:LANES])
                for i, k in T.grid(LANES, depth):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        c[vi] = c[vi] + T.cast(b[vi, vk], c_dtype) * T.cast(a[vk], c_dtype)

        return desc_ba

    @T.prim_func(s_tir=True)
    def desc(a: T.Buffer((depth,), a_dtype, offset_factor=1, align=1),
             b: T.Buffer((LANES, depth), b_dtype, offset_factor=1, align=1),
             c: T.Buffer((LANES,), c_dtype, offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:LANES], a[0:depth], b[0:LANES, 0:depth])
            T.writes(c[0:LANES])
            for i, k in T.grid(LANES, depth):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    c[vi] = c[vi] + T.cast(a[vk], c_dtype) * T.cast(b[vi, vk], c_dtype)

    return desc


def _impl_intrinsic(a_dtype: str, b_dtype: str, c_dtype: str, depth: int, llvm_name: str,
                    operand: str):
    """The step as one call of the LLVM intrinsic ``llvm_name`` on register values."""
    from tvm.script import tirx as T

    group = f"{a_dtype}x{depth}"

    @T.prim_func(s_tir=True)
    def impl(a: T.Buffer((depth,), a_dtype, offset_factor=1, align=1),
             b: T.Buffer((LANES, depth), b_dtype, offset_factor=1, align=1),
             c: T.Buffer((LANES,), c_dtype, offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:LANES], a[0:depth], b[0:LANES, 0:depth])
            T.writes(c[0:LANES])
            one = T.reinterpret(a.vload([0], group), dtype="int32")  # the group, as one lane
            c[T.ramp(T.int32(0), 1, LANES)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(llvm_name),
                c.vload([0], f"{c_dtype}x{LANES}"),
                T.reinterpret(T.broadcast(one, LANES), dtype=operand),
                b.vload([0, 0], f"{b_dtype}x{LANES * depth}"),
                dtype=f"{c_dtype}x{LANES}")

    return impl


def _impl_imported(a_dtype: str, b_dtype: str, c_dtype: str, depth: int, func: str):
    """The step as a call of the imported LLVM function ``func`` (:data:`_LLVM_IMPORTS`) on
    the raw bits of ``A``'s group (one 32-bit lane) and of ``B`` (16-bit lanes), read through
    ``uint16`` views of the two buffers: a bfloat16 load would be widened to float32 first
    (BF16ComputeLegalize)."""
    from tvm.script import tirx as T

    raw = f"uint16x{LANES * depth}"

    @T.prim_func(s_tir=True)
    def impl(a: T.Buffer((depth,), a_dtype, offset_factor=1, align=1),
             b: T.Buffer((LANES, depth), b_dtype, offset_factor=1, align=1),
             c: T.Buffer((LANES,), c_dtype, offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:LANES], a[0:depth], b[0:LANES, 0:depth])
            T.writes(c[0:LANES])
            a_bits = T.decl_buffer((depth,), "uint16", data=a.data, elem_offset=a.elem_offset)
            b_bits = T.decl_buffer((LANES * depth,), "uint16", data=b.data,
                                   elem_offset=b.elem_offset)
            c[T.ramp(T.int32(0), 1, LANES)] = T.call_extern(
                f"{c_dtype}x{LANES}", func, c.vload([0], f"{c_dtype}x{LANES}"),
                T.reinterpret(a_bits.vload([0], f"uint16x{depth}"), dtype="int32"),
                b_bits.vload([0], raw))

    return impl


@functools.cache
def _register(a_dtype: str, b_dtype: str, c_dtype: str, depth: int,
              swapped: bool = False) -> str:
    """Register the instruction for these dtypes once (TVM's registry keeps it for the
    process); ``swapped``: for products written ``B * A``."""
    from tvm.s_tir import TensorIntrin

    _, llvm_name, operand = _BY_DTYPES[a_dtype, b_dtype, c_dtype]
    name = f"dsl_dot_{LANES}x{depth}_{a_dtype}_{b_dtype}_{c_dtype}" + ("_ba" if swapped else "")
    if llvm_name in _LLVM_IMPORTS:
        impl = _impl_imported(a_dtype, b_dtype, c_dtype, depth, llvm_name)
    else:
        impl = _impl_intrinsic(a_dtype, b_dtype, c_dtype, depth, llvm_name, operand)
    TensorIntrin.register(name, _desc(a_dtype, b_dtype, c_dtype, depth, swapped), impl,
                          override=True)
    _NAMES[name] = llvm_name
    return name


_NAMES: dict[str, str] = {}  # registered intrinsic -> LLVM intrinsic or imported function


def llvm_import(intrin: str) -> str | None:
    """LLVM IR the code generator must link in for a function that uses the registered
    intrinsic ``intrin`` (a loop's ``pragma_import_llvm``), or None."""
    return _LLVM_IMPORTS.get(_NAMES.get(intrin, ""))


def dot_intrinsic(sch, block, target) -> str | None:
    """The tensor intrinsic for ``block``'s innermost (reduction) loop and the lane loop just
    outside it on ``target``, or None. The block must write ``C`` and read ``A`` (broadcast)
    then ``B`` in the dtypes of one of the instructions, and its last reduction iterator must
    be the instruction's depth."""
    blk = sch.get(block)
    reads = [r.source.dtype for r in blk.reads if r.source.name != blk.writes[0].source.name]
    if len(reads) != 2 or not blk.iter_vars:
        return None
    hit = _BY_DTYPES.get((str(reads[0]), str(reads[1]), str(blk.writes[0].source.dtype)))
    if hit is None:
        return None
    dtype = hit[0]
    depth = target.dot_depth(dtype)
    last = blk.iter_vars[-1]
    if depth <= 1 or int(last.iter_type) != 2 or int(last.dom.extent) != depth:
        return None
    return _register(str(reads[0]), str(reads[1]), str(blk.writes[0].source.dtype), depth)


def dot_for(a_dtype: str, b_dtype: str, c_dtype: str, target,
            swapped: bool = False) -> tuple[str, int] | None:
    """``(tensor intrinsic, depth)`` of the target's dot-product instruction for a product of
    ``a_dtype`` (broadcast) and ``b_dtype`` summed in ``c_dtype`` (a user's bfloat16 matmul
    summed in float32), written ``B * A`` where ``swapped``; None where the target has none
    for them."""
    hit = _BY_DTYPES.get((a_dtype, b_dtype, c_dtype))
    depth = target.dot_depth(hit[0]) if hit is not None else 1
    return None if depth <= 1 else (_register(a_dtype, b_dtype, c_dtype, depth, swapped),
                                    depth)
