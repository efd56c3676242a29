"""Build-only: int8 dx for an AVX-512 VNNI target and bf16 dx / dw for an AVX512-BF16 target
compile to AVX-512 code (this host may lack both; nothing is run). int8 dx is laid out for, and
tensorized into, ``vpdpbusd``; dense bf16 dx and dw into ``vdpbf16ps`` (an LLVM function the
kernel imports: TVM turns bfloat16 values into uint16 before LLVM); without the instruction
they multiply in fp32."""

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


@pytest.mark.parametrize("mcpu", ["icelake-server", "znver4", "sapphirerapids"])
def test_int8_dx_uses_vnni_on_a_vnni_target(mcpu):
    dx, w, dy = _int8_dx(mcpu)
    asm = _asm([dx], [w, dy], mcpu, "avx512vnni")
    assert "vpdpbusd" in asm


def test_int8_dx_multiplies_in_int32_without_vnni():
    dx, w, dy = _int8_dx("skylake-avx512")
    asm = _asm([dx], [w, dy], "skylake-avx512", "avx512f")
    assert "zmm" in asm and "vpmulld" in asm and "vpdpbusd" not in asm


def _bf16_dx(target: str):
    dy = te.placeholder((1, 2, 6, 6, 16), name="out_backprop", dtype="bfloat16")
    w = te.placeholder((2 * 9, 2, 16, 16), name="filters", dtype="bfloat16")
    with targets.use(target):
        dx = dsl.conv2d_backprop_input(w, dy, (32, 32, 3, 3), (1, 32, 6, 6),
                                       {"padding": [1, 1, 1, 1], "res_dtype": "bfloat16"})
    return dx, w, dy


@pytest.mark.parametrize("mcpu", ["sapphirerapids", "znver4"])
def test_bf16_dx_uses_vdpbf16ps_on_an_avx512_bf16_target(mcpu):
    dx, w, dy = _bf16_dx(mcpu)
    asm = _asm([dx], [w, dy], mcpu, "avx512bf16")
    assert "vdpbf16ps" in asm


def test_bf16_dx_multiplies_in_fp32_without_avx512_bf16():
    dx, w, dy = _bf16_dx("icelake-server")
    asm = _asm([dx], [w, dy], "icelake-server", "avx512f")
    assert "zmm" in asm and "vfmadd" in asm and "vdpbf16ps" not in asm


def _bf16_dw(target: str):
    dy = te.placeholder((1, 2, 6, 6, 16), name="out_backprop", dtype="bfloat16")
    x = te.placeholder((1, 2, 6, 6, 16), name="fmap", dtype="bfloat16")
    with targets.use(target):
        dw = dsl.conv2d_backprop_filter(x, dy, (32, 32, 3, 3), {"padding": [1, 1, 1, 1]})
    return dw, x, dy


@pytest.mark.parametrize("mcpu", ["sapphirerapids", "znver4"])
def test_bf16_dw_uses_vdpbf16ps_on_an_avx512_bf16_target(mcpu):
    dw, x, dy = _bf16_dw(mcpu)
    assert "vdpbf16ps" in _asm([dw], [x, dy], mcpu, "avx512bf16")


def test_bf16_dw_multiplies_in_fp32_without_avx512_bf16():
    dw, x, dy = _bf16_dw("icelake-server")
    asm = _asm([dw], [x, dy], "icelake-server", "avx512f")
    assert "zmm" in asm and "vfmadd" in asm and "vdpbf16ps" not in asm
