# The commands README.md and .ci/run use. `make help` lists them.
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python

.PHONY: help install run migrate test lint bench bench-workers clean

help:
	@echo "make install  - create $(VENV) and install payhooks with its dev tools"
	@echo "make run      - migrate, then run ingest, orders, bonuses, email, api and a dev SMTP sink"
	@echo "make test     - ruff format --check, ruff check, mypy, pytest (what CI runs)"
	@echo "make lint     - ruff and mypy only"
	@echo "make bench    - ingest benchmark: batched accept path vs the naive baseline"
	@echo "make bench-workers - worker benchmark: paid payments through all three workers"

$(BIN)/payhooks: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

install: $(BIN)/payhooks

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

bench-workers: install
	$(PY) -m bench.workers

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
