"""The static model of how busy a kernel keeps N cores (:mod:`dsl.runtime.scaling`), on loop
nests whose answer is known by counting: serial stages, parallel loops of too few tasks,
parallel loops inside serial ones, and a schedule's real kernel."""

import pytest
from tvm import s_tir, te

from dsl.runtime.scaling import predict

ROWS, COLS = 12, 100


def _two_stages(par_b: bool, par_c: bool, outer_serial: int = 0):
    """``b = a * 2`` then ``c = b + 1`` over ``ROWS x COLS``; ``par_*``: that stage's rows
    run as parallel tasks. ``outer_serial``: ``b``'s rows split into that many serial steps
    above a parallel loop of ``ROWS // outer_serial`` tasks."""
    a = te.placeholder((ROWS, COLS), "float32", name="a")
    b = te.compute((ROWS, COLS), lambda i, j: a[i, j] * 2.0, name="b", tag="elemwise")
    c = te.compute((ROWS, COLS), lambda i, j: b[i, j] + 1.0, name="c", tag="elemwise")
    sch = s_tir.Schedule(te.create_prim_func([a, c]))
    for name, par in (("b", par_b), ("c", par_c)):
        rows = sch.get_loops(sch.get_sblock(name))[0]
        if name == "b" and outer_serial:
            _, rows = sch.split(rows, [outer_serial, None])
        if par:
            sch.parallel(rows)
    return sch.mod


def test_serial_kernel_fills_one_core_in_n():
    pred = predict(_two_stages(False, False), 8)
    assert (pred.work, pred.launches) == (2 * ROWS * COLS, 0)
    assert pred.share == pytest.approx(1 / 8)
    assert [s.tasks for s in pred.stages] == [0, 0]


@pytest.mark.parametrize("cores, share", [(1, 1.0), (4, 1.0), (6, 1.0), (8, 12 / 16),
                                          (16, 12 / 16), (64, 12 / 64)])
def test_parallel_tasks_run_in_rounds(cores, share):
    """12 tasks: 2 rounds on 8 cores (the second on 4 of them), one round of 12 on 16."""
    pred = predict(_two_stages(True, True), cores)
    assert pred.share == pytest.approx(share)
    assert [s.tasks for s in pred.stages] == [ROWS, ROWS]


def test_the_serial_stage_limits_and_is_named():
    pred = predict(_two_stages(True, False), 4)
    # b: 1200 stores in 3 rounds of 100; c: 1200 on one core
    assert pred.share == pytest.approx(2400 / (4 * (300 + 1200)))
    worst = pred.limiting()
    assert (worst.name, worst.tasks, worst.work) == ("c", 0, ROWS * COLS)


def test_parallel_loop_inside_a_serial_one_pays_its_rounds_each_time():
    """3 serial steps, each 4 tasks of 100 stores: on 3 cores 2 rounds a step."""
    pred = predict(_two_stages(True, True, outer_serial=3), 3)
    b, c = pred.stages
    assert (b.work, b.tasks, b.time) == (ROWS * COLS, 4, pytest.approx(3 * 2 * 100))
    assert (c.tasks, c.time) == (ROWS, pytest.approx(4 * 100))
    assert (b.launches, c.launches, pred.launches) == (3, 1, 4)


def test_one_stage_kernel_keeps_its_loops():
    a = te.placeholder((ROWS, COLS), "float32", name="a")
    b = te.compute((ROWS, COLS), lambda i, j: a[i, j] * 2.0, name="b", tag="elemwise")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    sch.parallel(sch.get_loops(sch.get_sblock("b"))[0])
    (stage,) = predict(sch.mod, 8).stages
    assert (stage.name, stage.work, stage.tasks) == ("b", ROWS * COLS, ROWS)


def test_a_prim_func_alone_and_no_cores():
    mod = _two_stages(True, True)
    assert predict(mod["main"], 4).share == pytest.approx(1.0)
    with pytest.raises(ValueError, match="cores=0"):
        predict(mod, 0)


def test_exact_twins_are_conditional_and_left_out():
    """A float dx carries an exact twin per accumulator stage, run only for non-finite
    weights (:mod:`dsl.runtime.run_if`): the model counts the stages a usual call runs."""
    import dsl
    import targets
    from dsl.ops.group import GroupLayout

    w_sizes, x_sizes = (24, 20, 3, 3), (2, 20, 9, 9)
    fz = te.placeholder(GroupLayout.from_weight(w_sizes, 1).fracz_shape, name="filters",
                        dtype="float32")
    dy = te.placeholder((2, 2, 5, 5, 16), name="out_backprop", dtype="float32")
    dx = dsl.conv2d_backprop_input(fz, dy, w_sizes, x_sizes,
                                   {"strides": [2, 2], "padding": [1, 1, 1, 1]})
    tgt = targets.current().with_cores(8)
    mod = dsl.build(dsl.auto_schedule(dx, target=tgt),
                    {"name": "scaling_dx", "tensor_list": [fz, dy, dx], "need_build": False})
    pred = predict(mod, 8)
    twins = [s for s in pred.stages if s.conditional]
    assert twins and all("exact" in s.name for s in twins)
    assert pred.running == tuple(s for s in pred.stages if s not in twins)
    assert pred.work == sum(s.work for s in pred.running) < sum(s.work for s in pred.stages)
    assert pred.launches == sum(s.launches for s in pred.running)
