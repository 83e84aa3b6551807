"""A multi-key request reads the partitions the processing thread is not in first, and
waits only for the one it is in (it never follows the loop from partition to partition)."""
from __future__ import annotations

import json
import threading

from grudge_stream.serving import ScoreQueries, partition_for

N = 3


class _Op:
    kind, operator_id, watermark, next_offset = "scores", "op", 1, 0

    def __init__(self, partition: int, reads: list) -> None:
        self.partition, self.reads = partition, reads

    def describe_key(self, key: bytes, debug: bool = False) -> dict:
        self.reads.append(self.partition)
        return {"kind": "scores", "score": float(self.partition)}


class _Slot:
    def __init__(self, p: int, reads: list) -> None:
        self.operator, self.partition, self.partition_count = _Op(p, reads), p, N
        self.snapshotted_offset, self.restore_mode = None, "fresh"
        self.lock = threading.Lock()


def test_the_busy_partition_is_read_last_and_waited_for_once() -> None:
    reads: list[int] = []
    slots = {p: _Slot(p, reads) for p in range(N)}
    q = ScoreQueries(slots.get, lambda: N)
    keys: list[str] = []
    for i in range(1000):  # two keys of each partition
        k = f"user-{i}"
        p = partition_for(k.encode(), N, q.partitioner)
        if sum(partition_for(x.encode(), N, q.partitioner) == p for x in keys) < 2:
            keys.append(k)
        if len(keys) == 2 * N:
            break
    keys.sort(key=lambda k: partition_for(k.encode(), N, q.partitioner))
    slots[0].lock.acquire()  # the processing thread is in partition 0
    answer: dict = {}
    t = threading.Thread(target=lambda: answer.update(
        doc=q.handle("POST", "/v1/scores", "", json.dumps(keys).encode(), {})))
    t.start()
    t.join(0.5)
    assert t.is_alive() and sorted(reads) == [1, 1, 2, 2]  # read without waiting
    slots[0].lock.release()
    t.join(5)
    status, doc, _ = answer["doc"]
    assert status == 200 and reads[-2:] == [0, 0]
    assert [r["score"] for r in doc["results"]] == [float(partition_for(k.encode(), N, q.partitioner)) for k in keys]
