"""The fetches of a Faust app with embedded state ask for the partitions Faust consumes when
it asks, never for "every partition" (runtime/faust/consumer.py ``requested_partitions``).

Faust hands aiokafka its live set of active partitions; aiokafka reads an empty set as
every partition, and Faust drops the records of partitions it does not consume after the
consumer's position has moved past them. Seen on the real broker
(tests/integration/test_embedded_faust.py::test_two_instances_rebalance): a fetch begun
during Table recovery returned, once the recovery paused its changelogs, the records
prefetched for the source partitions still held for the state's restore; about 2,000
records of two partitions never reached an agent."""
from __future__ import annotations

import asyncio
import inspect

import aiokafka.consumer.fetcher as aiokafka_fetcher
import faust.transport.consumer as faust_consumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP

from grudge_stream.runtime.faust.consumer import EmbeddedStateConsumer, fetch_requested_partitions, requested_partitions


def test_a_fetch_asks_for_a_copy_of_the_active_partitions_and_none_for_an_empty_set():
    live = {TP("logins", 0), TP("logins-changelog", 0)}
    asked = requested_partitions(live)
    live.discard(TP("logins-changelog", 0))  # Faust pauses while the fetch waits
    live.add(TP("logins", 1))
    assert asked == frozenset({TP("logins", 0), TP("logins-changelog", 0)})
    assert requested_partitions(set()) is None
    assert requested_partitions(None) is None


class _Thread:
    def __init__(self) -> None:
        self.asked: list = []

    async def _fetch_records(self, consumer, active_partitions, timeout=None, max_records=None):
        self.asked.append(active_partitions)
        return {tp: [f"record of {tp.partition}"] for tp in active_partitions or ()}


def test_the_thread_of_an_app_with_state_never_fetches_with_an_empty_set():
    thread = fetch_requested_partitions(_Thread())
    assert asyncio.run(thread._fetch_records(None, set(), timeout=1.0, max_records=10)) == {}
    assert thread.asked == []  # aiokafka would have returned every partition's records
    live = {TP("logins", 2)}
    got = asyncio.run(thread._fetch_records(None, live, timeout=1.0, max_records=10))
    assert got == {TP("logins", 2): ["record of 2"]}
    assert thread.asked == [frozenset(live)] and thread.asked[0] is not live


def test_the_embedded_consumer_builds_its_thread_with_the_guard():
    class Base:
        def _new_consumer_thread(self):
            return _Thread()

    consumer = type("Mixed", (EmbeddedStateConsumer, Base), {})()
    thread = consumer._new_consumer_thread()
    assert getattr(thread._fetch_records, "grudge_requested_partitions", False)


def test_the_library_behaviour_the_guard_answers_is_still_there():
    """Pins: when these change, the guard may be unneeded or need a new shape."""
    params = list(inspect.signature(AIOKafkaConsumerThread._fetch_records).parameters)
    assert params[:3] == ["self", "consumer", "active_partitions"]
    assert "timeout" in params and "max_records" in params
    # aiokafka: an empty (falsy) partition set returns the records of every partition.
    assert "if partitions and tp not in partitions" in inspect.getsource(aiokafka_fetcher.Fetcher.fetched_records)
    # Faust: records of a partition not active when they are iterated are not yielded.
    assert "or tp in active_partitions" in inspect.getsource(faust_consumer.Consumer.getmany)
