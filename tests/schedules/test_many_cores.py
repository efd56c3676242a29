"""The dense conv2d and the DeconvGradFilter benchmark layers, built for servers of 16-128
cores, keep them busy by the static model of :mod:`dsl.runtime.scaling` (each stage's tasks
share out over the cores; nothing big left serial): what ``python -m dsl scaling`` reports,
held as a regression check because no machine of that size runs the tests."""

import pytest
from tvm import te

import dsl
import targets
from dsl.cli.bench.conv2d import LAYERS
from dsl.cli.bench.deconv import LAYERS as DECONV
from dsl.ops.deconv_grad_filter import deconv_grad_filter
from dsl.ops.group import GroupLayout
from dsl.runtime.scaling import predict

DENSE = [layer for layer in LAYERS if layer.groups == 1]


def _lowered(layer, kind: str, cores: int):
    c1 = lambda c: -(-c // 16)  # noqa: E731
    dy = te.placeholder((layer.n, c1(layer.cout), layer.out, layer.out, 16),
                        name="out_backprop", dtype="float32")
    if kind == "dx":
        first = te.placeholder(GroupLayout.from_weight(layer.w_shape(), 1).fracz_shape,
                               name="filters", dtype="float32")
        out = dsl.conv2d_backprop_input(first, dy, layer.w_shape(),
                                        (layer.n, layer.cin, layer.hw, layer.hw),
                                        layer.para(res_dtype="float32"))
    else:
        first = te.placeholder((layer.n, c1(layer.cin), layer.hw, layer.hw, 16), name="fmap",
                               dtype="float32")
        out = dsl.conv2d_backprop_filter(first, dy, layer.w_shape(), layer.para())
    sch = dsl.auto_schedule(out, target=targets.current().with_cores(cores))
    return dsl.build(sch, {"name": f"{kind}_{layer.name}", "tensor_list": [first, dy, out],
                           "need_build": False})


@pytest.mark.parametrize("cores, least", [(16, 0.95), (64, 0.85)])
@pytest.mark.parametrize("kind", ["dx", "dw"])
@pytest.mark.parametrize("layer", DENSE, ids=lambda layer: layer.name)
def test_dense_layers_keep_the_cores_busy(layer, kind, cores, least):
    pred = predict(_lowered(layer, kind, cores), cores)
    assert pred.share >= least, (pred.share, pred.limiting())


@pytest.mark.parametrize("cores", [32, 48])
@pytest.mark.parametrize("layer", [layer for layer in DENSE if layer.cin >= 16],
                         ids=lambda layer: layer.name)
def test_dense_dx_rows_in_parts_keep_32_and_48_cores_busy(layer, cores):
    """56 rows of two channel blocks are 112 tasks: 4 rounds on 32 cores for 3.5 of work
    (0.87), 3 on 48 for 2.3 (0.78), until each row's tiles are cut into parts. The 3-channel
    stem tiles a whole row of W positions at once: nothing to cut."""
    pred = predict(_lowered(layer, "dx", cores), cores)
    assert pred.share >= 0.9, (pred.share, pred.limiting())


@pytest.mark.parametrize("cores", [24, 48, 64, 128])
@pytest.mark.parametrize("layer", DECONV, ids=lambda layer: layer.name)
def test_deconv_grad_filter_layers_keep_many_cores_busy(layer, cores):
    """The dcgan layer has 2 oc blocks x 16 taps = 32 output blocks: 0.67 of 48 cores, 0.25 of
    128, until its row tiles join the tasks; the grouped one's taps of one dy phase shared a
    task where that halved 128 tasks to 64 on 48 cores (0.67)."""
    dy = te.placeholder((layer.n, layer.out, layer.out, layer.cout), "float32", name="dy")
    x = te.placeholder((layer.n, layer.hw, layer.hw, layer.cin), "float32", name="x")
    dw = deconv_grad_filter(dy, x, kernel=layer.k, stride=layer.stride, pad=layer.pad,
                            group=layer.groups)
    sch = dsl.auto_schedule(dw, target=targets.current().with_cores(cores))
    mod = dsl.build(sch, {"name": f"dgf_{layer.name}", "tensor_list": [dy, x, dw],
                          "need_build": False})
    pred = predict(mod, cores)
    assert pred.share >= 0.85, (pred.share, pred.limiting())
