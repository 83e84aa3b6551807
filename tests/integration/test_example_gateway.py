"""The example in examples/gateway runs end to end: a client blocked, forgiven, denied by hand."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DRIVE = Path(__file__).resolve().parents[2] / "examples" / "gateway" / "drive.py"


def test_gateway_example_blocks_forgives_and_denies(kafka_bootstrap, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRUDGE_")}
    env["KAFKA_BOOTSTRAP_SERVERS"] = kafka_bootstrap
    r = subprocess.run([sys.executable, str(DRIVE)], capture_output=True, text=True, timeout=240, env=env,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "403 blocked (score" in out
    assert "grudge-stream score abuse_scores mallory: mallory  score=" in out and "raised=True" in out
    assert "mallory forgiven: her next attempt is checked again: 401" in out
    assert "trudy: 403 blocked (reason override:deny)" in out
