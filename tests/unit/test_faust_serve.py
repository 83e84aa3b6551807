"""``grudge.serve`` (live reads of embedded state on a Faust app's web server) without a
broker: the pages it mounts, the access rules checked against the app's web settings as the
worker runs them, and the partitioner check fed from the events the agents hand the state.
The reads themselves, routed between two instances, are tested on the real broker
(tests/integration/test_embedded_reads.py)."""
from __future__ import annotations

import types

import faust
import pytest

from grudge_stream import faust as grudge
from grudge_stream.exceptions import ConfigError
from grudge_stream.hashkey import HashKey
from grudge_stream.serving import PartitionerCheck, partition_for
from grudge_stream.settings import Settings
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig
from grudge_stream.state import ScoreState

KEY = HashKey.parse("00112233445566778899aabbccddeeff")
SKETCH = ScoreSketchConfig(levels=4, cells_per_level=1000, decay=Exponential(0.01), lo=0.0, hi=1.0,
                           aggregator="min", hasher="siphash")


def make(name: str, **app_kw) -> tuple[faust.App, ScoreState]:
    app = faust.App(f"serve-{name}", broker="kafka://127.0.0.1:1", store="memory://", **app_kw)
    state = grudge.scores(app, f"{name}-abuse", source="logins", sketch=SKETCH, raise_at=0.5, clear_at=0.25,
                          hash_key=KEY, settings=Settings(environ={}))
    return app, state


def test_serve_mounts_the_score_pages_of_every_state_attached_before_or_after():
    app, first = make("pages")
    web = grudge.serve(app)
    later = grudge.scores(app, "pages-later", source="logins", sketch=SKETCH, raise_at=0.5, clear_at=0.25,
                          hash_key=KEY)
    paths = set(app.web.views)
    for state in (first, later):
        assert {f"/grudge/{state.name}/v1/score", f"/grudge/{state.name}/v1/scores"} <= paths
        assert web.path(state) == f"/grudge/{state.name}"
    with pytest.raises(ValueError, match="already served"):
        grudge.serve(app)
    other, _ = make("prefix")
    grudge.serve(other, prefix="/sketch/")
    assert "/sketch/prefix-abuse/v1/score" in other.web.views
    with pytest.raises(ValueError, match="prefix"):
        grudge.serve(make("bad")[0], prefix="grudge")
    with pytest.raises(ConfigError, match="key_partitioner"):
        grudge.serve(make("badpart")[0], key_partitioner="fnv")


def test_without_a_token_file_only_a_loopback_bind_is_served(tmp_path):
    app, _ = make("open")  # Faust binds every address by default
    web = grudge.serve(app)
    with pytest.raises(ConfigError) as refused:
        web.start()
    msg = str(refused.value)
    assert "0.0.0.0" in msg and "token_file" in msg and "--web-bind 127.0.0.1" in msg, msg
    assert len(msg.splitlines()) == 1

    # What `faust worker --web-bind 127.0.0.1 --web-host 127.0.0.1 --web-port 6071` sets.
    app, _ = make("loop", web_bind="127.0.0.1", canonical_url="http://127.0.0.1:6071")
    web = grudge.serve(app)
    web.start()
    assert web.access.tokens is None and web.base_url == "http://127.0.0.1:6071"

    tokens = tmp_path / "tokens"
    tokens.write_text("reader:" + "r" * 32 + "\n")
    app2, _ = make("tokens")
    web2 = grudge.serve(app2, token_file=str(tokens))
    web2.start()  # any bind address with tokens
    assert web2.access.authorize({}, "10.0.0.1")[1][0] == 401
    assert web2.access.authorize({"Authorization": "Bearer " + "x" * 32}, "10.0.0.1")[1][0] == 403
    assert web2.access.authorize({"Authorization": "Bearer " + "r" * 32}, "10.0.0.1") == ("reader", None)
    app3, _ = make("insecure")
    web3 = grudge.serve(app3, insecure_open=True)
    web3.start()
    assert web3.access.tokens is None


def test_the_keys_handed_to_the_state_check_the_partitioner():
    app, state = make("sample")
    web = grudge.serve(app)
    check = PartitionerCheck("murmur2", "logins")
    state.core = types.SimpleNamespace(partition_count=4, partitioner_check=check)  # a started state
    try:
        key = b"mallory"
        right = partition_for(key, 4, "murmur2")
        web.sample(state, types.SimpleNamespace(key=key, partition=right))
        assert check.status() == "verified"
        wrong = partition_for(key, 4, "crc32")
        if wrong == right:
            wrong = (right + 1) % 4
        web.sample(state, types.SimpleNamespace(key=key, partition=wrong))
        assert check.status() == "mismatched"
    finally:
        state.core = None
    # Inside an agent the state's position comes with the sampling hook.
    assert state.current_position is not None and state.context.current_position is state.current_position
