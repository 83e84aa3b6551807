"""The Helm chart (deploy/helm/grudge-stream), checked with the real tools, pinned by the Makefile
(`make deploy-check` builds or fetches them into .cache/tools):

- `helm lint --strict` and `helm template` for every shipped topology, with the default values on
  both runtimes and with the secured values (SASL over TLS, HTTPS, signing keys, exactly-once,
  the Prometheus Operator objects, the dashboard, KEDA);
- every rendered object validated: the Kubernetes kinds against the Kubernetes JSON schemas
  (`kubernetes-validate`, strict: an unknown field is an error), the ServiceMonitor,
  PrometheusRule and ScaledObject against their CRDs' own schemas (from the Prometheus Operator's
  and KEDA's Go modules), made strict the same way;
- the refusals (no hash key Secret, exactly-once on Faust, KEDA above the partition count, a
  secret in `settings`), the sizing table, the startup probe against `brokerWaitSeconds`;
- deploy/kubernetes/ is the chart's rendering (`make manifests`), never a second copy;
- the alert rules pass `promtool check rules` and their unit tests (`promtool test rules`).

Without the tools these tests skip, unless GRUDGE_DEPLOY_CHECK=1 (`make deploy-check`), where a
missing tool fails.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("grudge_chart_render", Path(__file__).with_name("render.py"))
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)  # type: ignore[union-attr]

TOOLS = ROOT / ".cache" / "tools"
PROMTOOL = os.environ.get("PROMTOOL") or str(TOOLS / "promtool")
CRDS = Path(os.environ.get("CRDS") or TOOLS / "crds")
REQUIRED = os.environ.get("GRUDGE_DEPLOY_CHECK") == "1"
CI = ROOT / "deploy" / "helm" / "ci"
K8S_VERSIONS = ("1.29.0", "latest")
VARIANTS = {
    "default-batch": ([CI / "default.yaml"], {"runtime": "batch"}),
    "default-faust": ([CI / "default.yaml"], {"runtime": "faust"}),
    "secured": ([CI / "secured.yaml"], {}),
}
CRD_FILES = {"ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
             "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
             "ScaledObject": "keda.sh_scaledobjects.yaml"}


def need(path: str | Path, what: str) -> None:
    if not Path(path).is_file():
        message = f"{what} not found at {path}: run `make deploy-tools`"
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def helm_ok() -> None:
    need(render.HELM, "helm")


@lru_cache(maxsize=None)
def rendered(topology: str, variant: str) -> tuple[dict, ...]:
    values, sets = VARIANTS[variant]
    out = render.template(f"t-{topology.replace('_', '-')}", *values, sets={"topology": topology, **sets})
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def _strict(schema: dict) -> dict:
    """A CRD's structural schema with unknown fields refused (the API server prunes them
    silently, which hides a misspelt field)."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str) and pattern.startswith("^(?i)"):  # Go's regexp takes flags anywhere
                node["pattern"] = "(?i)^" + pattern[5:]
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


@lru_cache(maxsize=None)
def crd_schema(kind: str) -> dict:
    path = CRDS / CRD_FILES[kind]
    need(path, f"the {kind} CRD")
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served") and v.get("storage")]
    return _strict(version["schema"]["openAPIV3Schema"])


def validate(doc: dict) -> None:
    kind = doc["kind"]
    if kind in CRD_FILES:
        import jsonschema

        jsonschema.Draft7Validator(crd_schema(kind)).validate(doc)  # an OpenAPI v3 structural schema
        return
    import kubernetes_validate as kv
    from kubernetes_validate import utils

    for version in K8S_VERSIONS:
        version = utils.latest_version() if version == "latest" else version
        try:
            kv.validate(doc, version, strict=True)
        except utils.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{kind}/{doc['metadata']['name']} invalid for Kubernetes {version}: {path}: {exc.message}")


# -- lint and render ------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("topology", render.TOPOLOGIES)
def test_lint(helm_ok, topology: str, variant: str) -> None:
    values, sets = VARIANTS[variant]
    args = ["lint", "--strict", str(render.CHART), "--set", f"topology={topology}"]
    for v in values:
        args += ["-f", str(v)]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    out = render.helm(*args, check=False)
    assert out.returncode == 0 and "0 chart(s) failed" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("topology", render.TOPOLOGIES)
def test_every_rendered_object_validates(helm_ok, topology: str, variant: str) -> None:
    docs = rendered(topology, variant)
    kinds = sorted(d["kind"] for d in docs)
    expected = {"NetworkPolicy", "PodDisruptionBudget", "Service", "StatefulSet"}
    if variant == "secured":
        expected |= {"ConfigMap", "PrometheusRule", "ScaledObject", "ServiceMonitor"}
    assert set(kinds) == expected, kinds
    for doc in docs:
        validate(doc)
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == [topology]
    env = {e["name"]: e for e in container["env"]}
    assert "GRUDGE_SEED" not in env and "GRUDGE_SASL_PASSWORD" not in env  # secrets only as files
    assert env["GRUDGE_RUNTIME"]["value"] == ("batch" if variant != "default-faust" else "faust")
    assert env["GRUDGE_REPLICATION_FACTOR"]["value"] == "3"


def test_the_validators_catch_a_misspelt_field(helm_ok) -> None:
    import jsonschema
    from kubernetes_validate import utils

    docs = rendered("abuse_scores", "secured")
    sts = copy.deepcopy(next(d for d in docs if d["kind"] == "StatefulSet"))
    c = sts["spec"]["template"]["spec"]["containers"][0]
    c["readinesProbe"] = c.pop("readinessProbe")
    with pytest.raises(pytest.fail.Exception):
        validate(sts)
    smon = copy.deepcopy(next(d for d in docs if d["kind"] == "ServiceMonitor"))
    smon["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        validate(smon)
    assert utils.latest_version()


@pytest.mark.parametrize("sets, message", [
    ({"queries.tokens.existingSecret": "t"}, "hashKey.existingSecret"),
    ({"hashKey.existingSecret": "k"}, "queries.tokens.existingSecret"),
    ({"hashKey.existingSecret": "k", "queries.tokens.existingSecret": "t", "runtime": "faust",
      "kafka.exactlyOnce": "true"}, "kafka.exactlyOnce needs runtime=batch"),
    ({"hashKey.existingSecret": "k", "queries.tokens.existingSecret": "t", "keda.enabled": "true",
      "keda.maxReplicas": "9", "settings.app_id": "a", "settings.source_topic": "s"}, "above partitions (8)"),
    ({"hashKey.existingSecret": "k", "queries.tokens.existingSecret": "t", "settings.seed": "00"}, "/settings"),
    ({"hashKey.existingSecret": "k", "queries.tokens.existingSecret": "t", "runtime": "flink"}, "/runtime"),
    ({"hashKey.existingSecret": "k", "queries.tokens.existingSecret": "t",
      "kafka.securityProtocol": "SASL_SSL"}, "kafka.sasl.existingSecret"),
])
def test_refusals(helm_ok, sets: dict, message: str) -> None:
    out = render.template("r", sets=sets, check=False)
    assert out.returncode != 0 and message in out.stderr, out.stderr


# -- sizing and probes ----------------------------------------------------------------------------


def sizing_table() -> dict[tuple[str, str], tuple[int, int]]:
    """docs/operations.md "Sizing": (topology, runtime) -> (request MiB, limit MiB)."""
    text = (ROOT / "docs" / "operations.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (batch|faust) \|(?:[^|\n]*\|){4} (\d+) Mi \| (\d+) Mi \|$", text, re.M)
    return {(t, r): (int(req), int(lim)) for t, r, req, lim in rows}


def test_resources_come_from_the_sizing_table(helm_ok) -> None:
    table = sizing_table()
    assert len(table) == 2 * len(render.TOPOLOGIES), sorted(table)
    for (topology, runtime), (request, limit) in table.items():
        docs = rendered(topology, "default-batch" if runtime == "batch" else "default-faust")
        sts = next(d for d in docs if d["kind"] == "StatefulSet")
        res = sts["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert res["requests"]["memory"] == f"{request}Mi", (topology, runtime, res)
        assert res["limits"]["memory"] == f"{limit}Mi", (topology, runtime, res)


@pytest.mark.parametrize("wait", [30, 120, 600])
def test_the_startup_probe_outlasts_the_broker_wait(helm_ok, wait: int) -> None:
    out = render.template("p", CI / "default.yaml", sets={"brokerWaitSeconds": str(wait)})
    sts = next(d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "StatefulSet")
    c = sts["spec"]["template"]["spec"]["containers"][0]
    probe = c["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= wait + 60
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GRUDGE_BROKER_WAIT_S"] == str(wait)


# -- one copy of everything -----------------------------------------------------------------------


def test_the_plain_manifests_are_the_charts_rendering(helm_ok) -> None:
    for name in render.GENERATED:
        committed = (ROOT / "deploy" / "kubernetes" / name).read_text()
        assert committed == render.generated(name), f"deploy/kubernetes/{name} differs from the chart: `make manifests`"


def test_the_chart_ships_the_same_dashboard_and_rules() -> None:
    files = render.CHART / "files"
    assert (files / "grudge-stream-dashboard.json").read_bytes() == (ROOT / "deploy/grafana/grudge-stream.json").read_bytes()
    assert (files / "grudge-stream.rules.yml").read_bytes() == \
        (ROOT / "deploy/prometheus/grudge-stream.rules.yml").read_bytes()
    json.loads((files / "grudge-stream-dashboard.json").read_text())


# -- alert rules ----------------------------------------------------------------------------------


def test_the_rules_pass_promtool() -> None:
    need(PROMTOOL, "promtool")
    rules = ROOT / "deploy" / "prometheus"
    for args in (["check", "rules", "grudge-stream.rules.yml"], ["test", "rules", "grudge-stream.rules.test.yml"]):
        out = subprocess.run([PROMTOOL, *args], cwd=rules, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr
