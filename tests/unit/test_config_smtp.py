"""Settings for a mail provider: SMTP_TLS, SMTP_USERNAME / SMTP_PASSWORD, SMTP_CA_FILE,
EMAIL_TEMPLATES_DIR; a bad one is named in the one ConfigError, the password never shown."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from shared.config import ConfigError, Settings

PASSWORD = "smtp-password-DONOTLEAK"
PROVIDER = {"SMTP_USERNAME": "apikey", "SMTP_PASSWORD": PASSWORD, "SMTP_TLS": "starttls"}


def config_error(env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(env)
    return str(raised.value)


def test_defaults_are_todays_plain_smtp_without_login() -> None:
    settings = Settings.from_env({})

    assert settings.smtp_tls == "none"
    assert (settings.smtp_username, settings.smtp_password) == (None, None)
    assert settings.smtp_ca_file is None
    assert settings.email_templates_dir is None


@pytest.mark.parametrize(
    ("raw", "expected"), [("none", "none"), ("STARTTLS", "starttls"), ("implicit", "implicit")]
)
def test_smtp_tls_modes(raw: str, expected: str) -> None:
    assert Settings.from_env({"SMTP_TLS": raw}).smtp_tls == expected


def test_an_unknown_smtp_tls_mode_is_named_with_the_modes() -> None:
    message = config_error({"SMTP_TLS": "ssl"})

    assert "SMTP_TLS must be one of none, starttls, implicit" in message


def test_credentials_are_read() -> None:
    settings = Settings.from_env(PROVIDER)

    assert (settings.smtp_username, settings.smtp_password) == ("apikey", PASSWORD)


@pytest.mark.parametrize("missing", ["SMTP_USERNAME", "SMTP_PASSWORD"])
def test_username_and_password_go_together(missing: str) -> None:
    env = {k: v for k, v in PROVIDER.items() if k != missing}

    message = config_error(env)

    assert "SMTP_USERNAME/SMTP_PASSWORD must be set together" in message
    assert PASSWORD not in message


def test_a_password_is_never_sent_in_clear() -> None:
    message = config_error({**PROVIDER, "SMTP_TLS": "none"})

    assert "SMTP_TLS must be starttls or implicit when SMTP_PASSWORD is set" in message


def test_a_bad_smtp_tls_with_a_password_is_named_once() -> None:
    message = config_error({**PROVIDER, "SMTP_TLS": "yes"})

    assert message.count("SMTP_TLS") == 1


def test_the_password_is_not_in_repr_or_redacted() -> None:
    settings = Settings.from_env(PROVIDER)

    for shown in (repr(settings), str(settings), repr(settings.redacted())):
        assert PASSWORD not in shown
    assert settings.redacted()["smtp_username"] == "apikey"


def test_a_ca_file_is_kept(tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca_file))

    assert Settings.from_env({"SMTP_CA_FILE": str(ca_file)}).smtp_ca_file == str(ca_file)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "is not a file"),
        (b"", "must be a readable PEM file of CA certificates"),
        (b"not a certificate\n", "must be a readable PEM file of CA certificates"),
    ],
)
def test_a_bad_ca_file_is_named(tmp_path: Path, content: bytes | None, why: str) -> None:
    ca_file = tmp_path / "ca.pem"
    if content is not None:
        ca_file.write_bytes(content)

    assert f"SMTP_CA_FILE {why}" in config_error({"SMTP_CA_FILE": str(ca_file)})


def test_the_templates_dir_must_be_a_directory(tmp_path: Path) -> None:
    assert Settings.from_env({"EMAIL_TEMPLATES_DIR": str(tmp_path)}).email_templates_dir == str(
        tmp_path
    )
    message = config_error({"EMAIL_TEMPLATES_DIR": str(tmp_path / "missing")})

    assert "EMAIL_TEMPLATES_DIR is not a directory" in message


def test_every_bad_smtp_variable_is_named_in_one_error(tmp_path: Path) -> None:
    message = config_error(
        {
            "SMTP_USERNAME": "apikey",
            "SMTP_TLS": "tls",
            "SMTP_CA_FILE": str(tmp_path / "none.pem"),
            "EMAIL_TEMPLATES_DIR": str(tmp_path / "none"),
        }
    )

    for name in ("SMTP_USERNAME/SMTP_PASSWORD", "SMTP_TLS", "SMTP_CA_FILE", "EMAIL_TEMPLATES_DIR"):
        assert name in message
