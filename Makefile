# The commands README.md and .ci/run use. `make help` lists them.
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
# The interpreter the venv is made from: Python 3.11, what CI and the image use (pyproject.toml
# allows 3.11-3.13 and the lock files are resolved for all three; only 3.11 is tested).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || echo python3)

.PHONY: help install lock run migrate test lint bench bench-vs-prototype bench-workers demo chaos soak clean

help:
	@echo "make install  - create $(VENV) and install payhooks with its dev tools"
	@echo "make lock     - regenerate requirements.lock and requirements-dev.lock from pyproject.toml"
	@echo "make run      - migrate, then run ingest, orders, bonuses, email, api and a dev SMTP sink"
	@echo "make test     - ruff format --check, ruff check, mypy, pytest (what CI runs)"
	@echo "make lint     - ruff and mypy only"
	@echo "make bench    - ingest benchmark: batched accept path vs the naive baseline"
	@echo "make demo     - the whole system plus the X-Hub simulator (300 payments), checked"
	@echo "make bench-vs-prototype - ingest beside the handbook's reference prototype (needs wrk)"
	@echo "make bench-workers - worker benchmark: paid payments through all three workers"
	@echo "make chaos    - the whole system under traffic while RabbitMQ / PostgreSQL / services fail"
	@echo "make soak     - MINUTES (30) at half the measured capacity, watched for growth"

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
# logs, restarts, Ctrl-C stops all, a dev SMTP sink on :1025). Dev secret and admin token
# when none are configured: never use them outside your machine.
run: install
	XHUB_WEBHOOK_SECRETS=$${XHUB_WEBHOOK_SECRETS:-dev-secret} ADMIN_TOKEN=$${ADMIN_TOKEN:-dev-admin-token} \
	$(BIN)/payhooks run all

lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench: migrate
	$(PY) -m bench.ingest

# payhooks ingest beside the handbook's reference prototype, both sent unique event ids
# (bench/vs_prototype.py says why); needs wrk. About 4 minutes.
bench-vs-prototype: install
	$(PY) -m bench.vs_prototype

bench-workers: install
	$(PY) -m bench.workers

# Every fault round (or ROUNDS=rabbitmq-stop,kill-orders): stops, kills and restarts this
# machine's RabbitMQ and PostgreSQL, so never beside other tests. About 15 minutes.
chaos: install
	$(PY) -m tests.chaos $(if $(ROUNDS),--rounds $(ROUNDS),)

MINUTES ?= 30
soak: install
	$(PY) -m tests.chaos.soak --minutes $(MINUTES)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis

# See it work: the whole system plus the X-Hub simulator driving a few hundred payments with
# duplicates, reordering and lost webhooks (repaired by the reconciler against the simulator's
# API), then a check of every payment against what payhooks did. Own database and queue prefix.
DEMO_ENV := DATABASE_URL=postgresql://postgres@127.0.0.1:5432/payhooks_demo AMQP_PREFIX=demo. \
	XHUB_WEBHOOK_SECRETS=demo-secret ADMIN_TOKEN=demo-admin-token \
	XHUB_API_URL=http://127.0.0.1:8090 XHUB_API_KEY=demo-provider-key \
	RECONCILE_INTERVAL=2 RECONCILE_AFTER=3 RETRY_DELAYS=0.5,1,2 LOG_LEVEL=WARNING
demo: install
	@export $(DEMO_ENV); \
	$(BIN)/payhooks run all > demo.log 2>&1 & supervisor=$$!; \
	trap 'kill $$supervisor 2>/dev/null; wait $$supervisor' EXIT INT TERM; \
	for port in 8080 8081 9101 9102 9103 9104; do \
		until curl -sf localhost:$$port/readyz >/dev/null; do sleep 0.5; done; done; \
	$(BIN)/payhooks sim --payments 300 --duplicates 0.1 --reorder 0.2 --lost 0.03 \
		--concurrency 10 --linger 10 --check > demo-summary.txt; status=$$?; \
	for port in 8080 8081 9101 9102 9103 9104; do \
		echo "# localhost:$$port/metrics"; curl -sf localhost:$$port/metrics | grep '^payhooks_'; done > demo-metrics.txt; \
	head -n 1 demo-summary.txt; grep '^MISMATCH' demo-summary.txt; sed -n '/^check:/,$$p' demo-summary.txt; \
	echo; echo "where to look:"; \
	echo "  demo-summary.txt  every delivery and payment with its expected outcome"; \
	echo "  demo-metrics.txt  /metrics of every service at the end (payhooks_* series)"; \
	echo "  demo.log          the services' logs"; \
	echo "  one payment:      DATABASE_URL=postgresql://postgres@127.0.0.1:5432/payhooks_demo AMQP_PREFIX=demo. $(BIN)/payhooks payment show <id>"; \
	echo "  live:             make run, then curl localhost:8080/metrics (ingest), localhost:8081/metrics (queues, DLQs)"; \
	exit $$status
