"""The vectorisable float32 exp the pattern rules register: within 2 ulp of float64 exp over
the whole float32 range, subnormal results, overflow to inf, NaN kept; no libm call left in
the vector loop; float16 through float32, float64 through libm."""

import numpy as np
import pytest
from pattern_helpers import build_run
from tvm import te

import schedules.patterns.fastmath  # noqa: F401  (registers the lowering)

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72, 88.73, 89.0, -87.5, -103.0,
                    -104.5, 1e-8, -1e-8, 0.5, -0.5], np.float32)


def _exp_kernel(n, dtype):
    x = te.placeholder((n,), name="x", dtype=dtype)
    return x, te.compute((n,), lambda i: te.exp(x[i]), name="y")


def test_exp_f32_accuracy_and_special_values():
    xs = np.concatenate([np.linspace(-110, 90, 200003, dtype=np.float32), SPECIAL])
    x, y = _exp_kernel(xs.size, "float32")
    (out,), why = build_run([y], [x], [xs])
    assert why.rule_of("y") == "patterns.injective"
    ref = np.exp(xs.astype(np.float64))
    normal = np.isfinite(ref) & (ref >= np.finfo(np.float32).tiny) & (ref <= 3.4e38)
    rel = np.abs(out[normal] - ref[normal]) / ref[normal]
    assert rel.max() <= 2 * np.finfo(np.float32).eps / 2, rel.max()  # 2 ulp
    sub = (ref < np.finfo(np.float32).tiny) & (ref > 0)
    assert np.abs(out[sub] - ref[sub]).max() <= 2 * 1.4013e-45
    with np.errstate(over="ignore"):
        expect = np.exp(SPECIAL)
    got = out[-SPECIAL.size:]
    assert np.array_equal(np.isnan(got), np.isnan(expect))
    fin = ~np.isnan(expect)
    assert np.array_equal(np.isinf(got[fin]), np.isinf(expect[fin]))
    np.testing.assert_allclose(got[fin & np.isfinite(expect)], expect[fin & np.isfinite(expect)],
                               rtol=3e-7, atol=3e-45)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_other_dtypes(dtype):
    xs = np.linspace(-10, 10, 1001).astype(dtype)
    x, y = _exp_kernel(xs.size, dtype)
    (out,), _ = build_run([y], [x], [xs])
    rtol = 1e-3 if dtype == "float16" else 1e-14
    np.testing.assert_allclose(out.astype(np.float64), np.exp(xs.astype(np.float64)), rtol=rtol)
