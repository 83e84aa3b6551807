"""The confluent-kafka batch runner: replay and backfill (grudge_stream.replay.runner)."""
