"""The `payhooks` console script refuses to start a service on bad configuration, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAYHOOKS = Path(sys.executable).parent / "payhooks"
# Refusing to start must not wait on anything: no connection is attempted before the check.
START_REFUSAL_TIMEOUT_S = 10


def run_payhooks(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the console script with only PATH and `env` set (nothing inherited from the shell)."""
    return subprocess.run(
        [str(PAYHOOKS), *args],
        cwd=REPO,
        env={"PATH": os.environ.get("PATH", ""), **env},
        capture_output=True,
        text=True,
        timeout=START_REFUSAL_TIMEOUT_S,
        check=False,
    )


def test_console_script_is_installed_next_to_the_interpreter() -> None:
    assert PAYHOOKS.exists()


def test_ingest_without_webhook_secrets_exits_with_one_line_naming_them() -> None:
    result = run_payhooks("run", "ingest")

    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "XHUB_WEBHOOK_SECRETS" in lines[0]
    assert result.stdout == ""


def test_ingest_with_blank_webhook_secrets_is_refused() -> None:
    result = run_payhooks("run", "ingest", XHUB_WEBHOOK_SECRETS=" , ")

    assert result.returncode != 0
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "XHUB_WEBHOOK_SECRETS" in result.stderr


@pytest.mark.parametrize("value", ["lots", "0", "256k"])
def test_ingest_with_malformed_max_body_exits_with_one_line_naming_it(value: str) -> None:
    result = run_payhooks("run", "ingest", XHUB_WEBHOOK_SECRETS="s3cr3t", INGEST_MAX_BODY=value)

    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "INGEST_MAX_BODY" in lines[0]
    assert "XHUB_WEBHOOK_SECRETS" not in lines[0]


def test_every_problem_is_named_in_the_same_single_line() -> None:
    result = run_payhooks("run", "ingest", INGEST_MAX_BODY="lots", INGEST_PORT="http")

    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    for name in ("XHUB_WEBHOOK_SECRETS", "INGEST_MAX_BODY", "INGEST_PORT"):
        assert name in lines[0]


def test_refusal_does_not_echo_secret_values() -> None:
    result = run_payhooks(
        "run",
        "ingest",
        XHUB_WEBHOOK_SECRETS="whsec_live_do_not_print",
        XHUB_TIMESTAMP_TOLERANCE="sk_live_also_do_not_print",
        DATABASE_URL="postgresql://app:db_password_do_not_print@db/payhooks",
    )

    assert result.returncode != 0
    assert "XHUB_TIMESTAMP_TOLERANCE" in result.stderr
    for secret in ("whsec_live_do_not_print", "sk_live_also_do_not_print", "db_password"):
        assert secret not in result.stderr
        assert secret not in result.stdout


def test_unknown_service_is_a_usage_error() -> None:
    result = run_payhooks("run", "no-such-service", XHUB_WEBHOOK_SECRETS="s")

    assert result.returncode != 0
    assert "no-such-service" in result.stderr
