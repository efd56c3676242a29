"""Software prefetch in row groups (schedules/patterns/prefetch.py): the prefetches cover the
next row line by line, appear only when the data exceeds the cores' L2, and leave the results
of softmax, layer-norm and RMS-norm unchanged (odd and prime sizes, fused rows, fp32/fp16)."""

import dataclasses
import math

import numpy as np
import pytest
import tvm
from pattern_helpers import build_run, check, norm_graph, norm_reference, rand, softmax_graph
from tvm import te

import targets
from schedules.patterns.prefetch import LINE_BYTES, line_plan

SHAPES = [(7, 131), (3, 5, 256), (2, 3, 5, 97), (2, 1, 3, 4, 64), (5, 1)]


@pytest.mark.parametrize("row_elems, n_iter, elem_bytes",
                         [(4096, 256, 4), (131, 9, 4), (97, 97, 2), (64, 1, 4), (1, 1, 4),
                          (1000, 7, 8)])
def test_line_plan_covers_every_line_of_the_row(row_elems, n_iter, elem_bytes):
    step, offsets = line_plan(row_elems, n_iter, elem_bytes)
    per_line = max(1, LINE_BYTES // elem_bytes)
    touched = {(j * step + k) // per_line for j in range(n_iter) for k in offsets}
    assert set(range(math.ceil(row_elems / per_line))) <= touched
    assert len(offsets) <= math.ceil(step / per_line) + 1  # per line, not per element


def _small_l2_target(shape, dtype):
    """A one-core target whose L2 is just big enough for two rows: the data of these small
    tests then counts as larger than the caches, as a big softmax does on a real machine."""
    row_bytes = 2 * shape[-1] * np.dtype(dtype).itemsize  # input row + output row
    return dataclasses.replace(targets.current(), cores=1,
                               l2_kib=max(1, math.ceil(2 * row_bytes / 1024)))


def _prefetched(why, stage):
    return [w for s, _, w in why.stages if s == stage and "prefetched" in w]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_softmax_with_prefetch(shape, dtype):
    target = _small_l2_target(shape, dtype)
    x = te.placeholder(shape, name="x", dtype=dtype)
    xn = rand(shape, dtype, np.random.default_rng(3), -4, 4)
    (out,), why = build_run([softmax_graph(x, shape, dtype)], [x], [xn], target=target)
    x64 = xn.astype(np.float64)
    ref = np.exp(x64 - x64.max(-1, keepdims=True))
    check(out, ref / ref.sum(-1, keepdims=True), dtype, "softmax")
    rows = math.prod(shape[:-1])
    big = rows * 2 * shape[-1] * np.dtype(dtype).itemsize > target.l2_kib * 1024
    if big and shape[-1] >= 16:
        assert _prefetched(why, "y"), str(why)
        assert "the next row of ['x'] and the output's row for writing" in _prefetched(
            why, "y")[0]


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("shape", SHAPES[:4], ids=str)
def test_normalisations_with_prefetch(shape, rms):
    target = _small_l2_target(shape, "float32")
    x = te.placeholder(shape, name="x")
    gamma, y = norm_graph(x, shape, "float32", rms)
    rng = np.random.default_rng(5)
    xn, gn = rand(shape, "float32", rng, -2, 2), rand(shape[-1:], "float32", rng)
    (out,), why = build_run([y], [x, gamma], [xn, gn], target=target)
    ref = norm_reference(xn, gn, rms)
    check(out, ref, "float32", "norm")
    notes = _prefetched(why, "y")
    assert notes, str(why)
    assert "gamma" not in notes[0]  # a per-column vector is not streamed row by row


def test_prefetch_calls_reach_the_kernel_and_point_at_the_next_row():
    shape = (6, 96)
    target = _small_l2_target(shape, "float32")
    x = te.placeholder(shape, name="x")
    import dsl

    sch = dsl.auto_schedule([softmax_graph(x, shape, "float32")], target=target)
    script = sch.s_tir().mod.script()
    calls = [line for line in script.splitlines() if "llvm.prefetch" in line]
    # one call per cache line of a vector tile (2 on AVX-512: 32 floats), for each stream:
    # the next row of x and the output's row
    reads = [c for c in calls if "x_flat" in c]
    assert reads and len(reads) == len([c for c in calls if "y_flat" in c]) == len(calls) / 2, \
        script
    assert "x_flat[T.min((" in script and "+ 1) * 96" in script  # the next row of x
    lib = tvm.compile(sch.s_tir().mod, target=target.tvm_target())
    assert "prefetch" in lib.mod.inspect_source("asm")


def test_no_prefetch_when_the_data_fits_in_l2():
    shape = (7, 131)
    x = te.placeholder(shape, name="x")
    xn = rand(shape, "float32", np.random.default_rng(9))
    (_,), why = build_run([softmax_graph(x, shape, "float32")], [x], [xn])
    assert why.rule_of("y") == "patterns.row_reduction"
    assert not _prefetched(why, "y"), str(why)


def test_prefetch_indexes_in_int64_past_2_to_the_31_elements():
    """Build only: a softmax of 2**31 + 2**20 elements indexes (and prefetches) in int64."""
    import dsl

    shape = (1 << 20, (1 << 11) + 1)
    x = te.placeholder(shape, name="x")
    y = softmax_graph(x, shape, "float32")
    sch = dsl.auto_schedule([y])
    mod = sch.s_tir([x, y]).mod
    lines = [ln for ln in mod.script().split("\n") if "llvm.prefetch" in ln]
    assert lines and all("T.int64(2049)" in ln for ln in lines), lines
    tvm.compile(mod, target=sch.target.tvm_target())
