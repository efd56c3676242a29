"""dsl.ops.convolution_backward at the TE level: checks, stage structure, schedules, targets."""

import re

import numpy as np
import pytest
from tvm import te

import dsl
import targets
from dsl.ops import tag
from dsl.ops.convolution_backward import plan, promote

from helpers import assert_close, rand
from reference import convolution_backward as ref_cb

T, F = True, False


def ph(shape, name, dtype="float32"):
    return te.placeholder(shape, name=name, dtype=dtype)


def op(go=(2, 6, 5), x=(2, 4, 7), w=(6, 2, 3), bias=(6,), stride=(1,), pad=(0,), dil=(1,),
       transposed=False, opad=(0,), groups=2, mask=(T, T, T), cmt=0,
       dtypes=("float32",) * 3):
    return dsl.convolution_backward(ph(go, "grad_output", dtypes[0]), ph(x, "input", dtypes[1]),
                                    ph(w, "weight", dtypes[2]), bias, stride, pad, dil,
                                    transposed, opad, groups, mask, cmt)


BAD = [  # (overrides, code, param fragment)
    ({"w": (6, 2)}, "E60003", "weight.shape"),
    ({"w": (6, 2, 3, 3, 3, 3)}, "E60003", "weight.shape"),
    ({"x": (2, 4, 7, 7)}, "E60003", "input.shape"),
    ({"dtypes": ("float32", "int32", "float32")}, "E60006", "input.dtype"),
    ({"dtypes": ("int8", "float32", "float32")}, "E60006", "grad_output.dtype"),
    ({"stride": (1, 1)}, "E60003", "stride"),
    ({"stride": (0,)}, "E60011", "stride[0]"),
    ({"stride": (True,)}, "E60005", "stride[0]"),
    ({"pad": (-1,)}, "E60011", "padding[0]"),
    ({"pad": (0, 0, 0, 0)}, "E60003", "padding"),  # 4 values only for 2-D
    ({"dil": (0,)}, "E60011", "dilation[0]"),
    ({"opad": (0, 0)}, "E60003", "output_padding"),
    ({"groups": 0}, "E60108", "groups"),
    ({"groups": 4, "w": (6, 1, 3)}, "E60108", "groups"),  # 4 does not divide Cout 6
    ({"x": (2, 5, 7)}, "E60002", "input.shape[1]"),
    ({"go": (2, 4, 5)}, "E60002", "grad_output.shape[1]"),
    ({"go": (3, 6, 5)}, "E60003", "grad_output.shape[0]"),
    ({"go": (2, 6, 4)}, "E60024", "grad_output L"),
    ({"w": (6, 2, 9), "go": (2, 6, 1)}, "E60025", "kernel L"),
    ({"bias": (5,)}, "E60002", "bias_sizes"),
    ({"bias": None}, "E60012", "bias_sizes"),
    ({"bias": (6, 1)}, "E60003", "bias_sizes"),
    ({"mask": (T, T)}, "E60003", "output_mask"),
    ({"mask": (1, T, T)}, "E60005", "output_mask[0]"),
    ({"cmt": 4}, "E60011", "cube_math_type"),
    ({"cmt": True}, "E60005", "cube_math_type"),
    ({"transposed": 0}, "E60005", "transposed"),
    ({"w": (6, 2, 0)}, "E60003", "weight.shape[2]"),
    ({"x": (2, 4, 0)}, "E60003", "input.shape[2]"),
    ({"x": (0, 4, 7)}, "E60003", "grad_output.shape[0]"),  # batch disagrees
    ({"x": (0, 4, 7), "go": (0, 6, 5)}, "E60003", "input.shape"),  # empty: numpy API only
    # transposed: weight [Cin, Cout/g, k]; output (L-1)*s - 2p + (k-1)*d + op + 1
    ({"transposed": T, "x": (2, 6, 4), "w": (6, 2, 3), "go": (2, 4, 9), "stride": (2,),
      "opad": (2,), "bias": (4,)}, "E60011", "output_padding[0]"),
    ({"transposed": T, "x": (2, 6, 4), "w": (6, 2, 3), "go": (2, 4, 8), "stride": (2,),
      "bias": (4,)}, "E60024", "grad_output L"),
    ({"transposed": T, "x": (2, 4, 4), "w": (6, 2, 3), "go": (2, 4, 9), "stride": (2,),
      "bias": (4,)}, "E60002", "input.shape[1]"),
    ({"transposed": T, "x": (2, 6, 4), "w": (6, 2, 3), "go": (2, 6, 9), "stride": (2,),
      "bias": (4,)}, "E60002", "grad_output.shape[1]"),
    ({"transposed": T, "x": (2, 6, 4), "w": (6, 2, 3), "go": (2, 4, 9), "stride": (2,),
      "bias": (6,)}, "E60002", "bias_sizes"),
    ({"transposed": T, "x": (2, 6, 1), "w": (6, 2, 1), "go": (2, 4, 1), "pad": (1,),
      "bias": (4,)}, "E60024", "padding (L)"),
]


@pytest.mark.parametrize("kw,code,param", BAD, ids=[f"{b[2]}-{b[1]}-{i}" for i, b in
                                                     enumerate(BAD)])
def test_errors_name_parameter_value_and_rule(kw, code, param):
    with pytest.raises(dsl.DslError) as e:
        op(**kw)
    assert e.value.code == code and param in e.value.param, str(e.value)
    assert e.value.rule and isinstance(e.value, RuntimeError)


def test_valid_calls_pass_checks():
    op()  # the defaults
    op(transposed=T, x=(2, 6, 4), w=(6, 2, 3), go=(2, 4, 10), stride=(2,), opad=(1,),
       bias=(4,))
    op(bias=None, mask=(T, T, F))  # bias_sizes may be None when grad_bias is not wanted
    op(x=(1, 3, 6, 7), w=(4, 3, 3, 2), go=(1, 4, 5, 4), pad=(1, 0, 0, 1), stride=(1, 2),
       dil=(1, 1), opad=(0, 0), groups=1, bias=(4,))  # 4-value 2-D padding


def test_outputs_masks_dtypes_and_stage_tags():
    gi, gw, gb = op(dtypes=("float16", "bfloat16", "float16"))
    assert (gi.dtype, gw.dtype, gb.dtype) == ("float32", "float16", "float16")
    assert [int(d) for d in gi.shape] == [2, 4, 7] and [int(d) for d in gw.shape] == [6, 2, 3]
    assert [int(d) for d in gb.shape] == [6]
    assert op(mask=(F, T, F))[0] is None and op(mask=(T, F, F))[1] is None
    from dsl.runtime.schedule import walk

    _, computes = walk([gi, gw, gb])
    for c in computes:
        assert c.tag.startswith("convolution_backward.") and c.name, (c.name, c.tag)
    assert len({c.tag for c in computes}) == len(computes)
    assert promote("float16", "bfloat16") == "float32" and promote("bfloat16",
                                                                   "bfloat16") == "bfloat16"


def _acc(outputs, tag):
    from dsl.runtime.schedule import walk

    _, computes = walk([t for t in outputs if t is not None])
    return next(c for c in computes if c.tag == f"convolution_backward.{tag}")


@pytest.mark.parametrize("stride,dil,taps", [(1, 1, 5), (2, 1, 3), (3, 1, 2), (2, 2, 5),
                                             (4, 2, 3)])
def test_strided_dx_visits_only_real_taps(stride, dil, taps):
    """No zero-insertion: a strided dx reduces over ceil(k / step) taps, not k."""
    k, n_in = 5, 20
    n_out = (n_in - (k - 1) * dil - 1) // stride + 1
    outs = op(go=(1, 6, n_out), x=(1, 4, n_in), w=(6, 2, k), stride=(stride,), dil=(dil,),
              mask=(T, F, F))
    acc = _acc(outs, "dx_acc")
    extents = [int(r.dom.extent) for r in acc.reduce_axis]
    assert extents == [taps, 3], extents  # taps per position, then Cout/groups


def test_transposed_grad_input_is_a_forward_convolution():
    outs = op(transposed=T, x=(1, 6, 4), w=(6, 2, 3), go=(1, 4, 10), stride=(2,), opad=(1,),
              bias=(4,), mask=(T, F, F))
    acc = _acc(outs, "fwd_acc")
    assert [int(r.dom.extent) for r in acc.reduce_axis] == [3, 2]  # k, Cout/groups
    assert [int(d) for d in acc.output(0).shape] == [1, 4, 6]  # [N, L, Cin] channels-last


def test_plan_maps_transposed_onto_the_plain_index_map():
    p = plan((1, 4, 8), "float32", (1, 6, 4), "float32", (6, 2, 3), "float32", [4], [2], [1],
             [1], True, [1], 2, [T, T, T])
    (a,) = p.axes
    assert (a.n_in, a.n_out, a.pad_before, a.pad_after) == (8, 4, 1, 0)  # pa - output_padding
    assert (p.cx, p.cy, p.cxg, p.cyg) == (4, 6, 2, 3)


@pytest.mark.parametrize("name", ["x86-avx2", "x86-64"])
def test_schedule_on_other_targets(name):
    """The x86 rule reads lanes / cores from the target: narrower vectors build and agree."""
    tgt = targets.get(name)
    if not targets.runnable(tgt):
        pytest.skip(f"{name} cannot run here")
    from dsl import kernel_cache

    rng = np.random.default_rng(0)
    dy, x, w = rand(rng, (2, 6, 3, 4), "float32"), rand(rng, (2, 4, 6, 7), "float32"), \
        rand(rng, (6, 2, 3, 2), "float32")
    params = ([6], [2, 2], [1, 1], [1, 1], False, [0, 0], 2, [T, T, T])

    def make():
        g, i, ww = ph(dy.shape, "grad_output"), ph(x.shape, "input"), ph(w.shape, "weight")
        return [g, i, ww], list(dsl.convolution_backward(g, i, ww, *params))

    kernel = kernel_cache.get_kernel({"t": "cb_target", "name": name}, make, prefix="t_cb",
                                     target=tgt)
    assert kernel.meta["schedule"]["rule"].endswith("schedule_convolution_backward")
    out = kernel(dy, x, w)
    ref = ref_cb(dy, x, w, [2, 2], [(1, 1), (1, 1)], [1, 1], False, [0, 0], 2)
    for o, r in zip(out, ref):
        assert_close(o, r, "float32", name)


def _tags(outputs):
    from dsl.runtime.schedule import walk

    _, computes = walk([t for t in outputs if t is not None])
    return {c.tag.split(".", 1)[1] for c in computes}


REP_CASES = [  # (kwargs of op, expanded packs expected)
    ({}, {"y_rep", "x_rep"}),  # Cin/g 2, Cout/g 3: lanes would cross groups
    ({"go": (2, 16, 6, 6), "x": (2, 8, 8, 8), "w": (16, 2, 3, 3), "bias": (16,),
      "stride": (1, 1), "pad": (0, 0), "dil": (1, 1), "opad": (0, 0), "groups": 4},
     {"y_rep", "x_rep"}),  # the train_cnn layer
    ({"groups": 1, "w": (6, 4, 3)}, set()),  # dense
    ({"go": (2, 4, 5), "w": (4, 1, 3), "bias": (4,), "groups": 4}, set()),  # depthwise c->c
    ({"go": (2, 8, 5), "w": (8, 1, 3), "bias": (8,), "groups": 4},
     {"y_rep", "x_rep"}),  # depthwise multiplier 2: Y channel 2c + co
    ({"go": (2, 16, 5), "x": (2, 16, 7), "w": (16, 8, 3), "bias": (16,), "groups": 2},
     set()),  # 8 channels per group: a group fills a vector on its own
    ({"go": (2, 32, 5), "x": (2, 8, 7), "w": (32, 4, 3), "bias": (32,), "groups": 2},
     {"y_rep"}),  # dw: Cout/g 16 fills the lanes (one x scalar per vector); dx expands
    ({"transposed": T, "x": (2, 6, 4), "w": (6, 2, 3), "go": (2, 4, 10), "stride": (2,),
      "opad": (1,), "bias": (4,)}, {"x_rep"}),  # transposed: dx and dw both read x_rep
]


@pytest.mark.parametrize("kw,reps", REP_CASES, ids=range(len(REP_CASES)))
def test_expanded_packs_only_where_lanes_would_cross_groups(kw, reps):
    """Grouped layers with few channels per group read y_rep / x_rep (and the schedule says
    so); dense, exact depthwise and wide groups keep the plain packs alone."""
    outs = op(**kw)
    tags = _tags(outs)
    assert tags & {"y_rep", "x_rep"} == reps, tags
    kernel = dsl.auto_schedule([t for t in outs if t is not None])
    kernel.s_tir()
    notes = {b: why for b, _, why in kernel.decisions}
    for rep in reps:
        assert notes[f"cb_{rep}"].startswith("expanded pack"), notes
    readers = {"y_rep": ["cb_dx_acc"], "x_rep": ["cb_dw_acc", "cb_fwd_acc"]}
    for rep, blocks in readers.items():
        reading = [b for b in blocks if f"cb_{rep}" in notes.get(b, "")]
        assert bool(reading) == (rep in reps), (rep, notes)


def test_expanded_pack_gradients_alone():
    """dx alone never builds x_rep or y_pack; dw alone never builds y_rep."""
    assert _tags(op(mask=(T, F, F))) & {"y_pack", "x_pack", "y_rep", "x_rep"} == {"y_rep"}
    assert _tags(op(mask=(F, T, F))) & {"y_pack", "x_pack", "y_rep", "x_rep"} == \
        {"y_pack", "x_rep"}


def test_grouped_dw_sums_the_batch_in_chunks():
    """dw with Y channels in lanes (expanded, or exact depthwise) and large images: partial
    sums per L2-sized batch chunk (rfactor)."""
    outs = op(go=(3, 12, 61, 59), x=(3, 8, 61, 59), w=(12, 2, 3, 3), bias=(12,),
              stride=(1, 1), pad=(1, 1), dil=(1, 1), opad=(0, 0), groups=4, mask=(F, T, F))
    kernel = dsl.auto_schedule([t for t in outs if t is not None])
    kernel.s_tir()
    notes = {b: why for b, _, why in kernel.decisions}
    assert "the batch in 3 L2-sized chunks" in notes["cb_dw_acc_rf"], notes
    depthwise = op(go=(3, 24, 31, 30), x=(3, 24, 61, 59), w=(24, 1, 3, 3), bias=(24,),
                   stride=(2, 2), pad=(1, 1), dil=(1, 1), opad=(0, 0), groups=24,
                   mask=(F, T, F))
    kernel = dsl.auto_schedule([t for t in depthwise if t is not None])
    kernel.s_tir()
    notes = {b: why for b, _, why in kernel.decisions}
    assert "the batch in 3 L2-sized chunks" in notes["cb_dw_acc_rf"], notes
    small = dsl.auto_schedule([t for t in op(mask=(F, T, F)) if t is not None])
    small.s_tir()
    assert not any("chunks" in why for _, _, why in small.decisions)  # one chunk: no rfactor


@pytest.mark.parametrize("name", ["host", "x86-64", "x86-avx512"])
def test_plain_grouped_lanes_stay_inside_one_group(name):
    """Without an expanded pack, a grouped reduction's vector width divides the channels per
    group of its vector axis (dx: Cin/g = 12; dw: Y channels in lanes, Cout/g = 8, or on
    narrow vectors Cin/g = 3 in lanes), on every vector width."""
    import re

    cases = [({"go": (2, 16, 5, 5), "x": (2, 24, 7, 7), "w": (16, 12, 3, 3)}, "cb_dx_acc",
              {3: 12}),
             ({"go": (2, 16, 5, 5), "x": (2, 6, 7, 7), "w": (16, 3, 3, 3)}, "cb_dw_acc",
              {2: 8, 3: 3})]
    for kw, block, groups in cases:
        outs = op(**kw, bias=(16,), stride=(1, 1), pad=(0, 0), dil=(1, 1), opad=(0, 0),
                  groups=2, mask=(T, T, F))
        kernel = dsl.auto_schedule([t for t in outs if t is not None], target=name)
        kernel.s_tir()
        notes = {b: why for b, _, why in kernel.decisions}
        assert "expanded" not in notes[block], notes[block]
        axis = int(re.search(r"vector axis (\d+)", notes[block]).group(1))
        vf = int(re.search(r"\d+ x (\d+) register tile", notes[block]).group(1))
        assert groups[axis] % vf == 0, (name, block, notes[block])


DB_CASES = [  # (grad_output shape, input dtype, vectorised on every x86 width)
    ((3, 5, 8, 8), "float32", True),  # 64 positions per channel: whole vectors
    ((2, 3, 2, 4, 4), "float16", True),  # 3-D: the three position loops fuse into 32
    ((2, 7, 13), "float32", False),  # a prime run: summed serially
    ((4, 2, 3, 5), "bfloat16", False),  # 15 positions
]


@pytest.mark.parametrize("go,dtype,vectorised", DB_CASES, ids=range(len(DB_CASES)))
def test_grad_bias_sums_each_channel_in_vector_lanes(go, dtype, vectorised):
    """grad_bias alone: a channel's positions (contiguous in NC*) summed in vector
    accumulators when they fill whole vectors, serially otherwise; the float64 sum either way."""
    nd = len(go) - 2
    x, w = (go[0], go[1], *go[2:]), (go[1], 1, *[1] * nd)
    outs = dsl.convolution_backward(ph(go, "grad_output", dtype), ph(x, "input", dtype),
                                    ph(w, "weight", dtype), [go[1]], [1] * nd, [0] * nd,
                                    [1] * nd, False, [0] * nd, go[1], [F, F, T])
    kernel = dsl.auto_schedule([outs[2]])
    kernel.s_tir()
    notes = {b: why for b, _, why in kernel.decisions}
    assert ("rfactor-vectorised" in notes["cb_db_acc"]) == vectorised, notes
    from dsl.api.aclnn import convolution_backward_kernel

    _, k = convolution_backward_kernel(go, dtype, x, dtype, w, dtype, [go[1]], [1] * nd,
                                       [0] * nd, [1] * nd, False, [0] * nd, go[1], [F, F, T])
    dy = rand(np.random.default_rng(3), go, dtype)
    db = k(dy)  # one output: returned alone
    ref = dy.astype(np.float64).sum(axis=(0, *range(2, len(go))))
    assert_close(db, ref, dtype, str(go))


NC_CASES = [  # (x shape, kernel, padding (before, after) per axis, dilation): exact depthwise
    ((2, 5, 9, 8), (3, 3), ((1, 1), (1, 1)), (1, 1)),  # odd channel count, 8-wide rows
    ((3, 7, 6, 11), (3, 2), ((2, 0), (0, 2)), (2, 1)),  # asymmetric padding, dilation, 12-wide
    ((2, 3, 20), (5,), ((2, 2),), (1,)),  # 1-D, rows of 20 (five 4-float vectors)
    ((1, 3, 4, 5, 8), (3, 3, 3), ((1, 1), (1, 1), (1, 1)), (1, 1, 1)),  # 3-D, 5 rows of 8
    ((2, 16, 7, 36), (3, 3), ((1, 1), (1, 1)), (1, 1)),  # AVX2: 36 = 4 x 8 + 4 lanes of rows
]


NC_STRIDED = [  # (x shape, kernel, padding, dilation, stride): rows of dy whole 4-vectors
    ((2, 4, 8, 15), (3, 3), ((1, 1), (1, 1)), (1, 1), (2, 2)),  # odd row of 15, zero taps
    ((2, 3, 16, 16), (3, 3), ((1, 1), (1, 1)), (1, 1), (2, 2)),  # MobileNet's stride 2
    ((2, 5, 24), (5,), ((2, 2),), (1,), (3,)),  # 1-D, stride 3, 5 taps in 2 phases of 3
    ((1, 3, 4, 6, 16), (3, 3, 3), ((1, 1),) * 3, (1, 1, 1), (1, 2, 2)),  # 3-D
    ((2, 4, 9, 16), (3, 3), ((3, 3), (3, 3)), (3, 3), (2, 2)),  # dilation 3 with stride 2
    ((2, 4, 9, 15), (3, 2), ((2, 0), (0, 1)), (1, 1), (2, 2)),  # asymmetric, even kernel
    # dy rows of 16 or more: dw reads x stored by stride phase
    ((2, 3, 5, 32), (3, 3), ((1, 1), (1, 1)), (1, 1), (2, 2)),  # 32 -> 16
    ((2, 4, 6, 40), (3, 2), ((2, 0), (0, 1)), (1, 1), (2, 2)),  # asymmetric: 40 -> 20
    ((2, 3, 50), (3,), ((1, 1),), (2,), (3,)),  # 1-D, stride 3 with dilation 2: 3 phases
]


def _nc_case(xs, k, pads, dil, stride=None):
    stride = stride or [1] * len(k)
    out_sp = [(n + pb + pa - (kk - 1) * d - 1) // s + 1
              for n, kk, (pb, pa), d, s in zip(xs[2:], k, pads, dil, stride)]
    return (xs[0], xs[1], *out_sp), (xs[1], 1, *k)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("c", NC_CASES + NC_STRIDED, ids=range(len(NC_CASES + NC_STRIDED)))
def test_exact_depthwise_runs_in_nc_layout(c, dtype):
    """Exact depthwise, any stride that shares no factor with the dilation, dy rows of whole
    4-float vectors: NC* stages only (no channel-last pack or transpose), every gradient
    equal to the float64 reference."""
    from dsl.api.aclnn import convolution_backward_kernel

    xs, k, pads, dil, *rest = c
    nd = len(k)
    stride = list(rest[0]) if rest else [1] * nd
    gs, ws = _nc_case(xs, k, pads, dil, stride)
    padding = ([a for a, _ in pads] if all(a == b for a, b in pads)
               else [v for pair in pads for v in pair])  # the API's 2-D [top, bottom, l, r]
    args = (gs, dtype, xs, dtype, ws, dtype, [xs[1]], stride, padding, list(dil), False,
            [0] * nd, xs[1])
    p, _ = convolution_backward_kernel(*args, [T, T, T])
    assert p.nc_depthwise
    _check_all_gradients(args, xs, stride, pads, dil, dtype, 11, c)


def _check_all_gradients(args, xs, stride, pads, dil, dtype, seed, what):
    """Run ``convolution_backward_kernel(*args)`` (every gradient, then each alone) on random
    operands; each gradient equal to the float64 reference."""
    from dsl.api.aclnn import convolution_backward_kernel

    nd = len(stride)
    _, kernel = convolution_backward_kernel(*args, [T, T, T])
    gs, ws = args[0], args[4]
    rng = np.random.default_rng(seed)
    arrays = {"grad_output": rand(rng, gs, dtype), "input": rand(rng, xs, dtype),
              "weight": rand(rng, ws, dtype)}
    ref = ref_cb(arrays["grad_output"], arrays["input"], arrays["weight"], list(stride),
                 list(pads), list(dil), False, [0] * nd, xs[1])
    got = kernel(*[arrays[t["name"]] for t in kernel.inputs])
    for o, r, name in zip(got, ref, ("dx", "dw", "db")):
        assert_close(o, r, dtype, f"{what} {name}")
    for mask in ((T, F, F), (F, T, F)):  # each gradient alone
        _, alone = convolution_backward_kernel(*args, list(mask))
        o = alone(*[arrays[t["name"]] for t in alone.inputs])
        assert_close(o, ref[mask.index(T)], dtype, f"{what} alone {mask}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("xs, stride", [((2, 5, 6, 36), (2, 2)), ((3, 4, 56), (3,))],
                         ids=str)
def test_depthwise_dx_in_nc_where_dy_rows_are_no_whole_vectors(xs, stride, dtype):
    """A 36 -> 18 stride-2 depthwise layer: dx's rows are whole 4-float vectors, dy's are
    neither whole vectors nor one ``NC_ROW`` vector, so dx takes the NC* stages and dw the
    channel-last ones, in one kernel; every gradient equal to the float64 reference."""
    from dsl.api.aclnn import convolution_backward_kernel

    nd = len(stride)
    k, pads = (3,) * nd, ((1, 1),) * nd
    gs, ws = _nc_case(xs, k, pads, (1,) * nd, stride)
    args = (gs, dtype, xs, dtype, ws, dtype, [xs[1]], list(stride), [1] * nd, [1] * nd, False,
            [0] * nd, xs[1])
    p, _ = convolution_backward_kernel(*args, [T, T, T])
    assert p.nc_dx and not p.nc_dw and not p.nc_depthwise
    outs = op(go=gs, x=xs, w=ws, bias=(xs[1],), stride=stride, pad=(1,) * nd, dil=(1,) * nd,
              opad=(0,) * nd, groups=xs[1])
    assert {"nc_y_pad", "nc_dx_acc", "x_pack", "dw_acc"} <= _tags(outs)
    assert not _tags(outs) & {"nc_x_pad", "nc_dw_acc", "dx_acc"}
    _check_all_gradients(args, xs, stride, pads, (1,) * nd, dtype, 7, xs)


NC_LANE_CASES = [  # (x, kernel, padding, dilation, stride): dy rows of <= 16, no 4-vectors
    ((2, 5, 9, 14), (3, 3), ((1, 1), (1, 1)), (1, 1), (1, 1)),  # 14x14: 16 lanes, dx packed
    ((2, 3, 8, 28), (3, 3), ((1, 1), (1, 1)), (1, 1), (2, 2)),  # 28 -> 14: all NC*
    ((2, 4, 7, 7), (3, 3), ((1, 1), (1, 1)), (1, 1), (1, 1)),  # 7x7: 8 lanes
    ((3, 4, 10), (4,), ((2, 2),), (1,), (1,)),  # 1-D, even kernel: rows of 11
    ((2, 3, 5, 11), (3, 2), ((2, 0), (0, 1)), (1, 1), (1, 1)),  # asymmetric: rows of 11
    ((1, 3, 3, 4, 6), (3, 3, 3), ((1, 1),) * 3, (1, 1, 1), (1, 2, 2)),  # 3-D: rows of 3
    ((2, 3, 5, 15), (3, 3), ((2, 2), (2, 2)), (2, 2), (1, 1)),  # dilation 2: lanes read 19
    ((2, 3, 6, 31), (3, 3), ((1, 1), (1, 1)), (1, 2), (2, 3)),  # stride 3, dilation 2: 10
]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("c", NC_LANE_CASES, ids=range(len(NC_LANE_CASES)))
def test_depthwise_dw_sums_lanes_past_short_rows(c, dtype):
    """Exact depthwise whose dy rows are no whole 4-float vectors but fit one ``NC_ROW``
    vector: dw sums per-lane partials over the row padded to 4, 8 or 16 lanes and leaves
    the lanes past it out; dx takes the NC* stages where its own rows are whole vectors,
    the channel-last ones elsewhere. Every gradient equal to the float64 reference."""
    from dsl.api.aclnn import convolution_backward_kernel

    xs, k, pads, dil, stride = c
    nd = len(k)
    gs, ws = _nc_case(xs, k, pads, dil, stride)
    padding = ([a for a, _ in pads] if all(a == b for a, b in pads)
               else [v for pair in pads for v in pair])
    args = (gs, dtype, xs, dtype, ws, dtype, [xs[1]], list(stride), padding, list(dil), False,
            [0] * nd, xs[1])
    p, _ = convolution_backward_kernel(*args, [T, T, T])
    n_out = gs[-1]
    assert p.nc_dw and p.nc_dw_lanes == next(w for w in (4, 8, 16) if w >= n_out)
    assert p.nc_dx == (xs[-1] % 4 == 0)
    _check_all_gradients(args, xs, stride, pads, dil, dtype, 5, c)


def test_nc_depthwise_gate_and_schedule():
    """Only exact depthwise with whole 4-float dy rows and strides that share no factor with
    the dilation takes the NC* path; the schedule says what it did; the other depthwise
    layers keep the channel-last packs."""
    def stages(**kw):
        outs = op(**kw)
        kernel = dsl.auto_schedule([t for t in outs if t is not None])
        kernel.s_tir()
        return _tags(outs), {b: why for b, _, why in kernel.decisions}

    base = {"go": (2, 4, 8), "x": (2, 4, 8), "w": (4, 1, 3), "bias": (4,), "pad": (1,),
            "groups": 4}
    tags, notes = stages(**base)
    assert {"nc_y_pad", "nc_x_pad", "nc_dx_acc", "nc_dw_acc"} <= tags
    assert not tags & {"y_pack", "x_pack", "dx_acc", "dw_acc"}, tags
    assert notes["cb_nc_dx_acc"].startswith("NC* depthwise dx"), notes
    assert "in lanes (rfactor)" in notes["cb_nc_dw_acc"], notes
    for pad in ("cb_nc_y_pad", "cb_nc_x_pad"):  # made inside the consumer's tasks, in cache
        assert notes[pad].startswith("NC* pad, computed in each task"), notes
    tags, _ = stages(**{**base, "go": (2, 4, 4), "x": (2, 4, 7), "stride": (2,)})
    assert {"nc_y_pad", "nc_w_pad", "nc_x_pad", "nc_dx_acc", "nc_dw_acc"} <= tags
    # dy rows of 16, stride 2: dw's x stored by stride phase [N, C, 2, 16 + 1 -> pitch 32]
    from dsl.runtime.schedule import walk

    outs = op(**{**base, "go": (2, 4, 16), "x": (2, 4, 32), "stride": (2,)})
    _, computes = walk([t for t in outs if t is not None])
    xpad = next(c for c in computes if c.tag.endswith(".nc_x_pad"))
    assert [int(d) for d in xpad.output(0).shape] == [2, 4, 2, 32], xpad.output(0).shape
    assert [int(v) for v in xpad.attrs[tag.ROW_INTERIOR]] == [1, 16]
    # rows of 7 (dy) and 9 (x): dw sums 8 lanes in NC*, dx keeps the channel-last stages
    tags, notes = stages(**{**base, "go": (2, 4, 7), "pad": (0,), "x": (2, 4, 9)})
    assert {"nc_dy_rows", "nc_x_pad", "nc_dw_lanes", "nc_dw_acc", "y_pack", "dx_acc"} <= tags
    assert not tags & {"nc_y_pad", "nc_dx_acc", "x_pack", "dw_acc"}, tags
    assert "the row padded to 8 lanes" in notes["cb_nc_dw_lanes"], notes
    assert notes["cb_nc_dw_acc"] == "the row's real lanes summed, per weight", notes
    for other in ({"go": (2, 4, 4), "x": (2, 4, 9), "stride": (2,), "dil": (2,)},  # gcd 2
                  {"go": (2, 4, 17), "pad": (0,), "x": (2, 4, 19)},  # rows of 17 and 19
                  {"go": (2, 8, 8), "w": (8, 1, 3), "bias": (8,)},  # multiplier 2
                  {"transposed": T, "w": (4, 1, 3), "x": (2, 4, 8), "go": (2, 4, 8)}):
        tags, _ = stages(**{**base, **other})
        assert not tags & {"nc_y_pad", "nc_x_pad", "nc_dx_acc", "nc_dw_acc"}, (other, tags)


@pytest.mark.parametrize("name", ["x86-64", "x86-avx2", "x86-avx512"])
def test_nc_depthwise_on_every_vector_width(name):
    """The NC* rule reads lanes from the target: SSE, AVX2 and AVX-512 schedule rows of 12
    (whole 4-float vectors only) and hold as many of a short row's taps as their registers
    take; where the machine runs the target, those kernels and a 28 -> 14 stride-2 one agree
    with the reference."""
    from dsl import kernel_cache

    tgt = targets.get(name)
    xs, k, pads, dil = (2, 6, 5, 12), (3, 3), ((1, 1), (1, 1)), (1, 1)
    gs, ws = _nc_case(xs, k, pads, dil)
    params = ([6], [1, 1], [1, 1], [1, 1], False, [0, 0], 6, [T, T, T])

    def make():
        g, i, ww = ph(gs, "grad_output"), ph(xs, "input"), ph(ws, "weight")
        return [g, i, ww], list(dsl.convolution_backward(g, i, ww, *params))

    g, i, ww = ph(gs, "grad_output"), ph(xs, "input"), ph(ws, "weight")
    sch = dsl.auto_schedule(list(dsl.convolution_backward(g, i, ww, *params)), target=tgt)
    sch.s_tir()
    notes = {b: why for b, _, why in sch.decisions}
    # lanes in whole registers (4 of them on every width; 12 lanes were a 12-float vector
    # that LLVM split into pieces and spilled)
    assert re.match(r"NC\* depthwise dx: \d+ x \d+ x 4 outputs", notes["cb_nc_dx_acc"]), notes
    assert "4 output positions in lanes" in notes["cb_nc_dw_acc"], notes  # 12 = 3 x 4
    for pad in ("cb_nc_y_pad", "cb_nc_x_pad"):  # the rows' borders apart, no bounds test
        assert notes[pad].endswith("interior in whole vectors, the borders apart"), notes
    # rows of 14: 16 lanes, one AVX-512 register (all 9 taps' sums held), two AVX2 ones or
    # four SSE ones (one row of 3 taps held: all 9 spilled on AVX2, 1.8x slower)
    g14, i14, w14 = ph((2, 6, 14, 14), "grad_output"), ph((2, 6, 14, 14), "input"), ph(ws,
                                                                                    "weight")
    dw14 = dsl.convolution_backward(g14, i14, w14, *params[:-1], [F, T, F])[1]
    sch14 = dsl.auto_schedule([dw14], target=tgt)
    sch14.s_tir()
    held = 9 if tgt.lanes("float32") == 16 else 3
    assert f"16 lanes, {held} taps' partial sums in registers" in dict(
        (b, why) for b, _, why in sch14.decisions)["cb_nc_dw_lanes"]
    if not targets.runnable(tgt):
        return
    kernel = kernel_cache.get_kernel({"t": "cb_nc_target", "name": name}, make,
                                     prefix="t_cb_nc", target=tgt)
    rng = np.random.default_rng(2)
    dy, x, w = rand(rng, gs, "float32"), rand(rng, xs, "float32"), rand(rng, ws, "float32")
    ref = ref_cb(dy, x, w, [1, 1], list(pads), list(dil), False, [0, 0], 6)
    for o, r in zip(kernel(dy, x, w), ref):
        assert_close(o, r, "float32", name)
    # 28 -> 14 at stride 2 on this width: dw's 16 lanes over x stored by phase, dx's tile of
    # rows in NC*, both against the reference
    xs2, ws2 = (2, 6, 10, 28), (6, 1, 3, 3)
    gs2 = (2, 6, 5, 14)
    params2 = ([6], [2, 2], [1, 1], [1, 1], False, [0, 0], 6, [T, T, T])

    def make2():
        g2, i2, w2 = ph(gs2, "grad_output"), ph(xs2, "input"), ph(ws2, "weight")
        return [g2, i2, w2], list(dsl.convolution_backward(g2, i2, w2, *params2))

    kernel2 = kernel_cache.get_kernel({"t": "cb_nc_target_s2", "name": name}, make2,
                                      prefix="t_cb_nc_s2", target=tgt)
    dy, x, w = rand(rng, gs2, "float32"), rand(rng, xs2, "float32"), rand(rng, ws2, "float32")
    ref = ref_cb(dy, x, w, [2, 2], [(1, 1), (1, 1)], [1, 1], False, [0, 0], 6)
    for o, r in zip(kernel2(dy, x, w), ref):
        assert_close(o, r, "float32", f"{name} stride 2")
