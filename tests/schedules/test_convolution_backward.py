"""What the x86 rule of ``convolution_backward`` is meant to do, checked on the scheduled TIR
and against the float64 reference (not on timings)."""

import numpy as np
import pytest
from tvm import te

import dsl
import dsl.api.aclnn
import targets
from dsl.ops.convolution_backward import convolution_backward

from helpers import assert_nonfinite_positions
from reference import convolution_backward as ref_cb

# conv1d, Cin 24 and Cout 20: dw keeps Cx in lanes (vector axis 2), the layout that packs
# y and x as panels; N 2, L 13, K 3, padding 1
N, CIN, COUT, L, K = 2, 24, 20, 13, 3


def _dw_schedule(target):
    go = te.placeholder((N, COUT, L), name="grad_output")
    x = te.placeholder((N, CIN, L), name="input")
    w = te.placeholder((COUT, CIN, K), name="weight")
    outs = convolution_backward(go, x, w, None, [1], [1], [1], False, [0], 1,
                                [False, True, False])
    return dsl.auto_schedule([t for t in outs if t is not None][0], target=target)


@pytest.mark.parametrize("name", ["x86-avx2", "x86-avx512"])
def test_dw_packs_are_panels_beside_the_exact_twin(name):
    # The exact twin (run only for a NaN / inf input) reads the packs too. It must not cost
    # dw its GotoBLAS panels: conv1d 8x256x1024 k3 dw went 81 -> 109 GFLOP/s on a Zen 3.
    sch = _dw_schedule(targets.get(name))
    stages = {s: why for s, _, why in dsl.explain(sch).stages}
    assert "cb_dw_acc_exact" in stages
    assert "cb_y_pack and cb_x_pack as panels" in stages["cb_dw_acc"]


@pytest.mark.parametrize("bad", [None, np.inf, np.nan], ids=["finite", "inf", "nan"])
def test_dw_through_panels_matches_the_reference(bad):
    rng = np.random.default_rng(3)
    dy = rng.uniform(-1, 1, (N, COUT, L)).astype(np.float32)
    x = rng.uniform(-1, 1, (N, CIN, L)).astype(np.float32)
    w = rng.uniform(-1, 1, (COUT, CIN, K)).astype(np.float32)
    if bad is not None:
        x[1, 5, 0] = bad  # the exact twin's result, read through the re-laid packs
    out = dsl.aclnn.convolution_backward(dy, x, w, [COUT], [1], [1], [1], False, [0], 1,
                                         [False, True, False], 0)[1]
    ref = ref_cb(dy, x, w, (1,), ((1, 1),), (1,), False, (0,), 1)[1]
    got, finite = assert_nonfinite_positions(out, ref, "grad_weight")
    err = np.abs(got[finite] - ref[finite]).max()
    assert err <= 2e-5 * max(1.0, np.abs(ref[finite]).max()), err
