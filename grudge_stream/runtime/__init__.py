"""The worker runtimes: a runtime-neutral core (``core``), the one consume loop of the
confluent-kafka consumers (``loop``), and two thin adapters, the confluent-kafka batch
worker (``batch``) and the Faust app (``faust``)."""
