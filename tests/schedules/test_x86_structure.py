"""What the x86 rules are meant to do, checked on the scheduled TIR (not on timings):
register-tiled accumulators, one block per stride phase with only the taps that hit,
the dw reduction split across cores when the other axes are small."""

import itertools

import pytest
from tvm import te

import dsl
import targets
from dsl.ops.conv2d_backprop_input import axis_phases
from dsl.ops.conv_geometry import ConvAxis
from dsl.ops.group import GroupLayout

from cases import C
from helpers import out_hw, para

HOST = targets.get("x86-avx512")


def _dx_sch(c):
    ho, wo = out_hw(c)
    w_sizes = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    fz = te.placeholder(GroupLayout.from_weight(w_sizes, c["groups"]).fracz_shape,
                        name="filters", dtype="float32")
    dy = te.placeholder((c["n"], -(-c["cout"] // 16), ho, wo, 16), name="out_backprop",
                        dtype="float32")
    dx = dsl.conv2d_backprop_input(fz, dy, w_sizes, (c["n"], c["cin"], c["h"], c["w"]),
                                   para(c, res_dtype="float32"))
    return dsl.auto_schedule(dx, target=HOST).s_tir([fz, dy, dx])


def _dw_sch(c, target=None):
    ho, wo = out_hw(c)
    x = te.placeholder((c["n"], -(-c["cin"] // 16), c["h"], c["w"], 16), name="fmap",
                       dtype="float32")
    dy = te.placeholder((c["n"], -(-c["cout"] // 16), ho, wo, 16), name="out_backprop",
                        dtype="float32")
    dw = dsl.conv2d_backprop_filter(x, dy, (c["cout"], c["cin"] // c["groups"], c["kh"],
                                            c["kw"]), para(c, groups=c["groups"]))
    return dsl.auto_schedule(dw, target=target or HOST).s_tir([x, dy, dw])


def _names(sch):
    return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]


@pytest.mark.parametrize("n_in,k,s,pad,d", [
    (9, 3, 2, 1, 1), (10, 1, 2, 0, 1), (13, 3, 3, 2, 2), (11, 3, 2, 2, 2), (15, 7, 2, 3, 1),
    (8, 4, 4, 1, 2)])
def test_phases_list_exactly_the_taps_that_hit(n_in, k, s, pad, d):
    n_out = ConvAxis.out_size(n_in, k, s, pad, pad, d)
    ax = ConvAxis.checked("H", n_in, n_out, k, s, pad, pad, d)
    hits = {(i, kk) for i, kk in itertools.product(range(n_in), range(k))
            if (i + pad - kk * d) % s == 0 and 0 <= (i + pad - kk * d) // s < n_out}
    listed = set()
    for p, (count, k0, taps, c) in enumerate(axis_phases(ax)):
        assert count == len(range(p, n_in, s))
        for q, j in itertools.product(range(count), range(taps)):
            kk = k0 + j * ax.tap_step
            assert kk < k
            row = q + c - j * ax.tap_step * d // s
            assert row == (q * s + p + pad - kk * d) // s  # the affine row is the real one
            if 0 <= row < n_out:
                listed.add((q * s + p, kk))
    assert listed == hits  # every hit listed; the rest read dy's zero padding


def test_strided_1x1_dx_has_one_phase_block_and_local_accumulators():
    sch = _dx_sch(C(1, 32, 32, 8, 8, 1, 2, (0, 0, 0, 0), 1, 1))
    # odd rows or columns get no tap of a 1x1 stride-2 kernel: no block computes them; and an
    # fp32 dy that needs no padding is read in place, not copied
    # (the weight scan and the exact twin are the NaN / inf fallback, dsl.runtime.run_if)
    assert _names(sch) == ["dx_w_nonfinite_lanes0_init", "dx_w_nonfinite_lanes0_update",
                           "dx_w_nonfinite", "dx_weight", "dx_exact_0_0_init",
                           "dx_exact_0_0_update", "dx_acc_0_0_init",
                           "dx_acc_0_0_update", "dx_acc_0_0_local", "dx"]
    script = sch.mod.script()
    assert "dx_acc_1_" not in script and "dx_acc_0_1" not in script  # no work for odd phases
    assert 'scope="local"' in script and "T.parallel" in script and "T.vectorized" in script


def test_3x3_s2_dx_has_four_phase_blocks():
    names = _names(_dx_sch(C(1, 32, 32, 9, 9, 3, 2, (1, 1, 1, 1), 1, 1)))
    phases = {n[len("dx_acc_"):len("dx_acc_") + 3] for n in names if n.startswith("dx_acc_")}
    assert phases == {"0_0", "0_1", "1_0", "1_1"}


def test_depthwise_dw_splits_the_reduction_across_cores():
    # too few register-tile tasks for 8 cores: the rows are split into rfactor parts
    c = C(1, 32, 32, 16, 16, 3, 1, (1, 1, 1, 1), 1, 32)
    script = _dw_sch(c, HOST.with_cores(8)).mod.script()
    assert "dw_acc_rf" in script and 'scope="local"' in script


def test_dense_dw_keeps_a_register_tile():
    script = _dw_sch(C(1, 64, 64, 8, 8, 3, 1, (1, 1, 1, 1), 1, 1)).mod.script()
    assert "dw_acc_local" in script or "dw_acc_rf_local" in script
    assert "T.unroll" in script and "T.vectorized" in script


def test_few_input_channels_do_not_vectorise_channel_padding():
    """RGB-stem-like: 3 input channels would fill 3 of 16 lanes; the W positions (dx) and
    the output channels (dw) take the lanes instead."""
    c = C(1, 3, 32, 20, 20, 7, 2, (3, 3, 3, 3), 1, 1)
    assert any(n.startswith("dx_acc_w") for n in _names(_dx_sch(c)))
    assert any(n.startswith("dw_acc_t") for n in _names(_dw_sch(c)))
