"""Prometheus metrics of a grudge-stream worker (one registry per runtime), in base units
(seconds, bytes), with the standard process, platform and Python GC collectors."""
from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self._pause_max = 0.0
        if registry is None:
            # process_resident_memory_bytes & co.: a fixed-memory product shows its memory.
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        lbl = ["operator", "partition"]
        self.events = Counter("grudge_events_total", "Valid events applied to a sketch", lbl, registry=r)
        self.dead_letters = Counter("grudge_dead_letters_total", "Records sent to the dead-letter topic", lbl, registry=r)
        self.dead_letter_reasons = Counter("grudge_dead_letters_by_reason_total",
                                           "Records sent to the dead-letter topic, by reason class (late, future, "
                                           "time, key, value, other)", ["operator", "reason"], registry=r)
        self.future_clamped = Counter("grudge_future_clamped_total",
                                      "Events stamped beyond max_future_ms ahead of processing time, clamped to it",
                                      lbl, registry=r)
        self.late_applied = Counter("grudge_late_applied_total",
                                    "Late events (behind the watermark, within max_late_ms) applied with their weight",
                                    lbl, registry=r)
        self.late_dropped = Counter("grudge_late_dropped_total",
                                    "Events more than max_late_ms behind the watermark (dead-lettered or counted)",
                                    lbl, registry=r)
        self.outputs_dead_lettered = Counter(
            "grudge_outputs_dead_lettered_total",
            "Outputs that could not be delivered (too large, topic missing, refused) and went to the dead-letter topic",
            ["operator", "role"], registry=r)
        self.idle_ticks = Counter("grudge_idle_ticks_total", "Tick records written into quiet partitions "
                                  "holding raised keys (idle_tick_s)", ["operator"], registry=r)
        self.transactions_aborted = Counter("grudge_transactions_aborted_total", "exactly_once: transactions "
                                            "aborted and carried on from (the partitions went back to their "
                                            "snapshots)", registry=r)
        self.producers_renewed = Counter("grudge_producers_renewed_total", "exactly_once: transactional "
                                         "producers the broker fenced (a transaction it timed out) and "
                                         "replaced", registry=r)
        self.consumer_fatal = Counter("grudge_consumer_fatal_errors_total", "Fatal errors of the source "
                                      "consumer (a static member fenced by another with the same "
                                      "group_instance_id, say): each one replaces the consumer or ends "
                                      "the worker", registry=r)
        self.consumers_renewed = Counter("grudge_consumers_renewed_total", "Source consumers replaced in "
                                         "place after a fatal error (the partitions held went back to "
                                         "their snapshots)", registry=r)
        self.recovery_stalls = Counter("grudge_recovery_stalls_total", "Embedded state in a Faust app: "
                                       "Table recoveries of the app that read nothing for recovery_stall_s; "
                                       "each one asked the group for a rebalance", registry=r)
        self.ingest_native = Gauge("grudge_ingest_native", "Batch runtime: 1 when records are read on the "
                                   "native ingest path (setting ingest), 0 on confluent-kafka messages", registry=r)
        self.alerts = Counter("grudge_alerts_total", "Alerts emitted", lbl + ["state"], registry=r)
        self.outputs = Counter("grudge_outputs_total", "Output records published", ["operator", "role"], registry=r)
        self.snapshot_bytes = Gauge("grudge_snapshot_bytes", "Size of the last snapshot", lbl, registry=r)
        self.snapshots = Counter("grudge_snapshots_total", "Snapshots written", lbl, registry=r)
        self.snapshot_seconds = Histogram("grudge_snapshot_duration_seconds",
                                          "Time of a checkpoint round: outputs flushed, every changed partition "
                                          "snapshotted and written", ["operator"],
                                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.snapshot_time = Gauge("grudge_snapshot_timestamp_seconds", "Wall time of the last snapshot (age = now - this)", lbl, registry=r)
        self.restore_seconds = Gauge("grudge_restore_duration_seconds", "Time the last restore of a partition took", lbl, registry=r)
        self.snapshots_refused = Counter("grudge_snapshots_refused_total", "Snapshots refused on restore (corrupt or mismatched)", lbl, registry=r)
        self.restore_fallbacks = Counter("grudge_restore_fallbacks_total", "Restores that fell back", lbl + ["mode"], registry=r)
        self.replayed_silently = Counter("grudge_replayed_silently_total", "Records replayed after a restore "
                                         "whose outputs had been delivered before (dropped)", lbl, registry=r)
        self.outputs_suppressed = Counter("grudge_outputs_suppressed_total", "Outputs of the silent replay after a "
                                          "restore, dropped (delivered before)", lbl, registry=r)
        self.commits = Counter("grudge_commits_total", "Offset commits (or exactly-once transactions)",
                               ["operator"], registry=r)
        self.snapshot_bytes_written = Counter("grudge_snapshot_bytes_written_total", "Snapshot bytes written",
                                              lbl, registry=r)
        self.replay_records = Gauge("grudge_restore_replay_records", "Records a restore of the partition would "
                                    "replay now (applied since its snapshot)", lbl, registry=r)
        self.replay_seconds = Gauge("grudge_restore_replay_seconds", "Estimated time a restore of the partition "
                                    "would replay now, at the measured processing rate", lbl, registry=r)
        self.replay_budget_exceeded = Gauge("grudge_restore_budget_exceeded", "1 while the replay a restore "
                                            "would need exceeds 1.5x snapshot_replay_budget_s (snapshots are "
                                            "not landing)", lbl, registry=r)
        self.watermark = Gauge("grudge_watermark_seconds", "Event-time watermark of a partition (Unix time)", lbl,
                               registry=r)
        self.consumer_lag = Gauge("grudge_consumer_lag_records",
                                  "Records of a source partition not processed yet (log end - next offset)", lbl,
                                  registry=r)
        self.watermark_lag = Gauge("grudge_watermark_lag_seconds", "Wall clock minus the watermark", lbl, registry=r)
        self.saturation = Gauge("grudge_sketch_saturation",
                                "How full a partition's sketch is, and the error that implies "
                                "(docs/accuracy.md)", lbl + ["sketch", "measure"], registry=r)
        self.saturation_warnings = Counter("grudge_sketch_saturation_warnings_total",
                                           "Checks that found a sketch past its accuracy target",
                                           lbl + ["sketch"], registry=r)
        self.sketch_memory = Gauge("grudge_sketch_memory_bytes", "Fixed memory of a partition's sketches", lbl, registry=r)
        self.assigned = Gauge("grudge_assigned_partitions", "Source partitions assigned to this worker", registry=r)
        self.queries = Counter("grudge_queries_total", "Score query requests (/v1/score, /v1/scores) answered, "
                               "by HTTP status (refusals included)", ["status"], registry=r)
        self.query_seconds = Histogram("grudge_query_duration_seconds", "Time to answer a score query request, "
                                       "forwards to other workers included", buckets=(
                                           0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                                       registry=r)
        self.query_refused = Counter("grudge_query_refused_total",
                                     "Score queries refused: no token (unauthenticated), a wrong one (forbidden), "
                                     "past the client's budget (budget)", ["reason"], registry=r)
        self.query_priority_paused = Counter("grudge_query_priority_paused_seconds_total",
                                             "Batch runtime: time the consume loop waited for live queries in "
                                             "flight (query_priority_share)", registry=r)
        self.entries_rejected = Counter("grudge_entries_rejected_total",
                                        "Members records and override entries ignored: no valid signature "
                                        "(signing_keys_file)", ["topic"], registry=r)
        self.partitioner_checked = Counter("grudge_partitioner_checked_total",
                                           "Sampled source keys checked against key_partitioner", ["partition"],
                                           registry=r)
        self.partitioner_mismatches = Counter("grudge_partitioner_mismatches_total",
                                              "Sampled source keys on another partition than key_partitioner "
                                              "computes (score answers for them read the wrong partition)",
                                              ["partition"], registry=r)
        self.restored = Gauge("grudge_restored_partitions", "Assigned partitions whose state is restored", registry=r)
        self.checkpoint_pause = Histogram(
            "grudge_checkpoint_loop_pause_seconds",
            "Time processing stood still for checkpoint work between two batches (offset commits, the "
            "state copy of a background snapshot, an exactly-once round); steps under 1 ms not counted",
            buckets=(0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5), registry=r)
        self.checkpoint_pause_max = Gauge("grudge_checkpoint_loop_pause_max_seconds",
                                          "The longest checkpoint_loop_pause since the worker started", registry=r)

    def checkpoint_paused(self, seconds: float) -> None:
        """Processing stood still ``seconds`` for checkpoint work (counted from 1 ms)."""
        if seconds >= 0.001:
            self.checkpoint_pause.observe(seconds)
            if seconds > self._pause_max:
                self._pause_max = seconds
                self.checkpoint_pause_max.set(seconds)

    def query_answered(self, status: int, seconds: float) -> None:
        self.queries.labels(str(status)).inc()
        self.query_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
