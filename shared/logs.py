"""Logging: structlog renders one JSON object per line; stdlib loggers are bridged into it."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import orjson
import structlog


def _dumps(event: Any, default: Any = None) -> bytes:
    """orjson, or plain json where orjson refuses: a lone surrogate (an undecodable header
    byte, say) must not turn the request that logs it into a 500."""
    try:
        return orjson.dumps(event, default=default)
    except TypeError:
        return json.dumps(event, default=repr, ensure_ascii=True).encode()


def configure_logging(level: str = "INFO") -> None:
    """Configure structlog and the stdlib root logger once per process."""
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_dumps),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.BytesLoggerFactory(sys.stdout.buffer),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.JSONRenderer(),
        ],
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
