"""`grudge-stream replay`: run a topology's operators over a range of its source topic.

Reads with confluent-kafka's batched ``consume()`` or, with ``ingest`` native or auto
where it loads, through the native ingest path (``grudge_stream.runtime.native``: the
same records, no ``Message`` object per record) — a throw-away consumer group, manual
assignment, no commits: the live group's offsets are never touched — and runs the same operators the live worker runs, on event time, and
sends their outputs to the topology's topics, to topics given on the command
line, or to JSONL for a dry run. With ``--write-snapshots`` it writes, at the
end offsets, snapshots that a live worker adopts on its next assignment
(stop the topology's workers first, or they will overwrite them).

State at the start of the range: fresh operators, or with ``--from-snapshot``
the newest snapshot of each partition (the range then starts at its
``next_offset``). Because operators run on event time, replaying the records a
live worker consumed, from the same starting state, reproduces its snapshots
byte for byte and the same alert ids. A topology re-keyed by a field reads its
repartition topic (``Topology.source_topic``): the records its operators
consumed (docs/runtime.md, "Repartitioning by a field").
"""
from __future__ import annotations

import base64
import json
import logging
import sys
import time
import uuid
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Mapping

from confluent_kafka import Consumer, KafkaError, TopicPartition

from grudge_stream.checkpoint import CheckpointStore, SnapshotWrite
from grudge_stream.exceptions import ConfigError
from grudge_stream.kafkaconf import FAST_CONSUMER  # noqa: F401 - also re-exported
from grudge_stream.operators.records import OutputRecord, group_source_records  # noqa: F401 - also re-exported
from grudge_stream.outputs import OutputPublisher
from grudge_stream.replay.ranges import Position, resolve, topic_partitions
from grudge_stream.runtime.loop import COLUMNS, RECORDS, Batch, ConsumeLoop
from grudge_stream.runtime.native import assign, open_reader, unassign
from grudge_stream.topology import Topology

log = logging.getLogger("grudge_stream.replay")

class JsonlSink:
    """A dry-run sink: one JSON line per output record."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.sent: dict[str, int] = {}

    def publish(self, records: list[OutputRecord]) -> int:
        w = self.stream.write
        for r in records:
            if r.value is None:
                value = None  # a tombstone (the key's alert state was cleared)
            else:
                try:
                    value = json.loads(r.value)
                except ValueError:
                    value = {"value_b64": base64.b64encode(r.value).decode()}
            w(json.dumps({"role": r.role, "key": None if r.key is None else r.key.decode("utf-8", "replace"),
                          "value": value}, separators=(",", ":")) + "\n")
            self.sent[r.role] = self.sent.get(r.role, 0) + 1
        return len(records)

    def flush(self, timeout_s: float = 60.0) -> None:
        self.stream.flush()


@dataclass
class ReplayReport:
    records: int = 0
    seconds: float = 0.0
    start: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)
    outputs: dict[str, int] = field(default_factory=dict)
    snapshots: dict[int, int] = field(default_factory=dict)  # partition -> generation
    ingest: str = "python"  # how the records were read: native or python

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


class Progress:
    """Records, rate and ETA: one rewritten line on a terminal, log lines otherwise."""

    def __init__(self, total: int, stream: IO[str] | None = None, every_s: float = 2.0) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every = 0.2 if self.tty else every_s
        self.t0 = time.monotonic()
        self.last = 0.0

    def update(self, done: int, per_partition: dict[int, tuple[int, int]], force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every:
            return
        self.last = now
        el = max(now - self.t0, 1e-9)
        rate = done / el
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        parts = " ".join(f"p{p}:{d}/{t}" for p, (d, t) in sorted(per_partition.items())[:8])
        msg = (f"replay {done}/{self.total} records ({100 * done / max(self.total, 1):.1f}%), "
               f"{rate:,.0f}/s, ETA {eta:.0f}s  {parts}")
        if self.tty:
            self.stream.write("\r" + msg[:200].ljust(120))
            if force:
                self.stream.write("\n")
            self.stream.flush()
        else:
            log.info(msg)


def replay(topology: Topology, bootstrap_servers: str, *, start: Position, end: Position,
           sink=None, write_snapshots: bool = False, from_snapshot: bool = False,
           batch_size: int = 2000, progress: bool = True, progress_stream: IO[str] | None = None,
           consumer_config: dict | None = None, client_config: dict | None = None,
           ends: Mapping[int, int] | None = None,
           apply: Callable[[Any, list, list, list, list], list[OutputRecord]] | None = None,
           ingest: str = "auto") -> ReplayReport:
    """Replay ``[start, end)`` of the topology's source topic through its operators.

    ``client_config``: security and pass-through properties of every client it makes
    (``grudge_stream.kafkaconf.client_config(settings)``). ``ends``: per partition, the end
    offset instead of ``end``'s (a backfill's: the group's committed offsets, clamped to the
    retained range). ``apply(operator, offsets, timestamps, keys, values)``: what a
    partition's records are handed to instead of ``process_columns`` (embedded state,
    grudge_stream.backfill: the user's code turns payloads into the state's values), its
    outputs returned; the operator's ``next_offset`` is then moved past the records, as a
    snapshot of the live state covers the records its agents saw without applying them.
    ``ingest``: how records are read, as the worker's setting (auto, native, python;
    docs/runtime.md "Ingest paths"); the outputs and snapshots are the same either way."""
    topic = topology.source_topic
    if write_snapshots and not (from_snapshot or start.kind == "earliest"):
        raise ConfigError(
            "--write-snapshots needs the whole history behind the state: replay --from earliest, "
            "or continue from the live snapshots with --from-snapshot"
        )
    consumer = Consumer({
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"grudge-replay-{uuid.uuid4().hex[:10]}",  # never the live group
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        "isolation.level": "read_committed",
        **FAST_CONSUMER,
        **(client_config or {}),
        **(consumer_config or {}),
    })
    report = ReplayReport()
    t0 = time.monotonic()
    reader = None
    try:
        # (ingest=native where it cannot run: ConfigError, before anything is read)
        reader = open_reader(ingest, consumer, topic, batch_size, quiet=not progress, what="replay ingest",
                             arrays=apply is None)  # a backfill's apply gets lists
        report.ingest = "native" if reader is not None else "python"
        partitions = topic_partitions(consumer, topic)
        starts = resolve(consumer, topic, partitions, start)
        ends_given = ends
        ends = resolve(consumer, topic, partitions, end)
        if ends_given is not None:
            marks = resolve(consumer, topic, partitions, Position("earliest"))
            ends = {p: min(max(ends_given.get(p, ends[p]), marks[p]), ends[p]) for p in partitions}
        store = (CheckpointStore(bootstrap_servers, topology.snapshot_topic, client_config=client_config)
                 if (write_snapshots or from_snapshot) else None)
        operators = {}
        for p in partitions:
            op = topology.operator(p, len(partitions))
            if from_snapshot:
                assert store is not None
                res = store.restore(op.operator_id, p,
                                    accept=lambda ref, blob, p=p: _snapshot_operator(topology, p, len(partitions),
                                                                                     blob))
                if res.blob is None:
                    raise ConfigError(f"--from-snapshot: no usable snapshot for {topic}[{p}]")
                op = _snapshot_operator(topology, p, len(partitions), res.blob)
                starts[p] = op.next_offset
            operators[p] = op
        bad = {p: (starts[p], ends[p]) for p in partitions if starts[p] > ends[p]}
        if bad:
            raise ConfigError(f"empty or inverted range: --from is after --to in partitions {bad}")
        report.start, report.end = dict(starts), dict(ends)
        todo = {p for p in partitions if starts[p] < ends[p]}
        total = sum(ends[p] - starts[p] for p in todo)
        done_pp = {p: 0 for p in partitions}
        prog = Progress(total, progress_stream) if progress else None
        shape = RECORDS if topology.needs_headers else COLUMNS
        if todo:  # split into the native reader first (grudge_stream.runtime.native.assign)
            assign(consumer, reader, [TopicPartition(topic, p, starts[p]) for p in sorted(todo)], incremental=False)

        def on_error(err) -> None:
            if err.code() == KafkaError._AUTO_OFFSET_RESET:  # consumer_config auto.offset.reset=error
                raise ConfigError(
                    f"records of {topic} were deleted (retention) before they were read ({err.str()}): "
                    "the range would have a hole; run it again over what is retained now")
            raise ConfigError(f"error reading {topic}: {err}")

        def step(batch: Batch) -> None:
            """Apply each partition's records below its end; a partition that reached it
            is done and unassigned."""
            for p in list(batch.groups):
                if p not in todo:
                    continue
                chunk = batch.groups[p]
                offs = batch.offsets(p, shape)
                cut = bisect_left(offs, ends[p])
                if cut < len(offs):
                    chunk = chunk[:cut] if shape == RECORDS else tuple(c[:cut] for c in chunk)
                if cut:
                    op = operators[p]
                    if apply is not None:
                        out = apply(op, *chunk)
                        if op.next_offset is None or op.next_offset < offs[cut - 1] + 1:
                            op.next_offset = offs[cut - 1] + 1
                    elif shape == RECORDS:
                        out = op.process(chunk)
                    else:
                        out = op.process_columns(topic, p, *chunk)
                    if out and sink is not None:
                        sink.publish(out)
                    report.records += cut
                    done_pp[p] = offs[cut - 1] + 1 - starts[p]
                if cut < len(offs) or (cut and offs[cut - 1] + 1 >= ends[p]):
                    todo.discard(p)
                    unassign(consumer, reader, [TopicPartition(topic, p)], incremental=True)
            if prog and batch.count:
                prog.update(report.records, {p: (done_pp[p], ends[p] - starts[p]) for p in partitions})

        ConsumeLoop(consumer, topic, batch_size=batch_size, wait_s=1.0, shape=shape,
                    on_error=on_error, native=reader).run(step, until=lambda: not todo)
        if prog:
            prog.update(report.records, {p: (done_pp[p], ends[p] - starts[p]) for p in partitions}, force=True)
        if sink is not None:
            sink.flush()
            report.outputs = dict(getattr(sink, "sent", {}))
        if write_snapshots:
            assert store is not None
            n = len(partitions)
            for p, op in operators.items():
                if op.next_offset is None:
                    op.next_offset = ends[p]
            refs = store.write_many(
                SnapshotWrite(op.operator_id, p, op.snapshot(), op.next_offset, op.watermark, op.fingerprint,
                              topic, n, topology.app_id) for p, op in operators.items())
            for p, ref in zip(operators, refs):
                report.snapshots[p] = ref.generation
            store.close()
        report.operators = operators  # type: ignore[attr-defined]
    finally:
        if reader is not None:
            reader.close()  # its handles go before the consumer they belong to
        consumer.close()
    report.seconds = time.monotonic() - t0
    return report


def make_sink(topology: Topology, bootstrap_servers: str, output: str, topic_overrides: dict[str, str],
              client_config: dict | None = None):
    """``none`` (a dry run), ``-`` / ``stdout``, ``jsonl:PATH``, or ``topology`` (the topology's own
    topics, as overridden role by role with ``topic_overrides``)."""
    if output == "topology":
        topics = {**topology.outputs, **topic_overrides}
        return OutputPublisher(bootstrap_servers, topics, client_config=client_config)
    if output == "none":
        return None
    if output in ("-", "stdout"):
        return JsonlSink(sys.stdout)
    if output.startswith("jsonl:"):
        path = output[len("jsonl:"):]
        try:
            return JsonlSink(open(path, "w", encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"--output jsonl:{path}: cannot write it ({exc.strerror})") from None
    raise ConfigError(f"--output must be topology, none, stdout or jsonl:PATH, not {output!r}")


def _snapshot_operator(topology: Any, partition: int, partition_count: int, blob: bytes) -> Any:
    """A new operator of ``partition`` restored from ``blob``, under the snapshot's index
    scheme when the topology left ``index_scheme`` at its default and the scheme is all
    that differs (as a worker restores, grudge_stream.partitions); MismatchError otherwise."""
    from grudge_stream.exceptions import MismatchError
    from grudge_stream.partitions import snapshot_index_scheme

    op = topology.operator(partition, partition_count)
    try:
        op.restore(blob)
    except MismatchError:
        scheme = snapshot_index_scheme(topology, op, blob)
        if scheme is None:
            raise
        op = topology.with_index_scheme(scheme).operator(partition, partition_count)
        op.restore(blob)
    return op
