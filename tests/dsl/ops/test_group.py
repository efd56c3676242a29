"""calculate_group and the group FracZ shape rules of the issue."""

import pytest

import dsl
from dsl.compute import cube_util
from dsl.ops.group import GroupLayout


@pytest.mark.parametrize("w_shape,groups,shape,g_extend,mult", [
    ((320, 3, 2, 2), 32, (24, 10, 16, 16), 2, 16),
    ((32, 1, 3, 3), 32, (18, 1, 16, 16), 2, 16),
    ((16, 16, 1, 1), 1, (1, 1, 16, 16), 1, 1),
    ((20, 3, 3, 3), 1, (9, 2, 16, 16), 1, 1),
    ((128, 4, 3, 3), 32, (72, 1, 16, 16), 8, 4),
])
def test_group_fracz_shapes(w_shape, groups, shape, g_extend, mult):
    cout, cin_g, _, _ = w_shape
    gd = dsl.calculate_group((1, cout, 5, 5), (1, cin_g * groups, 5, 5), w_shape, groups)
    assert gd["g_extend"] == g_extend and gd["multiple_extend"] == mult
    assert GroupLayout.from_weight(w_shape, groups).fracz_shape == shape


def test_calculate_group_matches_seed_formulas():
    gd = cube_util.calculate_group((2, 320, 4, 4), (2, 96, 4, 4), (320, 3, 2, 2), 32)
    assert gd == {"g_extend": 2, "multiple_extend": 16, "groups": 32, "dx_c1_extend": 3,
                  "dy_c1_extend": 10, "dx_c_ori": 3, "dy_c_ori": 10, "filter_batch_ori": 10,
                  "filter_c_ori": 3, "filter_ori_format": "NCHW"}


def test_calculate_group_formats():
    nchw = dsl.calculate_group((1, 32, 4, 4), (1, 32, 4, 4), (32, 4, 3, 3), 8)
    nhwc = dsl.calculate_group((1, 32, 4, 4), (1, 32, 4, 4), (32, 3, 3, 4), 8,
                               filter_ori_format="NHWC")
    hwcn = dsl.calculate_group((1, 32, 4, 4), (1, 32, 4, 4), (3, 3, 4, 32), 8,
                               filter_ori_format="HWCN")
    strip = [{k: v for k, v in d.items() if k != "filter_ori_format"} for d in (nhwc, hwcn)]
    assert strip[0] == strip[1] == {k: v for k, v in nchw.items() if k != "filter_ori_format"}


@pytest.mark.parametrize("args,code,param", [
    (((1, 16, 4, 4), (1, 32, 4, 4), (32, 4, 3, 3), 8), "E60002", "out_backprop_nchw[1]"),
    (((1, 32, 4, 4), (1, 30, 4, 4), (32, 4, 3, 3), 8), "E60002", "input_size_nchw[1]"),
    (((1, 30, 4, 4), (1, 28, 4, 4), (30, 4, 3, 3), 7), "E60108", "groups"),
    (((1, 32, 4, 4), (1, 32, 4, 4), (32, 4, 3, 3), 0), "E60108", "groups"),
    (((1, 32, 4, 4), (1, 32, 4, 4), (32, 4, 3), 8), "E60003", "w_shape_nchw"),
])
def test_calculate_group_errors(args, code, param):
    with pytest.raises(dsl.DslError) as e:
        dsl.calculate_group(*args)
    assert e.value.code == code and e.value.param.startswith(param), str(e.value)
