"""One version source (the package metadata), and what the wheel asks of a user's machine."""
from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import requires, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_one_version_everywhere() -> None:
    import grudge_stream

    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert version("grudge-stream") == declared == grudge_stream.__version__
    out = subprocess.run([sys.executable, "-m", "grudge_stream.cli", "--version"], capture_output=True,
                         text=True, timeout=60, cwd="/")
    assert out.stdout.strip() == f"grudge-stream {declared}", out
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(declared)} — \d{{4}}-\d\d-\d\d$", changelog, re.M), \
        f"CHANGELOG.md has no '## {declared} — <date>' section"
    # Nothing else names a version of its own (the image tags follow the release).
    for path in ("deploy/README.md", "grudge_stream/__init__.py"):
        text = (ROOT / path).read_text()
        assert not re.search(r"\b0\.1\.0\b", text), path


def test_test_only_dependencies_stay_out_of_the_runtime_requirements() -> None:
    runtime = [r for r in requires("grudge-stream") or [] if "extra ==" not in r]
    names = {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in runtime}
    assert "mmh3" not in names and "pytest" not in names, runtime
    assert {"numpy", "faust-streaming", "confluent-kafka", "prometheus-client"} <= names
