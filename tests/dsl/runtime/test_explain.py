"""dsl.explain: each stage, the rule that scheduled it and why; the generic last resort warns
once per pattern; print_ir prints the explanation; bad input is refused."""

import warnings

import pytest
from tvm import te

import dsl
import schedules.patterns as patterns


def _matmul_relu(m=24, n=32, k=16):
    a = te.placeholder((m, k), name="a")
    b = te.placeholder((k, n), name="b")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="c")
    y = te.compute((m, n), lambda i, j: te.max(c[i, j], 0.0), name="y")
    return a, b, y


def test_explain_lists_every_stage_with_rule_and_reason():
    a, b, y = _matmul_relu()
    why = dsl.explain(dsl.auto_schedule(y))
    assert isinstance(why, dsl.Explanation)
    assert why.rule == "schedules.generic.schedule_generic"
    assert {s for s, _, _ in why.stages} == {"c", "y"}
    assert why.rule_of("c") == "patterns.contraction+epilogue"
    assert all(w for _, _, w in why.stages)
    text = str(why)
    assert "c" in text and "patterns.contraction+epilogue" in text and "sum of products" in text
    with pytest.raises(KeyError):
        why.rule_of("no_such_stage")


def test_operator_stages_are_attributed_to_the_operator_rule():
    from dsl.ops.layout import nchw_to_5hd_compute

    x = te.placeholder((2, 3, 5, 7), name="x")
    out = nchw_to_5hd_compute(x)
    sch = dsl.auto_schedule(out)
    why = dsl.explain(sch)
    assert why.rule == sch.rule_name == "schedules.layout.schedule_layout_x86"
    from schedules.layout import RULE

    # every stage is scheduled by the layout rule (named by its label), none by a pattern
    assert why.stages and all(rule == RULE for _, rule, _ in why.stages), why.stages
    assert not why.fell_to_generic()


def _reversed_dot():
    x = te.placeholder((6, 8), name="x")
    k = te.reduce_axis((0, 8), name="k")
    r = te.compute((6,), lambda i: te.sum(x[i, k] * x[5 - i, 7 - k], axis=k), name="r")
    return x, r


def test_generic_fallback_warns_once_and_is_explained(monkeypatch):
    """Force every rule to refuse: the last resort schedules the stage, warns once per
    pattern (not once per build), and explain names the stage and the pattern."""
    monkeypatch.setattr(patterns, "RULES", ())
    monkeypatch.setattr(patterns, "_WARNED", set())
    x, r = _reversed_dot()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        why = dsl.explain(dsl.auto_schedule(r))
        dsl.explain(dsl.auto_schedule(r))
    msgs = [str(w.message) for w in caught if "generic schedule" in str(w.message)]
    assert len(msgs) == 1, msgs
    assert "'r'" in msgs[0] and "reduction" in msgs[0]
    assert why.rule_of("r") == patterns.GENERIC
    assert why.fell_to_generic() == ["r"]


def test_print_ir_prints_the_explanation(tmp_path, capsys):
    a, b, y = _matmul_relu()
    sch = dsl.auto_schedule(y)
    dsl.build(sch, {"name": "mm_relu", "tensor_list": [a, b, y], "print_ir": True,
                    "need_build": False, "kernel_meta_parent_dir": str(tmp_path)})
    out = capsys.readouterr().out
    assert "patterns.contraction+epilogue" in out
    assert "T.prim_func" in out or "prim_func" in out


def test_explain_refuses_a_non_schedule():
    with pytest.raises(dsl.DslError, match="sch"):
        dsl.explain("not a schedule")
