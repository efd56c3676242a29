"""Timing two or more kernels fairly on a loaded machine (used by ``bench`` and ``tune``)."""

from __future__ import annotations

import statistics


def alternating_samples(samplers, rounds: int) -> list[list[float]]:
    """``rounds`` results of each sampler, taken one of each per round so that a slow spell
    of the machine hits every side alike; ``out[i][r]`` is sampler ``i`` in round ``r``."""
    samples: list[list[float]] = [[] for _ in samplers]
    for _ in range(rounds):
        for sample, out in zip(samplers, samples):
            out.append(sample())
    return samples


def alternating_medians(samplers, rounds: int) -> list[float]:
    """Median of ``rounds`` results of each sampler (:func:`alternating_samples`)."""
    return [statistics.median(s) for s in alternating_samples(samplers, rounds)]


def paired_ratio(num: list[float], den: list[float]) -> float:
    """Median over rounds of ``num[r] / den[r]``: each ratio compares the two sides in the
    same state of the machine. Where a state slows both alike it equals the ratio of the
    medians; where the state changes how they compare (a neighbour that slows one side's
    memory traffic more than the other's), the two medians may come from rounds in
    different states, the same-round ratios never do."""
    return statistics.median(n / d for n, d in zip(num, den))
