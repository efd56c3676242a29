"""``python -m dsl export`` + ``dsl/cli/remote_run.py``: kernels cross-built for another machine
run there with TVM's runtime alone and are checked against that machine's PyTorch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_export_then_remote_run_checks_results(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "exp"
    from dsl.cli.export import main as export_main

    assert export_main([str(out), "--filter", "resnet50_3x3_s2", "--cores", "1"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [k["kind"] for k in manifest["kernels"]] == ["dx", "dw"]
    data = np.load(out / manifest["kernels"][0]["data"])
    assert sorted(np.unique(data["unpack_index"]).shape) == [data["unpack_index"].size]
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "dsl" / "cli" / "remote_run.py"), str(out),
                          "--threads", "1", "--repeat", "1", "--json", str(tmp_path / "r.json")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert len(rows) == 2 and all(r["rel_err"] <= 1e-5 for r in rows)
