"""Logging of a worker: repeated lines collapsed, optional JSON lines.

During a broker outage the Kafka clients report the same failure many times
a second (aiokafka logged about 100 ERROR lines a second in a measured 40 s
outage, librdkafka about 30). ``RepeatFilter`` lets one record per logger,
level and message template through per interval and counts the rest into
the next one that passes, so an outage is a few readable lines that still
say how often it happened.
"""
from __future__ import annotations

import json
import logging
import time

REPEAT_INTERVAL_S = 10.0
_MAX_KEYS = 4096


class RepeatFilter(logging.Filter):
    """At most one record per (logger, level, template) per ``interval_s`` (per exact message for
    grudge-stream's own loggers)."""

    def __init__(self, interval_s: float = REPEAT_INTERVAL_S) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._seen: dict[tuple, list] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        # Third-party clients repeat one template with ever-changing arguments (node ids,
        # timestamps): collapse by template. Ours log one line per partition, generation or
        # event on purpose: collapse only exact repeats.
        ours = record.name.startswith("grudge_stream") and record.name != "grudge_stream.kafka"
        key = (record.name, record.levelno, record.getMessage()[:300] if ours else str(record.msg)[:300])
        now = time.monotonic()
        entry = self._seen.get(key)
        if entry is None or now - entry[0] >= self.interval_s:
            if entry is not None and entry[1]:
                record.msg = f"{record.msg} [and {entry[1]} more like this in the last {now - entry[0]:.0f} s]"
            if len(self._seen) >= _MAX_KEYS:
                self._seen.clear()
            self._seen[key] = [now, 0]
            return True
        entry[1] += 1
        return False


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        body = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
                "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False)


def install(logger: logging.Logger | None = None, json_lines: bool = False) -> None:
    """Put a RepeatFilter (and the JSON formatter, if asked) on ``logger``'s handlers (the root
    logger's by default); idempotent."""
    logger = logger or logging.getLogger()
    for handler in logger.handlers:
        if not any(isinstance(f, RepeatFilter) for f in handler.filters):
            handler.addFilter(RepeatFilter())
        if json_lines:
            handler.setFormatter(JsonFormatter())


def kafka_client_logger() -> logging.Logger:
    """Where librdkafka's own log lines go (the ``logger`` client property)."""
    return logging.getLogger("grudge_stream.kafka")
