"""The core package never imports Quix Streams (an optional extra: grudge-stream[quix]);
only grudge_stream.quix does. Runs whether or not Quix Streams is installed."""
from __future__ import annotations

import json
import subprocess
import sys


def test_the_core_package_does_not_import_quixstreams() -> None:
    """Every module of the installed package except grudge_stream.quix and its modules
    imported: no quixstreams (whether or not it is installed)."""
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import grudge_stream\n"
        "failed = {}\n"
        # pkgutil.walk_packages, but not into grudge_stream.quix (a package: walk_packages
        # would import it to look for its modules).
        "def walk(path, prefix):\n"
        "    for m in pkgutil.iter_modules(path, prefix):\n"
        "        if m.name == 'grudge_stream.quix':\n"
        "            continue\n"
        "        try:\n"
        "            module = importlib.import_module(m.name)\n"
        "        except Exception as exc:\n"
        "            failed[m.name] = repr(exc)\n"
        "            continue\n"
        "        if m.ispkg:\n"
        "            walk(module.__path__, m.name + '.')\n"
        "walk(grudge_stream.__path__, 'grudge_stream.')\n"
        "print(json.dumps({'quix': sorted(n for n in sys.modules if n.split('.')[0] == 'quixstreams'),\n"
        "                  'count': len([n for n in sys.modules if n.startswith('grudge_stream')]),\n"
        "                  'failed': failed}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd="/")
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["quix"] == [], res
    assert res["failed"] == {}, res["failed"]  # every module imported (none hid an import of it)
    assert res["count"] > 30, res  # the walk imported the package, not nothing
