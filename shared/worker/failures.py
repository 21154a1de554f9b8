"""A failed message's next stop, the retry ladder then its DLQ, and the headers it carries
there (attempts, error, reason, times). No I/O."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.amqp.topology import WorkQueue
from shared.errors import PermanentError, TransientError
from shared.vocabulary import (
    ATTEMPTS,
    FIRST_FAILED_AT,
    LAST_ERROR,
    LAST_FAILED_AT,
    ORIGINAL_QUEUE,
    REASON,
    int_header,
)

MAX_ERROR_CHARS = 500


def attempts_of(headers: Mapping[str, Any]) -> int:
    """How often the message has failed before (0: never)."""
    return int_header(headers.get(ATTEMPTS)) or 0


@dataclass(frozen=True, slots=True)
class Route:
    target: str  # a retry queue or the DLQ
    outcome: str  # `retried` or `dead_lettered`
    headers: dict[str, Any]


def route(
    queue: WorkQueue,
    headers: Mapping[str, Any],
    error: Exception,
    *,
    retry: bool,
    now: dt.datetime,
) -> Route:
    """Where a message that failed with `error` goes: the next step of the ladder while
    `retry` and steps are left, else the DLQ with the error's reason."""
    attempts = attempts_of(headers) + 1
    at = now.isoformat()
    carried: dict[str, Any] = dict(headers)
    carried.update(
        {
            ATTEMPTS: attempts,
            LAST_FAILED_AT: at,
            LAST_ERROR: error_text(error)[:MAX_ERROR_CHARS],
            ORIGINAL_QUEUE: queue.name,
        }
    )
    carried.setdefault(FIRST_FAILED_AT, at)
    if retry and attempts <= len(queue.retry_queues):
        return Route(queue.retry_queues[attempts - 1], "retried", carried)
    if isinstance(error, PermanentError | TransientError):
        carried[REASON] = error.reason
    else:
        carried[REASON] = "retries_exhausted" if retry else "invalid_message"
    return Route(queue.dlq, "dead_lettered", carried)


def error_text(error: BaseException) -> str:
    """`Type: message`, or the type alone where the error says nothing more (a timeout)."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
