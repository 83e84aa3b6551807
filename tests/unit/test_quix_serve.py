"""``grudge_stream.quix.serve`` (live reads of a Quix application's states over HTTP)
without a broker: the arguments, the access rules against the address served, the paths
the server routes and the answers before a state has started, the server's port and its
close. The reads themselves, routed between two instances, are tested on the real broker
(tests/integration/test_embedded_quix_reads.py)."""
from __future__ import annotations

import json
import types
import urllib.error
import urllib.request

import pytest

pytest.importorskip("quixstreams", reason="Quix Streams is not installed (pip install 'grudge-stream[quix]')")

from quixstreams import Application  # noqa: E402

from grudge_stream import quix as grudge  # noqa: E402
from grudge_stream.exceptions import ConfigError  # noqa: E402
from grudge_stream.hashkey import HashKey  # noqa: E402
from grudge_stream.serving import PartitionerCheck, partition_for  # noqa: E402
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig  # noqa: E402
from grudge_stream.state import ScoreState  # noqa: E402

KEY = HashKey.parse("00112233445566778899aabbccddeeff")
SKETCH = ScoreSketchConfig(levels=2, cells_per_level=500, decay=Exponential(0.01), lo=0.0, hi=1.0, hasher="siphash")


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch):
    for name in ("GRUDGE_QUERY_TOKEN_FILE", "GRUDGE_WEB_HOST", "GRUDGE_WEB_PORT", "GRUDGE_ADVERTISED_URL",
                 "GRUDGE_WEB_TLS_CERT_FILE", "GRUDGE_WEB_TLS_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def app(tmp_path):
    return Application(broker_address="127.0.0.1:1", consumer_group="unit", state_dir=str(tmp_path),
                       loglevel=None)


def bound(app, name="abuse"):
    return grudge.bind(app, ScoreState(name, source_topic="logins", hash_key=KEY, sketch=SKETCH, raise_at=0.5,
                                       clear_at=0.25))


def get(url: str, token: str | None = None) -> tuple[int, dict | str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            status, data = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, data = e.code, e.read()
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data.decode()


def test_serve_checks_its_arguments(app, tmp_path):
    with pytest.raises(ConfigError, match="key_partitioner"):
        grudge.serve(app, key_partitioner="fnv")
    with pytest.raises(ValueError, match="^prefix"):
        grudge.serve(app, prefix="grudge")
    with pytest.raises(ValueError, match="^port"):
        grudge.serve(app, port=70_000)
    with pytest.raises(ValueError, match="^port"):
        grudge.serve(app, port="6066")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^app must be a quixstreams.Application"):
        grudge.serve(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="^token_file: query_token_file .* cannot be read"):
        grudge.serve(app, token_file=str(tmp_path / "missing"))
    grudge.serve(app, port=0)
    with pytest.raises(ValueError, match="^app: live reads are already served"):
        grudge.serve(app, port=0)


def test_without_a_token_file_only_a_loopback_address_is_served(tmp_path):
    def fresh(name):
        return Application(broker_address="127.0.0.1:1", consumer_group=name, state_dir=str(tmp_path / name),
                           loglevel=None)

    with pytest.raises(ConfigError) as refused:
        grudge.serve(fresh("open"), host="0.0.0.0", port=0)
    msg = str(refused.value)
    assert msg.startswith("host: live reads served on 0.0.0.0") and "token_file" in msg, msg
    assert len(msg.splitlines()) == 1
    assert grudge.serve(fresh("loop"), port=0).access.tokens is None  # 127.0.0.1 by default
    assert grudge.serve(fresh("insecure"), host="0.0.0.0", port=0, insecure_open=True).access.tokens is None

    tokens = tmp_path / "tokens"
    tokens.write_text("reader:" + "r" * 32 + "\n")
    web = grudge.serve(fresh("tokens"), host="0.0.0.0", port=0, token_file=str(tokens))
    assert web.access.authorize({}, "10.0.0.1")[1][0] == 401
    assert web.access.authorize({"Authorization": "Bearer " + "x" * 32}, "10.0.0.1")[1][0] == 403
    assert web.access.authorize({"Authorization": "Bearer " + "r" * 32}, "10.0.0.1") == ("reader", None)


def test_a_serving_section_is_what_the_other_arguments_default_to(tmp_path):
    from grudge_stream.sections import Serving

    def fresh(name):
        return Application(broker_address="127.0.0.1:1", consumer_group=name, state_dir=str(tmp_path / name),
                           loglevel=None)

    web = grudge.serve(fresh("section"), serving=Serving(web_host="0.0.0.0", web_port=0, insecure_open_queries=True,
                                                          query_rate_per_s=5, advertised_url="http://me:1"))
    assert (web.host, web.port, web.access.tokens, web.access.budget.rate) == ("0.0.0.0", 0, None, 5.0)
    assert web.serving.advertised_url == "http://me:1"
    with pytest.raises(ConfigError, match="^host: live reads served on 0.0.0.0"):
        grudge.serve(fresh("refused"), serving=Serving(web_host="0.0.0.0"), port=0)
    with pytest.raises(TypeError, match="Serving"):
        grudge.serve(fresh("wrong"), serving={"web_port": 0})


def test_the_server_routes_each_state_and_answers_503_until_it_started(app, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("reader:" + "r" * 32 + "\n")
    first = bound(app)
    web = grudge.serve(app, port=0, token_file=str(tokens), prefix="/sketch/")
    later = bound(app, "a b")  # bound after serve: served too
    web.start()
    try:
        base = f"http://127.0.0.1:{web.server.port}"
        assert web.base_url == base
        assert web.url(first) == f"{base}/sketch/abuse" and web.url(later) == f"{base}/sketch/a%20b"
        for path in ("/sketch/abuse/v1/score?key=eve", "/sketch/a%20b/v1/scores?key=eve"):
            status, body = get(base + path, "r" * 32)
            assert status == 503 and body["error"] == "not_ready", body
        # Only the states' score paths: no health pages, no other state, nothing else.
        for path in ("/sketch/abuse/ready", "/sketch/abuse/metrics", "/sketch/other/v1/score?key=eve",
                     "/ready", "/v1/score?key=eve", "/grudge/abuse/v1/score?key=eve"):
            assert get(base + path, "r" * 32)[0] == 404, path
    finally:
        web.close()
    assert web.server is None


def test_a_port_in_use_is_a_config_error_naming_it(app):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        web = grudge.serve(app, port=taken.getsockname()[1])
        with pytest.raises(ConfigError, match=r"^port: live reads cannot be served on 127\.0\.0\.1:"):
            web.start()
    finally:
        taken.close()


def test_records_applied_while_served_check_the_partitioner(app):
    """Served, a step applies each record under its partition's lock and samples its key
    against the reads' partitioner (as the Faust binding samples the agents' events)."""
    b = bound(app)
    check = PartitionerCheck("murmur2", "logins")
    key = b"mallory"
    right = partition_for(key, 4, "murmur2")
    wrong = (right + 1) % 4
    locked: list[bool] = []

    class Slot:
        lock = __import__("threading").Lock()

    slots = {right: Slot(), wrong: Slot()}
    b.state.core = types.SimpleNamespace(partition_count=4, partitioner_check=check, slots=slots)  # a started state
    try:
        def apply(k, v, p, o, t):
            locked.append(slots[p].lock.locked())
            return 1.0

        b.served = True
        assert b._apply_served(apply, key, None, right, 0, 1) == 1.0
        assert check.status() == "verified"
        b._apply_served(apply, key, None, wrong, 64 * 100 + 1, 1)  # not a sampled offset
        assert check.status() == "verified"
        b._apply_served(apply, key, None, wrong, 64 * 100, 1)
        assert check.status() == "mismatched"
        assert locked == [True, True, True]
    finally:
        b.state.core = None
