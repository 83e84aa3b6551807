"""Transport-free operators: a batch of source records in, output records out.

Nothing here imports Faust or Kafka; the same operators run under the Faust
runtime, the replay runner and unit tests.
"""
from grudge_stream.operators.base import Operator, OperatorContext
from grudge_stream.operators.codec import BadRecord, Event, EventCodec
from grudge_stream.operators.columns import Columns, Run
from grudge_stream.operators.records import OutputRecord, SourceRecord
from grudge_stream.operators.snapshots import read_snapshot

__all__ = ["BadRecord", "Columns", "Event", "EventCodec", "Operator", "OperatorContext", "OutputRecord", "Run",
           "SourceRecord", "read_snapshot"]
