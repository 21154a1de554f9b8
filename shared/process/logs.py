"""Logging: structlog renders one JSON object per line (or, for a person at a terminal, the
console form); stdlib loggers are bridged into it."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, TextIO

import orjson
import structlog


def _dumps(event: Any, default: Any = None) -> bytes:
    """orjson, or plain json where orjson refuses: a lone surrogate (an undecodable header
    byte, say) must not turn the request that logs it into a 500."""
    try:
        return orjson.dumps(event, default=default)
    except TypeError:
        return json.dumps(event, default=repr, ensure_ascii=True).encode()


def chosen_format(log_format: str | None, stream: TextIO) -> str:
    """LOG_FORMAT when set; otherwise the console form where a person reads `stream` (a
    terminal), JSON lines where a collector does (Docker, Kubernetes, a pipe, a file)."""
    if log_format is not None:
        return log_format
    try:
        return "console" if stream.isatty() else "json"
    except ValueError:  # a closed stream
        return "json"


def configure_logging(level: str = "INFO", log_format: str | None = None) -> None:
    """Configure structlog and the stdlib root logger once per process."""
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    processors: list[structlog.types.Processor]
    if chosen_format(log_format, sys.stdout) == "console":
        colors = sys.stdout.isatty()
        # ConsoleRenderer formats tracebacks itself (format_exc_info would flatten them first).
        processors = [*shared, structlog.dev.ConsoleRenderer(colors=colors)]
        factory: Any = structlog.PrintLoggerFactory(sys.stdout)
        stdlib_renderer: structlog.types.Processor = structlog.dev.ConsoleRenderer(colors=colors)
    else:
        processors = [
            *shared,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_dumps),
        ]
        factory = structlog.BytesLoggerFactory(sys.stdout.buffer)
        stdlib_renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, stdlib_renderer],
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiohttp's access log would duplicate our one-line-per-request event.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # aio-pika/aiormq narrate every reconnect attempt at INFO; warnings are enough.
    for noisy in ("aio_pika", "aiormq"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
