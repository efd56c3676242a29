"""deconv_grad_filter (TE level) through built kernels, against float64 and PyTorch."""

import numpy as np
import pytest

import dsl
import targets
from dsl import kernel_cache
from dsl.ops.conv_geometry import ConvAxis
from dsl.ops.deconv_grad_filter import deconv_grad_filter

from helpers import HAVE_TORCH, assert_close, rand
from reference import deconv_grad_filter as ref_dw


def _two(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def D(b, ih, iw, ic, oh, ow, oc, k, s, p, d, g):
    two = _two
    return {"b": b, "in": (ih, iw, ic), "out": (oh, ow, oc), "k": two(k), "s": two(s),
            "p": two(p), "d": two(d), "g": g}


CASES = [
    D(16, 4, 4, 4, 4, 4, 4, 4, 1, 0, 1, 1),                  # the seed example: out = in
    D(2, 5, 6, 8, 10, 12, 6, 4, 2, 1, 1, 1),                 # k4 s2 p1 upsampling
    D(2, 4, 5, 6, 13, 11, 4, (3, 2), (3, 2), (2, 1), (2, 1), 2),  # g2, s3, dy past every tap
    D(2, 7, 7, 16, 13, 13, 16, 3, 2, 1, 1, 16),              # depthwise-like (vector along g)
    D(1, 6, 6, 8, 6, 6, 16, 3, 1, 1, 1, 8),                  # depthwise, multiplier 2
    D(1, 5, 5, 4, 12, 12, 8, 3, 2, 2, 2, 1),                 # gcd(stride, dilation) = 2
    D(1, 3, 4, 40, 6, 8, 24, 2, 2, 0, 1, 1),                 # ICg 40: vector width 20
    D(16, 16, 16, 4, 16, 16, 4, 2, 1, 0, 1, 1),              # long K: split into partials
    D(1, 3, 3, 6, 1, 2, 4, 3, (1, 2), (1, 0), 1, 2),         # out_h 1: one row of dy
    D(16, 16, 16, 16, 16, 16, 16, 2, 1, 0, 1, 16),           # depthwise, partial sums
    D(16, 16, 16, 2, 17, 16, 16, 2, 1, (0, 1), 1, 1),        # vector along oc, partial sums
]

# 6-row register tiles on AVX2 (16 lanes, 12 accumulators) over extents 6 does not divide:
# each group's last row tile is ragged and gets a loop nest of its own
RAGGED = [
    D(2, 5, 7, 32, 10, 14, 28, 4, 2, 1, 1, 2),               # g2: 14 oc per group, 6 + 6 + 2
    D(1, 6, 5, 16, 11, 9, 13, 3, 2, (1, 0), 1, 1),           # 13 oc (prime): 6 + 6 + 1
    D(3, 4, 7, 48, 8, 13, 44, 2, (2, 1), (0, 1), (1, 2), 1),  # 44 oc, dilated: 7 x 6 + 2
    D(2, 5, 6, 13, 9, 11, 16, 3, 2, 1, 1, 1),                # oc-vector, rows over 13 ic
]
AVX2 = "x86-avx2"  # where the tiles above are ragged; every x86-64 host runs it


def case_id(c):
    return "b{}_in{}_out{}_k{}_s{}_p{}_d{}_g{}".format(
        c["b"], "x".join(map(str, c["in"])), "x".join(map(str, c["out"])),
        *("".join(map(str, c[key])) for key in ("k", "s", "p", "d")), c["g"])


def kernel_for(c, dtype, target=None):
    def make():
        from tvm import te
        dy = te.placeholder((c["b"], *c["out"]), dtype, name="dy")
        x = te.placeholder((c["b"], *c["in"]), dtype, name="x")
        dw = deconv_grad_filter(dy, x, kernel=c["k"], stride=c["s"], pad=c["p"],
                                dilation=c["d"], group=c["g"])
        return [dy, x], [dw]

    return kernel_cache.get_kernel({"op": "t_deconv_dw", "case": c, "dtype": dtype}, make,
                                   prefix="t_deconv_dw", target=target)


def data(c, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return rand(rng, (c["b"], *c["out"]), dtype), rand(rng, (c["b"], *c["in"]), dtype)


def torch_dw(dy, x, c):
    """Weight gradient of torch's conv_transpose2d (full output, cropped to dy's window),
    permuted from torch's [in_c, OCg, kh, kw] to [g, OCg, kh, kw, ICg]."""
    import torch
    import torch.nn.functional as F

    g, (pu, pl) = c["g"], c["p"]
    in_c, (out_h, out_w, out_c) = c["in"][2], c["out"]
    w = torch.zeros((in_c, out_c // g, *c["k"]), dtype=torch.float64, requires_grad=True)
    xt = torch.tensor(np.asarray(x, np.float64)).permute(0, 3, 1, 2)
    y = F.conv_transpose2d(xt, w, stride=c["s"], dilation=c["d"], groups=g)
    y = F.pad(y, (0, max(0, pl + out_w - y.shape[3]), 0, max(0, pu + out_h - y.shape[2])))
    y = y[:, :, pu:pu + out_h, pl:pl + out_w]
    y.backward(torch.tensor(np.asarray(dy, np.float64)).permute(0, 3, 1, 2))
    gw = w.grad.numpy().reshape(g, in_c // g, out_c // g, *c["k"])
    return gw.transpose(0, 2, 3, 4, 1)


@pytest.mark.parametrize("c", CASES, ids=case_id)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_matches_reference(c, dtype):
    dy, x = data(c, dtype)
    out = kernel_for(c, dtype)(dy, x)
    assert out.dtype == np.dtype(dtype)
    ref = ref_dw(dy, x, c["k"], c["s"], c["p"], c["d"], c["g"])
    assert_close(out, ref, dtype, case_id(c))


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch not installed")
@pytest.mark.parametrize("c", CASES, ids=case_id)
def test_matches_torch(c):
    dy, x = data(c, "float32", seed=1)
    out = kernel_for(c, "float32")(dy, x)
    assert_close(out, torch_dw(dy, x, c), "float32", "torch " + case_id(c))


def test_reference_matches_torch_on_every_case():
    if not HAVE_TORCH:
        pytest.skip("PyTorch not installed")
    for c in CASES:  # the reference and torch agree on the definition (in float64)
        dy, x = data(c, "float32", seed=2)
        np.testing.assert_allclose(ref_dw(dy, x, c["k"], c["s"], c["p"], c["d"], c["g"]),
                                   torch_dw(dy, x, c), atol=1e-9)


@pytest.mark.parametrize("name", [n for n in targets.names() if n != "host"])
@pytest.mark.parametrize("c", [CASES[2], CASES[3], CASES[7]], ids=case_id)
def test_every_runnable_target(name, c):
    tgt = targets.get(name)
    if not targets.runnable(tgt):
        pytest.skip(f"this machine cannot run {name}")
    dy, x = data(c, "float32", seed=4)
    kernel = kernel_for(c, "float32", tgt)
    assert kernel.meta["schedule"]["rule"].endswith("schedule_deconv_grad_filter")
    ref = ref_dw(dy, x, c["k"], c["s"], c["p"], c["d"], c["g"])
    assert_close(kernel(dy, x), ref, "float32", f"{name} {case_id(c)}")


@pytest.mark.parametrize("c", RAGGED, ids=case_id)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_ragged_row_tile_matches_reference(c, dtype):
    dy, x = data(c, dtype, seed=5)
    out = kernel_for(c, dtype, targets.get(AVX2))(dy, x)
    ref = ref_dw(dy, x, c["k"], c["s"], c["p"], c["d"], c["g"])
    assert_close(out, ref, dtype, f"{AVX2} {case_id(c)}")


@pytest.mark.parametrize("cores", [1, 2])
def test_ragged_row_tile_is_said_and_its_panels_zero_filled(cores):
    from tvm import te

    c = RAGGED[0]
    dy = te.placeholder((c["b"], *c["out"]), "float32", name="dy")
    x = te.placeholder((c["b"], *c["in"]), "float32", name="x")
    dw = deconv_grad_filter(dy, x, kernel=c["k"], stride=c["s"], pad=c["p"], dilation=c["d"],
                            group=c["g"])
    kernel = dsl.auto_schedule([dw], targets.get(AVX2).with_cores(cores))
    kernel.s_tir()
    notes = {b: w for b, _, w in kernel.decisions}
    assert notes["dw_acc"] == ("ic-vector register tile of 6 oc x 1 kw rows, 1 K part(s), "
                               "the last oc tile in a loop nest of its own"), notes
    assert notes["dy_pad"] == ("pad into panels of 6 channels (the last of each group "
                               "zero-filled), 2 x 2 stride-phase planes"), notes
    assert notes["x_global"] == "x into panels of 16 channels", notes
    # TVM writes the panels' zero padding in a block of its own: scheduled and said too
    assert notes["buffer_dy_pad_padding"] == ("zeros of the last panels' padding: groups "
                                              "across cores"), notes


@pytest.mark.parametrize("c", [CASES[1], CASES[3], CASES[7], RAGGED[0]], ids=case_id)
def test_one_and_many_core_kernels_agree_bitwise(c):
    # blocking and the partial-sum split are chosen by shape, never by cores
    dy, x = data(c, "float32")
    host = targets.current()
    one = kernel_for(c, "float32", host.with_cores(1))(dy, x)
    for cores in (max(2, host.cores), 16):  # 16: the taps join the parallel blocks
        many = kernel_for(c, "float32", host.with_cores(cores))(dy, x)
        assert np.array_equal(one, many), cores


@pytest.mark.parametrize("c", [CASES[0], CASES[3], CASES[7]], ids=case_id)
def test_parallel_loops_only_for_several_cores(c):
    from tvm import te
    dy = te.placeholder((c["b"], *c["out"]), "float32", name="dy")
    x = te.placeholder((c["b"], *c["in"]), "float32", name="x")
    dw = deconv_grad_filter(dy, x, kernel=c["k"], stride=c["s"], pad=c["p"], dilation=c["d"],
                            group=c["g"])
    host = targets.current()
    scripts = {n: dsl.auto_schedule(dw, host.with_cores(n)).s_tir([dy, x, dw]).mod.script()
               for n in (1, 2)}
    assert "T.parallel" not in scripts[1]
    assert "T.parallel" in scripts[2]
    assert "T.vectorized" in scripts[1]


def test_dy_pad_cast_stage_is_fp32_for_fp16():
    from tvm import te
    dy = te.placeholder((1, 4, 4, 8), "float16", name="dy")
    x = te.placeholder((1, 4, 4, 8), "float16", name="x")
    dw = deconv_grad_filter(dy, x, kernel=3, pad=1)
    assert dw.dtype == "float16" and tuple(int(v) for v in dw.shape) == (1, 8, 3, 3, 8)
    acc = dw.op.input_tensors[0]
    assert acc.dtype == "float32" and acc.op.input_tensors[0].op.tag.endswith("dy_pad")


def test_cropped_axis():
    a = ConvAxis.cropped("H", 4, 4, 4, 1, 0, 1, in_param="param[5]")
    assert (a.tap_extent, a.pad_before, a.pad_after) == (7, 0, 3)
    assert a.x_padded_size == 7
    a = ConvAxis.cropped("H", 20, 3, 2, 2, 1, 1, in_param="out_h")  # dy taller than the taps
    assert a.tap_extent == 6 and a.pad_after == 0
    with pytest.raises(dsl.DslError) as e:  # every tap lands above row 0
        ConvAxis.cropped("H", 3, 2, 2, 1, 5, 1, in_param="param[5]")
    assert e.value.code == "E60025" and e.value.param == "param[5]"
    with pytest.raises(dsl.DslError):  # s = d = 2, pad 1: taps only on odd rows, dy has row 0
        ConvAxis.cropped("W", 1, 3, 3, 2, 1, 2, in_param="param[6]")
    assert ConvAxis.cropped("W", 2, 3, 3, 2, 1, 2, in_param="param[6]").n_in == 2


@pytest.mark.parametrize("kwargs, code, param", [
    ({"group": 3}, "E60002", "x.shape[3]"),
    ({"stride": 0}, "E60011", "stride[0]"),
    ({"dilation": (1, 0)}, "E60011", "dilation[1]"),
    ({"pad": (-1, 0)}, "E60011", "pad[0]"),
    ({"pad": (9, 0)}, "E60025", "dy.shape[1]"),
    ({"kernel": (2, 2, 2)}, "E60003", "kernel"),
    ({"group": True}, "E60005", "group"),
])
def test_errors(kwargs, code, param):
    from tvm import te
    dy = te.placeholder((2, 4, 4, 8), "float32", name="dy")
    x = te.placeholder((2, 4, 4, 8), "float32", name="x")
    args = {"kernel": 3, **kwargs}
    with pytest.raises(dsl.DslError) as e:
        deconv_grad_filter(dy, x, **args)
    assert e.value.code == code and e.value.param == param, e.value


def test_tensor_errors():
    from tvm import te
    x = te.placeholder((2, 4, 4, 8), "float32", name="x")
    with pytest.raises(dsl.DslError) as e:
        deconv_grad_filter(te.placeholder((3, 4, 4, 8), "float32", name="dy"), x, kernel=3)
    assert e.value.param == "dy.shape[0]"
    with pytest.raises(dsl.DslError) as e:
        deconv_grad_filter(te.placeholder((2, 4, 4, 8), "float16", name="dy"), x, kernel=3)
    assert e.value.code == "E65002"
    with pytest.raises(dsl.DslError) as e:
        deconv_grad_filter(te.placeholder((2, 4, 8), "float32", name="dy"), x, kernel=3)
    assert e.value.param == "dy.shape"
    with pytest.raises(dsl.DslError) as e:
        deconv_grad_filter(x, te.placeholder((2, 4, 4, 8), "int32", name="xi"), kernel=3)
    assert e.value.code == "E60006"


@pytest.mark.parametrize("c,why", [
    (CASES[1], "pad into panels of 6 channels, 2 x 2 stride-phase planes"),
    # stride 3 does not divide the padded height: no phase planes along it
    (CASES[2], "pad into panels of 2 channels, 1 x 2 stride-phase planes"),
    (CASES[3], "elementwise pad"),  # vector along g: dy is read as vectors, not broadcast
], ids=["k4s2", "g2s3", "depthwise"])
def test_dy_is_packed_into_panels_where_the_tile_broadcasts_it(c, why):
    """The register tile broadcasts dy channels: dy_pad is laid out as panels of the tile's
    rows, one plane per stride phase when the stride divides the padded extent."""
    from tvm import te

    dy = te.placeholder((c["b"], *c["out"]), "float32", name="dy")
    x = te.placeholder((c["b"], *c["in"]), "float32", name="x")
    dw = deconv_grad_filter(dy, x, kernel=c["k"], stride=c["s"], pad=c["p"], dilation=c["d"],
                            group=c["g"])
    kernel = dsl.auto_schedule([dw])
    kernel.s_tir()
    notes = {b: w for b, _, w in kernel.decisions}
    assert notes["dy_pad"] == why, notes


# Vectors along oc (16 ic and 32 oc per group fill AVX-512's lanes alike: the tie goes to oc):
# dy is read in place from its pad copy while a step uses a quarter or more of the
# stride_w * out_c floats it strides over, else from panels of the tile's 32 channels.
OC_VECTOR = [
    (D(2, 5, 6, 16, 10, 12, 32, 4, 2, 1, 1, 1), "elementwise pad"),  # uses 32 / 64
    (D(2, 5, 6, 64, 10, 12, 128, 4, 2, 1, 1, 4),                      # uses 32 / 256,
     "dy padded per K chunk, in cache (pad into panels of 32 channels, 2 x 2 stride-phase "
     "planes)"),                                                       # panels per chunk
    (D(1, 4, 5, 48, 9, 11, 96, 3, 2, (1, 0), 1, 3),                   # odd padded extents:
     "pad into panels of 32 channels, 1 x 1 stride-phase planes"),    # no phase planes
]


@pytest.mark.parametrize("c,why", OC_VECTOR, ids=lambda v: case_id(v) if isinstance(v, dict)
                         else "")
def test_oc_vector_reads_dy_in_place_or_from_panels(c, why):
    from tvm import te

    tgt = targets.get("x86-avx512")
    dy = te.placeholder((c["b"], *c["out"]), "float32", name="dy")
    x = te.placeholder((c["b"], *c["in"]), "float32", name="x")
    dw = deconv_grad_filter(dy, x, kernel=c["k"], stride=c["s"], pad=c["p"], dilation=c["d"],
                            group=c["g"])
    kernel = dsl.auto_schedule([dw], tgt)
    kernel.s_tir()
    notes = {b: w for b, _, w in kernel.decisions}
    assert notes["dw_acc"].startswith("oc-vector register tile of "), notes
    assert notes["dy_pad"] == why, notes
    assert "x_global" not in notes  # the broadcast operand is read in place
    if targets.runnable(tgt):
        dy_v, x_v = data(c, "float32", seed=6)
        out = kernel_for(c, "float32", tgt)(dy_v, x_v)
        assert_close(out, ref_dw(dy_v, x_v, c["k"], c["s"], c["p"], c["d"], c["g"]),
                     "float32", case_id(c))


@pytest.mark.parametrize("extents,cores,want", [
    ([1, 2, 4, 4], 1, 2),    # one core: no tap above the chunk loop
    ([1, 2, 4, 4], 2, 2),    # the dcgan bench layer on two cores: one oc block each
    ([1, 2, 4, 4], 4, 3),    # taps' rows join where the blocks are too few
    ([1, 2, 4, 4], 16, 4),   # and their columns (32 blocks for 16 cores)
    ([8, 1, 4, 4], 2, 2),    # groups alone share out
    ([1, 3, 4, 4], 2, 3),    # 3 blocks on 2 cores do not: 12 do
    ([1, 1, 1, 1], 4, 2),    # nothing to share: the fewest loops
])
def test_parallel_lead_takes_the_fewest_loops_that_share_out_evenly(extents, cores, want):
    from schedules.deconv_grad_filter import parallel_lead

    assert parallel_lead(extents, cores) == want


@pytest.mark.parametrize("cores", [1, 2, 16])
def test_row_tiles_run_innermost_under_the_chunk_and_tap_loops(cores):
    # each tap's vectors are read by every row tile in a row, from L1 (see _blocked)
    from tvm import te

    dy = te.placeholder((2, 16, 16, 32), "float32", name="dy")
    x = te.placeholder((2, 8, 8, 32), "float32", name="x")
    dw = deconv_grad_filter(dy, x, kernel=4, stride=2, pad=1)
    tgt = targets.get("x86-avx512").with_cores(cores)
    sch = dsl.auto_schedule(dw, tgt).s_tir([dy, x, dw])
    script = sch.mod.script()
    nests = [b for b in ("dw_acc_update_ic_00", "dw_acc_update_ic_01")
             if f'T.sblock("{b}")' in script]
    assert len(nests) == 2, "a 12-row tile over 32 ic: two full tiles and a ragged one"

    def loops(block):
        return [sch.get(lp).loop_var.name for lp in sch.get_loops(sch.get_sblock(block))]

    def at(names, loop):  # a loop's position, alone or fused into the parallel loop
        return next(i for i, n in enumerate(names)
                    if n == loop or (n.endswith("_fused") and loop in n))

    # dy padded per chunk where the taps stay inside the tasks (one oc block here: one
    # core): the chunk is then rows of one image
    outer, inner = ("ih_0", "ih_1") if cores == 1 else ("b_ih_fused_0", "b_ih_fused_1")
    for block in nests:  # the partition's parts sit in a block under the shared loops
        names = loops("dw_acc_update_ic_0_common") + loops(block)
        tiles = next(n for n in names if n.startswith("ic_0"))
        chunk, taps = at(names, outer), [at(names, t) for t in ("k_h", "k_w_0")]
        assert max(taps) < names.index(tiles) < at(names, inner) < at(names, "iw")
        assert chunk < names.index(tiles), names
        if cores == 1:  # nothing to share out: every tap under the chunk loop
            assert chunk < min(taps), names
    assert ("T.parallel" in script) == (cores > 1)


# the dcgan bench layer's shape, smaller: vectors along oc read dy in place, two oc blocks
# (tasks of two cores), four by four taps of stride 2 (tasks from four cores on)
DCGAN_SMALL = D(2, 6, 7, 32, 12, 14, 64, 4, 2, 1, 1, 1)


def _dcgan_small(cores: int):
    """(kernel, its s_tir schedule) of :data:`DCGAN_SMALL` for AVX-512 on ``cores``."""
    from tvm import te

    c = DCGAN_SMALL
    dy = te.placeholder((c["b"], *c["out"]), "float32", name="dy")
    x = te.placeholder((c["b"], *c["in"]), "float32", name="x")
    dw = deconv_grad_filter(dy, x, kernel=c["k"], stride=c["s"], pad=c["p"], group=c["g"])
    kernel = dsl.auto_schedule([dw], targets.get("x86-avx512").with_cores(cores))
    return kernel, kernel.s_tir([dy, x, dw])


@pytest.mark.parametrize("cores,in_chunk", [(1, True), (2, True), (4, False), (16, False)])
def test_dy_is_padded_per_chunk_where_the_taps_stay_inside_a_task(cores, in_chunk):
    c, tgt = DCGAN_SMALL, targets.get("x86-avx512").with_cores(cores)
    kernel, sch = _dcgan_small(cores)
    notes = {b: w for b, _, w in kernel.decisions}
    assert (notes["dy_pad"] == "dy padded per K chunk, in cache") == in_chunk, notes
    pad_loops = [sch.get(lp).loop_var.name for lp in sch.get_loops(sch.get_sblock("dy_pad"))]
    # under the task loop(s) (g, oc_0: fused when parallel) and the chunk loops (b, ih_0)
    chunk = pad_loops[:4] == ["g", "oc_0", "b", "ih_0"] or pad_loops[:3] == [
        "g_oc_0_fused", "b", "ih_0"]
    assert chunk == in_chunk, pad_loops
    if targets.runnable(tgt):
        dy_v, x_v = data(c, "float32", seed=7)
        out = kernel_for(c, "float32", tgt)(dy_v, x_v)
        assert_close(out, ref_dw(dy_v, x_v, c["k"], c["s"], c["p"], c["d"], c["g"]),
                     "float32", case_id(c))


# the grouped_g8 bench layer's shape, smaller: vectors along oc, dy in panels of a group's 32
# channels (a step uses 32 of the 256 floats it strides over), one task per group
GROUPED_SMALL = D(2, 6, 7, 128, 12, 14, 128, 4, 2, 1, 1, 4)


@pytest.mark.parametrize("cores,in_chunk", [(1, True), (2, True), (16, False)])
def test_dy_panels_are_padded_per_chunk_where_the_taps_stay_inside_a_task(cores, in_chunk):
    """Each chunk (one image's rows) lays out its panels of dy inside the task that reads
    them, instead of a pass over all of dy first; 16 cores make tasks of the taps, which
    would each lay out the same chunk, so the pass stays. Bits as on one core, values as
    the float64 reference."""
    from tvm import te

    c, tgt = GROUPED_SMALL, targets.get("x86-avx512").with_cores(cores)
    dy = te.placeholder((c["b"], *c["out"]), "float32", name="dy")
    x = te.placeholder((c["b"], *c["in"]), "float32", name="x")
    dw = deconv_grad_filter(dy, x, kernel=c["k"], stride=c["s"], pad=c["p"], group=c["g"])
    kernel = dsl.auto_schedule([dw], tgt)
    sch = kernel.s_tir([dy, x, dw])
    notes = {b: w for b, _, w in kernel.decisions}
    panels = "pad into panels of 32 channels, 2 x 2 stride-phase planes"
    assert notes["dy_pad"] == (f"dy padded per K chunk, in cache ({panels})" if in_chunk
                               else panels), notes
    pad_loops = [sch.get(lp).loop_var.name for lp in sch.get_loops(sch.get_sblock("dy_pad"))]
    assert (pad_loops[1:3] == ["b", "ih_0"] or pad_loops[2:4] == ["b", "ih_0"]) == in_chunk, \
        pad_loops
    _agrees_with_one_core(c, cores, seed=9)


@pytest.mark.parametrize("cores,tasks", [(16, 16), (8, 8), (4, 4)])
def test_taps_of_one_dy_phase_share_a_task(cores, tasks):
    # k4 s2: taps kw and kw + 2 read the same dy columns, one apart. 16 cores: 2 oc blocks x
    # 4 kh x 2 column phases, each task both taps of its phase (32 one-tap tasks before);
    # 8 cores: 2 x 4 kh tasks would halve below the cores, so the taps stay as they were;
    # 4 cores: 2 oc x 2 kh phases
    script = _dcgan_small(cores)[1].mod.script()
    assert f"in T.parallel({tasks}):" in script, script
    _agrees_with_one_core(DCGAN_SMALL, cores, seed=8)


def _agrees_with_one_core(c, cores: int, seed: int) -> None:
    """Where this machine runs them: the kernel for ``cores`` gives the 1-core kernel's bits,
    and the float64 reference's values."""
    host = targets.current()
    if not targets.runnable(host):
        return
    dy_v, x_v = data(c, "float32", seed=seed)
    one = kernel_for(c, "float32", host.with_cores(1))(dy_v, x_v)
    many = kernel_for(c, "float32", host.with_cores(cores))(dy_v, x_v)
    assert np.array_equal(one, many), cores
    assert_close(one, ref_dw(dy_v, x_v, c["k"], c["s"], c["p"], c["d"], c["g"]), "float32",
                 case_id(c))


@pytest.mark.parametrize("cores,tasks,lead", [
    (2, 2, 2),      # the two oc blocks share out
    (16, 16, 4),    # 32 (oc, kh, kw) blocks, two taps of one dy phase in each task
    (48, 128, 5),   # 32 blocks keep 0.67 of 48 cores busy: the row tiles join, whole
    (64, 128, 5),   # 32 blocks would keep half of 64 busy
])
def test_row_tiles_become_tasks_where_the_blocks_are_too_few(cores, tasks, lead):
    from schedules.deconv_grad_filter import plan, task_loops
    from schedules.toolbox import accumulator_registers

    c, tgt = DCGAN_SMALL, targets.get("x86-avx512").with_cores(cores)
    p = {"group": c["g"], "in_c": c["in"][2], "out_c": c["out"][2], "kernel_h": c["k"][0],
         "kernel_w": c["k"][1], "batch": c["b"], "in_h": c["in"][0], "in_w": c["in"][1]}
    regs = accumulator_registers(tgt)
    cfg = task_loops(plan(p, 16, regs), p, 16, regs, cores)
    assert cfg["lead"] == lead
    # 12 rows over 32 ic: ragged (12 + 12 + 8); as tasks, 4 whole tiles of 8
    assert (cfg["inner"]["ic"], cfg["ragged"]) == ((8, False) if lead == 5 else (12, True))
    kernel, sch = _dcgan_small(cores)
    assert f"in T.parallel({tasks}):" in sch.mod.script()
    notes = {b: w for b, _, w in kernel.decisions}
    assert ("ic tiles tasks of their own" in notes["dw_acc"]) == (lead == 5), notes
    _agrees_with_one_core(c, cores, seed=9)  # the tasks regroup outputs, not any sum


@pytest.mark.parametrize("cores,tasks", [(8, 24), (16, 48)])
def test_taps_share_a_task_only_where_no_core_share_is_lost(cores, tasks):
    # 96 oc: 3 blocks x 4 kh x 4 kw = 48 tasks. 8 cores: 24 tasks of one phase's two taps
    # share out as well; 16 cores: 24 would keep 0.75 of them busy, so 48 one-tap tasks
    from tvm import te

    dy = te.placeholder((2, 12, 14, 96), "float32", name="dy")
    x = te.placeholder((2, 6, 7, 32), "float32", name="x")
    dw = deconv_grad_filter(dy, x, kernel=4, stride=2, pad=1)
    tgt = targets.get("x86-avx512").with_cores(cores)
    script = dsl.auto_schedule([dw], tgt).s_tir([dy, x, dw]).mod.script()
    assert f"in T.parallel({tasks}):" in script


# rows of dy 16 or more positions long (in_w): 4 reduction steps per loop iteration; 7: one
@pytest.mark.parametrize("c,unrolled", [(D(2, 5, 16, 32, 10, 32, 64, 4, 2, 1, 1, 1), True),
                                        (DCGAN_SMALL, False)], ids=["w16", "w7"])
def test_long_rows_step_four_reductions_per_iteration(c, unrolled):
    from tvm import te

    tgt = targets.get("x86-avx512").with_cores(2)
    dy = te.placeholder((c["b"], *c["out"]), "float32", name="dy")
    x = te.placeholder((c["b"], *c["in"]), "float32", name="x")
    dw = deconv_grad_filter(dy, x, kernel=c["k"], stride=c["s"], pad=c["p"], group=c["g"])
    kernel = dsl.auto_schedule([dw], tgt)
    script = kernel.s_tir([dy, x, dw]).mod.script()  # applies the rule, records its notes
    notes = {b: w for b, _, w in kernel.decisions}
    assert ("4 reduction steps per iteration" in notes["dw_acc"]) == unrolled, notes
    assert ("iw_1 in T.unroll(4)" in script) == unrolled
    if targets.runnable(tgt):
        dy_v, x_v = data(c, "float32", seed=9)
        out = kernel_for(c, "float32", tgt)(dy_v, x_v)
        assert_close(out, ref_dw(dy_v, x_v, c["k"], c["s"], c["p"], c["d"], c["g"]),
                     "float32", case_id(c))
