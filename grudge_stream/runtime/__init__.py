"""The worker runtimes: a runtime-neutral core (``core``) and two thin adapters, the
confluent-kafka batch worker (``batch``) and the Faust app (``faust``)."""
