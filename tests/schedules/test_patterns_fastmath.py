"""The vectorisable float32 exp and tanh the pattern rules register: exp within 2 ulp of
float64 exp over the whole float32 range, subnormal results, overflow to inf, NaN kept; tanh
within 2 ulp from 1e-30 up, +-1 past its clamp, -0 and NaN kept; no libm call left in the
vector loop; float16 through float32, float64 through libm."""

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


TANH_SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 0.625, -0.625,
                         0.6249999, 9.0, 10.0, 44.5, -44.5, 1e-30, -1e-30, 1e-40], np.float32)


def _tanh_kernel(n, dtype):
    x = te.placeholder((n,), name="x", dtype=dtype)
    return x, te.compute((n,), lambda i: te.tanh(x[i]), name="y")


def test_tanh_f32_accuracy_and_special_values():
    """Within 2 ulp of float64 tanh from 1e-30 to 20 in both signs (both sides of the
    polynomial's 0.625 and of the clamp), exactly +-1 past the clamp and at +-inf, -0 kept,
    NaN kept."""
    mags = np.logspace(-30, np.log10(20), 20001, dtype=np.float32)
    xs = np.concatenate([np.linspace(-20, 20, 200001, dtype=np.float32), mags, -mags,
                         TANH_SPECIAL])
    x, y = _tanh_kernel(xs.size, "float32")
    (out,), why = build_run([y], [x], [xs])
    assert why.rule_of("y") == "patterns.injective"
    ref = np.tanh(xs.astype(np.float64))
    fin = ~np.isnan(ref)
    ulp = np.spacing(np.abs(ref[fin]).astype(np.float32)).astype(np.float64)
    assert (np.abs(out[fin] - ref[fin]) / ulp).max() <= 2.0
    got, expect = out[-TANH_SPECIAL.size:], np.tanh(TANH_SPECIAL)
    assert np.isnan(got[0]) and list(got[1:3]) == [1.0, -1.0] and list(got[5:7]) == [1.0, -1.0]
    assert np.array_equal(np.signbit(got[1:]), np.signbit(expect[1:]))  # -0.0 stays -0.0
    assert got[-1] == np.float32(1e-40)  # a subnormal input comes back as itself


def test_tanh_leaves_no_libm_call():
    """The vector loop is arithmetic only (TVM's own rule is too, but it divides twice and
    loses the tiny values :func:`test_tanh_f32_accuracy_and_special_values` checks)."""
    import tvm

    import dsl

    x, y = _tanh_kernel(64, "float32")
    sch = dsl.auto_schedule([y])
    lib = tvm.compile(sch.s_tir([x, y]).mod, target=sch.target.tvm_target())
    body = lib.mod.inspect_source("asm")
    body = body[body.index("_compute_"):]
    assert "tanhf" not in body and "expf" not in body and "vdivps" in body


def test_tanh_float16_through_float32():
    xs = np.linspace(-12, 12, 2001).astype(np.float16)
    x, y = _tanh_kernel(xs.size, "float16")
    (out,), _ = build_run([y], [x], [xs])
    np.testing.assert_allclose(out.astype(np.float64), np.tanh(xs.astype(np.float64)),
                               rtol=1e-3, atol=1e-3)


LOG_SPECIAL = np.array([1e-40, 1e-45, 1.1754942e-38, 0.0, -0.0, -1.0, -1e-40, np.inf, -np.inf,
                        np.nan, 1.0, 0.5, 2.0, 0.70710677, 0.7071068, 1.4142135],
                       np.float32)


def _log_kernel(n, dtype):
    x = te.placeholder((n,), name="x", dtype=dtype)
    return x, te.compute((n,), lambda i: te.log(x[i]), name="y")


def test_log_f32_accuracy_and_special_values():
    """Within 2 ulp of float64 log from the smallest subnormal to FLT_MAX (the mantissa's
    two halves around sqrt(1/2) included); ln 0 = -inf (-0 too), negatives NaN, +inf and
    NaN themselves, ln 1 = 0 exactly."""
    xs = np.concatenate([np.exp(np.linspace(-103, 88.7, 200003)).astype(np.float32),
                         LOG_SPECIAL])
    x, y = _log_kernel(xs.size, "float32")
    (out,), why = build_run([y], [x], [xs])
    assert why.rule_of("y") == "patterns.injective"
    fin = (xs > 0) & np.isfinite(xs)
    ref = np.full(xs.shape, np.nan)
    ref[fin] = np.log(xs[fin].astype(np.float64))
    ulp = np.spacing(np.abs(ref[fin]).astype(np.float32)).astype(np.float64)
    assert (np.abs(out[fin] - ref[fin]) / ulp).max() <= 2.0
    got = out[-LOG_SPECIAL.size:]
    with np.errstate(divide="ignore", invalid="ignore"):
        expect = np.log(LOG_SPECIAL)
    assert np.array_equal(np.isnan(got), np.isnan(expect)), (got, expect)
    same = ~np.isnan(expect) & ~np.isfinite(expect)
    assert np.array_equal(got[same], expect[same])
    assert got[list(LOG_SPECIAL).index(1.0)] == 0.0


def test_log_leaves_no_libm_call():
    import tvm

    import dsl

    x, y = _log_kernel(64, "float32")
    sch = dsl.auto_schedule([y])
    lib = tvm.compile(sch.s_tir([x, y]).mod, target=sch.target.tvm_target())
    body = lib.mod.inspect_source("asm")
    assert "logf" not in body[body.index("_compute_"):]


def test_log_float16_through_float32():
    xs = np.exp(np.linspace(-9, 11, 2001)).astype(np.float16)
    x, y = _log_kernel(xs.size, "float16")
    (out,), _ = build_run([y], [x], [xs])
    np.testing.assert_allclose(out.astype(np.float64), np.log(xs.astype(np.float64)),
                               rtol=1e-3, atol=1e-3)
