"""Pattern rules for reductions: softmax, layer-norm and RMS-norm as row groups (rows across
cores, reductions at the row, rfactor-vectorised), reductions over the innermost and over
outer axes on their own; odd/prime sizes, fp32 and fp16, 2-D to 5-D, with and without a
fused consumer, against numpy float64."""

import numpy as np
import pytest
from pattern_helpers import build_run, check, norm_graph, norm_reference, rand, softmax_graph
from tvm import te

ROWS = [(7, 131), (3, 5, 256), (2, 3, 5, 97), (2, 1, 3, 4, 64), (1, 13)]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", ROWS, ids=str)
def test_softmax_row_group(shape, dtype):
    rng = np.random.default_rng(1)
    x = te.placeholder(shape, name="x", dtype=dtype)
    xn = rand(shape, dtype, rng, -4, 4)
    (out,), why = build_run([softmax_graph(x, shape, dtype)], [x], [xn])
    x64 = xn.astype(np.float64)
    ref = np.exp(x64 - x64.max(-1, keepdims=True))
    check(out, ref / ref.sum(-1, keepdims=True), dtype, "softmax")
    for stage in ("mx", "s", "y"):
        assert why.rule_of(stage) == "patterns.row_reduction", str(why)
    assert why.rule_of("e") == "patterns.row_reduction"  # exp computed once per row


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", ROWS[:4], ids=str)
def test_normalisations(shape, dtype, rms):
    rng = np.random.default_rng(2)
    x = te.placeholder(shape, name="x", dtype=dtype)
    gamma, y = norm_graph(x, shape, dtype, rms)
    xn, gn = rand(shape, dtype, rng, -2, 2), rand(shape[-1:], dtype, rng)
    (out,), why = build_run([y], [x, gamma], [xn, gn])
    ref = norm_reference(xn, gn, rms)
    check(out, ref, dtype, "norm")
    assert why.rule_of("y") == "patterns.row_reduction", str(why)
    assert why.rule_of("ss" if rms else "var") == "patterns.row_reduction"
    assert why.fell_to_generic() == []


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(11, 257), (3, 4, 96), (2, 3, 2, 5, 33), (4099,)], ids=str)
def test_inner_sum_alone(shape, dtype):
    rng = np.random.default_rng(4)
    x = te.placeholder(shape, name="x", dtype=dtype)
    k = te.reduce_axis((0, shape[-1]), name="k")
    r = te.compute(shape[:-1], lambda *i: te.sum(x(*i, k), axis=k), name="r")
    xn = rand(shape, dtype, rng)
    (out,), why = build_run([r], [x], [xn])
    check(out, xn.astype(np.float64).sum(-1), dtype, "sum")
    assert why.rule_of("r") == "patterns.inner_reduction", str(why)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(67, 13), (5, 3, 131), (3, 7, 2, 41), (2, 2, 3, 2, 19)],
                         ids=str)
def test_outer_max_alone_with_consumer(shape, dtype):
    """max over axis 0 (an outer axis), then a fused elementwise consumer."""
    rng = np.random.default_rng(6)
    x = te.placeholder(shape, name="x", dtype=dtype)
    k = te.reduce_axis((0, shape[0]), name="k")
    r = te.compute(shape[1:], lambda *i: te.max(x(k, *i), axis=k), name="r")
    y = te.compute(shape[1:], lambda *i: r(*i) * te.const(2, dtype), name="y")
    xn = rand(shape, dtype, rng)
    (out,), why = build_run([y], [x], [xn])
    check(out, xn.astype(np.float64).max(0) * 2, dtype, "max0")
    assert why.rule_of("r") == "patterns.outer_reduction", str(why)
    assert why.rule_of("y") == "patterns.injective"


def test_reduction_that_is_also_an_output():
    """Two outputs: the row sums and the centred rows; each scheduled, both exact."""
    shape = (9, 67)
    x = te.placeholder(shape, name="x")
    k = te.reduce_axis((0, shape[1]), name="k")
    s = te.compute(shape[:1], lambda i: te.sum(x[i, k], axis=k), name="s")
    y = te.compute(shape, lambda i, j: x[i, j] - s[i] / shape[1], name="y")
    xn = rand(shape, "float32", np.random.default_rng(8))
    (oy, osum), why = build_run([y, s], [x], [xn])
    x64 = xn.astype(np.float64)
    check(oy, x64 - x64.mean(1, keepdims=True), "float32", "centred")
    check(osum, x64.sum(1), "float32", "sums")
    assert why.rule_of("s") == "patterns.inner_reduction"
    assert why.rule_of("y") == "patterns.injective"


@pytest.mark.parametrize("n", [1031, 4096])
def test_global_sum(n):
    z = te.placeholder((n,), name="z")
    k = te.reduce_axis((0, n), name="k")
    t = te.compute((1,), lambda i: te.sum(z[k], axis=k), name="t")
    zn = rand((n,), "float32", np.random.default_rng(n))
    (out,), why = build_run([t], [z], [zn])
    check(out, np.array([zn.astype(np.float64).sum()]), "float32", "sum")
    assert why.rule_of("t") == "patterns.inner_reduction"


@pytest.mark.parametrize(("shape", "whole"), [((3, 5, 8, 56), True), ((2, 4, 6, 9), False),
                                              ((2, 3, 5, 32), True)], ids=str)
def test_channel_sums_over_an_image(shape, whole):
    """A batch-norm gradient's per-channel sum ``sum_{b, i, j} dy * x`` over NCHW: the image's
    rows (56 columns: no whole number of vectors alone) fused into one contiguous reduction
    loop and vectorised where the image is (8 x 56, 5 x 32); a 6 x 9 image is not, and stays
    serial. Against numpy float64."""
    n, c, h, w = shape
    rng = np.random.default_rng(23)
    x = te.placeholder(shape, name="x")
    dy = te.placeholder(shape, name="dy")
    b, i, j = (te.reduce_axis((0, e), name=nm) for e, nm in ((n, "b"), (h, "i"), (w, "j")))
    y = te.compute((c,), lambda ci: te.sum(dy[b, ci, i, j] * x[b, ci, i, j], axis=[b, i, j]),
                   name="dgamma")
    xn, dyn = rand(shape, "float32", rng), rand(shape, "float32", rng)
    (out,), why = build_run([y], [x, dy], [xn, dyn])
    ref = (dyn.astype(np.float64) * xn).sum(axis=(0, 2, 3))
    check(out, ref, "float32")
    note = {s: w for s, _, w in why.stages}["dgamma"]
    assert ("rfactor-vectorised" in note) == whole, note



@pytest.mark.parametrize(("shape", "cores", "parts"), [
    ((8, 20, 8, 32), 48, 2),     # 20 channel rows for 48 cores: 2 parts of the batch, 1 round
    ((6, 40, 8, 48), 16, 2),     # 40 rows on 16 cores: 3 rounds for 2.5; 80 rows 5 for 5
    ((8, 13, 16, 32), 48, 8),    # 13 rows: 8 parts, 104 tasks in 3 rounds of 1/104 each
    ((8, 64, 8, 32), 16, None),  # 64 rows share out over 16 cores
    ((1, 20, 32, 32), 48, None),  # one image: its rows are the contiguous run, left whole
], ids=str)
def test_channel_sums_partial_sums_for_many_cores(shape, cores, parts):
    """An NCHW per-channel sum whose channel rows leave cores idle splits its batch into
    partial sums, each part's rows tasks, added after; the image's rows stay one vectorised
    run. Built for the cores asked, run here. Against numpy float64."""
    import targets

    n, c, h, w = shape
    rng = np.random.default_rng(31)
    x, dy = te.placeholder(shape, name="x"), te.placeholder(shape, name="dy")
    b, i, j = (te.reduce_axis((0, e), name=nm) for e, nm in ((n, "b"), (h, "i"), (w, "j")))
    y = te.compute((c,), lambda ci: te.sum(dy[b, ci, i, j] * x[b, ci, i, j], axis=[b, i, j]),
                   name="dgamma")
    xn, dyn = rand(shape, "float32", rng), rand(shape, "float32", rng)
    (out,), why = build_run([y], [x, dy], [xn, dyn], target=targets.current().with_cores(cores))
    check(out, (dyn.astype(np.float64) * xn).sum(axis=(0, 2, 3)), "float32")
    note = {s: w for s, _, w in why.stages}["dgamma"]
    assert "rfactor-vectorised" in note, note
    assert ("partial sums" in note) == (parts is not None), note
    if parts is not None:
        assert f"{parts} partial sums over v_b" in note, note


def test_partial_sum_time():
    """A layer-norm gamma gradient (8192 x 1024, 32 tiles) on 48 cores: 64 parts fill the
    rounds but leave 64 x 1024 partials to add on one core; fewer parts are faster."""
    from schedules.patterns.reduction import partial_sum_time

    work, out = 8192 * 1024, 1024
    times = {p: partial_sum_time(work, out, 32, p, 48) for p in (1, 2, 4, 16, 64)}
    assert times[1] == work / 32  # 32 tasks, one round
    assert times[2] == times[1] + 2 * out  # 64 tasks still take 2 rounds of half the size
    assert times[16] < times[4] < times[1] and times[64] > times[16]


@pytest.mark.parametrize(("shape", "whole"), [((3, 5, 8, 56), True), ((2, 4, 6, 9), False)],
                         ids=str)
def test_channel_sums_with_a_per_channel_scalar(shape, whole):
    """A batch-norm backward's ``sum_{b, i, j} dy * (x - mu[c])``: the per-channel ``mu``,
    which no reduction iterator indexes, does not stop the image's rows from fusing into one
    vectorised run (it did: the sum stayed serial, a third of the whole backward). Against
    numpy float64."""
    n, c, h, w = shape
    rng = np.random.default_rng(29)
    x, dy = te.placeholder(shape, name="x"), te.placeholder(shape, name="dy")
    mu = te.placeholder((c,), name="mu")
    b, i, j = (te.reduce_axis((0, e), name=nm) for e, nm in ((n, "b"), (h, "i"), (w, "j")))
    y = te.compute((c,), lambda ci: te.sum(dy[b, ci, i, j] * (x[b, ci, i, j] - mu[ci]),
                                           axis=[b, i, j]), name="s2")
    xn, dyn, mun = (rand(s, "float32", rng) for s in (shape, shape, (c,)))
    (out,), why = build_run([y], [x, dy, mu], [xn, dyn, mun])
    ref = (dyn.astype(np.float64) * (xn - mun[None, :, None, None].astype(np.float64))).sum(
        axis=(0, 2, 3))
    check(out, ref, "float32")
    note = {s: w for s, _, w in why.stages}["s2"]
    assert ("rfactor-vectorised" in note) == whole, note

@pytest.mark.parametrize("group", [False, True], ids=["alone", "row_group"])
def test_partials_folded_to_one_vector(group):
    """A row of 1024 summed in several vectors of partials: the partials are added vector by
    vector into one vector before its lanes are summed (a chain of ``lanes`` scalar adds a
    row, not four times that), for a sum alone and for a softmax's; both against numpy."""
    import dsl
    import targets

    rng = np.random.default_rng(31)
    lanes = targets.current().lanes("float32")
    x = te.placeholder((6, 1024), name="x")
    k = te.reduce_axis((0, 1024), name="k")
    if group:
        y = softmax_graph(x, (6, 1024), "float32")
    else:
        y = te.compute((6,), lambda i: te.sum(x[i, k], axis=k), name="y")
    xn = rand((6, 1024), "float32", rng)
    (out,), _ = build_run([y], [x], [xn])
    if group:
        e = np.exp(xn - xn.max(-1, keepdims=True).astype(np.float64))
        check(out, e / e.sum(-1, keepdims=True), "float32")
    else:
        check(out, xn.astype(np.float64).sum(-1), "float32")
    func = dsl.auto_schedule([y]).s_tir([x, y]).mod["main"]
    partials = [b for b in _allocated(func) if len(b.shape) == 2 and int(b.shape[0]) == 6]
    assert sorted(int(b.shape[1]) for b in partials)[:1] == [lanes], [b.shape for b in partials]


def _allocated(func) -> list:
    import tvm
    import tvm_ffi

    blocks: list = []
    tvm_ffi.structural_walk(func.body, (tvm.s_tir.SBlock, blocks.append), order="post")
    return [buf for b in blocks for buf in b.alloc_buffers]


def _tap_sums_graph(n, c, size, ks, pads, dtype, nhwc=False, stride=1):
    """A depthwise weight gradient as users write it: ``dw[c, 0, ry, rx] = sum_{b, i, j}
    dy[b, c, i, j] * xpad[b, c, i + ry, j + rx]`` (NCHW, or NHWC with the channels last and
    the taps ``[ry, rx, c]``)."""
    (h, w), ((pt, pb), (pl, pr)) = size, pads
    ho, wo = (h + pt + pb - ks) // stride + 1, (w + pl + pr - ks) // stride + 1
    st = stride
    shape, dshape = ((n, h, w, c), (n, ho, wo, c)) if nhwc else ((n, c, h, w), (n, c, ho, wo))
    x = te.placeholder(shape, name="x", dtype=dtype)
    dy = te.placeholder(dshape, name="dy", dtype=dtype)
    inside = lambda i, j: te.all(i >= pt, i < h + pt, j >= pl, j < w + pl)  # noqa: E731
    zero = te.const(0, dtype)
    if nhwc:
        xp = te.compute((n, h + pt + pb, w + pl + pr, c), lambda b, i, j, ci: te.if_then_else(
            inside(i, j), x[b, i - pt, j - pl, ci], zero), name="pad")
    else:
        xp = te.compute((n, c, h + pt + pb, w + pl + pr), lambda b, ci, i, j: te.if_then_else(
            inside(i, j), x[b, ci, i - pt, j - pl], zero), name="pad")
    b, i, j = (te.reduce_axis((0, e), name=nm) for e, nm in ((n, "b"), (ho, "i"), (wo, "j")))
    if nhwc:
        dw = te.compute((ks, ks, c), lambda ry, rx, ci: te.sum(
            dy[b, i, j, ci] * xp[b, i + ry, j + rx, ci], axis=[b, i, j]), name="dw")
    else:
        src = xp if pads != ((0, 0), (0, 0)) else x  # no padding: the kernel input itself
        dw = te.compute((c, 1, ks, ks), lambda ci, z, ry, rx: te.sum(
            dy[b, ci, i, j] * src[b, ci, i * st + ry, j * st + rx], axis=[b, i, j]), name="dw")
    return x, dy, dw


def _ref_tap_sums(xn, dyn, ks, pads, s=1):
    """NCHW depthwise weight gradient from the definition (float64)."""
    xp = np.pad(xn.astype(np.float64), ((0, 0), (0, 0), *pads))
    ho, wo = dyn.shape[2:]
    return np.stack([np.stack([(dyn * xp[:, :, r:r + s * (ho - 1) + 1:s,
                                         t:t + s * (wo - 1) + 1:s]).sum(axis=(0, 2, 3))
                               for t in range(ks)], -1) for r in range(ks)], -2)[:, None]


@pytest.mark.parametrize(("n", "c", "size", "ks", "pads", "dtype"), [
    (2, 5, (12, 16), 3, ((1, 1), (1, 1)), "float32"),
    (3, 3, (7, 24), 5, ((2, 2), (2, 2)), "float32"),
    (1, 7, (9, 8), 3, ((0, 2), (1, 1)), "float32"),   # asymmetric padding
    (2, 4, (6, 32), 3, ((1, 1), (1, 1)), "float16"),
], ids=str)
def test_tap_sums(n, c, size, ks, pads, dtype):
    """A depthwise weight gradient takes the tap-sums rule (each tap's vector of partial sums
    in registers across the whole reduction) where its output rows are a whole number of
    half vectors; against numpy float64."""
    rng = np.random.default_rng(41)
    x, dy, dw = _tap_sums_graph(n, c, size, ks, pads, dtype)
    xn = rand([int(v) for v in x.shape], dtype, rng)
    dyn = rand([int(v) for v in dy.shape], dtype, rng)
    (out,), why = build_run([dw], [x, dy], [xn, dyn])
    check(out, _ref_tap_sums(xn, dyn, ks, pads), dtype)
    assert {s: r for s, r, _ in why.stages}["dw"] == "patterns.tap_sums", why.stages


@pytest.mark.parametrize(("n", "c", "size", "ks", "pads", "stride"), [
    (2, 5, (17, 33), 3, ((1, 1), (1, 0)), 2),   # 16 columns of a stride-2 dw
    (3, 3, (13, 26), 3, ((0, 0), (0, 0)), 2),   # 12 columns (xmm), the input unpadded
    (2, 4, (14, 25), 2, ((1, 1), (0, 2)), 3),   # stride 3, 9 columns: none divide
], ids=str)
def test_tap_sums_strided(n, c, size, ks, pads, stride):
    """A strided depthwise weight gradient (``x[.., i * s + ry, j * s + rx]``): the strided
    operand re-laid by phase so the lanes read whole vectors (a padding stage in place, a
    kernel input through a copy); rows that no vector of 4 or more lanes divides keep the
    other rules. Against numpy float64."""
    rng = np.random.default_rng(44)
    x, dy, dw = _tap_sums_graph(n, c, size, ks, pads, "float32", stride=stride)
    xn = rand([int(v) for v in x.shape], "float32", rng)
    dyn = rand([int(v) for v in dy.shape], "float32", rng)
    (out,), why = build_run([dw], [x, dy], [xn, dyn])
    check(out, _ref_tap_sums(xn, dyn, ks, pads, stride), "float32")
    whole = int(dy.shape[-1]) % 4 == 0
    assert ({s: r for s, r, _ in why.stages}["dw"] == "patterns.tap_sums") == whole, why.stages


@pytest.mark.parametrize(("n", "c", "size", "pads"), [
    (4, 32, (8, 16), ((1, 1), (1, 1))),
    (6, 16, (9, 7), ((0, 2), (1, 1))),   # odd sizes, asymmetric padding
], ids=str)
def test_tap_sums_channels_last(n, c, size, pads):
    """An NHWC depthwise weight gradient (taps ``[ry, rx, c]``): the channels in the lanes,
    every tap's vectors in registers across the whole reduction; against numpy float64."""
    rng = np.random.default_rng(43)
    x, dy, dw = _tap_sums_graph(n, c, size, 3, pads, "float32", nhwc=True)
    xn = rand([int(v) for v in x.shape], "float32", rng)
    dyn = rand([int(v) for v in dy.shape], "float32", rng)
    (out,), why = build_run([dw], [x, dy], [xn, dyn])
    ref = _ref_tap_sums(xn.transpose(0, 3, 1, 2), dyn.transpose(0, 3, 1, 2), 3,
                        pads)[:, 0].transpose(1, 2, 0)
    check(out, ref, "float32")
    assert {s: r for s, r, _ in why.stages}["dw"] == "patterns.tap_sums", why.stages



@pytest.mark.parametrize(("n", "size", "cores", "over"), [
    (8, (7, 9), 16, "v_b"),     # 2 blocks of 16 channels, 8 partial sums over the batch
    (1, (24, 24), 16, "v_i"),   # one image: over its rows
    (3, (20, 12), 8, "v_i"),    # a batch of 3 has no 4 parts: the rows
    (8, (7, 9), 2, None),       # 2 blocks for 2 cores: no partial sums
], ids=str)
def test_tap_sums_channels_last_partial_sums_for_many_cores(n, size, cores, over):
    """An NHWC depthwise weight gradient with fewer channel blocks than cores (32 channels,
    16 cores) splits its batch, or an image's rows, into partial sums, each a task, added
    after; where the blocks are enough, none. The schedule for 16 cores runs on this machine
    too. Against numpy float64."""
    import targets

    rng = np.random.default_rng(47)
    pads = ((1, 1), (1, 1))
    x, dy, dw = _tap_sums_graph(n, 32, size, 3, pads, "float32", nhwc=True)
    xn = rand([int(v) for v in x.shape], "float32", rng)
    dyn = rand([int(v) for v in dy.shape], "float32", rng)
    tgt = targets.current().with_cores(cores)
    (out,), why = build_run([dw], [x, dy], [xn, dyn], target=tgt)
    ref = _ref_tap_sums(xn.transpose(0, 3, 1, 2), dyn.transpose(0, 3, 1, 2), 3,
                        pads)[:, 0].transpose(1, 2, 0)
    check(out, ref, "float32")
    rule, note = next((r, w) for st, r, w in why.stages if st == "dw")
    assert rule == "patterns.tap_sums", why.stages
    assert ("partial sums" in note) == (over is not None), note
    if over is not None and tgt.lanes("float32") == 16:  # the blocks counted for 16 lanes
        assert f"partial sums over {over}" in note, note

@pytest.mark.parametrize(("n", "cores", "parts"), [(8, 48, 2), (8, 16, 2), (8, 8, None)],
                         ids=str)
def test_tap_sums_partial_sums_for_many_cores(n, cores, parts):
    """An NCHW depthwise weight gradient of 24 channels (24 row tasks) on 48 cores splits
    its batch in two (48 tasks, one round); on 16 cores too (2 rounds for 1.5 of work, then
    3 for 3); 8 cores take the 24 rows in 3 full rounds. Against numpy float64."""
    import targets

    rng = np.random.default_rng(59)
    pads = ((1, 1), (1, 1))
    x, dy, dw = _tap_sums_graph(n, 24, (12, 16), 3, pads, "float32")
    xn = rand([int(v) for v in x.shape], "float32", rng)
    dyn = rand([int(v) for v in dy.shape], "float32", rng)
    (out,), why = build_run([dw], [x, dy], [xn, dyn],
                            target=targets.current().with_cores(cores))
    check(out, _ref_tap_sums(xn, dyn, 3, pads), "float32")
    rule, note = next((r, w) for st, r, w in why.stages if st == "dw")
    assert rule == "patterns.tap_sums", why.stages
    assert ("partial sums over" in note) == (parts is not None), note
    if parts is not None:
        assert f"{parts} partial sums over" in note, note


@pytest.mark.parametrize(("shape", "dtype", "cores", "over"), [
    ((8, 12, 11, 32), "float32", 16, "v_k1"),  # a bias gradient: 12 parts of its rows
    ((1, 40, 28, 32), "float32", 16, "v_k1"),  # one image: its rows
    ((3, 20, 12, 48), "float16", 16, "v_k1"),  # 48 channels; a batch of 3: the rows
    ((640, 64), "float32", 16, "v_k0"),        # a layer norm's dgamma-like column sum
    ((8, 12, 11, 32), "float32", 2, "v_k0"),   # 128-byte rows are one piece: 2 parts
    ((8, 12, 11, 512), "float32", 2, None),    # 2 pieces of 1 KiB for 2 cores: no parts
    ((4, 7, 9, 32), "float32", 16, None),      # 8064 elements: one core, no partial sums
], ids=str)
def test_outer_reduction_partial_sums_for_many_cores(shape, dtype, cores, over):
    """A sum over every axis but the last (a bias gradient over NHWC, a column sum) streams
    its rows into the output row, shared out among cores in pieces of at least
    :data:`STREAM_RUN_BYTES`; with fewer pieces than cores it splits a reduction axis
    (the first, else the next) into partial sums, each a task, added after; with pieces
    enough, or too small a sum for more than one core, none. Built for 16 cores, it runs
    here too. Against numpy float64."""
    import targets

    rng = np.random.default_rng(53)
    dy = te.placeholder(shape, name="dy", dtype=dtype)
    red = [te.reduce_axis((0, e), name=f"k{i}") for i, e in enumerate(shape[:-1])]
    db = te.compute((shape[-1],), lambda c: te.sum(
        dy[(*red, c)].astype("float32"), axis=red), name="db")
    dyn = rand(shape, dtype, rng)
    tgt = targets.current().with_cores(cores)
    (out,), why = build_run([db], [dy], [dyn], target=tgt)
    check(out, dyn.astype(np.float64).sum(axis=tuple(range(len(shape) - 1))), "float32")
    rule, note = next((r, w) for st, r, w in why.stages if st == "db")
    assert rule == "patterns.outer_reduction", why.stages
    assert ("partial sums" in note) == (over is not None), note
    if over is not None and tgt.lanes("float32") == 16:
        assert f"partial sums over {over}" in note, note


@pytest.mark.parametrize(("shape", "dtype", "cores", "pieces"), [
    ((37, 96), "float32", 1, 1),           # a column sum, prime rows
    ((3, 5, 7, 48), "float16", 1, 1),      # an NHWC bias gradient: rows n, h, w
    ((6, 4, 5, 32), "float32", 1, 1),      # a row of 4 x 5 x 32
    ((64, 1024), "float32", 2, 2),         # 4 KiB rows: two pieces of 2 KiB
], ids=str)
def test_outer_reduction_streams_rows_into_the_output_row(shape, dtype, cores, pieces):
    """A sum over the leading axes of an input read ``[reduction.., spatial..]`` adds the
    input to the output row :data:`STREAM_ROWS` rows a pass, the input read in its memory
    order (a tile of the output in registers read a short run of each row in turn, a row
    apart: a 4096 x 4096 transposed matrix-vector product 2.3x slower on one Zen 4 core).
    Against numpy float64."""
    import targets

    rng = np.random.default_rng(59)
    dy = te.placeholder(shape, name="dy", dtype=dtype)
    red = [te.reduce_axis((0, shape[0]), name="k")]
    db = te.compute(shape[1:], lambda *c: te.sum(dy[(*red, *c)].astype("float32"), axis=red),
                    name="db")
    dyn = rand(shape, dtype, rng)
    (out,), why = build_run([db], [dy], [dyn], target=targets.current().with_cores(cores))
    check(out, dyn.astype(np.float64).sum(axis=0), "float32")
    note = dict((st, w) for st, _, w in why.stages)["db"]
    assert "streamed 4 rows a pass" in note, note
    assert (f"{pieces} pieces of it across cores" in note) == (pieces > 1), note


@pytest.mark.parametrize("cores", [1, 2])
@pytest.mark.parametrize(("shape", "parts"), [((3, 37, 80), False), ((2, 5, 19, 48), False),
                                              ((1, 2048, 128), True)], ids=str)
def test_sum_over_a_middle_axis_streams_each_leading_step(shape, parts, cores):
    """``y[b, j] = sum_r x[b, r, j]`` (a mean over a sequence; a 4-D ``[b, c, r, j]``): each
    step of the leading axes is a streamed reduction of its own, the steps tasks; one step
    on 2 cores splits its 2048 rows into partial sums. Against float64."""
    import targets

    x = te.placeholder(shape, name="x")
    r = te.reduce_axis((0, shape[-2]), name="r")
    y = te.compute((*shape[:-2], shape[-1]), lambda *i: te.sum(x[(*i[:-1], r, i[-1])],
                                                                axis=r), name="y")
    xn = rand(shape, "float32", np.random.default_rng(62))
    (out,), why = build_run([y], [x], [xn], target=targets.current().with_cores(cores))
    check(out, xn.astype(np.float64).sum(axis=-2), "float32")
    note = dict((st, w) for st, _, w in why.stages)["y"]
    assert "streamed 4 rows a pass" in note, note
    assert ("partial sums" in note or "in parts" in note) == (parts and cores > 1), note


@pytest.mark.parametrize(("cols", "streamed"), [(80, True), (67, False)])
def test_transposed_matrix_vector_product_streams_its_matrix(cols, streamed):
    """``y[i] = sum_r a[r, i] * x[r]`` (prime rows, 2 cores): the matrix streamed a row at a
    time, ``x[r]`` one broadcast a row; a row that is no whole number of vectors (67) keeps
    the register tile. Against float64."""
    import targets

    rng = np.random.default_rng(61)
    rows = 53
    a = te.placeholder((rows, cols), name="a")
    x = te.placeholder((rows,), name="x")
    r = te.reduce_axis((0, rows), name="r")
    y = te.compute((cols,), lambda i: te.sum(a[r, i] * x[r], axis=r), name="y")
    an, xn = rand((rows, cols), "float32", rng), rand((rows,), "float32", rng)
    (out,), why = build_run([y], [a, x], [an, xn], target=targets.current().with_cores(2))
    check(out, xn.astype(np.float64) @ an.astype(np.float64), "float32")
    note = dict((st, w) for st, _, w in why.stages)["y"]
    assert ("streamed" in note) == streamed, note


def test_row_vector_times_matrix_streams_the_matrix():
    """``c[0, j] = sum_r a[0, r] * b[r, j]`` (a matmul of one row): its unit axis is no
    stride, the matrix streams a row at a time (4096 x 4096 on one Zen 4 core: 5.4 ->
    2.5 ms). Against float64."""
    rng = np.random.default_rng(71)
    a, b = te.placeholder((1, 37), name="a"), te.placeholder((37, 96), name="b")
    r = te.reduce_axis((0, 37), name="r")
    c = te.compute((1, 96), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="c")
    an, bn = rand((1, 37), "float32", rng), rand((37, 96), "float32", rng)
    (out,), why = build_run([c], [a, b], [an, bn])
    check(out, an.astype(np.float64) @ bn.astype(np.float64), "float32")
    assert "streamed" in dict((st, w) for st, _, w in why.stages)["c"], why.stages


def test_outer_reduction_whose_output_transposes_its_input_is_not_streamed():
    """``t[i, j] = sum_k z[k, j, i]``: the output row is no run of an input row; the
    register tile. Against float64."""
    rng = np.random.default_rng(67)
    z = te.placeholder((9, 16, 32), name="z")
    k = te.reduce_axis((0, 9), name="k")
    t = te.compute((32, 16), lambda i, j: te.sum(z[k, j, i], axis=k), name="t")
    zn = rand((9, 16, 32), "float32", rng)
    (out,), why = build_run([t], [z], [zn])
    check(out, zn.astype(np.float64).sum(0).T, "float32")
    assert "streamed" not in dict((st, w) for st, _, w in why.stages)["t"], why.stages


def test_tap_sums_refused():
    """Rows of 7 (no whole half vector) and NHWC channels that are no whole vector (12)
    keep the other rules; a depthwise forward (its taps are the reduction) is no tap sum.
    Correct either way."""
    rng = np.random.default_rng(42)
    x, dy, dw = _tap_sums_graph(2, 3, (5, 7), 3, ((1, 1), (1, 1)), "float32")
    xn, dyn = rand((2, 3, 5, 7), "float32", rng), rand((2, 3, 5, 7), "float32", rng)
    (out,), why = build_run([dw], [x, dy], [xn, dyn])
    check(out, _ref_tap_sums(xn, dyn, 3, ((1, 1), (1, 1))), "float32")
    assert {s: r for s, r, _ in why.stages}["dw"] != "patterns.tap_sums", why.stages

    x, dy, dw = _tap_sums_graph(2, 12, (6, 8), 3, ((1, 1), (1, 1)), "float32", nhwc=True)
    xn, dyn = rand((2, 6, 8, 12), "float32", rng), rand((2, 6, 8, 12), "float32", rng)
    (out,), why = build_run([dw], [x, dy], [xn, dyn])
    ref = _ref_tap_sums(xn.transpose(0, 3, 1, 2), dyn.transpose(0, 3, 1, 2), 3,
                        ((1, 1), (1, 1)))[:, 0].transpose(1, 2, 0)
    check(out, ref, "float32")
    assert {s: r for s, r, _ in why.stages}["dw"] != "patterns.tap_sums", why.stages

    xp = te.placeholder((2, 16, 10, 34), name="xp")
    wt = te.placeholder((16, 3, 3), name="wt")
    ry, rx = te.reduce_axis((0, 3), name="ry"), te.reduce_axis((0, 3), name="rx")
    fwd = te.compute((2, 16, 8, 32), lambda b, c, i, j: te.sum(
        xp[b, c, i + ry, j + rx] * wt[c, ry, rx], axis=[ry, rx]), name="fwd")
    xpn, wtn = rand((2, 16, 10, 34), "float32", rng), rand((16, 3, 3), "float32", rng)
    (out,), why = build_run([fwd], [xp, wt], [xpn, wtn])
    ref = sum(xpn[:, :, r:r + 8, t:t + 32].astype(np.float64) * wtn[None, :, r, t, None, None]
              for r in range(3) for t in range(3))
    check(out, ref, "float32")
    assert {s: r for s, r, _ in why.stages}["fwd"] == "patterns.window", why.stages
