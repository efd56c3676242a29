"""python -m dsl.cli.bench.calls: every way of calling runs the same kernel on its memory."""

import numpy as np

from dsl.cli.bench import calls


def test_every_way_of_calling_computes_the_same_result():
    kernel = calls._kernel((1, 2, 4, 6), "float32")
    fns = calls.candidates(kernel, "float32")
    assert {"raw tvm", "tvm out=", "tvm bind", "numpy bind", "numpy +4 B bind"} <= set(fns)
    for fn in fns.values():
        fn()
    dy = np.random.default_rng(0).standard_normal((1, 2, 2, 3)).astype("float32")
    want = np.repeat(np.repeat(dy, 2, axis=2), 2, axis=3) / 4
    bound = fns["numpy +4 B bind"]
    np.testing.assert_allclose(bound.outputs, want, rtol=1e-6)


def test_per_call_table_names_each_way_against_raw(capsys):
    assert calls.main(["--shape", "1,2,4,6", "--per-call", "3"]) == 0
    out = capsys.readouterr().out
    for row in ("raw tvm", "numpy out=", "numpy bind", "copying (old)"):
        assert row in out, out
