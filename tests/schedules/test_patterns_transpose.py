"""Pattern rule for transposes (``schedules/patterns/transpose.py``): layout stages whose
input runs along another axis than their output, tiled along both; 2-D and batched
transposes, NHWC <-> NCHW, every dtype, 1 and 2 cores, against numpy (a transpose is exact).
Prime extents leave no tile of 4 and keep the injective rule."""

import numpy as np
import pytest
from pattern_helpers import build_run, rand
from tvm import te

import targets

# (input shape, output axes as a permutation of the input's)
CASES = [
    ((64, 48), (1, 0)),
    ((3, 40, 24), (0, 2, 1)),           # batched, as attention's K^T
    ((2, 7, 9, 32), (0, 3, 1, 2)),      # NHWC -> NCHW, rows of 9 (tiles of 9 lanes)
    ((2, 16, 5, 12), (0, 2, 3, 1)),     # NCHW -> NHWC, 16 channels stored innermost
    ((37, 53), (1, 0)),                 # prime: no tile of 4, the injective rule
]


def _permute(x, perm):
    return te.compute([x.shape[p] for p in perm], lambda *o: x(*[
        o[perm.index(d)] for d in range(len(perm))]), name="y")


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_transpose_is_tiled_along_both_axes(case, dtype, cores):
    shape, perm = case
    x = te.placeholder(shape, name="x", dtype=dtype)
    y = _permute(x, perm)
    rng = np.random.default_rng(21)
    xn = (rng.integers(-128, 128, shape).astype(dtype) if dtype == "int8"
          else rand(shape, dtype, rng))
    (out,), why = build_run([y], [x], [xn], target=targets.get("host").with_cores(cores))
    np.testing.assert_array_equal(out, xn.transpose(perm))
    tiled = min(shape) != 37
    assert why.rule_of("y") == ("patterns.transpose" if tiled else "patterns.injective"), \
        str(why)
    if tiled:
        note = dict((s, t) for s, _, t in why.stages)["y"]
        assert "tiles of" in note and "the read's contiguous axis" in note, note


def test_a_gather_is_no_transpose():
    """``y[i, j] = x[j // 2, i]`` reads its rows through index arithmetic: not a bare
    iterator, so not this rule's (the injective rule's vectors)."""
    import tvm

    from schedules.patterns.analysis import block_facts
    from schedules.patterns.transpose import transposed_axis

    x = te.placeholder((16, 32), name="x")
    y = te.compute((32, 32), lambda i, j: x[j // 2, i], name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    assert transposed_axis(block_facts(sch, sch.get_sblock("y"))) is None
    z = te.compute((32, 16), lambda i, j: x[j, i], name="z")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, z]))
    assert transposed_axis(block_facts(sch, sch.get_sblock("z"))) == "v_i"
