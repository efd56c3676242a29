"""The dense dx rule's reduction chunks (``schedules/conv2d_backprop_input.py``): the plan's
numbers from the target's caches and cores, the scheduled structure, and results against
the float64 reference where a small L1 forces chunks on small layers."""

from dataclasses import replace

import numpy as np
import pytest

import dsl
import targets
from dsl.ops.group import GroupLayout
from schedules import conv2d_backprop_input as rule

from cases import C
from helpers import (
    assert_close,
    case_id,
    dx_data,
    dx_kernel,
    host_with,
    nc1hwc0_to_nchw,
    nchw_to_5hd,
    out_hw,
    para,
    weight_to_fracz,
)
from reference import conv2d_backprop_input as ref_dx

HOST = targets.get("host")


@pytest.mark.parametrize("co1, taps, cx1_t, l1d, step, kc", [
    (16, 9, 2, 48, 1, 1),    # 3x3: 18 KB of panel per 16 Cout, 24 KB budget
    (16, 9, 1, 48, 1, 2),    # one C1x block per tile: 9 KB per 16 Cout
    (32, 1, 2, 48, 1, 8),    # 1x1: 2 KB per 16 Cout -> 12, the divisor of 32 below: 8
    (4, 1, 2, 48, 1, 4),     # the whole reduction fits: one chunk
    (8, 1, 2, 48, 2, 8),     # a 1x1 phase of a layout chunked by 2: all 8 fit
    (8, 4, 2, 48, 2, 2),     # a 2x2 phase: 8 KB per block -> 3, rounded to the step
    (16, 49, 2, 32, 1, 1),   # a panel over the budget still takes one block
    (12, 9, 1, 48, 4, 4),    # a 3x3 phase of a layout chunked by 4: one step of 4
])
def test_chunk_blocks(co1, taps, cx1_t, l1d, step, kc):
    tgt = replace(HOST, l1d_kib=l1d)
    assert rule.chunk_blocks(co1, taps, 4, cx1_t, tgt, step=step) == kc


@pytest.mark.parametrize("n_other, hq, row_bytes, cores, rows", [
    (2, 56, 7168, 2, 28),    # 4 tasks on 2 cores; 56 rows would leave one task per core
    (2, 56, 7168, 16, 1),    # 112 tasks for 16 cores (4 rows: 28 tasks, 7/8 busy)
    (64, 14, 1792, 2, 14),   # batch 8: the whole image per task
    (1, 13, 1024, 4, 1),     # a prime height: 13 tasks beat one
    (1, 8, 1 << 20, 1, 1),   # a row over the L2 share: one row per task
])
def test_task_rows(n_other, hq, row_bytes, cores, rows):
    tgt = replace(HOST, l2_kib=2048, cores=cores)
    assert rule.task_rows(n_other, hq, row_bytes, tgt) == rows


@pytest.mark.parametrize("tasks, wq, tw, cores, parts", [
    (112, 56, 8, 2, 1),     # rows share out: a row a task
    (112, 56, 7, 32, 2),    # 8 tiles a row: halves, 224 tasks in 7 rounds of 32
    (112, 56, 7, 128, 8),   # 896 tasks: 7 full rounds
    (112, 56, 8, 64, 7),    # 7 tiles a row: sevenths, 784 tasks, 12.25 rounds
    (112, 56, 8, 128, 1),   # sevenths leave as many cores idle as whole rows: rows
    (3, 28, 7, 2, 2),       # 3 rows on 2 cores: halves of rows
    (81, 11, 11, 64, 1),    # one tile a row: nothing to cut
    (4, 30, 7, 16, 1),      # a ragged last tile: parts would split it
])
def test_row_segments(tasks, wq, tw, cores, parts):
    assert rule.row_segments(tasks, wq, tw, cores) == parts


def _dx_schedule(c, tgt, dtype="float32"):
    from tvm import te

    ho, wo = out_hw(c)
    w_sizes = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    fz = te.placeholder(GroupLayout.from_weight(w_sizes, c["groups"]).fracz_shape,
                        name="filters", dtype=dtype)
    dy = te.placeholder((c["n"], -(-c["cout"] // 16), ho, wo, 16), name="out_backprop",
                        dtype=dtype)
    dx = dsl.conv2d_backprop_input(fz, dy, w_sizes, (c["n"], c["cin"], c["h"], c["w"]),
                                   para(c, res_dtype="float32"))
    return dsl.auto_schedule(dx, target=tgt), (fz, dy, dx)


def test_chunked_dx_reads_weight_panels_in_l1():
    """A 3x3 layer whose weight panel per tile overflows the budget: Cout in chunks of 16,
    the weight stage re-laid as panels ``[C1x/2, CO/16, KH, KW, 16, 2, 16]``."""
    c = C(2, 64, 64, 10, 10, 3, 1, (1, 1, 1, 1), 1, 1)
    sch, tensors = _dx_schedule(c, host_with(48, 2))
    text = str(dsl.explain(sch))
    assert "Cout in chunks of 16 (weight panels in L1)" in text
    script = sch.s_tir(list(tensors)).mod.script()
    assert "dx_weight = T.sblock_alloc_buffer((2, 4, 3, 3, 16, 2, 16))" in script


def test_a_panel_that_fits_keeps_the_whole_reduction_under_the_tile():
    c = C(1, 32, 32, 8, 8, 1, 1, (0, 0, 0, 0), 1, 1)
    sch, tensors = _dx_schedule(c, host_with(48, 2))
    assert "chunks" not in str(dsl.explain(sch))
    script = sch.s_tir(list(tensors)).mod.script()
    assert "dx_weight = T.sblock_alloc_buffer((2, 1, 1, 32, 16))" in script


CHUNKED = [
    C(3, 40, 36, 9, 11, 3, 1, (1, 1, 1, 1), 1, 1),       # batch 3, C not multiples of 16
    C(1, 32, 48, 13, 13, 3, 2, (1, 0, 0, 1), 1, 1),      # stride 2, asymmetric, prime H
    C(2, 32, 32, 12, 10, (3, 2), 1, (2, 1, 0, 2), 2, 1),  # dilation 2, 3x2 taps
    C(1, 48, 64, 7, 7, 1, 2, (0, 0, 0, 0), 1, 1),        # 1x1 stride 2: chunks of taps 1
    C(2, 24, 33, 5, 19, 5, 3, (2, 2, 1, 3), (1, 2), 1),  # stride 3, odd channels, wide rows
]


@pytest.mark.parametrize("cores", [2, 16])
@pytest.mark.parametrize("c", CHUNKED, ids=case_id)
def test_chunked_dx_matches_the_reference(c, cores):
    """A 4 KB L1d forces chunks of one or two Cout blocks on small layers; 16 cores split
    the rows of each image into several tasks."""
    tgt = host_with(4, cores)
    sch, _ = _dx_schedule(c, tgt)
    assert "chunks of" in str(dsl.explain(sch))
    for dtype in ("float32", "float16"):
        dy, w = dx_data(c, dtype)
        kernel = dx_kernel(c, dtype, "float32", tgt)
        out = nc1hwc0_to_nchw(kernel(weight_to_fracz(w, 1), nchw_to_5hd(dy)), c["cin"])
        ref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"],
                     c["dil"], 1)
        assert_close(out, ref, "float32", f"{case_id(c)} {dtype} on {cores} cores")


ROW_PARTS = [  # (case, L1d KiB, {cores: tasks of each dx_acc phase}): too few rows for the
    # cores, so each row's register tiles are cut into parts, each part a task
    (C(1, 32, 32, 4, 32, 3, 1, (1, 1, 1, 1), 1, 1), 4, {2: [4], 16: [16]}),  # chunked
    (C(1, 32, 48, 6, 28, 3, 2, (1, 0, 0, 1), 1, 1), 4, {2: [6] * 4, 16: [6] * 4}),  # 3 rows
    (C(2, 40, 24, 3, 56, 1, 1, (0, 0, 0, 0), 1, 1), 48, {2: [18], 16: [72]}),  # no chunks
    (C(1, 3, 16, 3, 250, 7, 2, (3, 3, 3, 3), 1, 1), 48,  # 3 channels: W positions in lanes
     {2: [2] * 4, 16: [2, 2, 4, 4]}),
]


@pytest.mark.parametrize("c, l1d, tasks", ROW_PARTS, ids=[case_id(c) for c, *_ in ROW_PARTS])
def test_dx_rows_cut_into_parts_for_many_cores(c, l1d, tasks):
    """The tasks of each phase (the scaling model's reading of the built loops), and the
    results of the 16-core kernel against the float64 reference."""
    from dsl.runtime.scaling import predict

    for cores, expect in tasks.items():
        sch, tensors = _dx_schedule(c, host_with(l1d, cores))
        built = dsl.build(sch, {"name": f"parts_{cores}", "tensor_list": list(tensors),
                                "need_build": False})
        got = [s.tasks for s in predict(built, cores).stages if s.name.startswith("dx_acc")]
        assert got == expect, (cores, got)
    dy, w = dx_data(c, "float32")
    kernel = dx_kernel(c, "float32", "float32", host_with(l1d, 16))
    out = nc1hwc0_to_nchw(kernel(weight_to_fracz(w, 1), nchw_to_5hd(dy)), c["cin"])
    ref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"],
                 c["dil"], 1)
    assert_close(out, ref, "float32", f"{case_id(c)} on 16 cores")


def test_chunked_dx_with_a_nonfinite_weight_runs_the_exact_twin():
    """The exact twin reads the panels too: a NaN weight reaches only the positions whose
    taps read it, the rest match the reference."""
    c = CHUNKED[1]
    tgt = host_with(4, 2)
    dy, w = dx_data(c, "float32")
    w = w.copy()
    w[5, 7, 0, 2] = np.nan
    kernel = dx_kernel(c, "float32", "float32", tgt)
    out = nc1hwc0_to_nchw(kernel(weight_to_fracz(w, 1), nchw_to_5hd(dy)), c["cin"])
    with np.errstate(invalid="ignore"):
        ref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"],
                     c["dil"], 1)
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    assert np.isnan(ref).any() and not np.isnan(ref).all()
    finite = ~np.isnan(ref)
    assert_close(out[finite], ref[finite], "float32", "finite positions")


LANE_RUNS = [  # (case, equal lanes per run of the regathered dy: gcd(Cin / groups, 16))
    (C(1, 32, 32, 9, 9, 3, 1, (1, 1, 1, 1), 1, 8), 4),        # 4 channels a group (ResNeXt)
    (C(2, 24, 12, 7, 11, 3, 2, (1, 0, 1, 2), 1, 3), 8),       # 8 a group, stride 2, odd H/W
    (C(1, 36, 18, 6, 6, (3, 2), 1, (0, 1, 1, 0), 2, 18), 2),  # 2 a group, 36 channels
    (C(1, 64, 32, 5, 5, 3, 1, (1, 1, 1, 1), 1, 2), 16),       # 32 a group: one run a vector
]


@pytest.mark.parametrize("c, run", LANE_RUNS, ids=lambda v: case_id(v) if isinstance(v, dict)
                         else str(v))
def test_grouped_dx_loads_each_run_of_equal_lanes_once(c, run):
    sch, tensors = _dx_schedule(c, host_with(48, 2))
    assert f"runs of {run} equal lanes" in str(dsl.explain(sch))
    script = sch.s_tir(list(tensors)).mod.script()
    at = script.index('T.sblock("dx_dy_pad")')
    stage = script[at - 400:at]  # the loops just above the stage's block
    assert f"T.vectorized({run})" in stage, stage
    for dtype in ("float32", "float16"):
        dy, w = dx_data(c, dtype)
        kernel = dx_kernel(c, dtype, "float32", host_with(48, 2))
        out = nc1hwc0_to_nchw(kernel(weight_to_fracz(w, c["groups"]), nchw_to_5hd(dy)),
                              c["cin"])
        ref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"],
                     c["dil"], c["groups"])
        assert_close(out, ref, "float32", f"{case_id(c)} {dtype}")


IN_TASK_PAD = [  # (case, cores, whether each task pads its own rows of dy)
    (C(4, 40, 36, 8, 11, 3, 1, (1, 1, 1, 1), 1, 1), 2, True),   # 4 images, 2 tasks a core
    (C(4, 32, 32, 6, 10, 3, 1, (2, 1, 0, 2), 2, 1), 2, True),   # dilation 2, asymmetric pads
    (C(2, 24, 33, 14, 7, (3, 2), 1, (1, 1, 1, 0), 1, 1), 2, True),  # 2 tasks of 7 rows an image
    (C(4, 40, 36, 8, 11, 3, 1, (1, 1, 1, 1), 1, 1), 16, False),  # rows of 1: 3x the pad
    (CHUNKED[1], 2, False),  # stride 2: a pad read by every phase
]


@pytest.mark.parametrize("c, cores, in_task", IN_TASK_PAD,
                         ids=[f"{case_id(c)}-{n}cores" for c, n, _ in IN_TASK_PAD])
def test_where_each_task_pads_its_rows_of_dy(c, cores, in_task):
    sch, tensors = _dx_schedule(c, host_with(4, cores))
    text = str(dsl.explain(sch))
    assert ("dy padded in each task" in text) == in_task, text
    assert ("each task every C1x block of its rows" in text) == in_task
    if in_task:  # the pad is a buffer of one task's rows, inside the task loop
        script = sch.s_tir(list(tensors)).mod.script()
        task = script.index("T.parallel", script.index('T.sblock("dx_acc_init")') - 2000)
        assert task < script.index('T.sblock("dx_dy_pad")') < script.index(
            'T.sblock("dx_acc_update")')


@pytest.mark.parametrize("c", [c for c, _, in_task in IN_TASK_PAD if in_task], ids=case_id)
def test_dx_that_pads_in_each_task_matches_the_reference(c):
    """In float32 and float16, and with a NaN weight (the exact twin reads dy itself now)."""
    _matches_with_a_nan_weight(c, host_with(4, 2), (3, 5, 0, 1))


def _matches_with_a_nan_weight(c, tgt, at: tuple) -> None:
    """dx of case ``c`` built for ``tgt`` against the float64 reference in float32 and
    float16, and with a NaN weight at ``at``: NaN exactly where the reference has it."""
    shape = (c["n"], c["cin"], c["h"], c["w"])
    for dtype, nan in (("float32", False), ("float16", False), ("float32", True)):
        dy, w = dx_data(c, dtype)
        if nan:
            w = w.copy()
            w[at] = np.nan
        kernel = dx_kernel(c, dtype, "float32", tgt)
        out = nc1hwc0_to_nchw(kernel(weight_to_fracz(w, 1), nchw_to_5hd(dy)), c["cin"])
        with np.errstate(invalid="ignore"):
            ref = ref_dx(dy, w, shape, c["stride"], c["pads"], c["dil"], 1)
        assert np.array_equal(np.isnan(out), np.isnan(ref)), f"{case_id(c)} {dtype} {nan}"
        assert not nan or np.isnan(ref).any() and not np.isnan(ref).all()
        finite = ~np.isnan(ref)
        assert_close(out[finite], ref[finite], "float32", f"{case_id(c)} {dtype} {nan}")


@pytest.mark.parametrize("base", ["x86-avx2", "x86-64"])
def test_dx_that_pads_in_each_task_on_narrower_vectors(base):
    """The same tasks and pad on 8- and 4-lane targets (each C0 block two or four vectors),
    which this machine runs too."""
    c = IN_TASK_PAD[0][0]
    tgt = replace(targets.get(base), name=f"{base}-l1d4-c2", l1d_kib=4, cores=2)
    targets.register(tgt)
    sch, _ = _dx_schedule(c, tgt)
    assert "dy padded in each task" in str(dsl.explain(sch))
    dy, w = dx_data(c, "float32")
    kernel = dx_kernel(c, "float32", "float32", tgt)
    out = nc1hwc0_to_nchw(kernel(weight_to_fracz(w, 1), nchw_to_5hd(dy)), c["cin"])
    ref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"], c["dil"], 1)
    assert_close(out, ref, "float32", base)


POSITIONS_IN_TASKS = [  # (case, cores, whether each task pads dy and computes every phase)
    (C(2, 3, 20, 32, 32, 7, 2, (3, 3, 3, 3), 1, 1), 2, True),   # a stem: 4 phases, 2 images
    (C(1, 3, 24, 16, 32, 3, 1, (1, 1, 1, 1), 1, 1), 2, True),   # stride 1: one phase
    (C(2, 4, 32, 20, 32, 3, 1, (2, 1, 1, 2), 2, 1), 2, True),   # dilation 2, asymmetric pads
    (C(2, 3, 20, 32, 32, 7, 2, (3, 3, 3, 3), 1, 1), 16, False),  # rows of 1 a task: 4x the pad
    (C(1, 3, 16, 31, 32, 7, 2, (3, 3, 3, 3), 1, 1), 2, False),  # phases of 16 and 15 rows
    (C(1, 3, 16, 32, 40, 7, 2, (3, 3, 3, 3), 1, 1), 2, False),  # 20 columns in 32 lanes
]


@pytest.mark.parametrize("c, cores, in_task", POSITIONS_IN_TASKS,
                         ids=[f"{case_id(c)}-{n}cores" for c, n, _ in POSITIONS_IN_TASKS])
def test_where_few_channel_dx_runs_in_tasks_of_rows(c, cores, in_task):
    """W positions in the lanes (few input channels): the pad of dy, every phase and dx in
    one parallel loop over blocks of dx rows where those tile dx evenly and share out."""
    sch, tensors = _dx_schedule(c, host_with(48, cores))
    text = str(dsl.explain(sch))
    assert "W positions in vector lanes" in text
    assert ("dy padded in each task of" in text) == in_task, text
    script = sch.s_tir(list(tensors)).mod.script()
    pad, phase = script.index('T.sblock("dx_dy_pad'), script.index('T.sblock("dx_acc_w')
    out = script.index('T.sblock("dx")')
    task = script.rfind("T.parallel", 0, min(pad, phase))
    # in a task: one parallel loop above the pad, the phases and dx, which follow it in turn
    assert (task >= 0 and "T.parallel" not in script[task + 10:] and pad < phase < out) == \
        in_task


@pytest.mark.parametrize("c", [c for c, _, in_task in POSITIONS_IN_TASKS if in_task],
                         ids=case_id)
def test_few_channel_dx_in_tasks_matches_the_reference(c):
    """float32, float16, and a NaN weight (the exact twins read dy itself, outside the
    tasks)."""
    _matches_with_a_nan_weight(c, host_with(48, 2), (3, 1, 0, 2))
