"""ForgettingBloom against its pure-Python reference, and batch == singles."""

from __future__ import annotations

import math

import numpy as np
from bloom_reference import BloomReference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grudge_stream import ForgettingBloom
from grudge_stream.hashing import hash64_many

KEYS = [b"%d" % i for i in range(40)] + ["str-\u00e9", b""]

configs = st.fixed_dictionaries(
    {
        "capacity": st.integers(1, 25),
        "fp_rate": st.sampled_from([0.5, 0.2, 0.05, 0.01]),
        "generations": st.sampled_from([2, 3, 4, 5, 8]),
        "period_ms": st.sampled_from([None, 1, 7, 1000]),
        "seed": st.integers(0, 2**64 - 1),
        "hasher": st.sampled_from(["murmur3", "siphash"]),
        "index_scheme": st.sampled_from(["independent", "km"]),
        "overload": st.sampled_from(["shrink_window", "raise_fp"]),
    }
)

ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "aia", "aia", "contains", "stats"]),
        st.integers(0, len(KEYS) - 1),
        st.one_of(st.integers(0, 3), st.integers(-5, 0), st.integers(0, 5000)),
    ),
    min_size=1,
    max_size=80,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, seq=ops, start=st.integers(-(10**5), 10**5))
def test_matches_reference(cfg, seq, start):
    bf = ForgettingBloom(**cfg)
    ref = BloomReference(**cfg)
    t = start
    for op, ki, step in seq:
        key = KEYS[ki]
        t += step
        if op == "add":
            bf.add(key, now_ms=t)
            ref.add(key, now_ms=t)
        elif op == "aia":
            assert bf.add_if_absent(key, now_ms=t) == ref.add_if_absent(key, now_ms=t)
        elif op == "contains":
            assert bf.contains(key, now_ms=t) == ref.contains(key, now_ms=t)
            later = t + 3 * (cfg["period_ms"] or 1)
            assert bf.contains(key, now_ms=later) == ref.contains(key, now_ms=later)
        else:
            assert math.isclose(bf.approx_count(), ref.approx_count(), rel_tol=1e-9) or (
                math.isinf(bf.approx_count()) and math.isinf(ref.approx_count())
            )
            assert math.isclose(
                bf.fp_rate_estimate(), ref.fp_rate_estimate(), rel_tol=1e-9, abs_tol=1e-15
            )
        assert bf.rotations == ref.rotations
        assert bf.overloads == ref.overloads
        assert bf.generation_counts() == [
            ref.counts[(ref.newest - i) % ref.G] for i in range(ref.G)
        ]
    for key in KEYS:
        assert bf.contains(key, now_ms=t) == ref.contains(key, now_ms=t)
    blob = bf.to_bytes()
    back = ForgettingBloom.from_bytes(blob)
    assert back.to_bytes() == blob
    for key in KEYS:
        assert back.contains(key, now_ms=t) == ref.contains(key, now_ms=t)


@settings(max_examples=100, deadline=None)
@given(
    cfg=configs,
    seq=ops,
    start=st.integers(0, 10**5),
    split=st.integers(1, 9),
    form=st.sampled_from(["list", "prehashed"]),
)
def test_batch_equals_singles(cfg, seq, start, split, form):
    single = ForgettingBloom(**cfg)
    batch = ForgettingBloom(**cfg)
    events, t = [], start
    for op, ki, step in seq:
        t += step
        events.append((op, KEYS[ki], t))
    expect = []
    for op, key, now in events:
        if op == "add":
            single.add(key, now_ms=now)
        elif op == "aia":
            expect.append(single.add_if_absent(key, now_ms=now))
    got = []
    # group consecutive events of one kind (add / aia) into batches of at most `split`
    writes = [(op, k, n) for op, k, n in events if op in ("add", "aia")]
    i = 0
    while i < len(writes):
        op = writes[i][0]
        j = i
        while j < len(writes) and writes[j][0] == op and j - i < split:
            j += 1
        keys = [k for _, k, _ in writes[i:j]]
        if form == "prehashed":
            keys = hash64_many(keys, cfg["seed"], cfg["hasher"])
        times = np.array([n for _, _, n in writes[i:j]], dtype=np.int64)
        if op == "add":
            batch.add_many(keys, now_ms=times)
        else:
            got.extend(batch.add_if_absent_many(keys, now_ms=times).tolist())
        i = j
    assert got == expect
    assert batch.to_bytes() == single.to_bytes()
    now = events[-1][2] + (cfg["period_ms"] or 1)
    assert batch.contains_many(KEYS, now_ms=now).tolist() == [
        single.contains(k, now_ms=now) for k in KEYS
    ]
    times = np.arange(len(KEYS), dtype=np.int64) * (cfg["period_ms"] or 1) + events[-1][2]
    assert batch.contains_many(KEYS, now_ms=times).tolist() == [
        single.contains(k, now_ms=int(x)) for k, x in zip(KEYS, times)
    ]


@settings(max_examples=60, deadline=None)
@given(
    cfg=configs,
    a_keys=st.lists(st.integers(0, len(KEYS) - 1), max_size=30),
    b_keys=st.lists(st.integers(0, len(KEYS) - 1), max_size=30),
)
def test_merge_is_a_union(cfg, a_keys, b_keys):
    cfg = dict(cfg, capacity=10_000, period_ms=None)
    a, b = ForgettingBloom(**cfg), ForgettingBloom(**cfg)
    for ki in a_keys:
        a.add(KEYS[ki])
    for ki in b_keys:
        b.add(KEYS[ki])
    before = [a.contains(k) or b.contains(k) for k in KEYS]
    a.merge(b)
    for k, was in zip(KEYS, before):
        if was:
            assert a.contains(k)
    assert ForgettingBloom.from_bytes(a.to_bytes()).to_bytes() == a.to_bytes()
