"""The `payhooks` console script refuses to start a service on bad configuration, in one line;
reads ./.env under the real environment; knows its version."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from shared.providers.xhub.signatures import verify

REPO = Path(__file__).resolve().parents[2]
# Not the repository's root, where a developer's .env would fill in what a test leaves unset.
NO_DOTENV = REPO / "tests"
PAYHOOKS = Path(sys.executable).parent / "payhooks"
# Refusing to start must not wait on anything: no connection is attempted before the check.
START_REFUSAL_TIMEOUT_S = 10


def run_payhooks(*args: str, cwd: Path = NO_DOTENV, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the console script with only PATH and `env` set (nothing inherited from the shell)."""
    return subprocess.run(
        [str(PAYHOOKS), *args],
        cwd=cwd,
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


def test_version_is_the_installed_distributions() -> None:
    result = run_payhooks("--version")

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"payhooks {metadata.version('payhooks')}\n"


def test_a_secret_file_that_cannot_be_read_is_named_in_one_line(tmp_path: Path) -> None:
    result = run_payhooks(
        "run", "ingest", XHUB_WEBHOOK_SECRETS_FILE=str(tmp_path / "no-such-secret")
    )

    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "XHUB_WEBHOOK_SECRETS_FILE names a file that cannot be read" in result.stderr


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_dot_env_in_the_current_folder_is_read_and_the_environment_wins(tmp_path: Path) -> None:
    # `send` shows both without any service running: the URL (INGEST_PORT) it could not
    # reach, and the signature (XHUB_WEBHOOK_SECRETS) of what it tried to send.
    from_file, from_env = closed_port(), closed_port()
    (tmp_path / ".env").write_text(
        f"# local settings\nXHUB_WEBHOOK_SECRETS=dotenv-secret\nINGEST_PORT={from_file}\n"
    )
    (tmp_path / "elsewhere").mkdir()

    read = run_payhooks("send", "--payment-id", "pay_env", cwd=tmp_path)
    overridden = run_payhooks(
        "send", "--payment-id", "pay_env", cwd=tmp_path, INGEST_PORT=str(from_env)
    )
    not_here = run_payhooks("send", "--payment-id", "pay_env", cwd=tmp_path / "elsewhere")

    assert read.returncode == 3, read.stderr  # signed and tried: nothing listens there
    assert f"127.0.0.1:{from_file}/" in read.stdout
    headers = dict(re.findall(r"^> ([\w-]+): (.*)$", read.stdout, re.MULTILINE))
    body = next(line[2:] for line in read.stdout.splitlines() if line.startswith("> {"))
    signature = headers["X-Webhook-Signature"]
    assert verify([b"dotenv-secret"], headers["X-Webhook-Timestamp"], body.encode(), signature)
    assert overridden.returncode == 3
    assert f"127.0.0.1:{from_env}/" in overridden.stdout
    assert not_here.returncode == 2  # only ./.env, not a parent folder's: no secret
    assert "XHUB_WEBHOOK_SECRETS" in not_here.stderr
