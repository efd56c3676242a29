"""A user's elementwise stages around a shipped operator are fused into the operator's own
schedule (schedules.fusion): the anchor is found by tag anywhere in the graph, epilogues are
reverse-inlined into the operator's output block, prologues inlined into its first stages,
and the results equal float64 numpy references written from the math."""

import numpy as np
import pytest
from tvm import te

import dsl
from dsl import kernel_cache
from dsl.ops.layout import fracz_to_weight

from cases import C
from helpers import (
    assert_close,
    case_id,
    nc1hwc0_to_nchw,
    nchw_to_5hd,
    out_hw,
    para,
    rand,
    weight_to_fracz,
)
from reference import conv2d_backprop_filter as ref_dw
from reference import conv2d_backprop_input as ref_dx
from reference import convolution_backward as ref_cb

CASES = [
    C(2, 20, 24, 9, 8, 3, 2, (1, 1, 1, 1), 1, 1),       # odd channels, stride 2
    C(1, 12, 20, 5, 5, 2, 1, (0, 0, 0, 0), (2, 1), 4),  # groups 4, Cin_g 3, Cout_g 5
    C(2, 24, 24, 7, 7, 3, 2, (1, 1, 1, 1), 1, 24),      # depthwise, stride 2
    C(1, 16, 32, 9, 10, 3, 2, (1, 0, 0, 1), 1, 1),      # dense register tile
]
# one stride phase (1x1), dense tile, padded channels: dx + epilogue
# written from the register tile
ONE_PHASE = C(2, 20, 17, 7, 9, 1, 1, (0, 0, 0, 0), 1, 1)
DX_CASES = [*CASES, ONE_PHASE]
PRO = 0.5  # the prologue scales dy by this (exact in fp16)


def _ew(shape, fn, name):
    return te.compute(shape, lambda *i: fn(i), name=name)


def _dy(shape, prologue):
    """dy as the operator sees it: the placeholder, or a user's fp16 -> fp32 cast and scale."""
    if not prologue:
        dy = te.placeholder(shape, "float32", "dy")
        return dy, dy
    dy16 = te.placeholder(shape, "float16", "dy16")
    return dy16, _ew(shape, lambda i: dy16[i].astype("float32") * PRO, "dy_scale")


def _make(graph, c, variant):
    args, out, _ = graph(c, variant)
    return args, [out]


def _check_fused(kernel_or_sch, epilogues, rule):
    """The operator's rule ran and no epilogue block is left on its own."""
    sch = dsl.auto_schedule(kernel_or_sch["outs"])
    mod = sch.s_tir(kernel_or_sch["args"])
    names = {mod.get(b).name_hint for b in mod.get_child_blocks(mod.get_sblock("root"))}
    assert sch.rule_name.endswith(rule)
    fused = {stage for stage, r, why in sch.decisions if r == "fusion" and "into" in why}
    assert set(epilogues) <= fused, sch.decisions
    assert not names & set(epilogues), names
    assert any(r != "fusion" for _, r, _ in sch.decisions)  # the operator's rule noted its own
    return {stage: why for stage, _, why in sch.decisions}


# ---------------------------------------------------------------------------------------- dx
def dx_graph(c, variant):
    ho, wo = out_hw(c)
    w_sizes = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    fz = te.placeholder(dsl.layout.GroupLayout.from_weight(w_sizes, c["groups"]).fracz_shape,
                        "float32", "filters")
    dy_in, dy = _dy((c["n"], -(-c["cout"] // 16), ho, wo, 16), variant == "bias_prologue")
    dx = dsl.conv2d_backprop_input(fz, dy, w_sizes, (c["n"], c["cin"], c["h"], c["w"]),
                                   para(c, res_dtype="float32"))
    shape = tuple(int(d) for d in dx.shape)
    if variant == "residual_mask":
        res = te.placeholder(shape, "float32", "residual")
        mask = te.placeholder(shape, "float32", "relu_mask")
        add = _ew(shape, lambda i: dx[i] + res[i], "add_residual")
        out = _ew(shape, lambda i: mask[i] * add[i], "relu_grad")
        return [fz, dy_in, res, mask], out, ["add_residual", "relu_grad"]
    if variant == "relu_select":  # the suite's row: a compare stage beside the epilogue
        res = te.placeholder(shape, "float32", "residual")
        fwd = te.placeholder(shape, "float32", "fwd")
        out = dsl.vsel(dsl.vcmp(fwd, 0.0, "gt"), dsl.vadd(dx, res), 0.0)
        return [fz, dy_in, res, fwd], out, ["vcmp", "vadd", "vsel"]
    if variant == "scale_cast16":
        out = _ew(shape, lambda i: (dx[i] * 0.25).astype("float16"), "scale_cast")
        return [fz, dy_in], out, ["scale_cast"]
    bias = te.placeholder((shape[1], 16), "float32", "bias")
    out = _ew(shape, lambda i: dx[i] + bias[i[1], i[4]], "add_bias")
    return [fz, dy_in, bias], out, ["add_bias"]


@pytest.mark.parametrize("variant",
                         ["residual_mask", "relu_select", "scale_cast16", "bias_prologue"])
@pytest.mark.parametrize("c", DX_CASES, ids=case_id)
def test_dx_with_epilogue(c, variant):
    args, out, epilogues = dx_graph(c, variant)
    notes = _check_fused({"outs": out, "args": [*args, out]}, epilogues, "schedule_dx_x86")
    if variant == "bias_prologue" and c is not ONE_PHASE:
        # cast + scale of dy folded into dx's own pad / cast stage (a 1x1 dx has none: the
        # reduction reads dy, so the prologue is materialised once instead)
        assert notes["dy_scale"].startswith("prologue inlined into dx_dy_"), notes
    if c is ONE_PHASE:  # no round trip through dx_acc: the tile writes the epilogue's result
        assert notes["dx"].startswith("written from the register tile"), notes
    kernel = kernel_cache.get_kernel({"t": "fuse_dx", "c": c, "v": variant},
                                     lambda: _make(dx_graph, c, variant), prefix="t_fuse_dx")
    rng = np.random.default_rng(3)
    ho, wo = out_hw(c)
    x_shape = (c["n"], c["cin"], c["h"], c["w"])
    w = rand(rng, (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"]), "float32")
    dy = rand(rng, (c["n"], c["cout"], ho, wo), "float16" if variant == "bias_prologue"
              else "float32")
    scale = PRO if variant == "bias_prologue" else 1.0
    ref = ref_dx(dy.astype(np.float64) * scale, w, x_shape, c["stride"], c["pads"], c["dil"],
                 c["groups"])
    inputs = [weight_to_fracz(w, c["groups"]), nchw_to_5hd(dy)]
    if variant == "residual_mask":
        res = rand(rng, x_shape, "float32")
        mask = (rng.uniform(size=x_shape) > 0.4).astype(np.float32)
        inputs += [nchw_to_5hd(res), nchw_to_5hd(mask)]
        ref = mask * (ref + res)
    elif variant == "relu_select":
        res, fwd = rand(rng, x_shape, "float32"), rand(rng, x_shape, "float32")
        inputs += [nchw_to_5hd(res), nchw_to_5hd(fwd)]
        ref = np.where(fwd > 0, ref + res, 0.0)
    elif variant == "scale_cast16":
        ref = ref * 0.25
    else:
        bias = rand(rng, (-(-c["cin"] // 16) * 16,), "float32")
        inputs.append(bias.reshape(-1, 16))
        ref = ref + bias[:c["cin"]].reshape(1, -1, 1, 1)
    got = nc1hwc0_to_nchw(np.asarray(kernel(*inputs)), c["cin"])
    assert_close(got, ref, "float16" if variant == "scale_cast16" else "float32", variant)


# ---------------------------------------------------------------------------------------- dw
def dw_graph(c, variant):
    ho, wo = out_hw(c)
    w_sizes = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    x = te.placeholder((c["n"], -(-c["cin"] // 16), c["h"], c["w"], 16), "float32", "fmap")
    dy_in, dy = _dy((c["n"], -(-c["cout"] // 16), ho, wo, 16), variant == "decay_prologue")
    dw = dsl.conv2d_backprop_filter(x, dy, w_sizes, para(c, groups=c["groups"]))
    shape = tuple(int(d) for d in dw.shape)
    if variant == "scale_cast16":
        out = _ew(shape, lambda i: (dw[i] * 0.25).astype("float16"), "scale_cast")
        return [x, dy_in], out, ["scale_cast"]
    wt = te.placeholder(shape, "float32", "weight")
    out = _ew(shape, lambda i: dw[i] + 0.125 * wt[i], "weight_decay")
    return [x, dy_in, wt], out, ["weight_decay"]


@pytest.mark.parametrize("variant", ["scale_cast16", "decay_prologue"])
@pytest.mark.parametrize("c", CASES[:3], ids=case_id)
def test_dw_with_epilogue(c, variant):
    args, out, epilogues = dw_graph(c, variant)
    notes = _check_fused({"outs": out, "args": [*args, out]}, epilogues, "schedule_dw_x86")
    if variant == "decay_prologue":  # inlined into its pad / cast stage, or materialised
        assert notes["dy_scale"].startswith(("prologue inlined into dw_dy_",  # once when the
                                             "not inlinable: elementwise")), notes  # acc reads dy
    kernel = kernel_cache.get_kernel({"t": "fuse_dw", "c": c, "v": variant},
                                     lambda: _make(dw_graph, c, variant), prefix="t_fuse_dw")
    rng = np.random.default_rng(5)
    ho, wo = out_hw(c)
    w_shape = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    x = rand(rng, (c["n"], c["cin"], c["h"], c["w"]), "float32")
    pro = variant == "decay_prologue"
    dy = rand(rng, (c["n"], c["cout"], ho, wo), "float16" if pro else "float32")
    ref = ref_dw(x, dy.astype(np.float64) * (PRO if pro else 1.0), w_shape, c["stride"],
                 c["pads"], c["dil"], c["groups"])
    inputs = [nchw_to_5hd(x), nchw_to_5hd(dy)]
    if pro:
        w = rand(rng, w_shape, "float32")
        inputs.append(weight_to_fracz(w, c["groups"]))
        ref = ref + 0.125 * w
    else:
        ref = ref * 0.25
    got = fracz_to_weight(np.asarray(kernel(*inputs)), w_shape, c["groups"])
    assert_close(got, ref, "float32" if pro else "float16", variant)


# ------------------------------------------------------------------------ convolution_backward
CB = {  # odd channels (5 in, 10 out), groups 5, stride 2
    "dy": (2, 10, 3, 4), "x": (2, 5, 6, 7), "w": (10, 1, 3, 2), "stride": [2, 2],
    "pad": [1, 1], "groups": 5}


def cb_graph(prologue):
    dy_in, dy = _dy(CB["dy"], prologue)
    x = te.placeholder(CB["x"], "float32", "input")
    w = te.placeholder(CB["w"], "float32", "weight")
    gi, gw, gb = dsl.convolution_backward(dy, x, w, [CB["dy"][1]], CB["stride"], CB["pad"],
                                          [1, 1], False, [0, 0], CB["groups"], [True] * 3, 0)
    res = te.placeholder(CB["x"], "float32", "residual")
    add = _ew(CB["x"], lambda i: gi[i] + res[i], "add_residual")
    gi2 = _ew(CB["x"], lambda i: te.max(add[i], 0.0), "relu")
    gw2 = _ew(CB["w"], lambda i: (gw[i] * 0.25).astype("float16"), "scale_cast")
    gb2 = _ew((CB["dy"][1],), lambda i: gb[i] + 1.0, "add_one")
    return [dy_in, x, w, res], [gi2, gw2, gb2]


def cb_reference(dy, x, w, res):
    gi, gw, gb = ref_cb(dy, x, w, CB["stride"], [(1, 1), (1, 1)], [1, 1], False, [0, 0],
                        CB["groups"])
    return np.maximum(gi + res, 0.0), gw * 0.25, gb + 1.0


@pytest.mark.parametrize("prologue", [False, True])
def test_convolution_backward_with_epilogues_and_three_outputs(prologue):
    args, outs = cb_graph(prologue)
    _check_fused({"outs": outs, "args": [*args, *outs]},
                 ["add_residual", "relu", "scale_cast", "add_one"],
                 "schedule_convolution_backward")
    kernel = kernel_cache.get_kernel({"t": "fuse_cb", "p": prologue},
                                     lambda: cb_graph(prologue), prefix="t_fuse_cb")
    rng = np.random.default_rng(7)
    dy = rand(rng, CB["dy"], "float16" if prologue else "float32")
    x, w, res = (rand(rng, CB[k], "float32") for k in ("x", "w", "x"))
    got = kernel(dy, x, w, res)
    refs = cb_reference(dy.astype(np.float64) * (PRO if prologue else 1.0), x, w, res)
    for g, r, dt in zip(got, refs, ("float32", "float16", "float32")):
        assert_close(g, r, dt, "cb")


# ------------------------------------------------------------------------------- two outputs
def test_two_outputs_plain_and_fused():
    """[epilogue(dx), dx]: dx is a kernel output, so the epilogue cannot be inlined into it;
    it gets the elementwise rule and both outputs are right."""
    c = CASES[0]

    def make():
        args, out, _ = dx_graph(c, "scale_cast16")
        dx = out.op.input_tensors[0]
        return args, [out, dx]

    args, outs = make()
    sch = dsl.auto_schedule(outs)
    assert sch.rule_name.endswith("schedule_dx_x86")
    sch.s_tir([*args, *outs])
    assert ("scale_cast", "fusion",
            "not inlinable: elementwise rule (vector lanes, parallel)") in sch.decisions
    kernel = kernel_cache.get_kernel({"t": "fuse_two", "c": c}, make, prefix="t_fuse_two")
    rng = np.random.default_rng(9)
    ho, wo = out_hw(c)
    w = rand(rng, (c["cout"], c["cin"], c["kh"], c["kw"]), "float32")
    dy = rand(rng, (c["n"], c["cout"], ho, wo), "float32")
    ref = ref_dx(dy, w, (c["n"], c["cin"], c["h"], c["w"]), c["stride"], c["pads"], c["dil"], 1)
    scaled, dx = kernel(weight_to_fracz(w, 1), nchw_to_5hd(dy))
    assert_close(nc1hwc0_to_nchw(np.asarray(dx), c["cin"]), ref, "float32", "dx")
    assert_close(nc1hwc0_to_nchw(np.asarray(scaled), c["cin"]), ref * 0.25, "float16", "scaled")


def test_anchor_found_below_a_user_output():
    """The operator's rule is found by tag even when a user's stage is the graph's output."""
    args, out, _ = dx_graph(CASES[3], "residual_mask")
    sch = dsl.auto_schedule(out)
    assert sch.anchor_tag == "conv2d_backprop_input"
    assert sch.op_info()["op"] == "conv2d_backprop_input"


def test_epilogue_after_a_reduction_output_gets_the_elementwise_rule():
    """avg_pool2d_backward in float32 with no W phases: the output stage is the reduction
    itself, TVM refuses the inline, and the epilogue is scheduled on its own, still right."""
    from reference import avg_pool2d_backward as ref_pool

    def make():
        dy = te.placeholder((2, 3, 5, 7), "float32", "grad_output")
        x = te.placeholder((2, 3, 9, 7), "float32", "self")
        dx = dsl.avg_pool2d_backward(dy, x, [3], [2, 1], [1], False, True, 0)
        return [dy], [_ew(tuple(int(d) for d in dx.shape), lambda i: dx[i] * 2.0 + 1.0, "epi")]

    args, outs = make()
    sch = dsl.auto_schedule(outs)
    sch.s_tir([*args, *outs])
    assert sch.rule_name.endswith("schedule_avg_pool2d_backward")
    assert ("epi", "fusion", "not inlinable: elementwise rule (vector lanes, parallel)") \
        in sch.decisions
    kernel = kernel_cache.get_kernel({"t": "fuse_pool"}, make, prefix="t_fuse_pool")
    dy = rand(np.random.default_rng(11), (2, 3, 5, 7), "float32")
    ref = ref_pool(dy, (2, 3, 9, 7), (3, 3), (2, 1), (1, 1), False, True, 0) * 2 + 1
    assert_close(kernel(dy), ref, "float32", "pool epilogue")
