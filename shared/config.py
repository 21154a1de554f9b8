"""Settings: the one place that reads the environment, parsed once into a frozen value."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from shared.config_values import amqp_url, ca_file, directory, log_format, log_level, smtp_tls
from shared.providers.registry import PROVIDERS
from shared.tokens import AdminToken, parse_admin_tokens, with_legacy

T = TypeVar("T")


_NO_SECRETS: tuple[bytes, ...] = ()
_DEFAULT_RETRY_DELAYS_S: tuple[float, ...] = (1.0, 5.0, 30.0, 120.0, 600.0)
# Secrets that may come from a file instead, NAME_FILE=path (Docker and Kubernetes secrets).
FILE_VARIABLES = frozenset(
    {
        "XHUB_WEBHOOK_SECRETS",
        "ADMIN_TOKEN",
        "ADMIN_TOKENS",
        "XHUB_API_KEY",
        "DATABASE_URL",
        "AMQP_URL",
        "SMTP_PASSWORD",
        *(provider.secrets_variable for provider in PROVIDERS),
        *(p.payment_api.key_variable for p in PROVIDERS if p.payment_api is not None),
    }
)


class ConfigError(Exception):
    """One or more environment variables are missing or malformed; the message names them all."""


MIN_RETENTION_DAYS = 35
# INGEST_PROCESSES above this is a typo, not a machine (each process holds its own database
# pool of 10 and one RabbitMQ connection).
_MAX_PROCESSES = 64


@dataclass(frozen=True, slots=True)
class Settings:
    database_url: str = field(repr=False)
    amqp_url: str = field(repr=False)
    webhook_secrets: tuple[bytes, ...] = field(repr=False)  # X-Hub's (XHUB_WEBHOOK_SECRETS)
    # Every registered provider's secrets by provider name (its `secrets_variable`, parsed by
    # the provider); () for one not configured, which then has no route.
    provider_secrets: Mapping[str, tuple[bytes, ...]] = field(repr=False)
    timestamp_tolerance_s: int
    # (base URL, key) of each provider's payment API (its `payment_api`) by provider name, for
    # those whose key variable is set: the reconciler asks only these (X-Hub's are below).
    provider_apis: Mapping[str, tuple[str, str]] = field(repr=False)
    # Each provider's own settings (its `options`, those set), by provider name.
    provider_options: Mapping[str, Mapping[str, str]]
    max_body_bytes: int
    xhub_api_url: str | None
    xhub_api_key: str | None = field(repr=False)
    smtp_host: str
    smtp_port: int
    email_from: str
    smtp_username: str | None
    smtp_password: str | None = field(repr=False)
    smtp_tls: str  # one of SMTP_TLS_MODES
    smtp_ca_file: str | None
    email_templates_dir: str | None
    bonus_points: int
    retry_delays_s: tuple[float, ...]
    reconcile_interval_s: float
    reconcile_after_s: float
    reconcile_horizon_s: float
    # How long the orders worker keeps an event for a payment without an order before it
    # dead-letters it with reason unknown_payment.
    unknown_payment_park_s: float
    xhub_api_rate: float  # questions a second to the provider's API: the reconciler's budget
    admin_token: str | None = field(repr=False)
    admin_tokens: tuple[AdminToken, ...] = field(repr=False)  # ADMIN_TOKEN's first, as `admin`
    retention_days: int
    # Where expired inbox days are archived (docs/retention.md); None: nothing is expired.
    archive_dir: Path | None
    ingest_port: int
    ingest_processes: int
    api_port: int
    orders_port: int
    bonuses_port: int
    email_port: int
    reconciler_port: int
    ingest_tls_cert: str | None
    ingest_tls_key: str | None
    amqp_prefix: str
    log_level: str
    log_format: str | None  # one of LOG_FORMATS; None: console on a terminal, else json

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, required: Iterable[str] = ()
    ) -> Settings:
        """Parse every variable; raise one ConfigError naming each missing or bad one.

        `required` lists variable names (e.g. XHUB_WEBHOOK_SECRETS) the calling service cannot
        start without.
        """
        env = os.environ if environ is None else environ
        reader = _Reader(env)
        admin = reader.optional("ADMIN_TOKEN")
        values: dict[str, Any] = {
            "database_url": reader.text(
                "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/payhooks"
            ),
            "amqp_url": reader.parse("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/", amqp_url),
            "webhook_secrets": reader.parse("XHUB_WEBHOOK_SECRETS", _NO_SECRETS, _secrets),
            "provider_secrets": {
                provider.name: reader.parse(
                    provider.secrets_variable, _NO_SECRETS, provider.parse_secrets
                )
                for provider in PROVIDERS
            },
            "timestamp_tolerance_s": reader.parse("XHUB_TIMESTAMP_TOLERANCE", 300, _positive_int),
            "provider_apis": _provider_apis(reader),
            "provider_options": {
                provider.name: {
                    name: value
                    for name, parser in (provider.options or {}).items()
                    if (value := reader.parse(name, "", parser))
                }
                for provider in PROVIDERS
            },
            "max_body_bytes": reader.parse("INGEST_MAX_BODY", 262_144, _positive_int),
            "xhub_api_url": reader.optional("XHUB_API_URL"),
            "xhub_api_key": reader.optional("XHUB_API_KEY"),
            "smtp_host": reader.text("SMTP_HOST", "127.0.0.1"),
            "smtp_port": reader.parse("SMTP_PORT", 1025, _port),
            "email_from": reader.text("EMAIL_FROM", "payments@payhooks.localhost"),
            "smtp_username": reader.optional("SMTP_USERNAME"),
            "smtp_password": reader.optional("SMTP_PASSWORD"),
            "smtp_tls": reader.parse("SMTP_TLS", "none", smtp_tls),
            "smtp_ca_file": reader.parse("SMTP_CA_FILE", None, ca_file),
            "email_templates_dir": reader.parse("EMAIL_TEMPLATES_DIR", None, directory),
            "bonus_points": reader.parse("BONUS_POINTS", 500, _positive_int),
            "retry_delays_s": reader.parse("RETRY_DELAYS", _DEFAULT_RETRY_DELAYS_S, _delays),
            "reconcile_interval_s": reader.parse("RECONCILE_INTERVAL", 60.0, _positive_float),
            "reconcile_after_s": reader.parse("RECONCILE_AFTER", 900.0, _positive_float),
            "xhub_api_rate": reader.parse("XHUB_API_RATE", 10.0, _positive_float),
            "reconcile_horizon_s": reader.parse("RECONCILE_HORIZON", 2_592_000.0, _positive_float),
            "unknown_payment_park_s": reader.parse(
                "UNKNOWN_PAYMENT_PARK_SECONDS", 21_600.0, _positive_float
            ),
            "admin_token": admin,
            "admin_tokens": reader.parse(
                "ADMIN_TOKENS", with_legacy(admin, ()), lambda t: parse_admin_tokens(t, admin)
            ),
            "retention_days": reader.parse("RETENTION_DAYS", 35, _retention_days),
            "archive_dir": reader.parse("ARCHIVE_DIR", None, _archive_dir),
            "ingest_port": reader.parse("INGEST_PORT", 8080, _port),
            "ingest_processes": reader.parse("INGEST_PROCESSES", 1, _processes),
            "api_port": reader.parse("API_PORT", 8081, _port),
            "orders_port": reader.parse("ORDERS_PORT", 9101, _port),
            "bonuses_port": reader.parse("BONUSES_PORT", 9102, _port),
            "email_port": reader.parse("EMAIL_PORT", 9103, _port),
            "reconciler_port": reader.parse("RECONCILER_PORT", 9104, _port),
            "ingest_tls_cert": reader.optional("INGEST_TLS_CERT"),
            "ingest_tls_key": reader.optional("INGEST_TLS_KEY"),
            "amqp_prefix": reader.text("AMQP_PREFIX", ""),
            "log_level": reader.parse("LOG_LEVEL", "INFO", log_level),
            "log_format": reader.parse("LOG_FORMAT", None, log_format),
        }
        for entry in required:  # NAME, or NAME|OTHER: one of them
            names = entry.split("|")
            failed = any(n in reader.errors or f"{n}_FILE" in reader.errors for n in names)
            if not any((reader.raw(n) or "").strip() for n in names) and not failed:
                reader.errors[" or ".join(names)] = "is required"
        if (values["ingest_tls_cert"] is None) != (values["ingest_tls_key"] is None):
            reader.errors["INGEST_TLS_CERT/INGEST_TLS_KEY"] = "must be set together"
        if (values["smtp_username"] is None) != (values["smtp_password"] is None):
            reader.errors["SMTP_USERNAME/SMTP_PASSWORD"] = "must be set together"
        elif (
            values["smtp_password"]
            and values["smtp_tls"] == "none"
            and "SMTP_TLS" not in reader.errors
        ):
            # Never send a password in clear: a provider's port 587 wants starttls, 465 implicit.
            reader.errors["SMTP_TLS"] = "must be starttls or implicit when SMTP_PASSWORD is set"
        if reader.errors:
            problems = "; ".join(f"{name} {why}" for name, why in sorted(reader.errors.items()))
            raise ConfigError(f"invalid configuration: {problems}")
        return cls(**values)

    def redacted(self) -> dict[str, object]:
        """Every setting that is safe to log (secrets and credentials left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.repr}


def _provider_apis(reader: _Reader) -> dict[str, tuple[str, str]]:
    apis = {}
    for provider in PROVIDERS:
        api = provider.payment_api
        if api is None:
            continue
        key = reader.optional(api.key_variable)
        url = reader.optional(api.url_variable) or api.url_default
        if key is None:
            continue
        if url is None:
            reader.errors[api.url_variable] = f"is required with {api.key_variable}"
            continue
        apis[provider.name] = (url, key)
    return apis


def is_set(env: Mapping[str, str], name: str) -> bool:
    """NAME has a value, or (for FILE_VARIABLES) NAME_FILE names a file: what `required` asks
    (NAME|OTHER: one of them)."""
    if "|" in name:
        return any(is_set(env, one) for one in name.split("|"))
    via_file = name in FILE_VARIABLES and bool(env.get(f"{name}_FILE", "").strip())
    return bool(env.get(name, "").strip()) or via_file


class _Reader:
    """Collects parse errors instead of stopping at the first one."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.errors: dict[str, str] = {}
        self._raw: dict[str, str | None] = {}

    def raw(self, name: str) -> str | None:
        """The variable as set, or for FILE_VARIABLES the content of the file NAME_FILE names."""
        if name not in self._raw:
            value = self.env.get(name)
            path = self.env.get(f"{name}_FILE", "").strip() if name in FILE_VARIABLES else ""
            if path and value is not None and value.strip():
                self.errors[name] = f"and {name}_FILE are both set: keep one"
                value = None
            elif path:
                value = self._file(f"{name}_FILE", path)
            self._raw[name] = value
        return self._raw[name]

    def _file(self, variable: str, path: str) -> str | None:
        # The reason only: neither the content nor the path (a secret pasted by mistake).
        try:
            with open(path, encoding="utf-8") as file:
                return file.read().removesuffix("\n").removesuffix("\r")
        except UnicodeDecodeError:
            self.errors[variable] = "names a file that is not UTF-8 text"
        except OSError as e:
            self.errors[variable] = f"names a file that cannot be read ({e.strerror or 'error'})"
        return None

    def text(self, name: str, default: str) -> str:
        value = self.raw(name)
        if value is None:
            return default
        if not value.strip() and default:
            self.errors[name] = "must not be empty"
        return value.strip()

    def optional(self, name: str) -> str | None:
        value = (self.raw(name) or "").strip()
        return value or None

    def parse(self, name: str, default: T, parser: Callable[[str], T]) -> T:
        raw = self.raw(name)
        if raw is None or raw.strip() == "":
            return default
        try:
            return parser(raw.strip())
        except ValueError as e:
            # The message describes the expected shape, never echoes the value (it may be secret).
            self.errors[name] = str(e)
            return default


def _retention_days(raw: str) -> int:
    # The inbox is the dedup window: X-Hub retries for up to 30 days and SPEC keeps accepted
    # webhooks at least 35, so a shorter retention would let a late retry through as new.
    value = _positive_int(raw)
    if value < MIN_RETENTION_DAYS:
        raise ValueError(f"must be at least {MIN_RETENTION_DAYS} (the dedup window)")
    return value


def _archive_dir(raw: str) -> Path:
    # Absolute: the reconciler, the api and the CLI may start in different directories and
    # must all name the same files. Created at the first archive if missing.
    path = Path(raw)
    if not path.is_absolute():
        raise ValueError("must be an absolute path")
    if path.exists() and not path.is_dir():
        raise ValueError("must be a directory")
    return path


def _positive_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("must be a whole number") from None
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


def _port(raw: str) -> int:
    value = _positive_int(raw)
    if value > 65535:
        raise ValueError("must be a port number (1-65535)")
    return value


def _processes(raw: str) -> int:
    value = _positive_int(raw)
    if value > _MAX_PROCESSES:
        raise ValueError(f"must be 1-{_MAX_PROCESSES}")
    return value


def _positive_float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("must be a number of seconds") from None
    if not 0 < value < float("inf"):
        raise ValueError("must be a finite number greater than 0")
    return value


def _delays(raw: str) -> tuple[float, ...]:
    shape = "must be comma-separated seconds between 0.001 and 86400, e.g. 1,5,30"
    try:
        delays = tuple(_positive_float(part) for part in raw.split(","))
    except ValueError:
        raise ValueError(shape) from None
    # Each delay names a retry queue in whole milliseconds, bounded so the TTL fits RabbitMQ.
    if not all(0.001 <= d <= 86_400 for d in delays):
        raise ValueError(shape)
    return delays


def _secrets(raw: str) -> tuple[bytes, ...]:
    secrets = tuple(part.strip().encode() for part in raw.split(",") if part.strip())
    if not secrets:
        raise ValueError("must hold at least one secret")
    return secrets
