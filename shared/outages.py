"""Which failures are an outage of payhooks' own infrastructure (PostgreSQL, RabbitMQ, SMTP)
rather than something wrong with the message or the business (SPEC section 5): told by the
error's type and the driver's codes, never by its text. No I/O."""

from __future__ import annotations

import socket
import ssl

import aiormq.exceptions
import asyncpg

from shared.errors import Dependency, PermanentError, TransientError, UnavailableError

# SQLSTATE classes of a server that cannot be reached or cannot take the work: 08 connection
# exception, 53 insufficient resources (disk full, out of memory, too many connections),
# 58 system error (I/O).
_DOWN_SQLSTATE_CLASSES = frozenset({"08", "53", "58"})
# 57P01 admin shutdown (also pg_terminate_backend), 57P02 crash shutdown, 57P03 cannot connect
# now (starting, stopping, recovering), 57P05 idle session timeout, 25006 read-only
# transaction (a standby, or a primary demoted in a failover). Not 57014 query canceled: a
# statement timeout is not an outage by itself.
_DOWN_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "57P05", "25006"})

# The connection to RabbitMQ or its channel went away (not: a channel closed by the broker for
# a request of ours it refused, a returned message, a protocol error of ours).
_BROKER_DOWN: tuple[type[BaseException], ...] = (
    aiormq.exceptions.AMQPConnectionError,
    aiormq.exceptions.ChannelInvalidStateError,
)

# What the network and the OS say when a server cannot be reached: refused, reset, timed out,
# no route, a name that does not resolve, a TLS handshake that failed. Not every OSError:
# a missing file or a permission is a bug or a deployment error of ours, not an outage.
_NETWORK_DOWN: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    socket.gaierror,
    socket.herror,
    ssl.SSLError,
)


def outage_of(
    error: BaseException, *, unattributed: Dependency = Dependency.POSTGRESQL
) -> Dependency | None:
    """The dependency whose outage `error` is, or None when it is the message's or the
    business's failure (or a bug). `unattributed`: the dependency a bare network error
    (refused, reset, timed out) can only have come from where the caller met it; in the
    workers that is PostgreSQL, the one driver whose errors reach them untranslated (the
    broker's and the SMTP sender's are translated into errors that name their dependency)."""
    if isinstance(error, BaseExceptionGroup):
        for member in error.exceptions:
            if (found := outage_of(member, unattributed=unattributed)) is not None:
                return found
        return None
    if isinstance(error, PermanentError):
        return None
    if isinstance(error, TransientError):
        if error.dependency is not None:
            return error.dependency
        return unattributed if isinstance(error, UnavailableError) else None
    if isinstance(error, asyncpg.PostgresError):
        code = error.sqlstate or ""
        down = code[:2] in _DOWN_SQLSTATE_CLASSES or code in _DOWN_SQLSTATES
        return Dependency.POSTGRESQL if down else None
    # asyncpg says "connection is closed" and "pool is closing" with InterfaceError itself
    # (its subclasses are a bad argument or an unsupported feature: the caller's), and "another
    # operation is in progress" with InternalClientError itself when the server terminated
    # the connection under it (issue 39's 500s); TargetServerAttributeNotMatched: no
    # read-write server among the hosts (a failover under way).
    if type(error) in (asyncpg.InterfaceError, asyncpg.exceptions.InternalClientError) or (
        isinstance(error, asyncpg.exceptions.TargetServerAttributeNotMatched)
    ):
        return Dependency.POSTGRESQL
    if isinstance(error, _BROKER_DOWN):  # before the network: AMQPConnectionError is one
        return Dependency.RABBITMQ
    if isinstance(error, _NETWORK_DOWN) or type(error) is OSError:
        # A bare OSError: asyncio's "Multiple exceptions" when every address refused.
        return unattributed
    return None


def is_outage(error: BaseException) -> bool:
    """Whether `error` is any dependency's outage (the api and console: 503, never 500)."""
    return outage_of(error) is not None
