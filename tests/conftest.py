"""Shared test setup: reference/helpers importable, kernels cached across the session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
# Built kernels persist between runs (keyed by the scheduled TIR, so never stale).
os.environ.setdefault("DSL_CACHE_DIR", str(TESTS.parent / ".pytest_cache" / "dsl-kernels"))
