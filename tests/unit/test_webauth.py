"""Access to the query API without a broker: token files (parsing, rotation without a restart,
a bad rewrite keeps the old tokens), 401 / 403 / 429 from ScoreQueries.prepare, the bind check."""
from __future__ import annotations

import os
import time

import pytest

from grudge_stream import webauth
from grudge_stream.exceptions import ConfigError
from grudge_stream.metrics import Metrics
from grudge_stream.serving import FORWARDED_HEADER, ScoreQueries
from grudge_stream.topology import Settings
from grudge_stream.webauth import QueryAccess, QueryBudget, TokenFile, is_loopback, parse_tokens

A = "worker:" + "a" * 32
B = "gateway:" + "b" * 32


def _rewrite(path, text: str) -> None:
    path.write_text(text)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a visible change


def test_token_file_lines_names_and_refusals() -> None:
    assert parse_tokens("# c\n\n" + A + "\n" + "c" * 20 + "\n", "f") == {
        "worker": b"a" * 32, "token-4": b"c" * 20}
    for bad in ("", "# only\n", "x:short\n", "x:" + "é" * 20 + "\n", f"{A}\n{A}\n", "x:" + "a b" * 10 + "\n"):
        with pytest.raises(ConfigError):
            parse_tokens(bad, "f")


def test_tokens_rotate_without_restart_and_a_bad_rewrite_keeps_the_old(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(webauth, "RECHECK_S", 0.0)
    f = tmp_path / "tokens"
    f.write_text(A + "\n")
    tf = TokenFile(str(f))
    assert tf.identify(b"a" * 32) == "worker" and tf.identify(b"b" * 32) is None
    _rewrite(f, A + "\n" + B + "\n")
    assert tf.identify(b"b" * 32) == "gateway"
    _rewrite(f, "gateway:short\n")  # refused: the previous tokens stay
    assert tf.identify(b"b" * 32) == "gateway"
    _rewrite(f, B + "\n")
    assert tf.identify(b"a" * 32) is None and tf.own_token() == b"b" * 32
    with pytest.raises(ConfigError):
        TokenFile(str(tmp_path / "missing"))


def test_budget_refills_and_bounds_its_clients() -> None:
    b = QueryBudget(10.0, 20.0, max_clients=3)
    assert b.charge("x", 20, now=0.0) == 0.0
    assert b.charge("x", 5, now=0.0) == pytest.approx(0.5)
    assert b.charge("x", 5, now=0.5) == 0.0
    assert b.charge("big", 1000, now=0.0) == 0.0  # a full bucket lets one large request through...
    assert b.charge("big", 1, now=1.0) > 90  # ...and its debt is paid back before the next
    for c in "pqrs":
        b.charge(c, 1, now=0.0)
    assert len(b._buckets) == 3


def _queries(tmp_path, **sets) -> tuple[ScoreQueries, Metrics]:
    f = tmp_path / "tokens"
    f.write_text(A + "\n" + B + "\n")
    m = Metrics()
    values = {"query_token_file": str(f), **sets}
    access = QueryAccess.from_settings(Settings(values, environ={}), m)
    return ScoreQueries(lambda p: None, lambda: 4, access=access), m


def _refused(m: Metrics, reason: str) -> float:
    return m.registry.get_sample_value("grudge_query_refused_total", {"reason": reason}) or 0.0


def test_prepare_answers_401_403_and_429(tmp_path) -> None:
    q, m = _queries(tmp_path, query_rate_per_s="1", query_burst="3")
    status, doc, headers = q.prepare("GET", "/v1/score", "key=a", b"", {}, "10.0.0.1")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    for bad in ("Basic " + "b" * 32, "Bearer", "Bearer  ", "b" * 32):
        assert q.prepare("GET", "/v1/score", "key=a", b"", {"Authorization": bad}, "p")[0] == 401
    for wrong in ("Bearer " + "c" * 32, "Bearer " + "é" * 40, "Bearer " + "b" * 100_000):
        assert q.prepare("GET", "/v1/score", "key=a", b"", {"Authorization": wrong}, "p")[0] == 403
    ok = {"Authorization": "Bearer " + "b" * 32}
    assert q.prepare("GET", "/v1/scores", "key=a&key=b", b"", ok, "p") == ([b"a", b"b"], True, False)
    assert q.prepare("GET", "/v1/score", "key=a", b"", ok, "p")[0] == [b"a"]
    status, doc, headers = q.prepare("GET", "/v1/score", "key=a", b"", ok, "p")
    assert status == 429 and doc["error"] == "too_many_requests" and int(headers["Retry-After"]) >= 1
    # The workers' own token (the file's first) forwarding: charged at the first worker, not here.
    fwd = {"Authorization": "Bearer " + "a" * 32, FORWARDED_HEADER: "http://w:1"}
    for _ in range(5):
        assert q.prepare("GET", "/v1/score", "key=a", b"", fwd, "p")[0] == [b"a"]
    # A client marking its request as forwarded is still charged.
    assert q.prepare("GET", "/v1/score", "key=a", b"", {**ok, FORWARDED_HEADER: "x"}, "p")[0] == 429
    assert (_refused(m, "unauthenticated"), _refused(m, "forbidden"), _refused(m, "budget")) == (5, 3, 2)
    time.sleep(0)  # (the budget's clock is monotonic; nothing else waits)


def test_the_bind_check(tmp_path, caplog) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("pod-1")
    open_local = QueryAccess.from_settings(Settings({}, environ={}))
    assert open_local.tokens is None and open_local.authorize({}, "127.0.0.1")[1] is None
    with pytest.raises(ConfigError, match="query_token_file"):
        QueryAccess.from_settings(Settings({"web_host": "0.0.0.0"}, environ={}))
    with caplog.at_level("WARNING"):
        QueryAccess.from_settings(Settings({"web_host": "0.0.0.0", "insecure_open_queries": "true"}, environ={}))
    assert "insecure_open_queries" in caplog.text
    q, _ = _queries(tmp_path, web_host="0.0.0.0")
    assert q.access.tokens is not None


def test_a_refused_request_body_is_never_read(tmp_path) -> None:
    q, _ = _queries(tmp_path)
    reads = []

    def body() -> bytes:
        reads.append(1)
        return b'["a"]'

    assert q.prepare("POST", "/v1/scores", "", body, {}, "p")[0] == 401
    assert q.prepare("POST", "/v1/scores", "", body, {"Authorization": "Bearer " + "c" * 32}, "p")[0] == 403
    assert reads == []
    ok = {"Authorization": "Bearer " + "b" * 32}
    assert q.prepare("POST", "/v1/scores", "", body, ok, "p") == ([b"a"], True, False) and reads == [1]


def test_token_and_signing_key_files_share_one_parser_and_its_messages() -> None:
    from grudge_stream.signing import SigningKeys

    assert parse_tokens("# comment\n\n" + "t" * 20 + "\ngateway:" + "g" * 20 + "\n", "f") == {
        "token-3": b"t" * 20, "gateway": b"g" * 20}
    for text, needle in (("a:" + "x" * 8, "f line 1: a token is 16-512 printable ASCII"),
                         (f"a:{'x' * 20}\na:{'y' * 20}", "f line 2: the name 'a' is used twice"),
                         ("# nothing\n", "f holds no token")):
        with pytest.raises(ConfigError, match=needle):
            parse_tokens(text, "f")
    with pytest.raises(ConfigError, match="k line 1: a key line is name:key"):
        SigningKeys.parse("x" * 40, "k")  # a signing key needs its name (the signer)
    with pytest.raises(ConfigError, match="k line 1: a key is 32-512 printable"):
        SigningKeys.parse("w:" + "x" * 16, "k")


def test_without_tokens_only_a_members_address_forwards_past_the_budget() -> None:
    """insecure_open_queries: the forwarded mark alone proves nothing; a request marked so
    passes the budget only from the address of a worker in the members directory."""
    from grudge_stream.serving import MembersDirectory

    access = QueryAccess.from_settings(Settings({"web_host": "0.0.0.0", "insecure_open_queries": "true",
                                                 "query_rate_per_s": "1", "query_burst": "2"}, environ={}))
    directory = MembersDirectory("127.0.0.1:1", "app", "w2", "http://127.0.0.1:6067")  # not started
    directory.members["w1"] = {"url": "http://127.0.0.1:6066", "partitions": [0]}
    q = ScoreQueries(lambda p: None, lambda: 4, access=access, directory=directory)
    fwd = {FORWARDED_HEADER: "http://127.0.0.1:6067"}
    for _ in range(6):  # a worker forwarding: charged where its client asked
        assert q.prepare("GET", "/v1/score", "key=a", b"", fwd, "127.0.0.1")[0] == [b"a"]
    # Anyone else marking its requests forwarded is charged like any client.
    got = [q.prepare("GET", "/v1/score", "key=a", b"", fwd, "203.0.113.9")[0] for _ in range(4)]
    assert got[:2] == [[b"a"], [b"a"]] and got[2:] == [429, 429]
    assert not q.peer_is_member("") and ScoreQueries(lambda p: None, lambda: 4).peer_is_member("127.0.0.1") is False
