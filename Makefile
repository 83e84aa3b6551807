# grudge-stream developer commands. Everything runs from a local virtualenv (.venv).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Broker jars stay in the checkout (git-ignored), whichever directory a command runs in.
export GRUDGE_KAFKA_CACHE ?= $(CURDIR)/.cache/kafka
# Run the installed package from outside the checkout: `python -m` from here would import the
# uncompiled source tree instead.
RUN_INSTALLED := cd / && "$(CURDIR)/$(BIN)/python" -m

.PHONY: help install test test-faults test-unit pythons-venvs pythons-run release-venvs upgrade-fixture example bench bench-kafka bench-peers broker-start broker-stop broker-status demo clean deploy-tools deploy-check manifests docs typecheck test-pythons

help:
	@echo "make test          install the package with its test extras into $(VENV) and the pinned deploy tools, start a local Kafka broker, run pytest"
	@echo "make demo          local broker + abuse-score worker + traffic; prints the alerts as they arrive"
	@echo "make example       the example gateway (examples/gateway): a client blocked, forgiven, denied by hand"
	@echo "make test-unit     unit/property/golden tests only (no broker)"
	@echo "make release-venvs the released 0.2.0 in .cache/grudge-0.2.0-venv, built from its release commit (the upgrade tests run it)"
	@echo "make upgrade-fixture rewrite tests/data/upgrade-0.2.0 with 0.2.0 workers on a broker of its own"
	@echo "make test-faults   the full broker-fault set on a three-node cluster, both runtimes (long)"
	@echo "make test-pythons  the unit, property and golden tests on the oldest and newest supported Pythons (PYTHONS=...)"
	@echo "make bench         sketch benchmarks (hashing, ScoreSketch, DecayingCountMin, ForgettingBloom)"
	@echo "make bench-kafka   runtime benchmarks against a local broker (Faust, batch runtime, checkpoints, latency)"
	@echo "make bench-peers   the abuse_scores job beside Kafka Streams, Quix Streams and a Faust Table (PEERS_ARGS=...)"
	@echo "make deploy-check  the Helm chart (lint, render, schemas), the alert rules (promtool) and the dashboard, with pinned tools"
	@echo "make manifests     regenerate deploy/kubernetes/ from the Helm chart"
	@echo "make docs          the API reference from the docstrings (pdoc) into build/api; fails on any warning"
	@echo "make typecheck     mypy --strict on the public API (the files listed under [tool.mypy] in pyproject.toml)"
	@echo "make broker-start  start the local single-node KRaft broker (tools/devkafka; jars fetched with Maven on first use)"
	@echo "make broker-stop   stop it"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# A real, non-editable install: the tests import the compiled extension from site-packages.
# The dev broker (tests, demo, benchmarks) is a distribution of its own, tools/devkafka
# (module grudge_devkafka), installed beside the package; the grudge-stream wheel does not carry it.
# It reruns only when a source of either changed (the stamp is older than one of them).
DEVKAFKA    := tools/devkafka
PKG_SOURCES := pyproject.toml setup.py README.md $(wildcard cyext/*) \
	$(shell find grudge_stream topologies -name '*.py' -o -name '*.pyi' -o -name py.typed 2>/dev/null) \
	$(wildcard $(DEVKAFKA)/pyproject.toml $(DEVKAFKA)/*.py)
INSTALL_STAMP := $(VENV)/.grudge-stream-installed

install: $(INSTALL_STAMP)

$(INSTALL_STAMP): $(PKG_SOURCES) | $(BIN)/python
	@echo "==> installing grudge-stream[test] and the dev broker ($(DEVKAFKA)) into $(VENV): pip builds a wheel, compiling the Cython kernels in cyext/ (a minute or two)"
	@# build/lib.* keeps every module an earlier build copied; a module since moved or removed
	@# would ride along into the wheel (build/temp.* keeps the compiled objects).
	rm -rf build/lib.*
	$(BIN)/python -m pip install --progress-bar on ".[test]" "./$(DEVKAFKA)"
	@touch $@
	@echo "==> installed; 'make test' and 'make demo' reinstall only when a source changes"

# pytest's session fixture starts and stops the broker (KAFKA_BOOTSTRAP_SERVERS, testcontainers
# or the local jars, in that order); fetching the jars first keeps the download out of test time.
# The suite runs as two pytest sessions side by side (TEST_LANES=2), each with a broker and a
# temporary directory of its own: the tests that need no broker, the three-broker cluster
# tests, the image and the upgrade beside every other integration test. Most of an integration
# test is waiting (session timeouts, rebalances, restarts), so two sessions take about the time
# of the longer one. The second session's output is printed when both have ended.
# TEST_LANES=1 runs the one session of plain `pytest` (what KAFKA_BOOTSTRAP_SERVERS always gets:
# two sessions must not share one broker).
TEST_LANES ?= 2
LANE_B := tests/unit tests/property tests/golden tests/deploy tests/integration/test_cluster_faults.py \
          tests/integration/test_image.py tests/integration/test_upgrade.py tests/integration/test_outage.py \
          tests/integration/test_embedded_quix.py tests/integration/test_hostile_input.py \
          tests/integration/test_alert_view.py tests/integration/test_embedded_loop.py
test: install deploy-tools release-venvs
	$(RUN_INSTALLED) grudge_devkafka jars
	@if [ "$(TEST_LANES)" = 1 ] || [ -n "$$KAFKA_BOOTSTRAP_SERVERS" ]; then exec $(BIN)/pytest; fi; \
	tmp=$$(mktemp -d -t grudge-test-XXXXXX); t0=$$(date +%s); \
	echo "==> two pytest sessions: [b] $(LANE_B) (log: $$tmp/b.log, printed at the end); [a] the rest, here"; \
	$(BIN)/pytest --basetemp=$$tmp/b $(LANE_B) >$$tmp/b.log 2>&1 & b=$$!; \
	trap 'kill $$b 2>/dev/null' INT TERM; \
	$(BIN)/pytest --basetemp=$$tmp/a $(addprefix --ignore=,$(LANE_B)); a=$$?; \
	echo "==> session [a] ended after $$(( $$(date +%s) - t0 )) s (status $$a); waiting for [b]"; \
	wait $$b; bs=$$?; \
	echo "==> session [b] ($(LANE_B)), status $$bs, ended by $$(( $$(date +%s) - t0 )) s:"; cat $$tmp/b.log; \
	if [ $$a = 0 ] && [ $$bs = 0 ]; then rm -rf $$tmp; exit 0; fi; \
	echo "make test: session [a] status $$a, session [b] status $$bs (temporary directories kept in $$tmp)"; exit 1

# The last release, built from its release commit into .cache/grudge-0.2.0-venv (git-ignored) the
# first time (pip compiles its Cython kernels: 8 minutes on a busy 2-core machine), kept after that; the rolling
# upgrade test (tests/integration/test_upgrade.py) starts its workers. Status 3 from the tool: the
# commit is not in this clone (a shallow one), and that test skips saying so.
release-venvs: install
	@$(BIN)/python tools/release_venv.py 0.2.0 >/dev/null || [ $$? = 3 ]

# tests/data/upgrade-0.2.0: state written by 0.2.0 workers (tools/make_upgrade_fixture.py says what).
FIXTURE_BROKER := $(CURDIR)/.cache/kafka/upgrade-fixture
upgrade-fixture: release-venvs
	@export KAFKA_BOOTSTRAP_SERVERS=$$($(RUN_INSTALLED) grudge_devkafka start --dir "$(FIXTURE_BROKER)"); \
	status=0; (cd / && "$(CURDIR)/.cache/grudge-0.2.0-venv/bin/python" "$(CURDIR)/tools/make_upgrade_fixture.py" \
	  --out "$(CURDIR)/tests/data/upgrade-0.2.0") || status=1; \
	$(RUN_INSTALLED) grudge_devkafka stop --dir "$(FIXTURE_BROKER)" >/dev/null 2>&1; exit $$status

# The full fault set of tests/integration/test_cluster_faults.py (make test runs its short part).
test-faults: install
	$(RUN_INSTALLED) grudge_devkafka jars
	GRUDGE_FAULTS=1 $(BIN)/pytest tests/integration/test_cluster_faults.py -s

test-unit: install
	$(BIN)/pytest tests/unit tests/property tests/golden

# The supported Pythons besides the default one: the oldest (requires-python) and the newest.
# Each gets a virtualenv of its own (.venv-<python>) with the package built and installed for it,
# one after the other (the builds share build/; `make pythons-venvs`); then their tests run side
# by side, each with its own log and temporary directory (they mostly wait, so they take about
# the time of one), and each log is printed when all have ended (`make pythons-run`, on the
# virtualenvs as they are). CI builds them before `make test` and runs their tests beside it.
# A name pyenv knows but has not selected (its shim refuses it) is taken from pyenv's versions.
PYTHONS ?= python3.10 python3.12 python3.13
test-pythons: pythons-venvs
	@$(MAKE) --no-print-directory pythons-run

pythons-venvs:
	@for py in $(PYTHONS); do \
	  bin=$$py; \
	  if ! $$bin -c 'import sys' >/dev/null 2>&1 && command -v pyenv >/dev/null; then \
	    ver=$$(pyenv versions --bare | grep -E "^$${py#python}(\.|$$)" | tail -1); \
	    [ -n "$$ver" ] && bin="$$(pyenv root)/versions/$$ver/bin/$$py"; \
	  fi; \
	  $$bin -c 'import sys' >/dev/null 2>&1 || { echo "make test-pythons: $$py not found (PYTHONS=...)"; exit 1; }; \
	  v=.venv-$$py; echo "==> $$($$bin --version) in $$v"; \
	  [ -x $$v/bin/python ] || $$bin -m venv $$v || exit 1; \
	  rm -rf build/lib.*; $$v/bin/python -m pip install -q ".[test]" "./$(DEVKAFKA)" || exit 1; \
	done

pythons-run:
	@for py in $(PYTHONS); do \
	  [ -x .venv-$$py/bin/pytest ] || { echo "make pythons-run: no .venv-$$py (make pythons-venvs first)"; exit 1; }; \
	done; \
	mkdir -p build/test-pythons; pids=""; \
	for py in $(PYTHONS); do \
	  .venv-$$py/bin/pytest -q --basetemp=build/test-pythons/tmp-$$py \
	    tests/unit tests/property tests/golden >build/test-pythons/$$py.log 2>&1 & pids="$$pids $$!"; \
	done; \
	failed=""; set -- $(PYTHONS); \
	for pid in $$pids; do wait $$pid || failed="$$failed $$1"; shift; done; \
	for py in $(PYTHONS); do \
	  echo "==> tests under $$py"; \
	  case " $$failed " in *" $$py "*) cat build/test-pythons/$$py.log;; *) tail -n 3 build/test-pythons/$$py.log;; esac; \
	done; \
	[ -z "$$failed" ] || { echo "make test-pythons: failed under$$failed (logs in build/test-pythons/)"; exit 1; }

DEMO_ARGS ?=
demo: install
	$(RUN_INSTALLED) grudge_devkafka jars
	$(BIN)/grudge-stream demo $(DEMO_ARGS)

example: install
	$(RUN_INSTALLED) grudge_devkafka jars
	cd / && "$(CURDIR)/$(BIN)/python" "$(CURDIR)/examples/gateway/drive.py"

# Sketch benchmarks (no broker); the runtime ones need Kafka: `make bench-kafka`.
SKETCH_BENCHES := bench_hash bench_score bench_countmin bench_bloom bench_small_batches
KAFKA_BENCHES  := bench_checkpoint bench_checkpoint_cost bench_alert_latency bench_faust bench_faust_memory bench_batch bench_rss bench_query
BENCH_BROKER   := $(CURDIR)/.cache/kafka/bench
bench: install
	@for b in $(SKETCH_BENCHES); do echo "== $$b"; (cd / && "$(CURDIR)/$(BIN)/python" "$(CURDIR)/benchmarks/$$b.py") || exit 1; done

bench-kafka: install
	@export KAFKA_BOOTSTRAP_SERVERS=$${KAFKA_BOOTSTRAP_SERVERS:-$$($(RUN_INSTALLED) grudge_devkafka start --dir "$(BENCH_BROKER)")}; \
	status=0; for b in $(KAFKA_BENCHES); do [ -f benchmarks/$$b.py ] || continue; echo "== $$b"; \
	  (cd / && "$(CURDIR)/$(BIN)/python" "$(CURDIR)/benchmarks/$$b.py") || status=1; done; \
	$(RUN_INSTALLED) grudge_devkafka stop --dir "$(BENCH_BROKER)" >/dev/null 2>&1; exit $$status

# Peers (benchmarks/peers): builds the Kafka Streams app with Maven and a Quix Streams venv under
# .cache/peers on first use, runs them against a broker of its own, then draws docs/peers-*.png.
PEERS_ARGS   ?= --sizes 10000:500000 --runs 3
PEERS_BROKER := $(CURDIR)/.cache/peers/kafka
# The results file the run writes and the plots read (one entry per keys:events size).
PEERS_OUT    ?= $(CURDIR)/.cache/peers/results.json
bench-peers: install
	@export KAFKA_BOOTSTRAP_SERVERS=$$($(RUN_INSTALLED) grudge_devkafka start --dir "$(PEERS_BROKER)"); \
	status=0; (cd / && "$(CURDIR)/$(BIN)/python" "$(CURDIR)/benchmarks/peers/run_peers.py" \
	  --broker-data-dir "$(PEERS_BROKER)/data" --out "$(PEERS_OUT)" $(PEERS_ARGS)) || status=1; \
	$(RUN_INSTALLED) grudge_devkafka stop --dir "$(PEERS_BROKER)" >/dev/null 2>&1; \
	if [ $$status = 0 ]; then \
	  "$(CURDIR)/.cache/peers/quix-venv/bin/python" "$(CURDIR)/benchmarks/peers/plot_peers.py" \
	    --results "$(PEERS_OUT)" --outdir "$(CURDIR)/docs" || status=1; \
	fi; exit $$status

broker-start: install
	$(RUN_INSTALLED) grudge_devkafka start

broker-stop:
	$(RUN_INSTALLED) grudge_devkafka stop

# A stopped broker is an answer, not a failure of make (grudge_devkafka status exits 3 for it).
broker-status:
	@$(RUN_INSTALLED) grudge_devkafka status || [ $$? -eq 3 ]

# Deploy tools, pinned, under .cache/tools (git-ignored): helm built from its Go module, the
# CRD schemas of the Prometheus Operator and KEDA from theirs, promtool from Debian's
# prometheus package (extracted, never installed: no daemon).
GO             ?= $(shell command -v go || echo /usr/local/go/bin/go)
TOOLS          := $(CURDIR)/.cache/tools
HELM_VERSION   := v4.3.2
PROMOP_MODULE  := github.com/prometheus-operator/prometheus-operator@v0.86.1
KEDA_MODULE    := github.com/kedacore/keda/v2@v2.18.0
HELM           := $(TOOLS)/helm
PROMTOOL       := $(TOOLS)/promtool
CRDS           := $(TOOLS)/crds
export HELM PROMTOOL CRDS

$(HELM):
	@echo "==> building helm $(HELM_VERSION) from its Go module (a minute or two, once)"
	GOBIN=$(TOOLS) $(GO) install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION)

$(PROMTOOL):
	@echo "==> promtool from Debian's prometheus package (extracted into $(TOOLS), not installed)"
	@mkdir -p $(TOOLS)/deb
	cd $(TOOLS)/deb && (apt-get download prometheus 2>/dev/null || (apt-get update -qq && apt-get download prometheus))
	dpkg-deb -x $$(ls -t $(TOOLS)/deb/prometheus_*.deb | head -1) $(TOOLS)/deb/extracted
	cp "$$(find $(TOOLS)/deb/extracted -type f -name promtool | head -1)" $@

$(CRDS)/.stamp:
	@mkdir -p $(CRDS)
	d=$$($(GO) mod download -json $(PROMOP_MODULE) | sed -n 's/.*"Dir": "\(.*\)",/\1/p') && \
	  cp $$d/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml \
	     $$d/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml $(CRDS)/
	d=$$($(GO) mod download -json $(KEDA_MODULE) | sed -n 's/.*"Dir": "\(.*\)",/\1/p') && \
	  cp $$d/config/crd/bases/keda.sh_scaledobjects.yaml $(CRDS)/
	@touch $@

deploy-tools: $(HELM) $(PROMTOOL) $(CRDS)/.stamp

# tests/deploy: helm lint and template of every topology (default and secured values), the
# rendered objects against the Kubernetes and CRD schemas, deploy/kubernetes/ against the chart,
# promtool on the alert rules and their unit tests.
deploy-check: install deploy-tools
	GRUDGE_DEPLOY_CHECK=1 $(BIN)/pytest tests/deploy

manifests: $(HELM)
	$(BIN)/python tests/deploy/render.py --write

# The API reference: the public modules (docs/embedding.md), from their docstrings. pdoc imports
# them; PDOC_ALLOW_EXEC lets an import ask the platform for its architecture.
API_MODULES := grudge_stream grudge_stream.state grudge_stream.faust grudge_stream.client \
	grudge_stream.sketches grudge_stream.exceptions grudge_stream.hashing grudge_stream.topology grudge_stream.sections
docs: install
	$(BIN)/python -m pip install -q "pdoc>=16,<17"
	@rm -rf build/api && mkdir -p build
	cd / && PDOC_ALLOW_EXEC=1 "$(CURDIR)/$(BIN)/python" -m pdoc -o "$(CURDIR)/build/api" $(API_MODULES) \
	  2> "$(CURDIR)/build/api-warnings.txt"
	@if [ -s build/api-warnings.txt ]; then cat build/api-warnings.txt; echo "make docs: pdoc warned (above)"; exit 1; fi
	@echo "==> API reference in build/api/index.html"

# mypy --strict on the public API; pyproject.toml's [tool.mypy] lists the files.
typecheck: install
	$(BIN)/python -m pip install -q "mypy==2.4.1"
	$(BIN)/python -m mypy

clean:
	rm -rf build dist *.egg-info $(DEVKAFKA)/build $(DEVKAFKA)/*.egg-info $(INSTALL_STAMP)
