"""Every Python snippet in README.md runs, as written, and does what the text around it says.

The snippets are fragments (they use arrays and tensors the prose describes), so each runs
after a small set-up that defines those names, and a check after it. The set-ups are keyed by
a line the snippet must contain: a README edit that changes a snippet without updating its
set-up here fails the test instead of going untested.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)

PORT = """
from dsl import tvm
import dsl
"""

SETUPS = {
    "from dsl.compute import cube_util": ("", "assert cube_util.ceil(17, 16) == 2"),
    "dx_5hd = kernel(": (PORT + """
import numpy as np
rng = np.random.default_rng(0)
w_nchw = (rng.integers(-4, 4, (16, 16, 1, 1)) / 4).astype("float16")
dy_nchw = (rng.integers(-4, 4, (1, 16, 7, 7)) / 4).astype("float16")
""", """
ref = np.einsum("nohw,oi->nihw", dy_nchw.astype(np.float64), w_nchw[:, :, 0, 0].astype(np.float64))
got = dsl.layout.nc1hwc0_to_nchw(np.asarray(dx_5hd), 16)
assert np.abs(got - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())
"""),
    "dsl.vsel(dsl.vcmp(fwd": (PORT + """
dy = tvm.placeholder((1, 1, 7, 7, 16), name="out_backprop", dtype="float32")
w = tvm.placeholder((9, 1, 16, 16), name="filters", dtype="float32")
filter_sizes, input_sizes = (16, 16, 3, 3), (1, 16, 7, 7)
para = {"padding": [1, 1, 1, 1], "res_dtype": "float32"}
fwd = tvm.placeholder((1, 1, 7, 7, 16), name="fwd", dtype="float32")
residual = tvm.placeholder((1, 1, 7, 7, 16), name="residual", dtype="float32")
""", """
assert sch.rule_name.endswith("schedule_dx_x86"), sch.rule_name
assert not dsl.explain(sch).fell_to_generic()
"""),
    "dsl.aclnn.convolution_backward(grad_output": (PORT + """
import numpy as np
rng = np.random.default_rng(0)
input = rng.standard_normal((2, 5, 9, 9)).astype("float32")
weight = rng.standard_normal((6, 5, 3, 3)).astype("float32")
Cout = 6
grad_output = rng.standard_normal((2, 6, 5, 5)).astype("float32")
x = input
grad_pooled = rng.standard_normal((2, 5, 5, 5)).astype("float32")
param = [2, 4, 4, 4, 2, 4, 4, 4, 4, 4, 1, 1, 0, 0, 1, 1, 1]  # the seed's example, batch 2
x_nhwc = rng.integers(0, 10, 2 * 4 * 4 * 4).astype("float32") / 50
dy = rng.integers(0, 10, 2 * 4 * 4 * 4).astype("float32") / 50
dw = np.zeros(4 * 4 * 4 * 4, "float32")
""", """
assert gi.shape == input.shape and gw.shape == weight.shape and gb.shape == (Cout,)
assert np.allclose(gb, grad_output.sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-4)
assert gx.shape == x.shape and np.isfinite(gx).all()
assert np.abs(dw).max() > 0
"""),
    "print(dsl.explain(sch))": (PORT + """
from tvm import te
x = te.placeholder((64, 100), name="x")
k = te.reduce_axis((0, 100), name="k")
m = te.compute((64,), lambda i: te.max(x[i, k], axis=k), name="m")
e = te.compute((64, 100), lambda i, j: te.exp(x[i, j] - m[i]), name="e")
k2 = te.reduce_axis((0, 100), name="k2")
s = te.compute((64,), lambda i: te.sum(e[i, k2], axis=k2), name="s")
y = te.compute((64, 100), lambda i, j: e[i, j] / s[i], name="y")
""", """
import numpy as np
xs = np.random.default_rng(0).standard_normal((64, 100)).astype("float32")
ys = dsl.load("softmax")(xs)
ref = np.exp(xs - xs.max(1, keepdims=True))
ref /= ref.sum(1, keepdims=True)
assert np.abs(ys - ref).max() < 1e-5
"""),
    "dsl.pytorch.convert(model)": ("""
import pytest
torch = pytest.importorskip("torch")
import dsl
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.AvgPool2d(2))
x = torch.randn(2, 3, 8, 8)
""", """
assert model[0].weight.grad is not None and dsl.pytorch.STATS
"""),
    'k = dsl.load("my_kernel")': (PORT + """
import numpy as np
from tvm import te
dy_t = te.placeholder((4, 33), name="dy")
dx_t = te.compute((4, 33), lambda i, j: dy_t[i, j] * 2.0, name="dx")
dsl.build(dsl.auto_schedule(dx_t), {"name": "my_kernel", "tensor_list": [dy_t, dx_t]})
dy = np.arange(4 * 33, dtype="float32").reshape(4, 33)
dx = np.empty_like(dy)
""", """
assert np.array_equal(dx, 2 * dy) and np.array_equal(odd, 2 * dy)
assert odd.ctypes.data % 64
"""),
}


def _setup_for(snippet: str):
    hits = [key for key in SETUPS if key in snippet]
    assert len(hits) == 1, f"README snippet has {len(hits)} set-ups here:\n{snippet}"
    return SETUPS[hits[0]]


def test_every_snippet_has_a_setup():
    assert len(SNIPPETS) == len(SETUPS)
    for snippet in SNIPPETS:
        _setup_for(snippet)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # builds write kernel_meta/ here
    snippet = SNIPPETS[index]
    before, after = _setup_for(snippet)
    namespace: dict = {}
    exec(compile(textwrap.dedent(before), "setup", "exec"), namespace)  # noqa: S102
    exec(compile(snippet, f"README.md snippet {index}", "exec"), namespace)  # noqa: S102
    exec(compile(textwrap.dedent(after), "check", "exec"), namespace)  # noqa: S102
