"""AMX tiles for the dot-product dx and dw (``schedules/amx.py``): the tile plan, the rewritten
kernel's structure for an AMX target (built anywhere, not run), and results against the
float64 reference where this machine has AMX."""

import dataclasses
import re

import numpy as np
import pytest

import dsl
import targets
from dsl.ops.group import GroupLayout
from dsl.runtime.build import lower
from schedules import amx

from cases import C
from helpers import (
    assert_close,
    case_id,
    dw_data,
    dw_kernel,
    dx_data,
    dx_kernel,
    nc1hwc0_to_nchw,
    nchw_to_5hd,
    out_hw,
    para,
    weight_to_fracz,
)
from reference import conv2d_backprop_filter as ref_dw
from reference import conv2d_backprop_input as ref_dx

SPR = targets.get("sapphirerapids")
HOST_HAS_AMX = targets.get("host").has("amx_tile", "amx_bf16", "amx_int8")


@pytest.mark.parametrize("extent, rows, mt", [
    (56, 14, 2), (28, 14, 2), (14, 14, 1), (32, 16, 2), (16, 16, 1), (48, 16, 1),
    (13, 13, 1), (7, 7, 1), (1, 1, 1), (34, 2, 1),  # 34 = 2 x 17: 17 rows would not fit
])
def test_tile_rows(extent, rows, mt):
    assert amx.tile_rows(extent) == (rows, mt)


@pytest.mark.parametrize("tasks, cores, chunks", [
    (448, 2, 2), (448, 16, 16), (448, 48, 448), (56, 48, 56), (7, 2, 7), (12, 3, 3),
    (1, 1, 1), (6, 1, 1),
])
def test_core_chunks(tasks, cores, chunks):
    assert amx.core_chunks(tasks, cores) == chunks


def _lowered(c, dtype, tgt, offset_x=0):
    """The lowered TIR of case ``c``'s dx in ``dtype`` laid out and scheduled for ``tgt``."""
    from tvm import te

    ho, wo = out_hw(c)
    w_sizes = (c["cout"], c["cin"], c["kh"], c["kw"])
    c0 = 32 if dtype == "int8" else 16
    lay = (dsl.layout.Int8DxLayout if dtype == "int8" else GroupLayout).from_weight(w_sizes, 1)
    with targets.use(tgt):
        fz = te.placeholder(lay.fracz_shape, name="filters", dtype=dtype)
        dy = te.placeholder((c["n"], -(-c["cout"] // c0), ho, wo, c0), name="out_backprop",
                            dtype=dtype)
        res = "int32" if dtype == "int8" else "float32"
        extra = {"offset_x": offset_x} if dtype == "int8" else {}
        dx = dsl.conv2d_backprop_input(fz, dy, w_sizes, (c["n"], c["cin"], c["h"], c["w"]),
                                       {**para(c, res_dtype=res), **extra})
        sch = dsl.auto_schedule(dx, target=tgt)
    return str(dsl.explain(sch)), lower(sch, "k", [fz, dy, dx]).script()


@pytest.mark.parametrize("dtype, instr", [("bfloat16", "tdpbf16ps"), ("int8", "tdpbssd")])
def test_an_amx_target_gets_tile_products(dtype, instr):
    """One phase of 32 positions and 4 C1x blocks: 2 x 2 accumulator tiles of 16 rows, the
    tiles configured once per chunk of tasks (2 cores: 2 chunks), released after, and the
    tile state requested from Linux before anything; dx written from the tiles (int8: signed
    bytes as they come, so no weight-sum correction with offset_x 0)."""
    c = C(2, 64, 48, 6, 32, 3, 1, (1, 1, 1, 1), 1, 1)
    note, script = _lowered(c, dtype, dataclasses.replace(SPR, cores=2))
    assert f"AMX {instr}: 2x2 accumulator tiles of 16 Wq positions" in note
    assert "written from the register tile" in note and "dx_wsum" not in script
    # dy staged in blocks of one 64-byte tile row (Cout 48 padded to 64), the weight's Cout
    # padded alike: each tile product as deep as the unit takes
    k0, dot = (32, 2) if dtype == "bfloat16" else (64, 4)
    assert f"dx_dy_pad = T.sblock_alloc_buffer((2, {64 // k0}, 8, 34, {k0}), " in script
    assert f"dx_weight = T.sblock_alloc_buffer((4, 3, 3, {64 // dot}, 16, {dot}), " in script
    assert script.count(f"llvm.x86.{instr}") == 4
    assert script.count("llvm.x86.ldtilecfg") == 1 and script.count("tilerelease") == 1
    assert script.index('"syscall"') < script.index("ldtilecfg")
    assert "T.parallel(2)" in script


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("cout", [64, 48, 20])
def test_dy_reblocked_into_tile_rows_reads_each_5hd_block_as_one_vector(dtype, cout):
    """dy re-blocked from 5HD blocks (16 bf16 / 32 int8 channels) into 64-byte tile rows:
    each source block's run of lanes is one vectorised loop over a contiguous read; the
    channel index is clamped only where the rows reach past what out_backprop holds (Cout 20
    in int8: one 32-channel block, rows of 64)."""
    c = C(1, 32, cout, 6, 32, 1, 1, (0, 0, 0, 0), 1, 1)
    note, script = _lowered(c, dtype, SPR)
    run, row = (16, 32) if dtype == "bfloat16" else (32, 64)
    clamped = -(-cout // row) * row > -(-cout // run) * run
    assert f"re-blocked dy: runs of {run} lanes from one 5HD block" in note, note
    at = script.index('T.sblock("dx_dy_pad")')
    stage = script[script.rindex("\n        for ", 0, at):script.index("\n        for ", at)]
    assert f"T.vectorized({run})" in stage
    read = re.search(r"T.reads\(out_backprop\[(.*)\]\)", stage).group(1)
    assert ("T.min(" in read) == clamped, read


def test_int8_offset_x_needs_weight_sums_only_for_stride_holes():
    """Signed bytes read offset_x in the padding as they are, so a stride-1 int8 dx with
    offset_x != 0 is the tile sum itself, written from the tiles; a strided one adds offset_x
    x the weights of the taps each phase lacks (they read offset_x in the stride holes)."""
    c = C(1, 32, 64, 6, 32, 3, 1, (1, 1, 1, 1), 1, 1)
    note, script = _lowered(c, "int8", dataclasses.replace(SPR, cores=2), offset_x=-5)
    assert "written from the register tile" in note and "dx_wsum" not in script
    c = C(1, 32, 64, 9, 32, 3, 2, (1, 1, 1, 1), 1, 1)
    note, script = _lowered(c, "int8", dataclasses.replace(SPR, cores=2), offset_x=-5)
    assert "dx_wsum" in script and note.count("AMX tdpbssd") == 4


def test_strided_phases_each_get_tiles():
    c = C(1, 32, 48, 9, 10, 3, 2, (1, 0, 0, 1), 1, 1)
    note, script = _lowered(c, "bfloat16", SPR)
    assert note.count("AMX tdpbf16ps") == 4 and script.count("ldtilecfg") == 4


@pytest.mark.parametrize("tgt", ["znver4", "skylake-avx512", "x86-avx2"])
def test_a_target_without_amx_gets_no_tiles(tgt):
    c = C(1, 32, 32, 6, 16, 3, 1, (1, 1, 1, 1), 1, 1)
    note, script = _lowered(c, "bfloat16", targets.get(tgt))
    assert "AMX" not in note and "llvm.x86.t" not in script and "syscall" not in script


# mt x nt tiles 2 x 2 with batch 2 and Cout not a multiple of 16; a prime row (13 rows); stride
# 2 with asymmetric padding (phases of 5 and 4 rows); dilation 2 with 3x2 taps; a 1x1 layer
# (dy read in place) with 3 C1x blocks (one accumulator tile along n)
AMX_CASES = [
    C(2, 64, 40, 5, 32, 3, 1, (1, 1, 1, 1), 1, 1),
    C(1, 32, 33, 7, 13, 3, 1, (1, 1, 1, 1), 1, 1),
    C(1, 32, 48, 9, 10, 3, 2, (1, 0, 0, 1), 1, 1),
    C(2, 32, 32, 11, 14, (3, 2), 1, (2, 1, 0, 2), 2, 1),
    C(3, 48, 64, 7, 7, 1, 1, (0, 0, 0, 0), 1, 1),
]


@pytest.mark.skipif(not HOST_HAS_AMX, reason="this machine has no AMX")
@pytest.mark.parametrize("c", AMX_CASES, ids=case_id)
@pytest.mark.parametrize("res_dtype", ["float32", "bfloat16"])
def test_bfloat16_dx_through_tiles(c, res_dtype):
    dy, w = dx_data(c, "bfloat16")
    out5 = dx_kernel(c, "bfloat16", res_dtype)(weight_to_fracz(w, 1), nchw_to_5hd(dy))
    ref = ref_dx(dy.astype(np.float64), w.astype(np.float64), (c["n"], c["cin"], c["h"], c["w"]),
                 c["stride"], c["pads"], c["dil"], 1)
    out = nc1hwc0_to_nchw(out5, c["cin"]).astype(np.float64)
    # fp32 accumulation of exact bf16 products: fp32 accuracy before the result's rounding
    assert_close(out, ref, "float32" if res_dtype == "float32" else "bfloat16", case_id(c))


def _dw_note(c, tgt):
    from tvm import te

    ho, wo = out_hw(c)
    with targets.use(tgt):
        x = te.placeholder((c["n"], -(-c["cin"] // 16), c["h"], c["w"], 16), name="fmap",
                           dtype="bfloat16")
        dy = te.placeholder((c["n"], -(-c["cout"] // 16), ho, wo, 16), name="out_backprop",
                            dtype="bfloat16")
        dw = dsl.conv2d_backprop_filter(x, dy, (c["cout"], c["cin"], c["kh"], c["kw"]),
                                        para(c, res_dtype="float32"))
        sch = dsl.auto_schedule(dw, target=tgt)
    return str(dsl.explain(sch)), lower(sch, "k", [x, dy, dw]).script()


def test_bfloat16_dw_gets_tiles_of_cout_rows():
    """dw: Cout as tile rows (2 x 16), C1x blocks as lanes (2 tiles), the 28 Wo pairs of a
    row in tile rows of 14 (the largest divisor up to 16)."""
    c = C(1, 32, 64, 8, 56, 3, 1, (1, 1, 1, 1), 1, 1)
    note, script = _dw_note(c, dataclasses.replace(SPR, cores=2))
    assert "AMX tdpbf16ps: 2x2 accumulator tiles of 16 Cout x 16 lanes, Wo pairs 14" in note
    assert script.count("llvm.x86.tdpbf16ps") == 4
    # dy's tiles are laid out by the tile row: Cout rows of 14 pairs, 56 bytes apart, one
    # contiguous block; x's tile rows step two paired columns (64 bytes each) per Wo pair
    assert "dw_dy_pair = T.sblock_alloc_buffer((1, 8, 2, 64, 14, 2)" in script
    loads = re.findall(r"tileloadd64\", T.int8\((\d)\), .*?T.int64\((\d+)\)\)", script)
    assert sorted(set(loads)) == [("4", "56"), ("5", "56"), ("6", "128"), ("7", "128")]
    note, script = _dw_note(c, targets.get("znver4"))
    assert "AMX" not in note and "tdpbf16ps" not in script


def test_bfloat16_1x1_dw_pairs_x_in_each_task():
    """A 1x1 layer has no taps to share x's pairs: each task (a block of x channels) pairs
    its own just before its tiles read them, and the buffer stays whole at the root (a
    task-sized copy would not match the tile addresses)."""
    c = C(2, 64, 32, 6, 8, 1, 1, (0, 0, 0, 0), 1, 1)
    note, script = _dw_note(c, dataclasses.replace(SPR, cores=2))
    assert "each task pairs its own x channels" in note
    task = script.index("in T.parallel(")
    assert task < script.index('T.sblock("dw_x_pair")') < script.index("tdpbf16ps")
    assert script.index("T.address_of(dw_x_pair[0, 0, 0, 0, 0, 0])") < task
    note, _ = _dw_note(C(2, 64, 32, 6, 8, 3, 1, (1, 1, 1, 1), 1, 1), SPR)
    assert "each task" not in note  # a 3x3's taps share the pairs: paired once, up front


# dense dw through tiles: batch 2 with 2 x 2 tiles; stride 2, asymmetric padding, odd Cout (a
# partial tile of rows), odd Wo (the pair past it is zero); dilation 2 with 3x2 taps; 1x1
AMX_DW_CASES = [
    C(2, 32, 64, 6, 32, 3, 1, (1, 1, 1, 1), 1, 1),
    C(1, 16, 33, 9, 11, 3, 2, (1, 0, 0, 1), 1, 1),
    C(2, 32, 32, 11, 14, (3, 2), 1, (2, 1, 0, 2), 2, 1),
    C(3, 48, 16, 7, 7, 1, 1, (0, 0, 0, 0), 1, 1),
]


@pytest.mark.skipif(not HOST_HAS_AMX, reason="this machine has no AMX")
@pytest.mark.parametrize("c", AMX_DW_CASES, ids=case_id)
def test_bfloat16_dw_through_tiles(c):
    from dsl.ops.layout import fracz_to_weight

    x, dy = dw_data(c, "bfloat16")
    out = dw_kernel(c, "bfloat16", "float32")(nchw_to_5hd(x), nchw_to_5hd(dy))
    w_shape = (c["cout"], c["cin"], c["kh"], c["kw"])
    ref = ref_dw(x.astype(np.float64), dy.astype(np.float64), w_shape, c["stride"], c["pads"],
                 c["dil"], 1)
    mask = weight_to_fracz(np.ones(w_shape, np.float32), 1) != 0
    assert not out[~mask].any(), "pad positions must be exactly zero"
    assert_close(fracz_to_weight(out, w_shape, 1).astype(np.float64), ref, "float32", case_id(c))
