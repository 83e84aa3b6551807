"""DecayingCountMin against its pure-Python reference, on random operation sequences,
and batch == the same single operations in order."""

from __future__ import annotations

import numpy as np
from countmin_reference import CountMinReference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grudge_stream import DecayingCountMin
from grudge_stream.hashing import hash64_many

KEYS = [b"", b"a", b"b", b"hot", b"cold", "caf\u00e9", b"x" * 40, b"k1", b"k2", b"k3", b"k4", b"k5"]

configs = st.fixed_dictionaries(
    {
        "depth": st.integers(1, 4),
        "width": st.sampled_from([1, 2, 7, 16, 64]),
        "epoch_ms": st.sampled_from([None, 1, 10, 1000]),
        "counter_bits": st.sampled_from([4, 5, 8, 24, 27]),
        "seed": st.integers(0, 2**64 - 1),
        "hasher": st.sampled_from(["murmur3", "siphash"]),
        "index_scheme": st.sampled_from(["independent", "km"]),
        "top_k": st.sampled_from([0, 1, 3, 8]),
    }
)

# Times move mostly forward, sometimes far (across stamp wrap-around) and sometimes back.
time_steps = st.one_of(
    st.integers(0, 30),
    st.integers(-50, 0),
    st.integers(0, 40_000),
    st.sampled_from([255, 256, 257, 279, 280, 2**20, 2**33]),
)

ops = st.lists(
    st.tuples(
        st.sampled_from(["inc", "inc", "inc", "query", "tick", "top"]),
        st.integers(0, len(KEYS) - 1),
        st.one_of(st.integers(0, 3), st.integers(0, 2**30)),
        time_steps,
    ),
    min_size=1,
    max_size=60,
)


def _time(cfg, t):
    return t * (cfg["epoch_ms"] or 1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, seq=ops, start=st.integers(-(10**6), 10**6))
def test_matches_reference(cfg, seq, start):
    sk = DecayingCountMin(**cfg)
    ref = CountMinReference(**cfg)
    t = start
    for op, ki, count, step in seq:
        key = KEYS[ki]
        t += step
        now = _time(cfg, t)
        if op == "inc":
            sk.increment(key, count, now_ms=now)
            ref.increment(key, count, now_ms=now)
        elif op == "query":
            assert sk.query(key, now_ms=now) == ref.query(key, now_ms=now)
        elif op == "tick" and cfg["epoch_ms"] is None:
            n = step % 300
            sk.tick(n)
            ref.tick(n)
        elif op == "top" and cfg["top_k"]:
            assert sk.top() == ref.top()
            assert sk.top(1, now_ms=now) == ref.top(1, now_ms=now)
        for k in KEYS[:4]:
            assert sk.query(k, now_ms=now) == ref.query(k, now_ms=now)
    assert sk.epoch == ref.epoch
    blob = sk.to_bytes()
    back = DecayingCountMin.from_bytes(blob)
    assert back.to_bytes() == blob
    for k in KEYS:
        assert back.query(k) == sk.query(k) if cfg["epoch_ms"] is None else True
        assert back.query(k, now_ms=_time(cfg, t)) == ref.query(k, now_ms=_time(cfg, t))
    if cfg["top_k"]:
        assert back.top() == ref.top()


@settings(max_examples=100, deadline=None)
@given(
    cfg=configs,
    seq=ops,
    start=st.integers(0, 10**6),
    split=st.integers(1, 7),
    form=st.sampled_from(["list", "prehashed", "rows"]),
)
def test_batch_equals_singles(cfg, seq, start, split, form):
    single = DecayingCountMin(**cfg)
    batch = DecayingCountMin(**cfg)
    incs = [
        (KEYS[ki] if form == "list" else (b"%05d" % ki), count, start + _time(cfg, i * (step % 50)))
        for i, (op, ki, count, step) in enumerate(seq)
    ]
    # event times must be those of a single stream: keep them in arrival order as given
    for key, count, now in incs:
        single.increment(key, count, now_ms=now)
    for lo in range(0, len(incs), split):
        chunk = incs[lo : lo + split]
        keys = [k for k, _, _ in chunk]
        if form == "prehashed":
            keys = hash64_many(keys, cfg["seed"], cfg["hasher"])
        elif form == "rows":
            keys = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(chunk), 5)
        batch.increment_many(
            keys,
            counts=np.array([c for _, c, _ in chunk], dtype=np.int64),
            now_ms=np.array([n for _, _, n in chunk], dtype=np.int64),
        )
    assert batch._raw_cells().tobytes() == single._raw_cells().tobytes()
    if form != "prehashed":
        assert batch.to_bytes() == single.to_bytes()
    else:
        assert [v for _, v in batch.top()] == [v for _, v in single.top()] if cfg["top_k"] else True
    keys = [k for k, _, _ in incs]
    now = incs[-1][2]
    got = batch.query_many(keys if form == "list" else [bytes(k) for k in keys], now_ms=now)
    assert got.tolist() == [single.query(k, now_ms=now) for k in keys]
    times = np.array([n for _, _, n in incs], dtype=np.int64) + 3 * (cfg["epoch_ms"] or 1)
    got = batch.query_many(keys, now_ms=times)
    assert got.tolist() == [single.query(k, now_ms=int(t)) for k, t in zip(keys, times)]


@settings(max_examples=60, deadline=None)
@given(cfg=configs, a_ops=ops, b_ops=ops)
def test_merge_without_halving_is_exact(cfg, a_ops, b_ops):
    """Both inputs at one epoch: merge equals one sketch fed both streams."""
    cfg = dict(cfg, epoch_ms=None)
    a, b, both = (DecayingCountMin(**cfg) for _ in range(3))
    for sk, seq in ((a, a_ops), (b, b_ops)):
        for _, ki, count, _ in seq:
            sk.increment(KEYS[ki], count)
            both.increment(KEYS[ki], count)
    a.merge(b)
    assert a._raw_cells().tobytes() == both._raw_cells().tobytes()
    for k in KEYS:
        assert a.query(k) == both.query(k)


@settings(max_examples=60, deadline=None)
@given(cfg=configs, seq=ops, side=st.lists(st.booleans(), min_size=60, max_size=60))
def test_merge_with_halving_is_within_rounding(cfg, seq, side):
    """Split one stream between two sketches: the merged cells never exceed, and trail
    by at most 2, the cells of one sketch fed the whole stream (no saturation)."""
    cfg = dict(cfg, epoch_ms=None, counter_bits=27)
    a, b, both = (DecayingCountMin(**cfg) for _ in range(3))
    for (op, ki, count, step), left in zip(seq, side):
        if op == "tick":
            for sk in (a, b, both):
                sk.tick(step % 5)
            continue
        (a if left else b).increment(KEYS[ki], count % 1000)
        both.increment(KEYS[ki], count % 1000)
    a.merge(b)
    diff = both._decayed_cells() - a._decayed_cells()
    assert diff.min() >= 0 and diff.max() <= 2


@settings(max_examples=80, deadline=None)
@given(
    seq=st.lists(
        st.tuples(st.integers(0, 30), st.integers(1, 9), st.integers(0, 2)),
        min_size=1,
        max_size=200,
    ),
    top_k=st.integers(1, 6),
    width=st.sampled_from([4, 16, 64]),
)
def test_top_k_admission_guarantee(seq, top_k, width):
    """After an increment, an untracked key's estimate is at most the smallest current
    estimate among the candidates (otherwise it would have been admitted)."""
    sk = DecayingCountMin(depth=2, width=width, epoch_ms=None, top_k=top_k, seed=1)
    for ki, w, ticks in seq:
        if ticks == 2:
            sk.tick()
        key = b"key-%d" % ki
        sk.increment(key, w)
        cands = sk._candidates()
        tracked = {h for h, _, _ in cands}
        h = sk.query_many([key])  # estimate of the key
        est = int(h[0])
        kh = int(hash64_many([key], 1)[0])
        for ch, stored, _ in cands:
            cur = int(sk.query_many(np.array([ch], dtype=np.uint64))[0])
            assert stored <= cur  # stored values are lower bounds
        if kh not in tracked and est > 0 and len(cands) == top_k:
            floor = min(
                int(sk.query_many(np.array([ch], dtype=np.uint64))[0]) for ch, _, _ in cands
            )
            assert est <= floor
