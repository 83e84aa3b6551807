"""Render the Helm chart (deploy/helm/grudge-stream) with the pinned helm, and regenerate the
plain manifests of deploy/kubernetes/ from it (`make manifests`, or `render.py --write`)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "grudge-stream"
CI_VALUES = ROOT / "deploy" / "helm" / "ci"
HELM = os.environ.get("HELM") or str(ROOT / ".cache" / "tools" / "helm")
TOPOLOGIES = ("abuse_scores", "rate_limit", "heavy_hitters", "heavy_global", "dedup", "known_keys")
# deploy/kubernetes/<file>: (release name, values file). The Secrets beside them are placeholders
# kept by hand: the chart never holds a secret.
GENERATED = {"abuse-scores.yaml": ("abuse-scores", CI_VALUES / "kubernetes.yaml")}
HEADER = """\
# GENERATED from the Helm chart deploy/helm/grudge-stream by `make manifests` (values:
# deploy/helm/ci/{values}); do not edit: change the chart, then regenerate. A test fails when the two
# differ. Also apply abuse-scores-seed.yaml (the secret hash key; once, with a real key) and
# abuse-scores-query-tokens.yaml (the query tokens and signing keys, with real ones).
"""


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([HELM, *args], capture_output=True, text=True, check=check, timeout=120)


def template(release: str, *values: Path, sets: dict[str, str] | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
    args = ["template", release, str(CHART)]
    for v in values:
        args += ["-f", str(v)]
    for k, v in (sets or {}).items():
        args += ["--set", f"{k}={v}"]
    return helm(*args, check=check)


def generated(name: str) -> str:
    release, values = GENERATED[name]
    return HEADER.format(values=values.name) + template(release, values).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="write deploy/kubernetes/ (else: print)")
    args = ap.parse_args()
    for name in GENERATED:
        text = generated(name)
        if args.write:
            (ROOT / "deploy" / "kubernetes" / name).write_text(text)
            print(f"wrote deploy/kubernetes/{name}")
        else:
            sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
