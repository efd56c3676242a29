"""The dense dw rule's reduction chunks (``schedules/conv2d_backprop_filter.py``): the plan
from the target's L1d and cores, the fallback to rfactor chunks, and results against the
float64 reference."""


import numpy as np
import pytest

import dsl
from dsl.ops.layout import fracz_to_weight

from cases import C
from helpers import (
    assert_close,
    assert_nonfinite_positions,
    case_id,
    dw_data,
    dw_kernel,
    host_with,
    nchw_to_5hd,
    out_hw,
    para,
)
from reference import conv2d_backprop_filter as ref_dw


def _schedule(c, tgt):
    """The default schedule of case ``c``'s dw on ``tgt``."""
    from tvm import te

    ho, wo = out_hw(c)
    x = te.placeholder((c["n"], -(-c["cin"] // 16), c["h"], c["w"], 16), name="fmap")
    dy = te.placeholder((c["n"], -(-c["cout"] // 16), ho, wo, 16), name="out_backprop")
    dw = dsl.conv2d_backprop_filter(x, dy, (c["cout"], c["cin"] // c["groups"], c["kh"],
                                            c["kw"]), para(c, groups=c["groups"]))
    return dsl.auto_schedule(dw, target=tgt)


def _note(c, tgt, stage: str = "dw_acc") -> str:
    return dict((s, why) for s, _, why in dsl.explain(_schedule(c, tgt)).stages)[stage]


@pytest.mark.parametrize("c, l1d, cores, note", [
    # 2 C1 x 8 Cout tiles: 18 KB of accumulators per 16 Cout of a 3x3 layer fit 24 KB; an
    # x row of 2 C1 x 58 columns is 7.25 KB: 3 rows (one output row and the taps' halo)
    (C(1, 64, 64, 56, 56, 3, 1, (1, 1, 1, 1), 1, 1), 48, 2, "tasks of 16 Cout, 1-row"),
    # 1x1: 2 KB per 16 Cout, 64 Cout per task; x rows of 56 columns: 3 rows -> 2 (of 56)
    (C(1, 256, 64, 56, 56, 1, 1, (0, 0, 0, 0), 1, 1), 48, 2, "tasks of 64 Cout, 2-row"),
    # 16 cores: spans shrink to one register tile (8 Cout): 2 C1 pairs x 16 spans, 32 tasks
    (C(1, 64, 128, 16, 16, 1, 1, (0, 0, 0, 0), 1, 1), 48, 16, "tasks of 8 Cout"),
])
def test_dense_dw_plans_its_chunks_from_l1_and_cores(c, l1d, cores, note):
    assert note in _note(c, host_with(l1d, cores))


def test_too_few_tasks_fall_back_to_rfactor_chunks():
    """2 C1 pairs x 4 Cout spans cannot keep 64 cores busy: the rows are split instead."""
    note = _note(C(1, 64, 64, 56, 56, 3, 1, (1, 1, 1, 1), 1, 1), host_with(48, 64))
    assert "rfactor chunks" in note and "tasks of" not in note
    # each part's taps then run over one output row at a time: 3 x rows of 4 C1 blocks x
    # 58 columns (44 KB) already overflow half of L1d
    assert "of 1-row chunks" in note


CHUNKED = [
    C(3, 40, 36, 9, 11, 3, 1, (1, 1, 1, 1), 1, 1),        # batch 3, C not multiples of 16
    C(1, 32, 48, 13, 13, 3, 2, (1, 0, 0, 1), 1, 1),       # stride 2, asymmetric, prime H
    C(2, 32, 32, 12, 10, (3, 2), 1, (2, 1, 0, 2), 2, 1),  # dilation 2, 3x2 taps
    C(1, 48, 64, 7, 7, 1, 2, (0, 0, 0, 0), 1, 1),         # 1x1 stride 2
    C(2, 24, 33, 11, 19, 5, 3, (2, 2, 1, 3), (1, 2), 1),  # stride 3, odd Cout
]


def _run(c, dtype, tgt, seed=0, dy_at=None):
    """dw of case ``c`` and the float64 reference; ``dy_at``: ``(index, value)`` put into dy
    first."""
    x, dy = dw_data(c, dtype, seed=seed)
    if dy_at is not None:
        dy = dy.copy()
        dy[dy_at[0]] = dy_at[1]
    kernel = dw_kernel(c, dtype, "float32", tgt)
    g = c["groups"]
    w_shape = (c["cout"], c["cin"] // g, c["kh"], c["kw"])
    out = fracz_to_weight(kernel(nchw_to_5hd(x), nchw_to_5hd(dy)), w_shape, g)
    with np.errstate(invalid="ignore"):
        ref = ref_dw(x, dy, w_shape, c["stride"], c["pads"], c["dil"], g)
    return out, ref, x, dy


@pytest.mark.parametrize("l1d, cores", [(48, 2), (4, 2), (4, 3)])
@pytest.mark.parametrize("c", CHUNKED, ids=case_id)
def test_chunked_dw_matches_the_reference(c, l1d, cores):
    """48 KB: several output rows per chunk; 4 KB: one row, one register tile of Cout per
    task; 3 cores: narrower Cout spans, more tasks (or rfactor chunks where too few)."""
    tgt = host_with(l1d, cores)
    assert cores > 2 or "reduction chunks in L1" in _note(c, tgt)
    for dtype in ("float32", "float16"):
        out, ref, _, _ = _run(c, dtype, tgt)
        assert_close(out, ref, "float32", f"{case_id(c)} {dtype}, L1d {l1d} KB, {cores} cores")



def _chunked_script(c, tgt) -> str:
    return _schedule(c, tgt).s_tir().mod.script()


def test_chunked_dw_steps_two_output_columns_where_they_divide_wo():
    from schedules.conv2d_backprop_filter import POSITION_UNROLL

    even, odd = CHUNKED[1], CHUNKED[0]  # Wo 6 and 11
    assert out_hw(even)[1] % POSITION_UNROLL == 0 and out_hw(odd)[1] % POSITION_UNROLL
    tgt = host_with(48, 2)
    assert f"for wo_1 in T.unroll({POSITION_UNROLL})" in _chunked_script(even, tgt)
    assert "wo_1" not in _chunked_script(odd, tgt)  # one column per step, no ragged tail
    dilated = C(1, 32, 32, 12, 12, 3, 1, (2, 2, 2, 2), 2, 1)  # Wo 12, dilation 2
    assert "reduction chunks in L1" in _note(dilated, tgt)
    assert "wo_1" not in _chunked_script(dilated, tgt)

def test_chunked_dw_with_a_nonfinite_dy_runs_the_exact_twin():
    """x's padding meets dy in the fast path; an inf in dy makes the exact twin run, so the
    NaN / inf land only where the math puts them."""
    c = CHUNKED[1]
    tgt = host_with(4, 2)
    x, dy = dw_data(c, "float32")
    dy = dy.copy()
    dy[0, 3, 0, 0] = np.inf
    kernel = dw_kernel(c, "float32", "float32", tgt)
    w_shape = (c["cout"], c["cin"], c["kh"], c["kw"])
    out = fracz_to_weight(kernel(nchw_to_5hd(x), nchw_to_5hd(dy)), w_shape, 1)
    with np.errstate(invalid="ignore"):
        ref = ref_dw(x, dy, w_shape, c["stride"], c["pads"], c["dil"], 1)
    out, finite = assert_nonfinite_positions(out, ref, "inf in dy")
    assert not finite.all() and finite.any()
    assert_close(out[finite], ref[finite], "float32", "finite positions")


@pytest.mark.parametrize("tasks, cores, parts", [
    (1, 1, 1), (1, 2, 2), (1, 16, 16),  # one task: one part per core, no more
    (8, 2, 1), (8, 16, 2),               # parts only to fill the cores
    (9, 16, 7),                          # 63 tasks on 16 cores: the first even share
    (9, 8, 4),                           # none even up to 4 per core: the best (36 of 40)
])
def test_parallel_parts_fill_the_cores_evenly_with_the_fewest(tasks, cores, parts):
    from schedules.conv2d_backprop_filter import parallel_parts
    from schedules.toolbox import balance
    assert parallel_parts(tasks, cores) == parts
    for fewer in range(-(-cores // tasks), parts):  # no smaller count shares out as well
        assert balance(fewer * tasks, cores) < balance(parts * tasks, cores)


PARTS = [  # layers whose dw takes rfactor parts: row chunks inside each part
    (C(2, 3, 24, 23, 21, 7, 2, (3, 3, 3, 3), 1, 1), "dw_acc_t"),  # RGB stem: Cout lanes
    (C(1, 32, 32, 10, 9, 3, 1, (1, 0, 2, 1), 1, 4), "dw_acc"),     # grouped
    (C(2, 16, 16, 11, 12, 3, 2, (1, 1, 1, 1), 2, 16), "dw_acc"),   # depthwise, dilated
]


@pytest.mark.parametrize("c, stage", PARTS, ids=lambda v: case_id(v) if isinstance(v, dict)
                         else v)
def test_rfactor_parts_in_row_chunks_match_the_reference(c, stage):
    tgt = host_with(4, 4)  # cores enough that each layer's few tasks take parts
    assert "-row chunks" in _note(c, tgt, stage)
    for dtype in ("float32", "float16"):
        x, dy = dw_data(c, dtype)
        w_shape = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
        out = dw_kernel(c, dtype, "float32", tgt)(nchw_to_5hd(x), nchw_to_5hd(dy))
        ref = ref_dw(x, dy, w_shape, c["stride"], c["pads"], c["dil"], c["groups"])
        assert_close(fracz_to_weight(out, w_shape, c["groups"]), ref, "float32",
                     f"{case_id(c)} {dtype}")


@pytest.mark.parametrize("cin", [3, 5])
def test_planar_x_pad_is_written_row_by_row_across_channels(cin):
    # Cout in the lanes (few input channels): x_pad is NCHW from a 5HD x, whose cache lines
    # hold a pixel's channels; every channel of a row is written before the next row
    from tvm import te

    c = C(2, cin, 32, 11, 13, 3, 2, (1, 2, 1, 0), 1, 1)
    ho, wo = out_hw(c)
    x = te.placeholder((2, 1, 11, 13, 16), name="fmap")
    dy = te.placeholder((2, 2, ho, wo, 16), name="out_backprop")
    dw = dsl.conv2d_backprop_filter(x, dy, (32, cin, 3, 3), para(c))
    sch = dsl.auto_schedule(dw).s_tir([x, dy, dw])
    names = [sch.get(lp).loop_var.name for lp in sch.get_loops(sch.get_sblock("dw_x_pad"))]
    flat = "_".join(names)
    assert flat.index("hp") < flat.index("ci") < flat.index("wp"), names
    x_np, dy_np = dw_data(c, "float32", 3)
    out = dw_kernel(c, "float32", "float32")(nchw_to_5hd(x_np), nchw_to_5hd(dy_np))
    ref = ref_dw(x_np, dy_np, (32, cin, 3, 3), c["stride"], c["pads"], c["dil"], 1)
    assert_close(fracz_to_weight(out, (32, cin, 3, 3), 1), ref, "float32", case_id(c))


# (case, dw reads dy in place): the depthwise regather of dy is dy itself only for one input
# and one output channel per group, in whole C0 blocks
DY_IN_PLACE = [
    (C(2, 32, 32, 9, 11, 3, 1, (1, 1, 1, 1), 1, 32), True),     # depthwise, batch 2
    (C(1, 48, 48, 13, 7, 3, 2, (1, 0, 0, 1), 1, 48), True),     # stride 2, asymmetric
    (C(1, 32, 32, 10, 10, 3, 1, (2, 2, 2, 2), 2, 32), True),    # dilated
    (C(1, 24, 24, 8, 8, 3, 1, (1, 1, 1, 1), 1, 24), False),     # 24 channels: a ragged block
    (C(1, 16, 32, 8, 8, 3, 1, (1, 1, 1, 1), 1, 16), False),     # multiplier 2
    (C(1, 32, 32, 8, 8, 3, 1, (1, 1, 1, 1), 1, 8), False),      # 4 channels per group
]


@pytest.mark.parametrize("c, in_place", DY_IN_PLACE, ids=lambda v: case_id(v)
                         if isinstance(v, dict) else str(v))
def test_depthwise_dw_reads_dy_in_place_where_the_regather_is_dy(c, in_place):
    tgt = host_with(48, 2)
    notes = dict((s, why) for s, _, why in dsl.explain(_schedule(c, tgt)).stages)
    assert ("read in place" in notes.get("dw_dy_group", "")) == in_place, notes
    for dtype in ("float32", "float16"):
        out, ref, _, _ = _run(c, dtype, tgt, seed=5)
        assert_close(out, ref, "float32", f"{case_id(c)} {dtype}")


# (case, cores, x padded inside each task): grouped layers whose tasks' rows (with the taps'
# halo) cover x_pad at most 1.25 times over
PAD_IN_TASK = [
    (C(2, 64, 64, 28, 28, 3, 1, (1, 1, 1, 1), 1, 64), 16, True),   # 4 row chunks x 4 blocks
    (DY_IN_PLACE[1][0], 2, True),                                  # stride 2, 2 row chunks
    (DY_IN_PLACE[4][0], 2, True),                                  # multiplier 2
    (DY_IN_PLACE[0][0], 16, False),  # 8 chunks of 9 rows: each pads 2 halo rows of its own
    (CHUNKED[0], 2, False),          # dense: keeps the pass
]


@pytest.mark.parametrize("c, cores, in_task", PAD_IN_TASK, ids=lambda v: case_id(v)
                         if isinstance(v, dict) else str(v))
def test_grouped_dw_pads_its_rows_of_x_in_each_task(c, cores, in_task):
    tgt = host_with(48, cores)
    notes = dict((s, why) for s, _, why in dsl.explain(_schedule(c, tgt)).stages)
    assert ("padded in each task" in notes["dw_x_pad"]) == in_task, notes
    if not in_task:
        return
    # a NaN meeting x's padding: the exact twin (reading x itself) runs
    out, ref, _, _ = _run(c, "float32", tgt, seed=6, dy_at=((0, 1, 0, 0), np.nan))
    out, finite = assert_nonfinite_positions(out, ref, "NaN in dy")
    assert not finite.all() and finite.any()
    assert_close(out[finite], ref[finite], "float32", case_id(c))
