"""Shared test setup: reference/helpers importable, kernels cached across the session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
# Built kernels persist between runs (keyed by the scheduled TIR, so never stale).
os.environ.setdefault("DSL_CACHE_DIR", str(TESTS.parent / ".pytest_cache" / "dsl-kernels"))
# The default schedules are what the suite verifies; a user's tuned records must not swap them
# in (the tuning tests point DSL_TUNING_DB at their own temporary databases).
os.environ.setdefault("DSL_TUNING_DB", "off")
