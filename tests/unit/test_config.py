"""Settings.from_env: SPEC section 2 defaults, one error naming every bad variable, no secrets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.config import ConfigError, Settings, is_set
from shared.config_values import amqp_nodes

SECRET_LOOKING = "sk_live_9f8e7d6c5b4a3210DONOTLEAK"


def config_error(env: dict[str, str], required: tuple[str, ...] = ()) -> str:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(env, required=required)
    return str(raised.value)


def test_defaults_match_spec_section_2() -> None:
    settings = Settings.from_env({})

    assert settings.database_url == "postgresql://postgres@127.0.0.1:5432/payhooks"
    assert settings.amqp_url == "amqp://guest:guest@127.0.0.1:5672/"
    assert settings.webhook_secrets == ()
    assert settings.timestamp_tolerance_s == 300
    assert settings.max_body_bytes == 262_144
    assert settings.xhub_api_url is None
    assert settings.xhub_api_key is None
    assert settings.smtp_host == "127.0.0.1"
    assert settings.smtp_port == 1025
    assert settings.bonus_points == 500
    assert settings.retry_delays_s == (1.0, 5.0, 30.0, 120.0, 600.0)
    assert settings.reconcile_interval_s == 60.0
    assert settings.reconcile_after_s == 900.0
    assert settings.reconcile_horizon_s == 2_592_000.0
    assert settings.xhub_api_rate == 10.0
    assert settings.admin_token is None
    assert settings.ingest_port == 8080
    assert settings.ingest_processes == 1
    assert settings.api_port == 8081
    assert settings.orders_port == 9101
    assert settings.bonuses_port == 9102
    assert settings.email_port == 9103
    assert settings.reconciler_port == 9104
    assert settings.ingest_tls_cert is None
    assert settings.ingest_tls_key is None


def test_every_variable_is_read_from_the_given_environment() -> None:
    settings = Settings.from_env(
        {
            "DATABASE_URL": "postgresql://u@db:5433/x",
            "AMQP_URL": "amqp://u:p@mq:5673/v",
            "XHUB_WEBHOOK_SECRETS": "a,b",
            "XHUB_TIMESTAMP_TOLERANCE": "60",
            "INGEST_MAX_BODY": "1024",
            "XHUB_API_URL": "https://api.example",
            "XHUB_API_KEY": "key",
            "SMTP_HOST": "mail",
            "SMTP_PORT": "25",
            "EMAIL_FROM": "shop@example.com",
            "BONUS_POINTS": "7",
            "RETRY_DELAYS": "2,4",
            "RECONCILE_INTERVAL": "1.5",
            "RECONCILE_AFTER": "30",
            "RECONCILE_HORIZON": "86400",
            "UNKNOWN_PAYMENT_PARK_SECONDS": "120",
            "XHUB_API_RATE": "50",
            "ADMIN_TOKEN": "admin",
            "INGEST_PORT": "1",
            "INGEST_PROCESSES": "4",
            "API_PORT": "2",
            "ORDERS_PORT": "3",
            "BONUSES_PORT": "4",
            "EMAIL_PORT": "5",
            "RECONCILER_PORT": "65535",
        }
    )

    assert settings.database_url == "postgresql://u@db:5433/x"
    assert settings.amqp_url == "amqp://u:p@mq:5673/v"
    assert settings.webhook_secrets == (b"a", b"b")
    assert settings.timestamp_tolerance_s == 60
    assert settings.max_body_bytes == 1024
    assert settings.xhub_api_url == "https://api.example"
    assert settings.xhub_api_key == "key"
    assert (settings.smtp_host, settings.smtp_port) == ("mail", 25)
    assert settings.email_from == "shop@example.com"
    assert settings.bonus_points == 7
    assert settings.retry_delays_s == (2.0, 4.0)
    assert (settings.reconcile_interval_s, settings.reconcile_after_s) == (1.5, 30.0)
    assert settings.reconcile_horizon_s == 86_400.0
    assert settings.unknown_payment_park_s == 120.0
    assert settings.xhub_api_rate == 50.0
    assert settings.admin_token == "admin"
    assert settings.ingest_processes == 4
    ports = (
        settings.ingest_port,
        settings.api_port,
        settings.orders_port,
        settings.bonuses_port,
        settings.email_port,
        settings.reconciler_port,
    )
    assert ports == (1, 2, 3, 4, 5, 65535)


def test_webhook_secrets_are_split_on_commas_and_trimmed() -> None:
    settings = Settings.from_env({"XHUB_WEBHOOK_SECRETS": " new , old ,, "})

    assert settings.webhook_secrets == (b"new", b"old")


def test_empty_optional_variable_means_unset() -> None:
    settings = Settings.from_env({"XHUB_API_KEY": "  ", "INGEST_MAX_BODY": ""})

    assert settings.xhub_api_key is None
    assert settings.max_body_bytes == 262_144


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("XHUB_TIMESTAMP_TOLERANCE", "five minutes"),
        ("XHUB_TIMESTAMP_TOLERANCE", "0"),
        ("INGEST_MAX_BODY", "-1"),
        ("INGEST_MAX_BODY", "1.5"),
        ("SMTP_PORT", "65536"),
        ("INGEST_PORT", "http"),
        ("INGEST_PROCESSES", "0"),
        ("INGEST_PROCESSES", "65"),
        ("INGEST_PROCESSES", "two"),
        ("BONUS_POINTS", "0"),
        ("RECONCILE_INTERVAL", "nan"),
        ("RECONCILE_AFTER", "-5"),
        ("RETRY_DELAYS", "1,,5"),
        ("XHUB_WEBHOOK_SECRETS", " , ,"),
        ("LOG_LEVEL", "verbose"),
        ("RETENTION_DAYS", "3"),  # shorter than the dedup window X-Hub's retries need
    ],
)
def test_malformed_variable_is_named_in_the_error(name: str, value: str) -> None:
    message = config_error({name: value})

    assert name in message


def test_every_bad_variable_is_named_in_one_error() -> None:
    message = config_error(
        {"INGEST_MAX_BODY": "big", "SMTP_PORT": "0", "RETRY_DELAYS": "1,soon"},
        required=("ADMIN_TOKEN",),
    )

    for name in ("INGEST_MAX_BODY", "SMTP_PORT", "RETRY_DELAYS", "ADMIN_TOKEN"):
        assert name in message
    assert "\n" not in message


def test_required_webhook_secrets_missing_is_named() -> None:
    message = config_error({}, required=("XHUB_WEBHOOK_SECRETS",))

    assert "XHUB_WEBHOOK_SECRETS" in message
    assert "required" in message


def test_required_variable_that_is_blank_counts_as_missing() -> None:
    message = config_error({"XHUB_WEBHOOK_SECRETS": "   "}, required=("XHUB_WEBHOOK_SECRETS",))

    assert "XHUB_WEBHOOK_SECRETS" in message


def test_required_variable_that_is_set_passes() -> None:
    settings = Settings.from_env({"XHUB_WEBHOOK_SECRETS": "s"}, required=("XHUB_WEBHOOK_SECRETS",))

    assert settings.webhook_secrets == (b"s",)


def test_malformed_required_variable_is_named_once() -> None:
    message = config_error({"XHUB_WEBHOOK_SECRETS": ","}, required=("XHUB_WEBHOOK_SECRETS",))

    assert message.count("XHUB_WEBHOOK_SECRETS") == 1


@pytest.mark.parametrize(
    "name", ["INGEST_MAX_BODY", "XHUB_TIMESTAMP_TOLERANCE", "RETRY_DELAYS", "SMTP_PORT"]
)
def test_bad_value_is_not_echoed_in_the_error(name: str) -> None:
    message = config_error({name: SECRET_LOOKING, "XHUB_WEBHOOK_SECRETS": "hunter2-secret"})

    assert name in message
    assert SECRET_LOOKING not in message
    assert "hunter2-secret" not in message


def test_secrets_and_credentials_are_not_in_repr_or_redacted() -> None:
    settings = Settings.from_env(
        {
            "DATABASE_URL": "postgresql://payhooks:db-password-1@db/payhooks",
            "AMQP_URL": "amqp://user:mq-password-2@mq/",
            "XHUB_WEBHOOK_SECRETS": "whsec-current-3,whsec-previous-4",
            "XHUB_API_KEY": "api-key-5",
            "ADMIN_TOKEN": "admin-token-6",
        }
    )
    shown = [repr(settings), str(settings), repr(settings.redacted())]

    for text in shown:
        for secret in (
            "db-password-1",
            "mq-password-2",
            "whsec-current-3",
            "whsec-previous-4",
            "api-key-5",
            "admin-token-6",
        ):
            assert secret not in text
    assert "max_body_bytes" in settings.redacted()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1,5,30,120,600", (1.0, 5.0, 30.0, 120.0, 600.0)),
        ("0.2, 0.4", (0.2, 0.4)),
        ("10", (10.0,)),
        (" 3 ,7 ", (3.0, 7.0)),
    ],
)
def test_retry_delays_parse_as_seconds(raw: str, expected: tuple[float, ...]) -> None:
    assert Settings.from_env({"RETRY_DELAYS": raw}).retry_delays_s == expected


@pytest.mark.parametrize("raw", ["1,0", "-1", "1,,5", "1;5", "a,b", "5,", "nan"])
def test_malformed_retry_delays_are_rejected(raw: str) -> None:
    message = config_error({"RETRY_DELAYS": raw})

    assert "RETRY_DELAYS" in message


@pytest.mark.parametrize(
    "env", [{"INGEST_TLS_CERT": "/tls/cert.pem"}, {"INGEST_TLS_KEY": "/tls/key.pem"}]
)
def test_tls_cert_and_key_must_be_set_together(env: dict[str, str]) -> None:
    message = config_error(env)

    assert "INGEST_TLS_CERT" in message
    assert "INGEST_TLS_KEY" in message


def test_tls_cert_and_key_set_together_are_kept() -> None:
    settings = Settings.from_env({"INGEST_TLS_CERT": "/c.pem", "INGEST_TLS_KEY": "/k.pem"})

    assert (settings.ingest_tls_cert, settings.ingest_tls_key) == ("/c.pem", "/k.pem")


def test_settings_are_frozen() -> None:
    settings = Settings.from_env({})

    with pytest.raises(AttributeError):
        settings.max_body_bytes = 1  # type: ignore[misc]  # the point of the test


# --- NAME_FILE: secrets from files (Docker and Kubernetes secrets) ---------------------------


@pytest.mark.parametrize(
    ("name", "attribute", "expected"),
    [
        ("XHUB_WEBHOOK_SECRETS", "webhook_secrets", (b"new", b"old")),
        ("ADMIN_TOKEN", "admin_token", "new,old"),
        ("XHUB_API_KEY", "xhub_api_key", "new,old"),
        ("DATABASE_URL", "database_url", "new,old"),
    ],
)
def test_a_secret_is_read_from_the_file_its_file_variable_names(
    tmp_path: Path, name: str, attribute: str, expected: object
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("new,old\n")  # as `echo` and most editors leave it

    settings = Settings.from_env({f"{name}_FILE": str(secret)})

    assert getattr(settings, attribute) == expected


def test_the_broker_url_is_read_from_a_file_too(tmp_path: Path) -> None:
    secret = tmp_path / "amqp"
    secret.write_text("amqp://u:p@mq1/,amqp://u:p@mq2/\n")

    settings = Settings.from_env({"AMQP_URL_FILE": str(secret)})

    assert settings.amqp_url == "amqp://u:p@mq1/,amqp://u:p@mq2/"


@pytest.mark.parametrize(
    ("raw", "nodes"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/", ("amqp://guest:guest@127.0.0.1:5672/",)),
        (
            "amqp://u:p@mq1:5672/v, amqps://u:p@mq2:5671/v,amqp://u:p@mq3/v",
            ("amqp://u:p@mq1:5672/v", "amqps://u:p@mq2:5671/v", "amqp://u:p@mq3/v"),
        ),
    ],
)
def test_amqp_url_names_one_node_or_a_clusters_nodes(raw: str, nodes: tuple[str, ...]) -> None:
    assert amqp_nodes(raw) == nodes
    assert Settings.from_env({"AMQP_URL": raw}).amqp_url == raw


@pytest.mark.parametrize("raw", ["mq1:5672", "amqp://u:p@mq1/,http://mq2/", "amqp:///v"])
def test_an_amqp_url_that_is_not_a_list_of_node_urls_is_named(raw: str) -> None:
    error = config_error({"AMQP_URL": raw})
    assert "AMQP_URL" in error
    assert raw not in error  # it may hold a password


def test_smtp_password_is_read_from_a_file_too(tmp_path: Path) -> None:
    secret = tmp_path / "smtp"
    secret.write_text("p4ss\n")

    settings = Settings.from_env(
        {"SMTP_USERNAME": "u", "SMTP_PASSWORD_FILE": str(secret), "SMTP_TLS": "starttls"}
    )

    assert settings.smtp_password == "p4ss"


def test_only_the_trailing_newline_of_a_secret_file_is_dropped(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"  token with spaces inside\r\n")

    settings = Settings.from_env({"ADMIN_TOKEN_FILE": str(secret)})

    assert settings.admin_token == "token with spaces inside"  # values are trimmed as always


def test_a_required_secret_given_as_a_file_counts_as_set(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s\n")

    settings = Settings.from_env(
        {"XHUB_WEBHOOK_SECRETS_FILE": str(secret)}, required=("XHUB_WEBHOOK_SECRETS",)
    )

    assert settings.webhook_secrets == (b"s",)


def test_a_variable_and_its_file_variable_both_set_is_an_error(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET_LOOKING)

    message = config_error(
        {"ADMIN_TOKEN": "hunter2-secret", "ADMIN_TOKEN_FILE": str(secret)},
        required=("ADMIN_TOKEN",),
    )

    assert "ADMIN_TOKEN and ADMIN_TOKEN_FILE are both set" in message
    assert message.count("ADMIN_TOKEN") == 2  # not "is required" on top
    assert SECRET_LOOKING not in message
    assert "hunter2-secret" not in message


@pytest.mark.parametrize("problem", ["missing", "directory", "not utf-8", "unreadable"])
def test_an_unreadable_secret_file_is_named_without_its_content_or_path(
    tmp_path: Path, problem: str
) -> None:
    path = tmp_path / SECRET_LOOKING  # a secret pasted where the path belongs
    if problem == "directory":
        path.mkdir()
    elif problem == "not utf-8":
        path.write_bytes(b"\xff\xfe" + SECRET_LOOKING.encode())
    elif problem == "unreadable":
        path.write_text(SECRET_LOOKING)
        path.chmod(0)
        if os.access(path, os.R_OK):
            pytest.skip("root reads files whatever their mode")

    message = config_error(
        {"XHUB_WEBHOOK_SECRETS_FILE": str(path)}, required=("XHUB_WEBHOOK_SECRETS",)
    )

    assert "XHUB_WEBHOOK_SECRETS_FILE names a file that" in message
    assert "required" not in message  # one problem, said once
    assert SECRET_LOOKING not in message


def test_file_variables_of_other_settings_are_not_read(tmp_path: Path) -> None:
    # Only secrets come from files; SMTP_HOST_FILE means nothing (and is not opened).
    settings = Settings.from_env({"SMTP_HOST_FILE": str(tmp_path / "missing")})

    assert settings.smtp_host == "127.0.0.1"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"ADMIN_TOKEN": "t"}, True),
        ({"ADMIN_TOKEN_FILE": "/run/secrets/admin"}, True),
        ({"ADMIN_TOKEN": " ", "ADMIN_TOKEN_FILE": ""}, False),
        ({"SMTP_HOST_FILE": "/x"}, False),
    ],
)
def test_is_set_counts_a_file_variable_for_secrets_only(
    env: dict[str, str], expected: bool
) -> None:
    name = "SMTP_HOST" if "SMTP_HOST_FILE" in env else "ADMIN_TOKEN"

    assert is_set(env, name) is expected


# --- LOG_FORMAT -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, None), ("json", "json"), ("Console", "console")]
)
def test_log_format_is_json_console_or_unset(raw: str | None, expected: str | None) -> None:
    env = {} if raw is None else {"LOG_FORMAT": raw}

    assert Settings.from_env(env).log_format == expected


def test_an_unknown_log_format_is_named() -> None:
    assert "LOG_FORMAT" in config_error({"LOG_FORMAT": "pretty"})


# --- every registered provider's secrets (shared/providers/registry.py) ----------------------


def test_each_provider_has_its_secrets_and_only_those_configured_get_a_route() -> None:
    from shared.providers.registry import configured

    key = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    settings = Settings.from_env({"XHUB_WEBHOOK_SECRETS": "new, old"})
    assert settings.provider_secrets == {"xhub": (b"new", b"old"), "standard": (), "stripe": ()}
    assert [p.name for p in configured(settings.provider_secrets)] == ["xhub"]

    both = Settings.from_env({"XHUB_WEBHOOK_SECRETS": "s", "STANDARD_WEBHOOK_SECRETS": key})
    assert len(both.provider_secrets["standard"]) == 1
    assert [p.name for p in configured(both.provider_secrets)] == ["xhub", "standard"]

    stripe = Settings.from_env({"XHUB_WEBHOOK_SECRETS": "s", "STRIPE_WEBHOOK_SECRETS": key})
    assert stripe.provider_secrets["stripe"] == (key.encode(),)  # keyed as given, prefix too
    assert [p.name for p in configured(stripe.provider_secrets)] == ["xhub", "stripe"]


def test_stripes_api_is_configured_by_its_key_alone() -> None:
    assert Settings.from_env({}).provider_apis == {}
    settings = Settings.from_env({"STRIPE_API_KEY": "sk_test_x"})
    assert settings.provider_apis == {"stripe": ("https://api.stripe.com", "sk_test_x")}
    local = Settings.from_env({"STRIPE_API_KEY": "k", "STRIPE_API_URL": "http://127.0.0.1:1"})
    assert local.provider_apis["stripe"] == ("http://127.0.0.1:1", "k")
    assert "sk_test_x" not in repr(settings)
    assert "provider_apis" not in settings.redacted()


def test_stripe_livemode_is_live_test_or_any() -> None:
    assert Settings.from_env({}).provider_options["stripe"] == {}
    live = Settings.from_env({"STRIPE_LIVEMODE": "Live"})
    assert live.provider_options["stripe"] == {"STRIPE_LIVEMODE": "live"}
    assert "STRIPE_LIVEMODE must be live, test or any" in config_error({"STRIPE_LIVEMODE": "yes"})


def test_a_malformed_stripe_secret_is_named_never_shown() -> None:
    error = config_error({"STRIPE_WEBHOOK_SECRETS": f"sk_live_{SECRET_LOOKING}"})

    assert "STRIPE_WEBHOOK_SECRETS must be comma-separated whsec_... endpoint secrets" in error
    assert SECRET_LOOKING not in error


def test_a_malformed_standard_secret_is_named_never_shown() -> None:
    error = config_error({"STANDARD_WEBHOOK_SECRETS": f"whsec_{SECRET_LOOKING}!"})

    assert "STANDARD_WEBHOOK_SECRETS must be comma-separated whsec_<base64> secrets" in error
    assert SECRET_LOOKING not in error


def test_standard_secrets_may_come_from_a_file_and_stay_out_of_repr(tmp_path: Path) -> None:
    secret = tmp_path / "standard"
    secret.write_text("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n")
    settings = Settings.from_env({"STANDARD_WEBHOOK_SECRETS_FILE": str(secret)})

    assert len(settings.provider_secrets["standard"]) == 1
    assert "provider_secrets" not in repr(settings)
    assert "provider_secrets" not in settings.redacted()
