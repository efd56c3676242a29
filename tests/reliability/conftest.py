"""Reliability suite set-up: hypothesis profiles and the size knobs of the long tests.

``HYPOTHESIS_PROFILE=ci`` (default) draws a fixed, small set of examples (``derandomize``) so
CI is reproducible and fast; ``HYPOTHESIS_PROFILE=deep`` draws many more, randomly, for runs on
demand. ``RELIABILITY_FULL=1`` runs the resource and kill tests at their full sizes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # rel_* helper modules (pytest runs with --import-mode=importlib)

# Kernel builds take 0.1-1 s, far beyond hypothesis' default 200 ms deadline; a slow example is
# not a failure here, a wrong answer is.
_COMMON = {"deadline": None, "print_blob": True,
           "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much]}
settings.register_profile("ci", derandomize=True, max_examples=20, **_COMMON)
settings.register_profile("deep", max_examples=400, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
