"""Timing two or more kernels fairly on a loaded machine (used by ``bench`` and ``tune``)."""

from __future__ import annotations

import statistics


def alternating_medians(samplers, rounds: int) -> list[float]:
    """Median of ``rounds`` results of each sampler, taken one of each per round so that a
    slow spell of the machine hits every side alike."""
    samples: list[list[float]] = [[] for _ in samplers]
    for _ in range(rounds):
        for sample, out in zip(samplers, samples):
            out.append(sample())
    return [statistics.median(s) for s in samples]
