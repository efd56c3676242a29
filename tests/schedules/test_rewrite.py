"""``schedules/rewrite.py``: the guard of a padding stage that its whole domain satisfies is
dropped (a copy), every other guard and block kept as written."""

import pytest
import tvm
from tvm import te

from schedules.rewrite import drop_proven_guards


def _pad_func(lo: int, hi: int, size: int = 12, pad: int = 0):
    """A padding stage ``[2, size + 2 pad]`` guarded by ``lo <= i - pad < hi`` and a sum
    over it; returns its PrimFunc."""
    x = te.placeholder((2, size), name="x")
    xp = te.compute((2, size + 2 * pad), lambda b, i: te.if_then_else(
        te.all(i - pad >= lo, i - pad < hi), x[b, tvm.te.max(i - pad, 0)], 0.0), name="xpad")
    r = te.reduce_axis((0, size + 2 * pad), name="r")
    s = te.compute((2,), lambda b: te.sum(te.if_then_else(r > 0, xp[b, r], 0.0), axis=r),
                   name="s")
    return te.create_prim_func([x, s])


def _guarded(func, block: str) -> bool:
    """Whether ``block``'s body (up to the next block) tests a condition."""
    text = func.script()
    at = text.index(f'T.sblock("{block}")')
    end = text.find("T.sblock(", at + 1)
    return "if_then_else" in text[at:end if end > 0 else None]


@pytest.mark.parametrize("lo, hi, pad, dropped", [
    (0, 12, 0, True),    # zero padding: 0 <= i < 12 over i in [0, 12)
    (0, 12, 1, False),   # one element of padding each side: the guard is the padding
    (0, 11, 0, False),   # true on all but the last element
    (-3, 40, 0, True),   # wider than the domain
])
def test_a_guard_the_whole_domain_satisfies_is_dropped(lo, hi, pad, dropped):
    func = _pad_func(lo, hi, pad=pad)
    out = drop_proven_guards(func)
    assert _guarded(out, "xpad") != dropped, out.script()
    assert _guarded(out, "s")  # a reduction's guard is never touched
    assert out.same_as(func) != dropped
