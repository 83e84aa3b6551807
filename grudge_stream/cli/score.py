"""``grudge-stream score``: keys' current scores, asked of a running worker's query API."""
from __future__ import annotations

import argparse
import json
import sys
import time

from grudge_stream.cli.common import add_topology_arguments, settings_from
from grudge_stream.sections import Identity, Serving
from grudge_stream.topology import load_topology


def _score_line(ans: dict) -> str:
    key = ans.get("key") if ans.get("key") is not None else "b64:" + str(ans.get("key_b64"))
    if ans.get("error"):
        return f"{key}  error={ans['error']}  partition={ans.get('partition')}  {ans.get('message', '')}"
    parts = [key, f"score={ans['score']:.6g}" if isinstance(ans.get("score"), float) else f"score={ans.get('score')}"]
    for name in ("raised", "seen", "tokens_available", "partition", "watermark_ms", "next_offset"):
        if name in ans:
            parts.append(f"{name}={ans[name]}")
    if isinstance(ans.get("watermark_ms"), int):
        # Scores live in event time: a quiet partition's watermark stands still, and so do its bans.
        parts.append(f"watermark_age={time.time() - ans['watermark_ms'] / 1000:.0f}s")
    parts.append(f"served_by={ans.get('served_by')}")
    return "  ".join(parts)


def cmd_score(args: argparse.Namespace) -> int:
    """Ask a worker for keys' current scores (``/v1/scores``; any worker forwards to the owner)."""
    import urllib.error
    import urllib.request

    url = args.url
    settings = settings_from(args)
    token_file = args.token_file or Serving.of(settings).query_token_file
    headers = {"Content-Type": "application/json"}
    if token_file:
        from grudge_stream.webauth import TokenFile

        headers["Authorization"] = "Bearer " + TokenFile(token_file).own_token().decode()
    if not url:
        identity = Identity.of(settings)
        if identity.seed is None and identity.seed_file is None and not identity.insecure_public_seed:
            settings.overrides["seed"] = "0" * 32  # only the web settings are read: no sketch is built
        load_topology(args.topology, settings)
        serving = Serving.of(settings)
        host = serving.web_host
        scheme = "https" if serving.web_tls_cert_file else "http"
        url = f"{scheme}://{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{serving.web_port}"
    body = json.dumps({"keys": args.keys}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/v1/scores", data=body, method="POST", headers=headers)
    try:
        try:
            from grudge_stream.webauth import client_tls

            context = client_tls(settings) if url.startswith("https:") else None
            with urllib.request.urlopen(req, timeout=args.timeout, context=context) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            doc = json.loads(exc.read() or b"{}")
    except (OSError, ValueError) as exc:  # nothing listens there: the address is wrong, as for a broker
        print(f"grudge-stream score: no answer from {url}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    results = doc.get("results")
    if not isinstance(results, list):
        print(f"grudge-stream score: {doc.get('error')}: {doc.get('message')}", file=sys.stderr)
        return 1
    for ans in results:
        print(json.dumps(ans, separators=(",", ":")) if args.json else _score_line(ans), flush=True)
    return 0 if all(not a.get("error") for a in results) else 1


def add_score_parser(sub: argparse._SubParsersAction) -> None:
    """``grudge-stream score``."""
    sc = sub.add_parser("score", help="keys' current scores from a running worker (any worker: it "
                        "forwards to the owner); exit 1 if a key could not be answered")
    add_topology_arguments(sc)
    sc.add_argument("keys", nargs="+", metavar="KEY", help="the keys (UTF-8 text)")
    sc.add_argument("--url", default=None, help="a worker's URL (default http://<web_host>:<web_port> "
                    "of the topology's settings)")
    sc.add_argument("--token-file", default=None, help="a file holding the bearer token to present (its "
                    "first; default the query_token_file setting)")
    sc.add_argument("--json", action="store_true", help="one JSON answer per line")
    sc.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the answer")
    sc.set_defaults(func=cmd_score)
