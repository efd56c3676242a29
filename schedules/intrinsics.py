"""Dot-product instructions as tensor intrinsics, for ``sch.tensorize``.

A dot-product step is 16 lanes of a 512-bit accumulator, each adding the ``depth`` products of
one broadcast group of ``A`` with its own group of ``B``::

    C[i] += sum_{k < depth} A[k] * B[i, k]        (i < 16)

``vpdpbusd`` (AVX-512 VNNI, depth 4: ``A`` unsigned bytes, ``B`` signed bytes, int32 lanes)
is registered here with ``C`` in ``local`` scope, where a register tile keeps its
accumulators (TVM's own ``dot_16x4_vnni`` wants a global ``C`` and passes LLVM ``<16 x i32>``
operands, which LLVM's verifier now refuses). A schedule asks :func:`dot_intrinsic` which
one a reduction block can use on a target: the target must have the instruction
(:meth:`targets.CpuTarget.dot_depth`) and the block's innermost reduction must be that many
elements of those dtypes; anything else keeps its multiply-adds. ``vdpbf16ps`` (bfloat16
pairs) is not here: TVM 0.27 turns bfloat16 values into uint16 before LLVM, whose intrinsic
takes ``<32 x bfloat>`` (README, Known limitations).
"""

from __future__ import annotations

import functools

LANES = 16  # int32 / fp32 lanes of one 512-bit register

# (A dtype, B dtype, accumulator dtype) -> (dtype dot_depth is asked for, LLVM intrinsic, the
# vector type of A's broadcast groups). LLVM's vpdpbusd takes <16 x i32>, <64 x i8>, <64 x i8>.
_BY_DTYPES = {
    ("uint8", "int8", "int32"): ("int8", "llvm.x86.avx512.vpdpbusd.512", "uint8x64"),
}


@functools.cache
def _register(a_dtype: str, b_dtype: str, c_dtype: str, depth: int) -> str:
    """Register the instruction for these dtypes once (TVM's registry keeps it for the
    process); ``C`` is the ``local`` accumulator tile of a register tile (TVM's own
    ``dot_16x4_vnni`` expects a global one)."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    _, llvm_name, operand = _BY_DTYPES[a_dtype, b_dtype, c_dtype]
    name = f"dsl_dot_{LANES}x{depth}_{a_dtype}_{b_dtype}_{c_dtype}"
    group = f"{a_dtype}x{depth}"

    @T.prim_func(s_tir=True)
    def desc(a: T.Buffer((depth,), a_dtype, offset_factor=1),
             b: T.Buffer((LANES, depth), b_dtype, offset_factor=1),
             c: T.Buffer((LANES,), c_dtype, offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:LANES], a[0:depth], b[0:LANES, 0:depth])
            T.writes(c[0:LANES])
            for i, k in T.grid(LANES, depth):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    c[vi] = c[vi] + T.cast(a[vk], c_dtype) * T.cast(b[vi, vk], c_dtype)

    @T.prim_func(s_tir=True)
    def impl(a: T.Buffer((depth,), a_dtype, offset_factor=1),
             b: T.Buffer((LANES, depth), b_dtype, offset_factor=1),
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

    TensorIntrin.register(name, desc, impl, override=True)
    return name


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
