"""Run one benchmark script under two installations, alternately, and print every figure
of its result side by side: the "before and after in the same run" the docs quote.

Run: .venv/bin/python benchmarks/ab.py --against /path/to/other/venv/bin/python \
         [--runs 3] [--label-this after --label-against before] -- bench_score.py --part throughput

The script (a path, or a name in benchmarks/) runs ``--runs`` times with each interpreter,
rounds interleaved (this, against, this, ...), from ``/`` so each imports its own installed
grudge_stream. Its machine-readable result (the ``RESULT {json}`` line of common.emit, or
the ``JSON name`` block of _workload.emit, or a bare JSON object last) is flattened to ``a.b.c`` numeric leaves; the
table gives each leaf's median per side and the ratio this / against. Figures that are
times (keys ending in ``_ns``, ``_ms``, ``_s``, ``ns_per``...) are better lower, rates
higher: read the ratio with the unit.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import emit  # noqa: E402


def result_of(stdout: str) -> dict[str, Any]:
    lines = stdout.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("RESULT "):
            return json.loads(lines[i][len("RESULT "):])
        if lines[i].startswith("JSON ") and i + 1 < len(lines):
            return json.loads(lines[i + 1])
    for line in reversed(lines):  # a bare JSON object last (bench_score.py --part)
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit("the script printed no RESULT line or JSON block:\n" + stdout[-2000:])


def flatten(d: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(d, (int, float)) and not isinstance(d, bool):
        out[prefix] = float(d)
    return out


def run(python: str, script: str, args: list[str]) -> dict[str, float]:
    res = subprocess.run([python, script, *args], cwd="/", capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{python} {script} exited {res.returncode}:\n{res.stderr[-2000:]}")
    return flatten(result_of(res.stdout))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, help="the other installation's python")
    ap.add_argument("--this", default=sys.executable, help="this installation's python")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--label-this", default="this")
    ap.add_argument("--label-against", default="against")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    # The scripts run from /: every path given relative to here is made absolute.
    script = os.path.abspath(a.script) if os.path.exists(a.script) else os.path.join(HERE, a.script)
    a.this, a.against = (os.path.abspath(p) if os.sep in p else p for p in (a.this, a.against))
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    sides: dict[str, list[dict[str, float]]] = {a.label_this: [], a.label_against: []}
    for r in range(a.runs):
        for label, python in ((a.label_this, a.this), (a.label_against, a.against)):
            sides[label].append(run(python, script, args))
            print(f"# round {r + 1}/{a.runs}: {label} done", file=sys.stderr, flush=True)
    this, other = sides[a.label_this], sides[a.label_against]
    keys = [k for k in this[0] if all(k in s for s in this + other)]
    skip = ("load_avg", "cpus", "runs", "events", "keys", "n_", "seed")
    print(f"{os.path.basename(script)} {' '.join(args)}: medians of {a.runs} interleaved runs; "
          f"load {os.getloadavg()[0]:.1f} at the end")
    w = max([len(k) for k in keys] + [6])
    print(f"{'figure':{w}s} {a.label_this:>12s} {a.label_against:>12s} {'ratio':>7s}")
    summary = {}
    for k in keys:
        if any(k.rsplit('.', 1)[-1].startswith(s) for s in skip):
            continue
        mt = statistics.median(s[k] for s in this)
        mo = statistics.median(s[k] for s in other)
        ratio = mt / mo if mo else float("nan")
        summary[k] = {"this": mt, "against": mo, "ratio": ratio}
        print(f"{k:{w}s} {mt:12.4g} {mo:12.4g} {ratio:7.3f}")
    emit(summary)


if __name__ == "__main__":
    main()
