"""grudge_stream.quix without a broker (skipped where Quix Streams is not installed): the
private Quix attributes the binding relies on are where it expects them (this fails when a
Quix release moves them: re-check the binding, then the pin in pyproject.toml); bad input
raises one clear exception naming the argument (the checks that need topics, which Quix
looks up on the broker, are in tests/integration/test_embedded_quix.py)."""
from __future__ import annotations

import inspect

import pytest


quixstreams = pytest.importorskip(
    "quixstreams", reason="Quix Streams is not installed (pip install 'grudge-stream[quix]'; make test installs it)")

from quixstreams import Application  # noqa: E402

from grudge_stream import quix as grudge  # noqa: E402
from grudge_stream.hashkey import HashKey  # noqa: E402
from grudge_stream.sketches.score_config import Exponential, ScoreSketchConfig  # noqa: E402
from grudge_stream.state import ScoreState  # noqa: E402

KEY = HashKey.parse("00112233445566778899aabbccddeeff")
SKETCH = ScoreSketchConfig(levels=2, cells_per_level=500, decay=Exponential(0.01), lo=0.0, hi=1.0, hasher="siphash")


def test_installed_quix_is_a_supported_version() -> None:
    from grudge_stream.quix.rebalance import _version

    low, high = grudge.QUIX_SUPPORTED
    assert low <= _version() < high, (quixstreams.__version__, grudge.QUIX_SUPPORTED)


def test_the_private_rebalance_callbacks_are_where_the_binding_hooks_them() -> None:
    """``_hook_rebalance`` replaces these instance attributes before ``run()``; Quix must
    still read them from the instance when it subscribes, with (consumer, partitions)."""
    for name in ("_on_assign", "_on_revoke", "_on_lost"):
        fn = getattr(Application, name)
        assert list(inspect.signature(fn).parameters) == ["self", "_", "topic_partitions"], name
    run = inspect.getsource(Application._run_dataframe)
    for name in ("on_assign", "on_revoke", "on_lost"):
        assert f"{name}=self._{name}" in run, name
    # run() is what the binding wraps to close its states: a public method of the instance.
    assert callable(Application.run)


def test_checkpoints_flush_sinks_before_they_commit() -> None:
    """The commit-limit guarantee rests on this (documented by Quix for sinks: "the offset
    will be committed only if all the sinks ... are flushed successfully"): each checkpoint
    flushes the sinks, then commits. Pinned in the source so a reordering fails here."""
    from quixstreams.checkpointing.checkpoint import Checkpoint

    src = inspect.getsource(Checkpoint.commit)
    flush = src.index("sink.flush()")
    assert flush < src.index("self._consumer.commit(") and flush < src.index("commit_transaction(")


@pytest.fixture
def app(tmp_path):
    return Application(broker_address="127.0.0.1:1", consumer_group="unit", state_dir=str(tmp_path),
                       loglevel=None)


def score_state(name="abuse", topic="logins"):
    return ScoreState(name, source_topic=topic, hash_key=KEY, sketch=SKETCH, raise_at=0.5, clear_at=0.25)


def test_bind_wraps_the_callbacks_and_run(app) -> None:
    own = app._on_assign
    bound = grudge.bind(app, score_state())
    assert app._on_assign is not own and "grudge_stream" in app._on_assign.__module__
    assert "grudge_stream" in app.run.__module__
    assert bound.state.name == "abuse" and bound.source_topic == "logins"
    # A second state on the same app reuses the hooks (no double wrapping).
    hooked = app._on_assign
    grudge.bind(app, score_state("other"))
    assert app._on_assign is hooked


def test_bind_after_run_started_is_refused(app) -> None:
    grudge.bind(app, score_state())
    grudge.QuixStates.of(app).running = True
    with pytest.raises(RuntimeError, match="before the application runs"):
        grudge.bind(app, score_state("late"))
