"""The confluent-kafka batch runner: replay and backfill (grudge_stream.replay.runner). The live
batch worker is ``grudge_stream.runtime.batch``."""
