# The commands README.md and .ci/run use. `make help` lists them.
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python

.PHONY: help install run migrate test lint bench clean

help:
	@echo "make install  - create $(VENV) and install payhooks with its dev tools"
	@echo "make run      - migrate, then run the ingest service against local PostgreSQL/RabbitMQ"
	@echo "make test     - ruff format --check, ruff check, mypy, pytest (what CI runs)"
	@echo "make lint     - ruff and mypy only"
	@echo "make bench    - ingest benchmark: batched accept path vs the naive baseline"

$(BIN)/payhooks: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

install: $(BIN)/payhooks

migrate: install
	$(BIN)/payhooks migrate

# A dev secret is used when none is configured; never use it outside your machine.
run: migrate
	XHUB_WEBHOOK_SECRETS=$${XHUB_WEBHOOK_SECRETS:-dev-secret} $(BIN)/payhooks run ingest

lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench: migrate
	$(PY) -m bench.ingest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
