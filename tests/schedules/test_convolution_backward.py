"""What the x86 rule of ``convolution_backward`` is meant to do, checked on the scheduled TIR
and against the float64 reference (not on timings)."""

import re
from dataclasses import replace

import numpy as np
import pytest
from tvm import te

import dsl
import dsl.api.aclnn
import targets
from dsl.ops.convolution_backward import DW_Y_IN_PLACE_FROM, convolution_backward

from aclnn_helpers import call, data, gid, padding_arg, reference
from aclnn_helpers import geometry as G
from helpers import assert_nonfinite_positions
from reference import convolution_backward as ref_cb

# conv1d, Cin 24 and Cout 20: dw keeps Cx in lanes (vector axis 2), the layout that packs
# y and x as panels; N 2, L 13, K 3, padding 1
N, CIN, COUT, L, K = 2, 24, 20, 13, 3


def _dw_schedule(target, cin=CIN):
    go = te.placeholder((N, COUT, L), name="grad_output")
    x = te.placeholder((N, cin, L), name="input")
    w = te.placeholder((COUT, cin, K), name="weight")
    outs = convolution_backward(go, x, w, None, [1], [1], [1], False, [0], 1,
                                [False, True, False])
    return dsl.auto_schedule([t for t in outs if t is not None][0], target=target)


def _dx_matches(c, target: str, seed: int, bad=None, where=None) -> None:
    """dx of call ``c`` on ``target`` against the float64 reference, ``bad`` (NaN or inf) put
    into the weight at ``where`` first (dx then takes its exact twin's values there)."""
    dy, x, w = data(c, seed=seed)
    if bad is not None:
        w[where] = bad
    with targets.use(target):
        out = call(c, dy, x, w, mask=DX)[0]
    ref = reference(c, dy, x, w)[0]
    got, finite = assert_nonfinite_positions(out, ref, "grad_input")
    err = np.abs(got[finite] - ref[finite]).max()
    assert err <= 2e-5 * max(1.0, np.abs(ref[finite]).max()), err


def _dx_16bit_matches(c, target: str, seed: int, dtype: str = "float16",
                        atol: float = 4e-3) -> None:
    """dx of call ``c`` in ``dtype`` (a 16-bit float) against the float64 reference of the same
    inputs, within ``atol`` of its largest magnitude."""
    dy, x, w = data(c, (dtype,) * 3, seed=seed)
    with targets.use(target):
        out = call(c, dy, x, w, mask=DX)[0]
    ref = reference(c, *(a.astype(np.float64) for a in (dy, x, w)))[0]
    assert str(out.dtype) == dtype
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0, atol=atol * np.abs(ref).max())


# Cin 24 (from DW_Y_IN_PLACE_FROM up): y read in place, only x packed; Cin 12: both packed
@pytest.mark.parametrize("cin, panels", [(CIN, "cb_x_pack as panels"),
                                         (12, "cb_y_pack and cb_x_pack as panels")])
@pytest.mark.parametrize("name", ["x86-avx2", "x86-avx512"])
def test_dw_packs_are_panels_beside_the_exact_twin(name, cin, panels):
    # The exact twin (run only for a NaN / inf input) reads the packs too. It must not cost
    # dw its GotoBLAS panels: conv1d 8x256x1024 k3 dw went 81 -> 109 GFLOP/s on a Zen 3.
    sch = _dw_schedule(targets.get(name), cin)
    stages = {s: why for s, _, why in dsl.explain(sch).stages}
    assert "cb_dw_acc_exact" in stages
    assert panels in stages["cb_dw_acc"], stages["cb_dw_acc"]
    assert ("cb_y_pack" in stages) == (cin < DW_Y_IN_PLACE_FROM)


@pytest.mark.parametrize("where", ["x", "dy"])
@pytest.mark.parametrize("bad", [None, np.inf, np.nan], ids=["finite", "inf", "nan"])
@pytest.mark.parametrize("cin", [CIN, 12], ids=["y_in_place", "y_pack"])
def test_dw_through_panels_matches_the_reference(cin, bad, where):
    rng = np.random.default_rng(3)
    dy = rng.uniform(-1, 1, (N, COUT, L)).astype(np.float32)
    x = rng.uniform(-1, 1, (N, cin, L)).astype(np.float32)
    w = rng.uniform(-1, 1, (COUT, cin, K)).astype(np.float32)
    if bad is not None:  # the exact twin's result, read through the re-laid packs (or dy)
        (x if where == "x" else dy)[1, 5, 0] = bad
    out = dsl.aclnn.convolution_backward(dy, x, w, [COUT], [1], [1], [1], False, [0], 1,
                                         [False, True, False], 0)[1]
    ref = ref_cb(dy, x, w, (1,), ((1, 1),), (1,), False, (0,), 1)[1]
    got, finite = assert_nonfinite_positions(out, ref, "grad_weight")
    err = np.abs(got[finite] - ref[finite]).max()
    assert err <= 2e-5 * max(1.0, np.abs(ref[finite]).max()), err


# --- dx rows that no register tile divides: full 6-row tiles and a last tile of its own ------

# Cin 16 is two AVX2 registers, so 6 rows of accumulators; each row axis (dx's last spatial
# axis, the transposed dx's input width) is no multiple of 6 and its largest divisor <= 6
# fills under 3/4 of them
RAGGED = [
    G(1, 2, 16, 12, 26, 3, 1, 1),                                        # 1-D
    G(2, 2, 16, 12, (3, 59), 3, 1, [(1, 0), (2, 1)], (1, 2)),            # prime, asym, dil
    G(2, 1, 16, 8, (4, 31), 3, 2, 1),                                    # stride 2
    G(2, 2, 32, 12, (5, 14), 3, 1, 1, groups=2),                         # grouped
    G(2, 2, 16, 12, (3, 13), 4, 2, 1, transposed=True),                  # transposed, up 2
]
DX = (True, False, False)


def _ragged_schedule(c, target):
    go = te.placeholder(c["dy"], name="grad_output")
    x = te.placeholder(c["x"], name="input")
    w = te.placeholder(c["w"], name="weight")
    outs = convolution_backward(go, x, w, None, list(c["stride"]), padding_arg(c),
                                list(c["dil"]), c["transposed"], list(c["opad"]), c["groups"],
                                list(DX))
    return dsl.auto_schedule([t for t in outs if t is not None][0], target=target)


@pytest.mark.parametrize("c", RAGGED, ids=gid)
def test_dx_rows_take_full_tiles_and_a_last_tile_of_their_own(c):
    # 4-row tiles (8 accumulators) stall on the FMA latency: a conv1d dx of 1024 positions
    # went 136 -> 154 GFLOP/s on a Zen 3 with 6 rows and a last tile of 4
    sch = _ragged_schedule(c, targets.get("x86-avx2"))
    stages = {s: why for s, _, why in dsl.explain(sch).stages}
    acc = stages.get("cb_dx_acc") or stages["cb_fwd_acc"]
    rows = c["x"][-1]  # dx's (or the transposed dx's) last spatial axis
    assert "6 x 16 register tile" in acc, acc
    assert f"the last tile of {rows % 6} rows in a loop nest of its own" in acc, acc


def test_row_tile_is_exact_where_a_divisor_fills_the_registers():
    # 3-D dx and every dw keep exact tiles (see _schedule_acc); so does a row axis with a
    # divisor that fills 3/4 of the accumulators
    acc = {s: why for s, _, why in dsl.explain(
        _ragged_schedule(G(1, 2, 16, 12, 25, 3, 1, 1), targets.get("x86-avx2"))).stages}
    assert "5 x 16 register tile" in acc["cb_dx_acc"] and "last tile" not in acc["cb_dx_acc"]


# AVX-512, 64 channels: two vectors, 12 rows of accumulators. Whole tiles where the row
# axis has a divisor whose tiles hold 1.5x the 8 accumulators the FMA pipes need in flight
# and grad_input can be written from each task's tile (no stride phases); else 12-row
# tiles and a ragged last one
WHOLE_OR_RAGGED = [  # (call, rows per tile, rows of the last tile or 0)
    (G(1, 2, 64, 16, 56, 3, 1, 1), 8, 0),                                # 1-D: 7 x 8
    (G(2, 2, 64, 16, (3, 28), 4, 2, 1, transposed=True), 7, 0),          # transposed up 2
    (G(1, 2, 64, 16, 26, 3, 1, 1), 12, 2),                               # 2 x 2 too few
    (G(1, 1, 64, 16, 58, 3, 2, 1), 12, 10),                              # stride 2: no restore
]


@pytest.mark.parametrize("c,rows,last", WHOLE_OR_RAGGED, ids=lambda v: gid(v)
                         if isinstance(v, dict) else str(v))
def test_dx_takes_whole_tiles_that_cover_the_fma_latency_and_restore_in_cache(c, rows, last):
    stages = {s: why for s, _, why in
              dsl.explain(_ragged_schedule(c, targets.get("x86-avx512"))).stages}
    acc = stages.get("cb_dx_acc") or stages["cb_fwd_acc"]
    assert f"{rows} x 32 register tile" in acc, acc
    assert ("last tile" in acc) == bool(last), acc
    if last:
        assert f"the last tile of {last} rows in a loop nest of its own" in acc, acc
    else:
        assert "transposed in cache right after the task" in stages["grad_input"], stages
    if targets.runnable(targets.get("x86-avx512")):
        _dx_matches(c, "x86-avx512", seed=11)


@pytest.mark.parametrize("bad", [None, np.nan, np.inf], ids=["finite", "nan", "inf"])
@pytest.mark.parametrize("c", RAGGED, ids=gid)
def test_dx_with_a_last_tile_matches_the_reference(c, bad):
    _dx_matches(c, "x86-avx2", 11, bad, (0, 0, *(k - 1 for k in c["w"][2:])))


def test_dx_with_a_last_tile_in_float16():
    _dx_16bit_matches(RAGGED[1], "x86-avx2", 11)


# --- reduction chunks that span two axes -----------------------------------------------------

def test_chunk_steps_take_rows_of_the_next_axis_under_a_short_innermost_one():
    from schedules.convolution_backward import K_CHUNK, chunk_steps

    assert chunk_steps([8, 1024]) == (K_CHUNK, 1)  # a long innermost axis: chunks of it
    assert chunk_steps([1, 16, 28, 28]) == (28, 7)  # a 3-D dw: 7 rows of 28 (196 <= 256)
    assert chunk_steps([3, 3, 3, 64]) == (64, 3)  # a 3-D dx: 3 taps of 64 channels
    assert chunk_steps([13, 37]) == (37, 1)  # no divisor of 13 fits 256 // 37 = 6 but 1
    assert chunk_steps([28]) == (28, 1) and chunk_steps([]) == (1, 1)



def test_chunk_steps_keep_the_v_panel_within_the_share_of_l1_the_target_has():
    from schedules.convolution_backward import K_CHUNK, PANEL_L1_SHARE, chunk_steps, panel_steps

    for name in ("znver4", "sapphirerapids", "x86-avx2"):
        tgt = targets.get(name)
        for vf in (8, 16, 32, 64):
            steps = panel_steps(tgt, vf)
            assert steps * vf * 4 <= tgt.l1d_kib * 1024 * PANEL_L1_SHARE
            assert steps == K_CHUNK or (steps + 1) * vf * 4 > tgt.l1d_kib * 1024 * PANEL_L1_SHARE
    # a 256-channel conv1d dx, two vectors of lanes: 128 of its 256 steps per chunk on a
    # 32 KB (Zen 4) and a 48 KB (Sapphire Rapids) L1d alike
    assert chunk_steps([3, 256], panel_steps(targets.get("znver4"), 32)) == (128, 1)
    assert chunk_steps([3, 256], panel_steps(targets.get("sapphirerapids"), 32)) == (128, 1)
    assert chunk_steps([3, 3, 3, 64], panel_steps(targets.get("sapphirerapids"), 16)) == (64, 3)
    assert panel_steps(replace(targets.get("x86-avx2"), l1d_kib=1), 64) == 2


def test_a_flat_chunk_takes_taps_within_its_own_share_of_l1():
    from schedules.convolution_backward import FLAT_PANEL_L1_SHARE, chunk_steps, panel_steps

    zen4 = targets.get("znver4")  # 32 KB L1d: half of it holds 128 steps of two vectors
    limit, flat = panel_steps(zen4, 32), panel_steps(zen4, 32, share=FLAT_PANEL_L1_SHARE)
    assert (limit, flat) == (128, 192)
    assert chunk_steps([3, 3, 3, 64], limit) == (64, 1)  # 2 taps of 64 fit; 2 divides not 3
    assert chunk_steps([3, 3, 3, 64], limit, flat) == (64, 3)  # a 3-D dx: its 3 taps in one
    assert chunk_steps([3, 256], limit, flat) == (128, 1)  # the flat budget never splits kc

# 3-D layers whose innermost reduction axis is short: dw's chunk spans output rows (strided,
# dilated, padding per axis, prime sizes, batch 2), dx's spans taps
SPANNING = [
    (G(3, 2, 24, 20, (3, 7, 5), 3, 1, 1), (False, True, False), "cb_dw_acc", 35),
    (G(3, 2, 18, 20, (4, 9, 11), 3, 2, (1, 0, 2), (1, 2, 1)), (False, True, False),
     "cb_dw_acc", 21),
    (G(3, 2, 16, 20, (3, 5, 7), 3, 1, 1), (True, False, False), "cb_dx_acc", 60),
]


@pytest.mark.parametrize("c, mask, stage, steps", SPANNING, ids=lambda v: gid(v)
                         if isinstance(v, dict) else str(v))
def test_a_chunk_spanning_two_axes_matches_the_reference(c, mask, stage, steps):
    go = te.placeholder(c["dy"], name="grad_output")
    x = te.placeholder(c["x"], name="input")
    w = te.placeholder(c["w"], name="weight")
    outs = convolution_backward(go, x, w, None, list(c["stride"]), padding_arg(c),
                                list(c["dil"]), False, [0, 0, 0], 1, list(mask))
    sch = dsl.auto_schedule([t for t in outs if t is not None][0],
                            target=targets.get("x86-avx512"))
    why = {s: why for s, _, why in dsl.explain(sch).stages}[stage]
    assert f"{steps}-step reduction chunk" in why, why
    dy, xv, wv = data(c, seed=5)
    got = call(c, dy, xv, wv, mask=mask)[mask.index(True)]
    ref = reference(c, dy, xv, wv)[mask.index(True)]
    assert np.abs(got - ref).max() <= 2e-5 * max(1.0, np.abs(ref).max())


# --- dx: (tap, channel) chunks in one loop; grad_input transposed in cache ----------------

# (call, the chunk's taps and channels in one loop, grad_input written by each dx task)
FLAT = [
    (G(3, 2, 32, 20, (3, 5, 7), 3, 1, 1), True, True),  # stride = dilation = 1
    (G(3, 1, 16, 24, (5, 6, 9), 3, 2, 1, 2), True, False),  # stride = dilation = 2
    (G(3, 2, 16, 12, (4, 5, 7), 3, 1, (1, 0, 2), (1, 1, 2)), False, True),
    (G(3, 2, 16, 12, (4, 5, 7), 3, 1, 1, groups=2), False, True),
]


def _dx_notes(c, target):
    return {s: why for s, _, why in dsl.explain(_ragged_schedule(c, target)).stages}


@pytest.mark.parametrize("c, flat, in_cache", FLAT, ids=lambda v: gid(v)
                         if isinstance(v, dict) else str(v))
def test_dx_chunks_in_one_loop_where_both_operands_are_contiguous(c, flat, in_cache):
    # w_adj holds the taps last first, so where a tap moves the dy row by one (stride ==
    # dilation, ungrouped) the chunk is one run of taps x channels in both operands
    notes = _dx_notes(c, targets.get("x86-avx512"))
    assert ("in one loop" in notes["cb_dx_acc"]) == flat, notes["cb_dx_acc"]
    assert ("transposed in cache" in notes["grad_input"]) == in_cache, notes["grad_input"]


@pytest.mark.parametrize("bad", [None, np.nan, np.inf], ids=["finite", "nan", "inf"])
@pytest.mark.parametrize("c", [f[0] for f in FLAT], ids=gid)
def test_flat_chunks_and_the_in_cache_output_match_the_reference(c, bad):
    # the exact twin's values reach grad_input through the in-cache copy
    _dx_matches(c, "x86-avx512", 13, bad, (1, 0, *(k - 1 for k in c["w"][2:])))


def test_in_cache_output_reads_the_accumulator_tile_with_no_full_size_copy():
    # the tile's write-back into a full-size cb_dx_acc (read by grad_input alone) is inlined:
    # the kernel allocates the tile and the exact twin, never a dx_acc of the whole input
    from dsl.runtime.build import lower

    c = FLAT[0][0]
    go, x, w = (te.placeholder(c[k], name=n) for k, n in
                (("dy", "grad_output"), ("x", "input"), ("w", "weight")))
    out = convolution_backward(go, x, w, None, list(c["stride"]), padding_arg(c),
                               list(c["dil"]), False, list(c["opad"]), 1, list(DX))[0]
    sch = dsl.auto_schedule(out, target=targets.get("x86-avx512"))
    assert "no full-size copy" in {s: why for s, _, why in
                                   dsl.explain(sch).stages}["grad_input"]
    script = lower(sch, "k", [go, w, out]).script()
    buffers = set(re.findall(r"(cb_dx_acc\w*) = T\.sblock_alloc_buffer", script))
    assert buffers == {"cb_dx_acc_local", "cb_dx_acc_exact"}, buffers


# --- dx packs its own rows of dy inside each task ----------------------------------------

# (call, dx packs its rows of dy in each task on x86-avx512)
IN_TASK = [
    (G(1, 3, 40, 24, 64, 3, 1, 1), True),            # 40 channels: 4 vectors of 10
    (G(1, 2, 24, 20, 56, 5, 1, 3, 2), True),         # dilated taps, a halo of 8 rows
    (G(1, 2, 32, 48, 48, 3, 1, 1, groups=4), True),  # grouped: each group's rows of dy
    (G(1, 2, 40, 24, 19, 3, 1, 1), True),            # 19 rows: one tile
    (G(1, 1, 16, 8, 62, 3, 2, 1), False),            # stride 2: tasks not fused
    (G(2, 2, 24, 16, (6, 32), 3, 1, 1), False),      # 2-D: each task would repack 3 rows
    (FLAT[0][0], False),                             # 3-D: 9 rows
]


@pytest.mark.parametrize("c, in_task", IN_TASK, ids=lambda v: gid(v)
                         if isinstance(v, dict) else str(v))
def test_dx_packs_its_rows_of_dy_in_each_task_where_the_halo_is_small(c, in_task):
    # each task transposes its rows of dy (and the taps' halo) into cache just before its
    # register tiles read them, where the tasks' packs together repeat at most 1.25 rows in
    # every row of the whole pack; the exact twin then reads dy itself
    notes = _dx_notes(c, targets.get("x86-avx512"))
    assert ("computed in each task" in notes["cb_y_pack"]) == in_task, notes["cb_y_pack"]


@pytest.mark.parametrize("bad", [None, np.nan, np.inf], ids=["finite", "nan", "inf"])
@pytest.mark.parametrize("c", [c for c, hit in IN_TASK if hit], ids=gid)
def test_dx_that_packs_in_each_task_matches_the_reference(c, bad):
    _dx_matches(c, "x86-avx512", 17, bad, (1, 0, *(k - 1 for k in c["w"][2:])))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("c", [c for c, hit in IN_TASK if hit][:2], ids=gid)
def test_dx_that_packs_in_each_task_in_16_bits(c, dtype):
    # the pack converts each task's rows of dy to fp32 in cache; grad_input is rounded back
    _dx_16bit_matches(c, "x86-avx512", 17, dtype, atol=8e-3)


def test_in_cache_output_casts_to_float16():
    _dx_16bit_matches(FLAT[0][0], "x86-avx512", 13)


# --- the parallel split: tasks shared out evenly ---------------------------------------------

@pytest.mark.parametrize("cores, blocks", [(2, "4 x 2"), (16, "1 x 1"), (3, "8 x 2")])
def test_dw_blocks_shrink_until_the_tasks_share_out_evenly(cores, blocks):
    # a 3-D dw of 64 channels: 27 taps x (64 / 8 rows / mb) x (64 / 32 lanes / nb) tasks;
    # 27 on 2 cores leaves one idle 1/28 of the time, 54 none; on 16 cores 27, 54, 108 and 216
    # tasks leave some idle, 432 (single tiles) none; 3 cores: 27 tasks share out exactly
    why, _ = _dw3d(cores)
    assert f"8 x 32 register tile, {blocks} tiles per" in why, why


def _dw3d(cores: int):
    """dw of a 3-D layer of 64 channels scheduled for ``cores``: its note and lowered TIR."""
    from dsl.runtime.build import lower

    c = G(3, 1, 64, 64, (6, 7, 8), 3, 1, 1)
    go = te.placeholder(c["dy"], name="grad_output")
    x = te.placeholder(c["x"], name="input")
    w = te.placeholder(c["w"], name="weight")
    dw = convolution_backward(go, x, w, None, [1] * 3, [1] * 3, [1] * 3, False, [0] * 3, 1,
                              [False, True, False])[1]
    sch = dsl.auto_schedule(dw, target=targets.get("x86-avx512").with_cores(cores))
    why = {s: why for s, _, why in dsl.explain(sch).stages}["cb_dw_acc"]
    return why, lower(sch, "k", [go, x, dw]).script()


@pytest.mark.parametrize("cores, blocks", [(2, 2), (3, 3), (16, 16)])
def test_dw_taps_run_inside_each_reduction_chunk(cores, blocks):
    """The tile blocks (row x vector blocks) run across cores, the first tap axis joining
    them where they are too few to share out (3 cores: 1 block x 3 taps); every other tap
    loop lies below the chunk loop, reading the chunk again from cache."""
    why, script = _dw3d(cores)
    assert why.endswith("the taps inside each chunk"), why
    acc = script[script.rindex("T.parallel(", 0, script.index('T.sblock("cb_dw_acc_update")')):
                 script.index('T.sblock("cb_dw_acc_update")')]
    assert acc.startswith(f"T.parallel({blocks})"), acc[:40]
    loops = re.findall(r"for (.+?) in", acc)
    names = [n.strip() for lp in loops for n in lp.split(",")]
    chunk = next(i for i, n in enumerate(names) if n.startswith("o1_0"))
    assert any(n.startswith("i2") for n in names[chunk:]), names  # kw below the chunk


@pytest.mark.parametrize("cores", [2, 3, 16])
def test_dw_with_taps_inside_agrees_bitwise_across_core_counts(cores):
    """Each weight sums its chunks in the same order on every core count."""
    c = G(3, 2, 20, 24, (5, 6, 7), 3, 1, 1)
    dy, x, w = data(c, seed=5)
    with targets.use(targets.get("host").with_cores(1)):
        one = call(c, dy, x, w, mask=[False, True, False])[1]
    with targets.use(targets.get("host").with_cores(cores)):
        many = call(c, dy, x, w, mask=[False, True, False])[1]
    np.testing.assert_array_equal(one, many)
    ref = reference(c, dy, x, w)[1]
    assert np.abs(one - ref).max() <= 2e-5 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("bad", [None, np.nan], ids=["finite", "nan"])
def test_flat_chunk_beside_a_ragged_last_tile_matches_the_reference(bad):
    c = G(2, 2, 32, 20, (5, 29), 3, 1, 1)  # 29 rows: tiles of 12 and a last one of 5
    why = _dx_notes(c, targets.get("x86-avx512"))["cb_dx_acc"]
    assert "in one loop, the last tile of 5 rows" in why, why
    _dx_matches(c, "x86-avx512", 17, bad, (1, 0, 2, 2))



# chunks whose innermost loop has UNROLL_MIN_STEPS steps or more run STEP_UNROLL steps per
# iteration: a dilated 1-D dx (not flat) of 64 Cout and 37 rows (a ragged last tile), and a
# 3-D dw whose chunk is rows of 20 output columns
UNROLLED = [G(1, 2, 24, 64, 37, 3, 1, 2, 2), G(3, 1, 64, 64, (4, 5, 20), 3, 1, 1)]


@pytest.mark.parametrize("c", UNROLLED, ids=gid)
def test_long_chunks_step_several_reductions_per_iteration(c):
    from dsl.runtime.build import lower
    from schedules.toolbox import STEP_UNROLL, UNROLL_MIN_STEPS

    dx = c["nd"] == 1
    go, x, w = (te.placeholder(c[k], name=n) for k, n in
                (("dy", "grad_output"), ("x", "input"), ("w", "weight")))
    out = convolution_backward(go, x, w, None, list(c["stride"]), padding_arg(c),
                               list(c["dil"]), False, [0] * c["nd"], 1,
                               [dx, not dx, False])[0 if dx else 1]
    sch = dsl.auto_schedule(out, target=targets.get("x86-avx512"))
    why = {s: why for s, _, why in dsl.explain(sch).stages}["cb_dx_acc" if dx else "cb_dw_acc"]
    steps = int(re.search(r"per (\d+)-step reduction chunk", why).group(1))
    assert steps >= UNROLL_MIN_STEPS and "in one loop" not in why, why
    assert f"in T.unroll({STEP_UNROLL})" in lower(sch, "k", [go, x, w, out]).script()


@pytest.mark.parametrize("bad", [None, np.nan], ids=["finite", "nan"])
def test_unrolled_steps_with_a_ragged_last_tile_match_the_reference(bad):
    _dx_matches(UNROLLED[0], "x86-avx512", 19, bad, (3, 1, 2))

# dx whose channels span several vector tiles: the weight operand is laid out as panels
WIDE = [
    G(1, 2, 40, 24, 19, 3, 1, 1),                                   # 1-D, 40 = 5 x 8 channels
    G(2, 1, 48, 20, (5, 7), 3, 2, [(1, 0), (0, 2)], (1, 2)),        # 2-D, stride 2, dilated
    G(2, 2, 24, 48, (3, 6), 4, 2, 1, transposed=True),              # transposed: w_fwd
    G(3, 1, 32, 16, (3, 4, 5), 3, 1, 1),                            # 3-D
]


@pytest.mark.parametrize("c", WIDE, ids=gid)
def test_dx_weight_is_read_from_panels(c):
    sch = _ragged_schedule(c, targets.get("x86-avx2"))
    stages = {s: why for s, _, why in dsl.explain(sch).stages}
    acc = stages.get("cb_dx_acc") or stages["cb_fwd_acc"]
    assert ("cb_w_fwd as panels" if c["transposed"] else "cb_w_adj as panels") in acc, acc


@pytest.mark.parametrize("bad", [None, np.nan], ids=["finite", "nan"])
@pytest.mark.parametrize("c", WIDE, ids=gid)
def test_dx_through_weight_panels_matches_the_reference(c, bad):
    _dx_matches(c, "x86-avx2", 5, bad, (0, 0, *(k - 1 for k in c["w"][2:])))
