"""schedules.toolbox: each factor policy does what its docstring says, and every rule finds
its stages by tag and records a decision for each block it schedules."""

import pytest
from tvm import te

import dsl
import targets
from dsl.ops import tag
from schedules import toolbox as tb

from cases import CONV_CASES
from helpers import out_hw, para

SIZES = [1, 2, 3, 7, 8, 12, 16, 17, 20, 24, 31, 32, 48, 60, 64, 97, 128, 210]


@pytest.mark.parametrize("n", SIZES)
def test_divisor_policies(n):
    assert tb.divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    for cap in (1, 3, 8, 16, 1000):
        d = tb.largest_divisor(n, cap)
        assert n % d == 0 and d <= max(1, cap)
        assert not any(n % e == 0 for e in range(d + 1, min(n, cap) + 1))
        t = tb.tile_factor(n, cap)
        assert 1 <= t <= max(1, min(n, cap))
        assert n % t == 0 or t == min(n, cap)  # a ragged tail only at the full limit


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("limit", [4, 6, 12])
def test_chain_tile_keeps_enough_accumulators(n, limit):
    t = tb.chain_tile(n, limit, 2, 8)
    assert 1 <= t <= min(n, limit)
    if n <= limit:
        assert t == n
    elif n % t == 0:  # an exact tile is taken only with enough chains
        assert 2 * t >= limit and 2 * t >= 8 or n < 2 * limit
    else:
        assert t == limit or (n < 2 * limit and t == -(-n // 2))


def test_chain_tile_examples():
    # 14 positions, 6 fit: 2 (4 accumulators) would stall, so 6 with a tail of 2
    assert tb.chain_tile(14, 6, 2, 8) == 6
    assert tb.chain_tile(56, 6, 2, 8) == 4  # exact, 8 accumulators
    assert tb.chain_tile(7, 6, 2, 8) == 4  # two balanced tiles, not 6 + 1
    assert tb.chain_tile(20, 6, 2, 8) == 5
    assert tb.chain_tile(5, 6, 2, 8) == 5


@pytest.mark.parametrize("lanes", [4, 8, 16])
@pytest.mark.parametrize("n", SIZES)
def test_vector_factor_policies(n, lanes):
    r = tb.register_factor(n, lanes)
    assert n % r == 0 and (r % lanes == 0 or r <= lanes)
    e = tb.exact_vector_factor(n, lanes)
    assert e == n if n <= 4 * lanes else (e == 1 or (n % e == 0 and lanes // 2 <= e))
    f = tb.fill_vector_factor(n, lanes)
    assert f == n if n <= 2 * lanes else (n % f == 0 and f <= 2 * lanes)


def _dx(c):
    ho, wo = out_hw(c)
    w_sizes = (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"])
    fz = te.placeholder(dsl.layout.GroupLayout.from_weight(w_sizes, c["groups"]).fracz_shape,
                        name="filters")
    dy = te.placeholder((c["n"], -(-c["cout"] // 16), ho, wo, 16), name="out_backprop")
    return dsl.conv2d_backprop_input(fz, dy, w_sizes, (c["n"], c["cin"], c["h"], c["w"]),
                                     para(c, res_dtype="float32"))


def _dw(c):
    ho, wo = out_hw(c)
    x = te.placeholder((c["n"], -(-c["cin"] // 16), c["h"], c["w"], 16), name="fmap")
    dy = te.placeholder((c["n"], -(-c["cout"] // 16), ho, wo, 16), name="out_backprop")
    return dsl.conv2d_backprop_filter(x, dy, (c["cout"], c["cin"] // c["groups"], c["kh"],
                                              c["kw"]), para(c, groups=c["groups"]))


@pytest.mark.parametrize("make", [_dx, _dw])
@pytest.mark.parametrize("c", [CONV_CASES[2], CONV_CASES[4], CONV_CASES[8]])
def test_rules_note_every_block_they_schedule(make, c):
    s = dsl.auto_schedule(make(c), target=targets.get("x86-avx2"))
    wl = s.workload()
    rule = __import__("schedules").lookup(s.anchor_tag, s.target)[1]
    import tvm

    sch = tvm.s_tir.Schedule(s.prim_func())
    rule(sch, wl)
    noted = {stage for stage, _, _ in wl.decisions}
    staged = {name for names in wl.stages.values() for name in names}
    assert noted == staged  # every stage found by its tag and scheduled, none twice-named
    acc = tag.DX_ACC if make is _dx else tag.DW_ACC
    assert len(wl.stages[acc]) >= 1


def _transposed(shape, perm, pad=0):
    """``y[.., i, c] = x[.., c, i - pad]`` (zero outside): a (padded) layout transpose."""
    x = te.placeholder(shape, name="x")
    out_shape = [shape[p] for p in perm]
    out_shape[-2] += 2 * pad
    inv = [perm.index(d) for d in range(len(shape))]

    def body(*ix):
        src = [ix[inv[d]] for d in range(len(shape))]
        if not pad:
            return x[tuple(src)]
        i = ix[-2]
        src[perm[-2]] = te.max(te.min(i - pad, shape[perm[-2]] - 1), 0)
        return te.if_then_else(te.all(i >= pad, i < shape[perm[-2]] + pad), x[tuple(src)], 0.0)

    return x, te.compute(out_shape, body, name="y")


@pytest.mark.parametrize("shape,perm,pad", [((3, 16, 40), (0, 2, 1), 0),
                                            ((2, 24, 13), (0, 2, 1), 1),
                                            ((2, 8, 3, 5, 12), (0, 2, 3, 4, 1), 0),
                                            ((5, 12, 9), (0, 2, 1), 2)], ids=str)
def test_transpose_tile_blocks_a_layout_transpose(shape, perm, pad):
    """NCL -> NLC (and NCDHW -> NDHWC): tiled, the unrolled read axis may leave a guarded
    tail (13, 9 rows + padding), results exact against numpy."""
    import numpy as np
    import tvm

    x, y = _transposed(shape, perm, pad)
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    tgt = targets.current()
    assert tb.transpose_tile(sch, sch.get_sblock("y"), tgt)
    f = tvm.compile(sch.mod, target=tgt.tvm_target())
    xn = np.random.default_rng(3).standard_normal(shape).astype("float32")
    ref = np.transpose(xn, perm)
    if pad:
        widths = [(0, 0)] * len(shape)
        widths[-2] = (pad, pad)
        ref = np.pad(ref, widths)
    out = tvm.runtime.tensor(np.zeros(ref.shape, "float32"))
    f(tvm.runtime.tensor(xn), out)
    np.testing.assert_array_equal(out.numpy(), ref)


@pytest.mark.parametrize("w,lo,hi", [(8, 1, 2), (16, 3, 0), (32, 0, 5)])
def test_transpose_tile_of_a_padded_write_axis(w, lo, hi, monkeypatch):
    """5HD dy into zero-padded W rows (a few-channel dx's ``dx_dy_pad``): the write axis
    (W + padding) divides into blocks only inside the padding, so it is partitioned at the
    pad's bounds, the interior vectorised below runs of 8 channels that are transposed in
    registers when lowered (each run under the pad's row test); results exact against
    numpy."""
    import numpy as np
    import tvm
    import tvm_ffi

    from dsl.runtime import transpose_pass
    from dsl.runtime.build import compile_module

    lowered = []
    real = transpose_pass.rewrite
    monkeypatch.setattr(transpose_pass, "rewrite", lambda f: lowered.append(real(f)) or
                        lowered[-1])

    n, c1, h = 2, 2, 3
    x = te.placeholder((n, c1, h, w, 16), name="x")
    wp = lo + w + hi
    y = te.compute((n, c1 * 16, h + 2, wp), lambda b, c, i, j: te.if_then_else(
        te.all(i >= 1, i < h + 1, j >= lo, j < w + lo), x[b, c // 16, i - 1, j - lo, c % 16],
        0.0), name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    tgt = targets.current()
    assert tb.transpose_tile(sch, sch.get_sblock("y"), tgt)
    script = sch.mod.script()
    assert "T.vectorized" in script and ("partition" in script) == bool(lo or hi)
    f = compile_module(sch.mod, tgt.tvm_target())
    shuffles = []
    tvm_ffi.structural_walk(lowered[0].body, (tvm.tirx.Shuffle, shuffles.append))
    assert len(shuffles) >= tb.TRANSPOSE_TILE
    xn = np.random.default_rng(w).standard_normal((n, c1, h, w, 16)).astype("float32")
    ref = np.pad(xn.transpose(0, 1, 4, 2, 3).reshape(n, c1 * 16, h, w),
                 ((0, 0), (0, 0), (1, 1), (lo, hi)))
    out = tvm.runtime.tensor(np.zeros(ref.shape, "float32"))
    f(tvm.runtime.tensor(xn), out)
    np.testing.assert_array_equal(out.numpy(), ref)


@pytest.mark.parametrize("w", [28, 12, 16])
def test_transpose_tile_fuses_short_rows_with_the_next_axis(w):
    """NHWC -> NCHW with rows of 28 (or 12) floats: no block of 8 divides a row, so the rows
    and the axis outside them fuse into one write axis that 8 divides; rows of 16 stay as
    they are. Results exact against numpy."""
    import numpy as np
    import tvm

    shape = (2, 6, w, 24)
    x, y = _transposed(shape, (0, 3, 1, 2), 0)
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    tgt = targets.current()
    assert tb.transpose_tile(sch, sch.get_sblock("y"), tgt)
    # whole 8-lane blocks (rows of 28 or 12 alone: 4 lanes)
    assert tb.extent(sch, sch.get_loops(sch.get_sblock("y"))[-1]) == tb.TRANSPOSE_TILE
    f = tvm.compile(sch.mod, target=tgt.tvm_target())
    xn = np.random.default_rng(w).standard_normal(shape).astype("float32")
    out = tvm.runtime.tensor(np.zeros((2, 24, 6, w), "float32"))
    f(tvm.runtime.tensor(xn), out)
    np.testing.assert_array_equal(out.numpy(), xn.transpose(0, 3, 1, 2))


def test_transpose_tile_leaves_other_copies_alone():
    """A copy contiguous along the same axis on both sides, or whose write axis does not
    divide into blocks (a predicated vector is scalarised), is not a tiled transpose."""
    import tvm

    x = te.placeholder((4, 16, 32), name="x")
    same = te.compute((4, 16, 32), lambda a, b, c: x[a, b, c] * 2.0, name="y")
    x2 = te.placeholder((4, 18, 30), name="x2")
    odd = te.compute((4, 30, 18), lambda a, b, c: x2[a, c, b], name="z")
    for inp, out in ((x, same), (x2, odd)):
        sch = tvm.s_tir.Schedule(te.create_prim_func([inp, out]))
        assert not tb.transpose_tile(sch, sch.get_sblock(out.op.name), targets.current())


@pytest.mark.parametrize("extent, budget, rows", [
    (1024, 6, 6),   # divisor 4 fills 2/3 of the budget: 6-row tiles, a last tile of 4
    (28, 6, 6),
    (25, 6, 5),     # divisor 5 fills 5/6: exact
    (24, 6, 6),
    (11, 6, 1),     # under two full tiles: exact (here 1 row)
    (50, 24, 24),   # AVX-512 budget: divisor 10 fills 5/12
    (26, 24, 13),   # 13 rows, exact: no room for two tiles of 24
])
def test_row_tile(extent, budget, rows):
    assert tb.row_tile(extent, budget) == rows


def test_balance_is_the_busy_share_of_the_cores():
    assert tb.balance(28, 2) == 1.0 and tb.balance(27, 2) == 27 / 28
    assert tb.balance(27, 16) == 27 / 32 and tb.balance(1, 4) == 0.25


@pytest.mark.parametrize("tasks, cores, share", [
    (4, 2, 1.0),        # two each
    (2, 2, 0.5),        # one each: no slack
    (27, 2, 27 / 28),
    (28, 16, 28 / 32 * 28 / 32),  # two rounds, the second 12 of 16 busy; under 2 per core
])
def test_task_share(tasks, cores, share):
    assert tb.task_share(tasks, cores) == pytest.approx(share)


@pytest.mark.parametrize("sizes, cores, n", [
    ([2, 1, 3, 3, 3], 2, 2),    # two blocks: one per core, the taps below the chunks
    ([1, 1, 3, 3, 3], 3, 3),    # one block: the first tap axis joins (3 blocks on 3 cores)
    ([2, 1, 3, 3, 3], 16, 5),   # 54 blocks share 16 cores best (27/32 busy), none evenly
    ([8, 2, 3, 3, 3], 16, 2),   # 16 blocks: one per core
    ([5], 2, 1),                # fewer loops than the least asked for
])
def test_lead_loops_takes_the_fewest_that_share_out_evenly(sizes, cores, n):
    assert tb.lead_loops(sizes, cores) == n


def test_sharing_choice_takes_the_first_that_shares_out_else_the_best():
    # rows per task over a 56-row image, 2 blocks of channels, 16 cores: 28 and 14 rows
    # leave cores idle, 1 row (112 tasks) is the first that fills them
    rows = [28, 14, 8, 4, 2, 1]
    assert tb.sharing_choice(rows, lambda r: 2 * (56 // r), 16) == (1, 1.0)
    # 2 cores: 28 rows already make 4 tasks, two per core
    assert tb.sharing_choice(rows, lambda r: 2 * (56 // r), 2) == (28, 1.0)
    # none reaches BALANCE_MIN: the best share, the earlier on a tie
    cand, share = tb.sharing_choice([3, 2, 1], lambda t: t, 4)
    assert cand == 3 and share == pytest.approx(tb.task_share(3, 4))
