"""The Kafka layer: plumbing over the confluent-kafka clients that imports nothing above it."""
