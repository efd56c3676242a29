"""Alternating samples and paired ratios (``dsl/runtime/timing.py``), on fake samplers: no
clock is read, so nothing here depends on how busy the machine is."""

import itertools

import pytest

from dsl.runtime.timing import alternating_medians, alternating_samples, paired_ratio


def _sampler(values):
    it = iter(values)
    return lambda: next(it)


def test_samples_are_taken_one_of_each_per_round():
    order = []
    a = _sampler(itertools.count(0))
    b = _sampler(itertools.count(100))
    samples = alternating_samples([lambda: order.append("a") or a(),
                                   lambda: order.append("b") or b()], 3)
    assert order == ["a", "b"] * 3
    assert samples == [[0, 1, 2], [100, 101, 102]]
    assert alternating_medians([_sampler([3, 1, 2]), _sampler([9, 7, 8])], 3) == [2, 8]


def test_paired_ratio_is_the_median_of_same_round_ratios():
    # a state that slows both sides alike: the ratio of the medians, whatever the rounds
    state = [1, 1, 2, 2, 2, 1, 1]
    assert paired_ratio([s * 1.2 for s in state], state) == pytest.approx(1.2)
    # states that change how the sides compare: the two medians come from different rounds
    # (peer 2.0 in round 2, ours 3.0 in round 3); the same-round ratios 1.5, 0.5, 2, 0.5, 2
    ours = [1.0, 2.0, 3.0, 4.0, 5.0]
    peer = [1.5, 1.0, 6.0, 2.0, 10.0]
    assert paired_ratio(peer, ours) == pytest.approx(1.5)
    assert sorted(peer)[2] / sorted(ours)[2] == pytest.approx(2 / 3)
