"""Two workers configured exactly as the shipped Kubernetes manifest configures its pods (the
container's command, its environment with Kubernetes' $(VAR) expansion and downward-API pod
name, its secret files), on the real broker: a query sent to the worker that does not own the
key comes back with the owner's answer, through the advertised address, with the token and
the signed members directory the manifest sets up.

What differs from a cluster, and only that: each pod's DNS name (``<pod>.<service>``) is a
loopback address with a port of its own, the secret mounts are files in a temporary
directory, the broker is the test's, and the topics get names of their own (scoped
``GRUDGE_ABUSE_SCORES__*_TOPIC`` variables, as a values file's ``settings`` would add)."""
from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from grudge_devkafka import free_port
from grudge_stream.serving import partition_for
from grudge_stream.topics import create_topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "kubernetes" / "abuse-scores.yaml"
PARTITIONS = 4


def _statefulset() -> dict:
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with kubernetes-validate (the test extra)")
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    (service,) = [d for d in docs if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"]
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]
    return sts


def _pod_env(container: dict, pod: str, mounts: dict[str, Path]) -> dict[str, str]:
    """The container's environment as the kubelet builds it for pod ``pod``: fieldRef
    metadata.name, then $(VAR) expansion of earlier variables; mounted paths mapped."""
    env: dict[str, str] = {}
    for item in container["env"]:
        if "valueFrom" in item:
            assert item["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, item
            value = pod
        else:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(item["value"]))
        for mount, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if value.startswith(mount + "/"):
                value = str(local) + value[len(mount):]
                break
        env[item["name"]] = value
    return env


def _get(url: str, token: str | None = None, data: bytes | None = None) -> tuple[int, object]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except OSError:
        return 0, None


def test_a_query_to_the_non_owner_returns_the_owners_answer_as_the_manifest_deploys_them(
        kafka_bootstrap, tmp_path) -> None:
    sts = _statefulset()
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    service = sts["spec"]["serviceName"]
    mounts = {m["mountPath"]: tmp_path / m["name"] for m in container["volumeMounts"]}
    for local in mounts.values():
        local.mkdir()
    (mounts["/etc/grudge-stream/seed"] / "seed").write_text(secrets.token_hex(16))
    workers_token, client_token = "w" * 12 + secrets.token_hex(8), "g" * 12 + secrets.token_hex(8)
    (mounts["/etc/grudge-stream/query-tokens"] / "tokens").write_text(
        f"workers:{workers_token}\ngateway:{client_token}\n")
    (mounts["/etc/grudge-stream/signing-keys"] / "signing-keys").write_text("workers:" + secrets.token_hex(24) + "\n")

    run = uuid.uuid4().hex[:8]
    topics = {name: f"mf-{run}-{name}" for name in ("source", "alerts", "scores", "dead_letter", "snapshot")}
    create_topics(kafka_bootstrap, {topics["source"]: (PARTITIONS, {})})
    procs: list[tuple[str, int, subprocess.Popen, Path]] = []
    try:
        for ordinal in range(2):
            pod = f"{sts['metadata']['name']}-{ordinal}"
            env = _pod_env(container, pod, mounts)
            port = free_port()
            # The pod's DNS name and its port, as seen from the other pod.
            assert env["GRUDGE_ADVERTISED_URL"] == f"http://{pod}.{service}:{env['GRUDGE_WEB_PORT']}"
            env["GRUDGE_ADVERTISED_URL"] = f"http://127.0.0.1:{port}"
            env["GRUDGE_WEB_PORT"] = str(port)
            env["GRUDGE_WEB_HOST"] = "127.0.0.1"  # not every interface of the test machine
            env["KAFKA_BOOTSTRAP_SERVERS"] = kafka_bootstrap
            env["GRUDGE_REPLICATION_FACTOR"] = "1"  # one broker here
            env["GRUDGE_STATE_DIR"] = str(tmp_path / f"state-{ordinal}")
            for name, topic in topics.items():
                env[f"GRUDGE_ABUSE_SCORES__{name.upper()}_TOPIC"] = topic
            base = {k: v for k, v in os.environ.items() if not k.startswith(("GRUDGE_", "KAFKA_"))}
            log = tmp_path / f"{pod}.log"
            # deploy/Dockerfile: ENTRYPOINT ["grudge-stream", "worker"], the manifest's args after it.
            cmd = [sys.executable, "-m", "grudge_stream.cli", "worker", *container["args"]]
            with open(log, "wb") as f:
                proc = subprocess.Popen(cmd, env={**base, **env}, stdout=f, stderr=subprocess.STDOUT,
                                        cwd=str(tmp_path))
            procs.append((pod, port, proc, log))

        def ready(port: int) -> bool:
            status, body = _get(f"http://127.0.0.1:{port}/ready")  # open to probes, no token
            return status == 200

        deadline = time.monotonic() + 150
        while not all(ready(port) for _, port, _, _ in procs):
            for pod, _, proc, log in procs:
                assert proc.poll() is None, f"{pod} exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, [log.read_text()[-2000:] for *_, log in procs]
            time.sleep(1)

        # Events for keys of every partition, keyed as the workers' murmur2 partitioner expects.
        p = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
        now = int(time.time() * 1000)
        keys = [f"user-{i}" for i in range(64)]
        for i, key in enumerate(keys):
            for j in range(1 + i % 5):
                p.produce(topics["source"], key=key.encode(), value=b'{"outcome":"bad"}', timestamp=now + j)
        assert p.flush(30) == 0

        def owners() -> dict[int, str]:
            """Partition -> the pod that holds it, from each worker's /ready."""
            out: dict[int, str] = {}
            for pod, port, _, _ in procs:
                status, body = _get(f"http://127.0.0.1:{port}/ready")
                for part in (body or {}).get("assigned", []) if isinstance(body, dict) else []:
                    out[int(part)] = pod
            return out

        deadline = time.monotonic() + 60
        while len(owners()) < PARTITIONS:
            assert time.monotonic() < deadline, owners()
            time.sleep(1)
        held = owners()
        assert set(held.values()) == {pod for pod, *_ in procs}, f"both pods hold partitions: {held}"

        for asked_pod, asked_port, _, _ in procs:
            remote = [k for k in keys if held[partition_for(k.encode(), PARTITIONS)] != asked_pod]
            assert remote
            status, _ = _get(f"http://127.0.0.1:{asked_port}/v1/scores", None, json.dumps(remote).encode())
            assert status == 401, "the query API needs a token"
            deadline = time.monotonic() + 60
            while True:
                status, answer = _get(f"http://127.0.0.1:{asked_port}/v1/scores", client_token,
                                      json.dumps(remote).encode())
                results = answer.get("results", []) if isinstance(answer, dict) else []
                if status == 200 and results and all(r.get("score", 0) > 0 for r in results):
                    break  # every event applied by the owners
                assert time.monotonic() < deadline, (status, answer)
                time.sleep(1)
            for key, r in zip(remote, results):
                owner = held[partition_for(key.encode(), PARTITIONS)]
                owner_port = next(port for pod, port, _, _ in procs if pod == owner)
                # served_by / forwarded_by: the workers' advertised addresses.
                assert r["key"] == key and r["served_by"] == f"http://127.0.0.1:{owner_port}", r
                assert r.get("forwarded_by") == f"http://127.0.0.1:{asked_port}", r
                # The same answer as the owner's own.
                status, direct = _get(f"http://127.0.0.1:{owner_port}/v1/scores", client_token,
                                      json.dumps([key]).encode())
                assert status == 200 and abs(direct["results"][0]["score"] - r["score"]) < 0.05, (direct, r)
    finally:
        for _, _, proc, _ in procs:
            if proc.poll() is None:
                proc.terminate()
        for pod, _, proc, log in procs:
            try:
                assert proc.wait(60) == 0, log.read_text()[-3000:]
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
