# The commands README.md and .ci/run use. `make help` lists them.
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
# The interpreter the venv is made from: Python 3.11, what CI and the image use (pyproject.toml
# allows 3.11-3.13 and the lock files are resolved for all three; only 3.11 is tested).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || echo python3)

.PHONY: help install lock run migrate test lint bench bench-vs-prototype bench-workers bench-copies demo demo-traces chaos soak cluster-up cluster-down cluster-status chaos-cluster clean

help:
	@echo "make install  - create $(VENV) and install payhooks with its dev tools"
	@echo "make lock     - regenerate requirements.lock and requirements-dev.lock from pyproject.toml"
	@echo "make run      - migrate, then run ingest, orders, bonuses, email, api and a dev SMTP sink"
	@echo "make test     - ruff format --check, ruff check, mypy, pytest (what CI runs)"
	@echo "make lint     - ruff and mypy only"
	@echo "make bench    - ingest benchmark: batched accept path vs the naive baseline"
	@echo "make demo     - the whole system plus the simulator (300 payments per provider; PROVIDERS=xhub,standard,stripe), checked"
	@echo "make demo-traces - make demo with tracing on, viewed without Jaeger: one payment's trace printed (bench.trace_view)"
	@echo "make bench-vs-prototype - ingest beside the handbook's reference prototype (needs wrk)"
	@echo "make bench-workers - worker benchmark: paid payments through all three workers"
	@echo "make bench-copies - bench.workers, bench.ingest and one quorum queue: single node vs cluster"
	@echo "make chaos    - the whole system under traffic while RabbitMQ / PostgreSQL / services fail (CHAOS_PROVIDERS=xhub,standard,stripe)"
	@echo "make soak     - MINUTES (30) at half the measured capacity, watched for growth"
	@echo "make cluster-up   - 3 RabbitMQ nodes + PostgreSQL primary/sync standby on private ports"
	@echo "make cluster-down - remove them (nodes, clusters, files)"
	@echo "make chaos-cluster - make chaos's storm against that stack with 2 copies of every service"

# Exactly the versions (and hashes) of requirements-dev.lock, then payhooks itself without
# dependencies; `pip check` fails when pyproject.toml asks for a version the lock lacks.
$(BIN)/payhooks: pyproject.toml requirements-dev.lock
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || { \
		echo "payhooks needs Python 3.11 (what CI and the image use); install it, or: make PYTHON=/path/to/python3.11"; \
		exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes -r requirements-dev.lock
	$(BIN)/pip install --quiet --no-deps -e .
	@$(BIN)/pip check >/dev/null || { $(BIN)/pip check; rm -f $@; \
		echo "requirements-dev.lock is behind pyproject.toml: make lock"; exit 1; }
	@touch $@

install: $(BIN)/payhooks

$(BIN)/uv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes -r requirements-dev.lock

# requirements.lock: the runtime dependencies (the image); requirements-dev.lock: those and the
# dev group (make install, CI). Every platform, Python 3.11-3.13, with hashes. Versions already
# locked are kept unless pyproject.toml changes them; UPGRADE=1 takes the newest allowed.
# uv comes from the dev lock, so this works while the lock is behind pyproject.toml.
UV_COMPILE = $(BIN)/uv pip compile pyproject.toml --quiet --universal --generate-hashes \
	--custom-compile-command "make lock" $(if $(UPGRADE),--upgrade,)
lock: $(BIN)/uv
	$(UV_COMPILE) --output-file requirements.lock
	$(UV_COMPILE) --group dev --output-file requirements-dev.lock

migrate: install
	$(BIN)/payhooks migrate

# The whole system on one machine: `payhooks run all` (one process per service, prefixed
# logs, restarts, Ctrl-C stops all, a dev SMTP sink on :1025). Without a ./.env, a dev secret
# and admin token when the environment has none (never use them outside your machine); with
# one, its settings (`cp .env.example .env` has the same dev values), the environment's first.
# PostgreSQL and RabbitMQ are checked first (scripts/preflight.py): a missing one stops it at
# once, named, with how to start it.
run: install
	@$(PY) scripts/preflight.py
	@if [ -f .env ]; then exec $(BIN)/payhooks run all; fi; \
	XHUB_WEBHOOK_SECRETS=$${XHUB_WEBHOOK_SECRETS:-dev-secret} ADMIN_TOKEN=$${ADMIN_TOKEN:-dev-admin-token} \
	exec $(BIN)/payhooks run all

lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

# On both cores, then the tests marked solo (time budgets, CPU shares) alone.
test: lint
	$(BIN)/pytest -n 2 -m "not solo" --durations=25
	$(BIN)/pytest -m solo --durations=10

bench: migrate
	$(PY) -m bench.ingest

# payhooks ingest beside the handbook's reference prototype, both sent unique event ids
# (bench/vs_prototype.py says why); needs wrk. About 4 minutes.
bench-vs-prototype: install
	$(PY) -m bench.vs_prototype

bench-workers: install
	$(PY) -m bench.workers --then-half 8000

# What copies cost (docs/high-availability.md#what-copies-cost): the workers and ingest benches
# and one quorum queue on the machine's single RabbitMQ node and PostgreSQL beside a cluster
# of its own (tests/cluster.py, prefix `copies`, removed at the end), 1 and 2 copies of every
# service, one table side by side. About 8 minutes.
bench-copies: install
	$(PY) -m bench.copies

# Every fault round (or ROUNDS=rabbitmq-stop,kill-orders) against a RabbitMQ node and a
# PostgreSQL cluster of its own (tests/private_servers.py), which it stops, kills and restarts
# and removes at the end; the machine's shared servers are never touched. About 30 minutes.
chaos: install
	$(PY) -m tests.chaos $(if $(ROUNDS),--rounds $(ROUNDS),) $(if $(CHAOS_PROVIDERS),--provider $(CHAOS_PROVIDERS),)

MINUTES ?= 30
soak: install
	$(PY) -m tests.chaos.soak --minutes $(MINUTES)

# A highly available stack on this machine, beside its shared servers (tests/cluster.py,
# docs/high-availability.md): three clustered RabbitMQ nodes and a PostgreSQL primary with a
# synchronous hot standby, on private names and ports. cluster-up prints AMQP_URL and
# DATABASE_URL to export; cluster-down removes every node, cluster and file. About 40 s.
cluster-up: install
	$(PY) -m tests.cluster up

cluster-down: install
	$(PY) -m tests.cluster down

cluster-status: install
	$(PY) -m tests.cluster status

# make chaos's storm against that stack (its own, `hachaos*`, made and removed) with two
# copies of every service: RabbitMQ node kills and stops, a PostgreSQL failover, copies
# killed, a rolling restart (ROUNDS=kill-orders-leader,pg-failover for some). About 35 minutes.
chaos-cluster: install
	$(PY) -m tests.chaos.cluster $(if $(ROUNDS),--rounds $(ROUNDS),)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis

# See it work: the whole system plus the simulator driving 300 payments per provider with
# duplicates, reordering and lost webhooks, then a check of every payment (scripts/demo.sh says
# how). PROVIDERS=xhub,standard,stripe: a mixed storm (payments dealt round-robin). Own database and
# queue prefix; dependencies checked first, every wait bounded.
PROVIDERS ?= xhub
demo: install
	@BIN=$(BIN) PROVIDERS=$(PROVIDERS) bash scripts/demo.sh

# make demo with every payment traced (parentbased_always_on; the services sample one in a hundred
# by default), on a machine without Jaeger (docs/observability.md, "Viewing a trace
# in the demo"): bench.trace_view receives every service's spans over OTLP/HTTP on TRACE_PORT and
# keeps them in memory; at the end the first TRACE_PAYMENTS payments' traces go to
# demo-traces.txt as trees and the first one is printed. The viewer stops with the target.
TRACE_PORT ?= 4318
TRACE_PAYMENTS ?= 20
demo-traces: install
	@url=http://127.0.0.1:$(TRACE_PORT); \
	curl -s -o /dev/null --max-time 1 $$url; [ $$? -eq 7 ] || { \
		echo "something already listens on :$(TRACE_PORT); choose another: TRACE_PORT=..." >&2; exit 1; }; \
	$(PY) -m bench.trace_view serve --port $(TRACE_PORT) & viewer=$$!; \
	trap 'kill $$viewer 2>/dev/null; wait $$viewer 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	tries=0; \
	until curl -s -o /dev/null --max-time 1 $$url/traces; do \
		tries=$$((tries + 1)); [ $$tries -lt 40 ] && kill -0 $$viewer 2>/dev/null || { \
			echo "bench.trace_view did not start on :$(TRACE_PORT)" >&2; exit 1; }; \
		sleep 0.25; \
	done; \
	status=0; OTEL_EXPORTER_OTLP_ENDPOINT=$$url OTEL_TRACES_SAMPLER=parentbased_always_on BIN=$(BIN) PROVIDERS=$(PROVIDERS) \
		bash scripts/demo.sh || status=$$?; \
	[ $$status -ne 130 ] || exit 130; \
	$(PY) -m bench.trace_view first $(TRACE_PAYMENTS) --url $$url >demo-traces.txt || status=1; \
	echo; echo "one payment's traces (the first $(TRACE_PAYMENTS) in demo-traces.txt):"; \
	$(PY) -m bench.trace_view first 1 --url $$url; \
	exit $$status
