"""`grudge-stream demo` without a broker to use: one line that says what to do, exit 2."""
from __future__ import annotations

import os
import subprocess
import sys

# As if the dev broker (tools/devkafka, not in the grudge-stream wheel) were not installed.
WITHOUT_DEV_BROKER = ("import sys; sys.modules['grudge_devkafka'] = None\n"
                      "from grudge_stream.cli import main\n"
                      "sys.exit(main(['demo', '--seconds', '1']))\n")


def test_demo_without_bootstrap_or_dev_broker_says_so_in_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    out = subprocess.run([sys.executable, "-c", WITHOUT_DEV_BROKER], capture_output=True, text=True,
                         timeout=60, cwd="/", env=env)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("grudge-stream demo: no Kafka broker: set KAFKA_BOOTSTRAP_SERVERS")
    assert "tools/devkafka" in lines[0]
