"""Errors speak the caller's words: the argument order of build, the names of the parameters."""

from __future__ import annotations

import pytest

import dsl
from dsl import tvm as dtvm


def _dx(cin=16, groups=1):
    dy = dtvm.placeholder((1, 1, 5, 5, 16), name="out_backprop", dtype="float32")
    w_sizes = (16, 16 // groups, 3, 3)
    fz = dsl.layout.GroupLayout.from_weight(w_sizes, groups).fracz_shape
    w = dtvm.placeholder(fz, name="filters", dtype="float32")
    para = {"padding": [1, 1, 1, 1], "res_dtype": "float32", "groups": groups}
    return w, dy, dsl.conv2d_backprop_input(w, dy, w_sizes, (1, cin, 5, 5), para)


@pytest.mark.parametrize("order,index,name", [
    ((0, 2, 1), 2, "out_backprop"),  # filters, dx, out_backprop
    ((2, 0, 1), 1, "filters"),  # the output first: the first input after it is named
])
def test_an_input_after_an_output_is_refused_naming_it(tmp_path, order, index, name):
    tensors = _dx()
    with pytest.raises(dsl.DslError) as e:
        dsl.build(dsl.auto_schedule(tensors[2]), {
            "name": "k", "tensor_list": [tensors[i] for i in order],
            "kernel_meta_parent_dir": str(tmp_path)})
    assert e.value.code == "E60012"
    assert e.value.param == f"config['tensor_list'][{index}]" and e.value.value == name
    assert "inputs first, then the outputs" in e.value.rule and "'dx'" in e.value.rule
    assert not (tmp_path / "kernel_meta").exists(), "nothing is written on failure"


def test_with_several_outputs_every_input_comes_before_the_first_output(tmp_path):
    go = dtvm.placeholder((1, 4, 5, 5), name="grad_output", dtype="float32")
    x = dtvm.placeholder((1, 2, 5, 5), name="input", dtype="float32")
    w = dtvm.placeholder((4, 2, 1, 1), name="weight", dtype="float32")
    gi, gw, _ = dsl.convolution_backward(go, x, w, None, [1, 1], [0, 0], [1, 1], False,
                                         [0, 0], 1, [True, True, False])
    cfg = {"name": "k", "kernel_meta_parent_dir": str(tmp_path)}
    with pytest.raises(dsl.DslError) as e:
        dsl.build(dsl.auto_schedule([gi, gw]), {**cfg, "tensor_list": [go, x, gi, w, gw]})
    assert (e.value.param, e.value.value) == ("config['tensor_list'][3]", "weight")
    meta = dsl.build(dsl.auto_schedule([gi, gw]), {**cfg, "tensor_list": [go, x, w, gi, gw]})
    assert [t["role"] for t in meta["tensors"]] == ["input"] * 3 + ["output"] * 2


def test_channel_mismatch_names_input_sizes_not_internal_variables():
    with pytest.raises(dsl.DslError) as e:
        _dx(cin=24)
    assert e.value.code == "E60002" and e.value.param == "input_sizes[1]"
    assert "filter_sizes" in e.value.rule
    text = str(e.value)
    assert "_nchw" not in text and "w_shape" not in text, text


def test_groups_not_dividing_the_filter_name_filter_sizes():
    with pytest.raises(dsl.DslError) as e:
        dsl.conv2d_backprop_input(
            dtvm.placeholder((9, 1, 16, 16), name="filters", dtype="float32"),
            dtvm.placeholder((1, 1, 5, 5, 16), name="out_backprop", dtype="float32"),
            (10, 4, 3, 3), (1, 12, 5, 5), {"padding": [1, 1, 1, 1], "groups": 3})
    assert (e.value.code, e.value.param) == ("E60108", "groups")
    assert "filter_sizes" in e.value.rule and "w_shape" not in e.value.rule


def test_calculate_group_called_directly_names_its_own_parameters():
    with pytest.raises(dsl.DslError) as e:
        dsl.calculate_group((1, 32, 4, 4), (1, 30, 4, 4), (32, 4, 3, 3), 8)
    assert e.value.param == "input_size_nchw[1]" and "w_shape_nchw" in e.value.rule


@pytest.mark.parametrize("kind", ["where", "init"])
def test_reduction_with_where_or_init_is_refused(kind):
    """TVM 0.27's create_prim_func drops a Reduce's condition and init without a word; a user
    kernel using them would compute another sum, so auto_schedule refuses them by name."""
    from tvm import te

    a = te.placeholder((8,), name="a")
    k = te.reduce_axis((0, 8), name="k")
    extra = {"where": k < 4} if kind == "where" else {"init": a[0]}
    b = te.compute((8,), lambda i: te.sum(a[k], axis=k, **extra), name="b")
    with pytest.raises(dsl.DslError) as info:
        dsl.auto_schedule(b)
    assert "stage 'b'" in info.value.param and f"{kind}=" in str(info.value)
