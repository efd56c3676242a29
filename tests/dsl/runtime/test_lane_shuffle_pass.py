"""The lowering pass that turns gathers of a few short windows into window loads and one
shuffle: the windows it picks hold every lane and read nothing outside the gather's own
span; kernels it rewrites stay exact; loops nobody marked are left alone."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te, tirx

import targets
from dsl.runtime import lane_shuffle_pass
from dsl.runtime.build import compile_module
from dsl.runtime.lane_shuffle_pass import KEY, MAX_WINDOWS, windows


@pytest.mark.parametrize("offsets, expect", [
    (list(range(0, 32, 2)), (16, [0, 15])),  # a stride-2 row: two whole vectors
    ([(lane + 1) // 2 for lane in range(16)], (8, [0, 1])),  # each element twice
    ([lane % 2 for lane in range(16)], (2, [0])),  # two taps, alternating
    ([-3, -2, -1, 0], None),  # consecutive already: a plain load
    (list(range(0, 128, 8)), None),  # stride 8: more windows than are worth it
    ([5, 5, 5, 5], None),  # one element: a broadcast
])
def test_windows(offsets, expect):
    assert windows(offsets) == expect


def test_windows_hold_every_lane_and_stay_inside_the_span():
    rng = np.random.default_rng(5)
    for _ in range(500):
        lanes = int(rng.choice([4, 8, 16]))
        offsets = [int(v) for v in rng.integers(-20, 40, lanes)]
        plan = windows(offsets)
        if plan is None:
            continue
        width, starts = plan
        assert len(starts) <= MAX_WINDOWS and width <= lanes and width & (width - 1) == 0
        assert all(min(offsets) <= s and s + width - 1 <= max(offsets) for s in starts)
        assert all(any(s <= o < s + width for s in starts) for o in offsets), offsets


def _kernel(mark: bool):
    """Four gathers in one vectorised row (a stride-2 and a stride-3 ramp, each element twice,
    two values alternating), in a loop marked for the pass or not."""
    x = te.placeholder((200,), name="x")
    # sums only: no multiply-add that LLVM may contract and numpy would not
    y = te.compute((48,), lambda i: x[i * 2] + x[i // 2 + 7] - x[i % 2 + 3] + x[i * 3 + 1],
                   name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    (loop,) = sch.get_loops(sch.get_sblock("y"))
    outer, inner = sch.split(loop, [None, 16])
    sch.vectorize(inner)
    if mark:
        sch.annotate(outer, KEY, 1)
    return sch.mod


@pytest.mark.parametrize("mark", [True, False])
def test_marked_rows_are_rewritten_and_exact(mark, monkeypatch):
    seen = []
    real = lane_shuffle_pass.rewrite

    def spy(func):
        out = real(func)
        tvm_ffi.structural_walk(out.body, (tirx.Shuffle, seen.append), order="post")
        return out

    monkeypatch.setattr(lane_shuffle_pass, "rewrite", spy)
    lib = compile_module(_kernel(mark), targets.current().tvm_target())
    assert (len(seen) == 4) if mark else not seen
    xs = np.random.default_rng(1).standard_normal(200).astype("float32")
    out = tvm.runtime.tensor(np.zeros(48, "float32"))
    lib["main"](tvm.runtime.tensor(xs), out)
    i = np.arange(48)
    np.testing.assert_array_equal(out.numpy(), xs[i * 2] + xs[i // 2 + 7] - xs[i % 2 + 3]
                                  + xs[i * 3 + 1])
