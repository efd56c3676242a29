"""Build-only: int8 dx for an AVX-512 VNNI target and bf16 dx / dw for an AVX512-BF16 target
compile to AVX-512 code (this host may lack both; nothing is run). int8 dx is laid out for, and
tensorized into, ``vpdpbusd``; dense bf16 dx and dw into ``vdpbf16ps`` (an LLVM function the
kernel imports: TVM turns bfloat16 values into uint16 before LLVM); on an AMX target (Sapphire
Rapids) into the tile products ``tdpbssd`` / ``tdpbf16ps``; without the instruction they
multiply in fp32."""

import pytest
from tvm import te

import dsl
import targets
from dsl.runtime.build import lower
from dsl.runtime.schedule import auto_schedule


def _asm(outs, ins, mcpu: str, feature: str) -> str:
    import tvm
    from tvm.target import codegen

    if not codegen.llvm_cpu_has_features([feature],
                                         tvm.target.Target({"kind": "llvm", "mcpu": mcpu})):
        pytest.skip(f"this LLVM does not know {mcpu} with {feature}")
    tgt = targets.get(mcpu) if mcpu in targets.names() else \
        targets.CpuTarget("probe", "x86", {"kind": "llvm", "mcpu": mcpu}, 512, 2)
    sch = auto_schedule(outs, target=tgt)
    lib = tvm.compile(lower(sch, "k", [*ins, *outs]), target=tgt.tvm_target())
    return lib.mod.inspect_source("s")


def _int8_dx(target: str):
    """A dense int8 dx whose compute is laid out for ``target`` (the target in force)."""
    fz = dsl.layout.Int8DxLayout.from_weight((37, 40, 3, 3), 1).fracz_shape
    dy = te.placeholder((1, 2, 6, 6, 32), name="out_backprop", dtype="int8")
    w = te.placeholder(fz, name="filters", dtype="int8")
    with targets.use(target):
        dx = dsl.conv2d_backprop_input(w, dy, (37, 40, 3, 3), (1, 40, 6, 6),
                                       {"padding": [1, 1, 1, 1], "res_dtype": "int32",
                                        "offset_x": -3})
    return dx, w, dy


def _bf16_dx(target: str):
    dy = te.placeholder((1, 2, 6, 6, 16), name="out_backprop", dtype="bfloat16")
    w = te.placeholder((2 * 9, 2, 16, 16), name="filters", dtype="bfloat16")
    with targets.use(target):
        dx = dsl.conv2d_backprop_input(w, dy, (32, 32, 3, 3), (1, 32, 6, 6),
                                       {"padding": [1, 1, 1, 1], "res_dtype": "bfloat16"})
    return dx, w, dy


def _bf16_dw(target: str):
    dy = te.placeholder((1, 2, 6, 6, 16), name="out_backprop", dtype="bfloat16")
    x = te.placeholder((1, 2, 6, 6, 16), name="fmap", dtype="bfloat16")
    with targets.use(target):
        dw = dsl.conv2d_backprop_filter(x, dy, (32, 32, 3, 3), {"padding": [1, 1, 1, 1]})
    return dw, x, dy


# (kernel builder, {target with the instruction: the instruction}, its LLVM feature, a target
# without it, what that one multiplies with); a target with AMX takes its tile products
CASES = {
    "int8 dx": (_int8_dx, {"icelake-server": "vpdpbusd", "znver4": "vpdpbusd",
                           "sapphirerapids": "tdpbssd"}, "avx512vnni",
                "skylake-avx512", "vpmulld"),
    "bf16 dx": (_bf16_dx, {"sapphirerapids": "tdpbf16ps", "znver4": "vdpbf16ps"}, "avx512bf16",
                "icelake-server", "vfmadd"),
    "bf16 dw": (_bf16_dw, {"sapphirerapids": "tdpbf16ps", "znver4": "vdpbf16ps"}, "avx512bf16",
                "icelake-server", "vfmadd"),
}
WITH = [(k, mcpu) for k, c in CASES.items() for mcpu in c[1]]


@pytest.mark.parametrize("kind,mcpu", WITH, ids=[f"{k}-{m}" for k, m in WITH])
def test_dot_product_instruction_on_a_target_that_has_it(kind, mcpu):
    build, instrs, feature, _, _ = CASES[kind]
    out, *ins = build(mcpu)
    assert instrs[mcpu] in _asm([out], ins, mcpu, feature)


@pytest.mark.parametrize("kind", list(CASES))
def test_plain_multiply_adds_on_a_target_without_it(kind):
    build, instrs, _, without, plain = CASES[kind]
    out, *ins = build(without)
    asm = _asm([out], ins, without, "avx512f")
    assert "zmm" in asm and plain in asm
    assert not any(instr in asm for instr in instrs.values())
