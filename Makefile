# grudge-stream developer commands. Everything runs from a local virtualenv (.venv).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Broker jars stay in the checkout (git-ignored), whichever directory a command runs in.
export GRUDGE_KAFKA_CACHE ?= $(CURDIR)/.cache/kafka
# Run the installed package from outside the checkout: `python -m` from here would import the
# uncompiled source tree instead.
RUN_INSTALLED := cd / && "$(CURDIR)/$(BIN)/python" -m

.PHONY: help install test test-unit bench broker-start broker-stop broker-status demo clean

help:
	@echo "make test          install the package with its test extras into $(VENV), start a local Kafka broker, run pytest"
	@echo "make demo          local broker + abuse-score worker + traffic; prints the alerts as they arrive"
	@echo "make test-unit     unit/property/golden tests only (no broker)"
	@echo "make bench         run every benchmark script in benchmarks/"
	@echo "make broker-start  start the local single-node KRaft broker (jars fetched with Maven on first use)"
	@echo "make broker-stop   stop it"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# A real, non-editable install: the tests import the compiled extension from site-packages.
install: $(BIN)/python
	$(BIN)/python -m pip install -q ".[test]"

# pytest's session fixture starts and stops the broker (KAFKA_BOOTSTRAP_SERVERS, testcontainers
# or the local jars, in that order); fetching the jars first keeps the download out of test time.
test: install
	$(RUN_INSTALLED) grudge_stream.devkafka jars
	$(BIN)/pytest

test-unit: install
	$(BIN)/pytest tests/unit tests/property tests/golden

demo: install
	$(RUN_INSTALLED) grudge_stream.devkafka jars
	$(BIN)/grudge-stream demo

bench: install
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

broker-start: install
	$(RUN_INSTALLED) grudge_stream.devkafka start

broker-stop:
	$(RUN_INSTALLED) grudge_stream.devkafka stop

broker-status:
	$(RUN_INSTALLED) grudge_stream.devkafka status

clean:
	rm -rf build dist *.egg-info
