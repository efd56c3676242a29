"""Hostile and malformed input: every call of the corpus ends in DslError, writes nothing.

The corpus (``rel_corpus.py``) covers every public entry point of the core: the two
operators, calculate_group, the numpy and TE layouts, auto_schedule, build, load,
Kernel.__call__ and the kernel cache. Unusual but *valid* arrays (views, misaligned, read-only,
flat) must instead give the same answer as plain ones, and NaN / inf are data, not errors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rel_corpus import CASES, KNAME, build_golden, copy_golden, good_args, needs_kdir
from rel_corpus_ops import KNOWN_BUGS, OPS_CASES

import dsl

# Files a case itself creates as its hostile setup (a file where a directory should be, a
# symlinked kernel_meta); anything else appearing during a refused call is a leak.
SETUP_FILES = {"afile", "elsewhere", "kernel_meta", "kernel_meta/.hostile.lock"}


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    d = tmp_path_factory.mktemp("golden")
    build_golden(d)
    return d


def _paths(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _safe_id(cid: str) -> str:
    return cid.encode("unicode_escape").decode("ascii")


def test_corpus_is_large_enough():
    assert len(CASES) >= 200, len(CASES)
    assert len({c[0] for c in CASES}) == len(CASES)
    assert len(OPS_CASES) >= 100, len(OPS_CASES)


@pytest.mark.parametrize("cid,code,param,call", CASES, ids=[_safe_id(c[0]) for c in CASES])
def test_hostile_call_is_refused_cleanly(cid, code, param, call, tmp_path, monkeypatch,
                                         golden):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("DSL_CACHE_DIR", str(work / "cache"))
    args = (copy_golden(golden, work / "k"),) if needs_kdir(call) else ()
    _check_refused(cid, code, param, call, args, work, tmp_path)


@pytest.mark.parametrize("cid,code,param,call", [
    pytest.param(*c, id=_safe_id(c[0]), marks=[pytest.mark.xfail(strict=True,
                                                                 reason=KNOWN_BUGS[c[0]])]
                 if c[0] in KNOWN_BUGS else []) for c in OPS_CASES])
def test_hostile_call_of_other_operators_is_refused_cleanly(cid, code, param, call, tmp_path,
                                                            monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("DSL_CACHE_DIR", str(work / "cache"))
    _check_refused(cid, code, param, call, (), work, tmp_path)


def _check_refused(cid, code, param, call, args, work: Path, tmp_path: Path) -> None:
    before = _paths(work)
    with pytest.raises(dsl.DslError) as info:
        call(*args)
    err = info.value
    assert err.code == code, f"{cid}: {err}"
    assert param in err.param, f"{cid}: param {err.param!r}, wanted {param!r}: {err}"
    assert f"[{err.code}] {err.param}" in str(err)  # the message names code and parameter
    new = _paths(work) - before
    assert new <= SETUP_FILES, f"{cid} left files behind: {sorted(new)}"
    if "elsewhere" in new:  # the symlinked kernel_meta case: nothing went through the link
        assert (work / "kernel_meta").is_symlink() and not any((work / "elsewhere").iterdir())
    assert not list(tmp_path.parent.glob("evil*"))


# --- unusual but valid arrays --------------------------------------------------------------------

def _misaligned(a: np.ndarray) -> np.ndarray:
    raw = np.zeros(a.nbytes + 1, np.uint8)[1:]
    out = raw.view(a.dtype).reshape(a.shape)
    out[...] = a
    assert not out.flags.aligned
    return out


def _readonly(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


def _strided(a: np.ndarray) -> np.ndarray:
    big = np.zeros((*a.shape[:-1], a.shape[-1] * 2), a.dtype)
    big[..., ::2] = a
    view = big[..., ::2]
    assert not view.flags.c_contiguous
    return view


VARIANTS = {
    "fortran": np.asfortranarray,
    "misaligned": _misaligned,
    "readonly": _readonly,
    "strided": _strided,
    "flat": np.ravel,
    "reversed-view": lambda a: a[::-1][::-1],
}


@pytest.fixture(scope="module")
def kernel(golden):
    return dsl.load(KNAME, golden)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_unusual_valid_inputs_give_the_same_answer(kernel, variant):
    w, y = good_args()
    expect = kernel(w, y)
    got = kernel(VARIANTS[variant](w), VARIANTS[variant](y))
    np.testing.assert_array_equal(got, expect)


@pytest.mark.parametrize("variant", ["strided", "flat", "fortran", "misaligned"])
def test_given_output_buffers_are_written_in_place(kernel, variant):
    w, y = good_args()
    expect = kernel(w, y)
    out = VARIANTS[variant](np.full(expect.shape, np.nan, "float32"))
    kernel(w, y, out)
    np.testing.assert_array_equal(out.reshape(expect.shape), expect)


def test_nan_and_inf_are_data_not_errors(kernel):
    w, y = good_args()
    y[0, 0, 2, 2, 3] = np.nan
    w[0, 0, 1, 2] = np.inf
    out = kernel(w, y)
    assert np.isnan(out).any() and np.isfinite(out).any()


def test_output_buffer_aliasing_an_input_gets_the_right_answer(kernel):
    """Inputs are copied before the run, so an output laid over an input's memory is fine."""
    w, y = good_args()
    expect = kernel(w, y)
    out = w.reshape(-1)[:expect.size]  # a view of the weight's own memory
    kernel(w, y, out)
    np.testing.assert_array_equal(out.reshape(expect.shape), expect)


def test_one_kernel_called_from_many_threads(kernel):
    import threading

    w, y = good_args()
    expect = kernel(w, y)
    wrong = []

    def work():
        for _ in range(100):
            if not np.array_equal(kernel(w, y), expect):
                wrong.append(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not wrong
