"""Every metric the Grafana dashboard (deploy/grafana) and the alert rules (deploy/prometheus) use
is exported by a running worker: a real worker of each runtime, on the real broker, with
traffic (abusers raised, a bad record dead-lettered, a score query answered), scraped on
/metrics. Renaming a metric in the code without the dashboard and rules fails here, naming it."""
from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "grudge-stream.json"
RULES = ROOT / "deploy" / "prometheus" / "grudge-stream.rules.yml"
METRIC = re.compile(r"\b((?:grudge|process)_[a-z_]+)\b")
# Series a family exports besides its own name (histograms).
SUFFIXES = ("_bucket", "_count", "_sum")


def used_metrics() -> dict[str, set[str]]:
    """Metric name -> where it is used (dashboard panel titles, rule names)."""
    used: dict[str, set[str]] = {}
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            for name in METRIC.findall(target["expr"]):
                used.setdefault(name, set()).add(f"dashboard: {panel['title']}")
    for var in dash["templating"]["list"]:
        for name in METRIC.findall(json.dumps(var.get("query", ""))):
            used.setdefault(name, set()).add(f"dashboard variable {var['name']}")
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            for name in METRIC.findall(rule["expr"]):
                used.setdefault(name, set()).add(f"rule {rule['alert']}")
    return used


def exported(text: str) -> set[str]:
    """The series names a /metrics page declares (# TYPE) or carries samples of."""
    names = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    names |= set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{|\s)", text, re.M))
    return names


def missing(used: dict[str, set[str]], names: set[str]) -> dict[str, set[str]]:
    out = {}
    for name, where in used.items():
        base = next((name[: -len(s)] for s in SUFFIXES if name.endswith(s)), name)
        if name not in names and base not in names:
            out[name] = where
    return out


def test_the_extraction_finds_what_the_files_use() -> None:
    used = used_metrics()
    # One of each kind: a counter, a gauge, a histogram series, a process metric, a rule-only one.
    assert {"grudge_events_total", "grudge_consumer_lag_records", "grudge_query_duration_seconds_bucket",
            "process_resident_memory_bytes", "grudge_restore_budget_exceeded"} <= set(used)
    names = {"grudge_events_total", "grudge_query_duration_seconds"}
    assert missing({"grudge_query_duration_seconds_bucket": {"x"}, "grudge_events_total": {"y"}}, names) == {}
    assert missing({"grudge_renamed_total": {"rule R"}}, names) == {"grudge_renamed_total": {"rule R"}}


@pytest.mark.parametrize("runtime", ["batch", "faust"])
def test_a_running_worker_exports_every_metric_the_dashboard_and_rules_use(harness, runtime) -> None:
    h = harness(partitions=2)
    w = h.start_worker(runtime=runtime)
    w.wait_ready()
    events = h.make_events(3000, seed=11, abusers=3, users=50)
    h.produce(events + [(b"bad-client", b"not json", events[-1][2])])
    h.wait_caught_up()
    url = f"http://127.0.0.1:{w.web_port}"
    with urllib.request.urlopen(f"{url}/v1/score?key=abuser-0", timeout=10) as resp:
        assert resp.status == 200
    # The traffic must reach the series the dashboard plots, not only their declarations.
    series = ("grudge_events_total{", "grudge_dead_letters_by_reason_total{", 'grudge_queries_total{status="200"}',
              "grudge_query_duration_seconds_bucket{", "grudge_alerts_total{")
    bad = re.compile(r'grudge_dead_letters_by_reason_total\{operator="[^"]+",reason="value"\} 1\.0')
    deadline = time.monotonic() + 30
    while True:  # per-partition series are updated as the worker goes: wait for them
        text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
        gone = missing(used_metrics(), exported(text))
        absent = [s for s in series if s not in text] + ([] if bad.search(text) else ["the bad record's reason"])
        if not gone and not absent or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not gone, "used by the dashboard or the rules, not exported by a running worker: " + "; ".join(
        f"{name} ({', '.join(sorted(where))})" for name, where in sorted(gone.items()))
    assert not absent, (absent, [line for line in text.splitlines() if "by_reason" in line or "queries" in line])
