"""Parsers of single settings whose values are names or paths (shared/config.py uses them):
each returns the value or raises ValueError describing the expected shape."""

from __future__ import annotations

import os
import ssl
from urllib.parse import urlsplit

LOG_FORMATS = ("json", "console")
# SMTP_TLS: none (plain SMTP, today's local relays), starttls (upgrade, e.g. port 587) or
# implicit (TLS from the first byte, e.g. port 465).
SMTP_TLS_MODES = ("none", "starttls", "implicit")


def smtp_tls(raw: str) -> str:
    mode = raw.lower()
    if mode not in SMTP_TLS_MODES:
        raise ValueError("must be one of " + ", ".join(SMTP_TLS_MODES))
    return mode


def ca_file(raw: str) -> str:
    try:
        # What the SMTP client will do with it, done once here so a bad file stops the start.
        ssl.create_default_context(cafile=raw)
    except FileNotFoundError:
        raise ValueError("is not a file") from None
    except (OSError, ssl.SSLError):
        raise ValueError("must be a readable PEM file of CA certificates") from None
    return raw


def directory(raw: str) -> str:
    if not os.path.isdir(raw):
        raise ValueError("is not a directory")
    return raw


def log_format(raw: str) -> str:
    chosen = raw.lower()
    if chosen not in LOG_FORMATS:
        raise ValueError("must be one of " + ", ".join(LOG_FORMATS))
    return chosen


def log_level(raw: str) -> str:
    level = raw.upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR")
    return level


def amqp_nodes(raw: str) -> tuple[str, ...]:
    """AMQP_URL's nodes: one `amqp://` (or `amqps://`) URL, or the URLs of one RabbitMQ
    cluster's nodes separated by commas, tried in turn on connect and on every reconnect."""
    nodes = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not nodes:
        raise ValueError("must be an amqp:// URL, or several separated by commas")
    for node in nodes:
        parts = urlsplit(node)
        if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
            raise ValueError("must be amqp:// or amqps:// URLs with a host, separated by commas")
    return nodes


def amqp_url(raw: str) -> str:
    """AMQP_URL as given, once each node in it is a URL (amqp_nodes)."""
    amqp_nodes(raw)
    return raw


def several_hosts(dsn: str) -> bool:
    """Whether a libpq URI names several hosts (`postgresql://u@h1:5432,h2:5432/db`)."""
    netloc = urlsplit(dsn).netloc
    return "," in netloc.rpartition("@")[2]
