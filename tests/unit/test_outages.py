"""Which failures are a dependency's outage (no ladder step) and which the message's own."""

from __future__ import annotations

import json
import socket
import ssl

import aiormq.exceptions
import asyncpg
import pytest

from services.email.sender import SmtpLoginError, SmtpRejectedError, SmtpSender
from services.email.smtp import (
    SmtpDisconnectedError,
    SmtpEnvelopeError,
    SmtpLoginRefusedError,
    SmtpReplyError,
)
from shared.amqp.alarms import BlockedError
from shared.amqp.publish_together import PublishTimeoutError
from shared.db import ReadOnlyDatabaseError
from shared.errors import (
    BrokerUnavailableError,
    Dependency,
    PermanentError,
    TransientError,
    UnavailableError,
    UnknownPaymentError,
)
from shared.outages import is_outage, outage_of

PG, MQ, SMTP = Dependency.POSTGRESQL, Dependency.RABBITMQ, Dependency.SMTP


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(111, "Connection refused"),
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError(),
        OSError("Multiple exceptions: [Errno 111] ..., [Errno 99] ..."),
        socket.gaierror(-2, "Name or service not known"),
        ssl.SSLError(1, "handshake"),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"),
        asyncpg.exceptions.ConnectionFailureError(),
        asyncpg.exceptions.ClientCannotConnectError(),
        asyncpg.exceptions.AdminShutdownError("terminating connection"),
        asyncpg.exceptions.CrashShutdownError(),
        asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
        asyncpg.exceptions.ReadOnlySQLTransactionError("read-only transaction"),
        asyncpg.exceptions.TooManyConnectionsError(),
        asyncpg.exceptions.DiskFullError(),
        asyncpg.exceptions.PostgresIOError(),
        asyncpg.InterfaceError("cannot perform operation: connection is closed"),
        asyncpg.exceptions.InternalClientError("cannot switch to state 12; another operation"),
        asyncpg.exceptions.TargetServerAttributeNotMatched("no read-write server"),
        ReadOnlyDatabaseError("standby"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_database_that_cannot_be_reached_or_written_is_an_outage(error: Exception) -> None:
    assert outage_of(error) is PG
    assert is_outage(error)


@pytest.mark.parametrize(
    "error",
    [
        BrokerUnavailableError("RabbitMQ is not connected"),
        BlockedError(),
        PublishTimeoutError("no confirm"),
        aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED"),
        aiormq.exceptions.AMQPConnectionError("lost"),
        aiormq.exceptions.ChannelInvalidStateError("channel closed"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_broker_connection_or_channel_lost_is_rabbitmqs_outage(error: Exception) -> None:
    assert outage_of(error) is MQ


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad body"),
        KeyError("payment_id"),
        json.JSONDecodeError("x", "", 0),
        PermanentError("invalid message"),
        UnknownPaymentError("no order"),
        TransientError("something to retry"),
        RuntimeError("a bug"),
        FileNotFoundError(2, "No such file"),
        PermissionError(13, "denied"),
        asyncpg.exceptions.UniqueViolationError(),
        asyncpg.exceptions.CheckViolationError(),
        asyncpg.exceptions.DeadlockDetectedError(),
        asyncpg.exceptions.SerializationError(),
        asyncpg.exceptions.QueryCanceledError("statement timeout"),
        asyncpg.exceptions.DataError("invalid input for query argument"),
        asyncpg.exceptions.OutdatedSchemaCacheError("cached statement plan is invalid"),
        aiormq.exceptions.ChannelNotFoundEntity("NOT_FOUND"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_error_of_the_message_the_business_or_the_code_is_no_outage(error: Exception) -> None:
    assert outage_of(error) is None
    assert not is_outage(error)


def test_a_bare_network_error_is_the_dependency_the_caller_names() -> None:
    assert outage_of(ConnectionRefusedError(), unattributed=SMTP) is SMTP
    # One that names its dependency keeps it.
    assert outage_of(BlockedError(), unattributed=SMTP) is MQ
    # An UnavailableError that names none (ingest's) is the caller's.
    assert outage_of(UnavailableError("PostgreSQL unavailable"), unattributed=PG) is PG


def test_the_message_text_decides_nothing() -> None:
    assert outage_of(RuntimeError("connection refused")) is None
    assert outage_of(ValueError("the database system is shutting down")) is None


def test_an_exception_group_is_an_outage_when_one_of_its_errors_is() -> None:
    group = ExceptionGroup("batch", [ValueError("bad"), ConnectionResetError()])
    assert outage_of(group) is PG
    assert outage_of(ExceptionGroup("batch", [ValueError("bad")])) is None


def smtp_failure(error: Exception) -> Exception | None:
    return SmtpSender("127.0.0.1", 1025, connections=1)._unavailable(error)


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError(),
        SmtpDisconnectedError("the server closed the connection"),
        SmtpReplyError("connect", 421, "service not available"),
        SmtpReplyError("connect", 554, "no SMTP service here"),
        SmtpReplyError("STARTTLS", 454, "TLS not available"),
        SmtpReplyError("MAIL FROM", 451, "local error, try later"),
        SmtpReplyError("RCPT TO", 450, "mailbox busy"),
        SmtpReplyError("DATA content", 452, "insufficient storage"),
        SmtpLoginRefusedError("AUTH", 535, "bad credentials"),
        SmtpReplyError("MAIL FROM", 530, "must issue a STARTTLS command first"),
        ssl.SSLCertVerificationError(1, "CERTIFICATE_VERIFY_FAILED"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_smtp_server_away_or_saying_later_is_an_outage(error: Exception) -> None:
    failure = smtp_failure(error)
    assert failure is not None
    assert outage_of(failure) is SMTP
    assert failure.__cause__ is error


def test_a_refused_login_is_an_outage_that_says_what_to_fix() -> None:
    failure = smtp_failure(SmtpLoginRefusedError("AUTH", 535, "bad credentials"))
    assert isinstance(failure, SmtpLoginError)
    assert "SMTP_PASSWORD" in str(failure)


@pytest.mark.parametrize(
    "error",
    [
        SmtpReplyError("RCPT TO", 550, "no such user"),
        SmtpReplyError("MAIL FROM", 553, "sender not allowed"),
        SmtpReplyError("DATA content", 554, "message refused"),
        SmtpEnvelopeError("the server does not offer SMTPUTF8"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_smtp_refusal_of_one_email_is_that_emails_failure(error: Exception) -> None:
    failure = smtp_failure(error)
    assert isinstance(failure, SmtpRejectedError)
    assert outage_of(failure) is None


def test_an_envelope_smtp_cannot_carry_stays_as_it_is() -> None:
    error = ValueError("an envelope address can't hold '<'")
    assert smtp_failure(error) is error
    assert outage_of(error) is None
