"""The schedule registry: x86 rules for the x86 family, the generic fallback elsewhere, and
the fallback is numerically correct (it is what a target without rules gets)."""

import dataclasses

import numpy as np
import pytest

import schedules
import targets
from dsl.ops.conv2d_backprop_filter import TAG as DW_TAG
from dsl.ops.conv2d_backprop_input import TAG as DX_TAG
from dsl.ops.layout import fracz_to_weight, nc1hwc0_to_nchw, nchw_to_5hd, weight_to_fracz
from schedules.generic import schedule_generic

from cases import CONV_CASES
from helpers import assert_close, case_id, dw_data, dx_data, out_hw, para
from reference import conv2d_backprop_filter as ref_dw
from reference import conv2d_backprop_input as ref_dx

X86_RULES = {
    DX_TAG: "schedules.conv2d_backprop_input.schedule_dx_x86",
    DW_TAG: "schedules.conv2d_backprop_filter.schedule_dw_x86",
    "layout.to_5hd": "schedules.layout.schedule_layout_x86",
    "layout.from_5hd": "schedules.layout.schedule_layout_x86",
    "layout.to_fracz": "schedules.layout.schedule_layout_x86",
    "layout.from_fracz": "schedules.layout.schedule_layout_x86",
}
# a target no rule is registered for: same code generation as the baseline, another family
UNKNOWN = dataclasses.replace(targets.get("x86-64"), family="no-such-family")


@pytest.mark.parametrize("tag", sorted(X86_RULES))
@pytest.mark.parametrize("name", targets.names())
def test_x86_family_gets_its_rules(tag, name):
    tgt = targets.get(name)
    assert tgt.family == "x86"
    rule_name, _ = schedules.lookup(tag, tgt)
    assert rule_name == X86_RULES[tag]


@pytest.mark.parametrize("tag", sorted(X86_RULES))
def test_unknown_family_falls_back_to_generic(tag):
    rule_name, rule = schedules.lookup(tag, UNKNOWN)
    assert rule is schedule_generic
    assert rule_name == "schedules.generic.schedule_generic"


def _run_generic(outs, ins, arrays):
    """Schedule with the fallback, compile for UNKNOWN's LLVM target and run in memory."""
    import tvm

    import dsl

    sch = dsl.auto_schedule(outs, target=UNKNOWN)
    assert sch.rule_name == "schedules.generic.schedule_generic"
    lib = tvm.compile(sch.s_tir([*ins, *outs]).mod, target=UNKNOWN.tvm_target())
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros([int(d) for d in outs[0].shape], str(outs[0].dtype)), dev)
    lib["main"](*[tvm.runtime.tensor(a, dev) for a in arrays], out)
    return out.numpy()


@pytest.mark.parametrize("c", [CONV_CASES[2], CONV_CASES[7]], ids=case_id)
def test_generic_fallback_is_correct(c):
    from tvm import te

    import dsl
    from dsl.ops.group import GroupLayout

    ho, wo = out_hw(c)
    w_sizes = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    c1x, c1y = -(-c["cin"] // 16), -(-c["cout"] // 16)

    dy, w = dx_data(c, "float32")
    fz_t = te.placeholder(GroupLayout.from_weight(w_sizes, c["groups"]).fracz_shape,
                          name="filters", dtype="float32")
    dy_t = te.placeholder((c["n"], c1y, ho, wo, 16), name="out_backprop", dtype="float32")
    dx_t = dsl.conv2d_backprop_input(fz_t, dy_t, w_sizes, (c["n"], c["cin"], c["h"], c["w"]),
                                     para(c, res_dtype="float32"))
    out5 = _run_generic([dx_t], [fz_t, dy_t], [weight_to_fracz(w, c["groups"]), nchw_to_5hd(dy)])
    ref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"], c["dil"],
                 c["groups"])
    assert_close(nc1hwc0_to_nchw(out5, c["cin"]), ref, "float32", "generic dx")

    x, dy = dw_data(c, "float32")
    x_t = te.placeholder((c["n"], c1x, c["h"], c["w"], 16), name="fmap", dtype="float32")
    dw_t = dsl.conv2d_backprop_filter(x_t, dy_t, w_sizes,
                                      para(c, res_dtype="float32", groups=c["groups"]))
    out = _run_generic([dw_t], [x_t, dy_t], [nchw_to_5hd(x), nchw_to_5hd(dy)])
    ref = ref_dw(x, dy, w_sizes, c["stride"], c["pads"], c["dil"], c["groups"])
    assert_close(fracz_to_weight(out, w_sizes, c["groups"]), ref, "float32", "generic dw")
