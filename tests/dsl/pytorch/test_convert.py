"""dsl.pytorch.convert: a model of every supported layer, gradients equal to native PyTorch."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest

torch = pytest.importorskip("torch")
dsl_pytorch = pytest.importorskip("dsl.pytorch")
nn = torch.nn


class Mixed(nn.Module):
    """1-D, 2-D (grouped, dilated, transposed, avg-pool) and 3-D convolutions, tiny."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(2, 4, 3, stride=2, padding=1)
        self.t1 = nn.ConvTranspose1d(4, 2, 3, stride=2, padding=1, output_padding=1)
        self.c2 = nn.Conv2d(2, 4, 3, padding=2, dilation=2)
        self.g2 = nn.Conv2d(4, 6, 3, padding=1, groups=2, bias=False)
        self.p2 = nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False)
        self.t2 = nn.ConvTranspose2d(6, 3, 2, stride=2, groups=3)
        self.c3 = nn.Conv3d(1, 2, (2, 3, 3), padding=(0, 1, 1))

    def forward(self, x1, x2, x3):
        a = self.t1(torch.tanh(self.c1(x1)))
        b = self.t2(self.p2(torch.tanh(self.g2(torch.tanh(self.c2(x2))))))
        c = self.c3(x3)
        return a.square().mean() + b.square().mean() + c.square().mean()


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    return (torch.randn(2, 2, 9, generator=g).to(dtype),
            torch.randn(2, 2, 7, 6, generator=g).to(dtype),
            torch.randn(2, 1, 3, 5, 4, generator=g).to(dtype))


def _pair(dtype=torch.float32):
    torch.manual_seed(0)
    native = Mixed().to(dtype)
    ours = dsl_pytorch.convert(copy.deepcopy(native))
    return native, ours


def _grads(model, inputs):
    model.zero_grad(set_to_none=True)
    model(*inputs).backward()
    return {n: p.grad.double() for n, p in model.named_parameters()}


def _assert_close(got, want, rel):
    assert got.keys() == want.keys()
    for n in want:
        err = (got[n] - want[n]).abs().max() / want[n].abs().max().clamp_min(1e-30)
        assert err <= rel, (n, float(err))


def test_every_layer_converted_state_dict_unchanged():
    native, ours = _pair()
    assert dsl_pytorch.converted_layers(ours) == ["c1", "t1", "c2", "g2", "p2", "t2", "c3"]
    assert list(ours.state_dict()) == list(native.state_dict())
    for k, v in native.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v)
    ours.load_state_dict(native.state_dict())
    again = pickle.loads(pickle.dumps(ours))
    assert type(again.c2) is type(ours.c2)


def test_gradients_equal_native_fp32_and_the_backward_runs_dsl_ops():
    native, ours = _pair()
    x = _inputs()
    before = dict(dsl_pytorch.STATS)
    got = _grads(ours, x)
    # 6 convolutions and 1 pool ran their backward through the dsl:: operators
    assert dsl_pytorch.STATS["convolution_backward"] - before.get("convolution_backward", 0) == 6
    assert dsl_pytorch.STATS["avg_pool2d_backward"] - before.get("avg_pool2d_backward", 0) == 1
    _assert_close(got, _grads(native, x), 1e-4)


def test_autograd_graph_names_the_dsl_ops():
    _, ours = _pair()
    out = ours.c2(_inputs()[1])
    assert "dsl" in type(out.grad_fn).__name__.lower() or "dsl" in out.grad_fn.name()
    with torch.profiler.profile() as prof:
        out.sum().backward()
    names = {e.name for e in prof.events()}
    assert "dsl::convolution_backward" in names
    assert "aten::convolution_backward" not in names


def test_gradients_equal_native_under_torch_compile():
    native, ours = _pair()
    x = _inputs()
    torch._dynamo.reset()
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    before = dsl_pytorch.STATS["convolution_backward"]
    compiled.zero_grad(set_to_none=True)
    compiled(*x).backward()
    got = {n: p.grad.double() for n, p in ours.named_parameters()}
    assert dsl_pytorch.STATS["convolution_backward"] - before == 6
    _assert_close(got, _grads(native, x), 1e-4)


def test_bf16_gradients_within_bf16_tolerance():
    """bf16 model against the float64 native gradients: a few bf16 ulps (2**-8 each)."""
    native, ours = _pair(torch.bfloat16)
    ref = copy.deepcopy(native).double()
    got = _grads(ours, _inputs(torch.bfloat16))
    want = _grads(ref, tuple(t.double() for t in _inputs(torch.bfloat16)))
    _assert_close(got, want, 5e-2)
    for p in ours.parameters():
        assert p.grad.dtype == torch.bfloat16


def test_to_dtype_and_deepcopy_keep_working():
    _, ours = _pair()
    twin = copy.deepcopy(ours).to(torch.float64)
    assert dsl_pytorch.converted_layers(twin) == dsl_pytorch.converted_layers(ours)
    assert twin.c2.weight.dtype == torch.float64
    got = _grads(twin, tuple(t.double() for t in _inputs()))
    assert all(g.isfinite().all() for g in got.values())


def test_unsupported_layers_stay_native_in_one_warning():
    model = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"),
                          nn.Conv1d(2, 2, 4, padding="same"),
                          nn.Conv1d(2, 2, 3, padding="same"),
                          nn.Conv2d(2, 2, 3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dsl_pytorch.convert(model)
    assert len(caught) == 1
    msg = str(caught[0].message)
    assert "0 (Conv2d): padding_mode='reflect'" in msg and "1 (Conv1d)" in msg
    assert type(model[0]) is nn.Conv2d and type(model[1]) is nn.Conv1d
    assert dsl_pytorch.converted_layers(model) == ["2", "3"]
    with pytest.raises(Exception, match="model"):
        dsl_pytorch.convert("not a model")


def test_padding_same_converted_matches_native():
    torch.manual_seed(1)
    native = nn.Conv1d(2, 3, 3, padding="same", dilation=2)
    ours = dsl_pytorch.convert(copy.deepcopy(native))
    x = torch.randn(2, 2, 8)
    _assert_close(_layer_grads(ours, x), _layer_grads(native, x), 1e-5)


def _layer_grads(layer, x):
    layer.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    layer(x).square().sum().backward()
    return {"x": x.grad.double(), **{n: p.grad.double() for n, p in layer.named_parameters()}}
