"""A worker's record in the members directory (``Membership``), a part the worker core holds.

Owns: the worker's ``MembersDirectory`` (``grudge_stream.serving``; None until started, or
when it could not be), and what the worker last published there — when, and the watermarks
of the partitions it held (``grudge-stream alerts`` shows them). Live score queries are
forwarded to the owners this directory names; the record is republished now and then, at
once on an assignment change and when a partition gets its first watermark.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from grudge_stream.serving import MembersDirectory, advertised_url
from grudge_stream.sections import Serving, as_section
from grudge_stream.topology import Settings

# How often a worker republishes its members record (with its partitions' watermarks) from
# its loop; assignment changes publish at once.
MEMBERS_REFRESH_S = 10.0


class Membership:
    """The members record of one worker (see the module docstring).

    ``holder``: the worker's slots (``PartitionSlots``), read at each publish."""

    def __init__(self, holder: Any, serving: Serving | Settings, *, bootstrap: str, app_id: str,
                 instance_id: str | None, client_config: dict, runtime: str, topic: str, signing: Any,
                 metrics: Any, log: logging.Logger) -> None:
        self.holder = holder
        self.serving = as_section(Serving, serving)
        self.bootstrap = bootstrap
        self.app_id = app_id
        self.instance_id = instance_id
        self.client_config = client_config
        self.runtime = runtime
        self.topic = topic
        self.signing = signing
        self.metrics = metrics
        self.log = log
        self.directory: MembersDirectory | None = None
        self.published_at = 0.0  # monotonic time of the last members record
        self.published_marks: dict[int, int | None] = {}  # the watermarks it carried

    def start(self, url: str | None, queries: Any) -> bool:
        """Start the directory (blocking); ``url``: where this member answers score queries
        (default ``advertised_url``). Whether it started; ``queries`` forward through it."""
        url = url or advertised_url(self.serving)
        try:
            rejected = self.metrics.entries_rejected.labels("members")
            self.directory = MembersDirectory(self.bootstrap, self.app_id, self.instance_id or url, url,
                                              client_config=self.client_config, runtime=self.runtime,
                                              source_topic=self.topic, signing=self.signing,
                                              on_reject=rejected.inc).start()
        except Exception as exc:  # noqa: BLE001 - queries then answer for local partitions only
            self.log.error("members directory %s-members unavailable (%s): score queries answer for this "
                           "worker's partitions only", self.app_id, exc)
            return False
        queries.directory = self.directory
        return True

    def publish(self) -> None:
        """The worker's record: the partitions it holds restored, with their watermarks."""
        if self.directory is not None:
            # (Also called from the thread that starts the directory: copied first.)
            held = self.holder.held()
            marks = {p: slot.operator.watermark for p, slot in held.items()}
            self.directory.publish(list(held), self.holder.partition_count, watermarks=marks)
            self.published_at = time.monotonic()
            self.published_marks = marks

    def refresh_due(self, now: float) -> bool:
        """Whether the loop republishes now: ``MEMBERS_REFRESH_S`` after the last record, or
        at once when a partition got its first watermark."""
        marks = self.published_marks
        return now - self.published_at >= MEMBERS_REFRESH_S or any(
            slot.operator.watermark is not None and marks.get(p) is None
            for p, slot in list(self.holder.slots.items()))
