"""SMTP_TLS, SMTP_USERNAME / SMTP_PASSWORD, SMTP_CA_FILE and EMAIL_TEMPLATES_DIR against real
aiosmtpd servers that demand STARTTLS (or implicit TLS) and a login, as a mail provider does,
with certificates of a throwaway CA made for the test (trustme)."""

from __future__ import annotations

import asyncio
import contextlib
import email
import os
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from email.header import decode_header, make_header
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from bench.processes import free_port
from services.email.app import create_app as email_app
from services.email.sender import SmtpLoginError, SmtpSender, SmtpUnavailableError
from services.email.template_files import default_templates, load_templates
from services.email.templates import OutgoingEmail, render
from shared.amqp.topology import Topology
from shared.config import ConfigError, Settings
from shared.errors import EXIT_USAGE, PermanentError, TransientError
from shared.vocabulary import REFUNDED_EMAIL, SUCCEEDED_EMAIL
from tests.helpers import eventually, payment_event
from tests.integration.system import (
    EMAIL_FROM,
    get_one,
    post,
    register,
    start_system,
)
from tests.processes import payhooks_command

USERNAME = "shop-mailer"
PASSWORD = "s3cret-smtp-password"
WRONG_PASSWORD = "not-the-password"


@dataclass(frozen=True, slots=True)
class Received:
    message: Message
    encrypted: bool
    authenticated: bool


class ProviderSink:
    """aiosmtpd handler and authenticator: every login tried (user, accepted) and every message
    accepted, with whether its session was encrypted and logged in."""

    def __init__(self, password: str = PASSWORD) -> None:
        self.password = password
        self.logins: list[tuple[str, bool]] = []
        self.received: list[Received] = []

    def __call__(
        self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> AuthResult:
        assert isinstance(auth_data, LoginPassword)
        accepted = (auth_data.login, auth_data.password) == (
            USERNAME.encode(),
            self.password.encode(),
        )
        self.logins.append((auth_data.login.decode(), accepted))
        # handled=False: aiosmtpd answers the refusal itself (535).
        return AuthResult(success=accepted, handled=False)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        encrypted = server.transport.get_extra_info("ssl_object") is not None
        message = email.message_from_bytes(envelope.content)
        self.received.append(Received(message, encrypted, bool(session.authenticated)))
        return "250 Message accepted for delivery"


@dataclass(frozen=True, slots=True)
class Certificates:
    ca_file: Path  # what SMTP_CA_FILE names
    server: ssl.SSLContext  # the server's, for 127.0.0.1


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    ca = trustme.CA()
    ca_file = tmp_path_factory.mktemp("smtp-ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    return Certificates(ca_file, server)


@contextlib.contextmanager
def provider(
    sink: ProviderSink, server_tls: ssl.SSLContext, *, implicit: bool, mechanisms: str = "all"
) -> Iterator[int]:
    """A mail provider's submission port on 127.0.0.1: STARTTLS required then AUTH required
    (587), or TLS from the first byte then AUTH required (465); AUTH PLAIN and LOGIN offered,
    or (`mechanisms="LOGIN"`) LOGIN only. Yields the port."""
    port = free_port()
    tls: dict[str, Any] = (
        # aiosmtpd only counts a STARTTLS session as encrypted for AUTH: here the whole
        # connection is, so AUTH needs no further TLS.
        {"ssl_context": server_tls, "auth_require_tls": False}
        if implicit
        else {"tls_context": server_tls, "require_starttls": True}
    )
    controller = Controller(
        sink,
        hostname="127.0.0.1",
        port=port,
        auth_required=True,
        authenticator=sink,
        auth_exclude_mechanism=["PLAIN"] if mechanisms == "LOGIN" else [],
        **tls,
    )
    controller.start()
    try:
        yield port
    finally:
        controller.stop()


def message(payment_id: str) -> OutgoingEmail:
    return render(
        SUCCEEDED_EMAIL,
        payment_id=payment_id,
        order_id=f"ord_{payment_id}",
        amount="100.00",
        currency="USD",
        recipient="buyer@example.test",
        sender=EMAIL_FROM,
    )


def sender(port: int, certificates: Certificates, tls: str, password: str | None) -> SmtpSender:
    return SmtpSender(
        "127.0.0.1",
        port,
        username=USERNAME if password is not None else None,
        password=password,
        tls=tls,
        ca_file=str(certificates.ca_file),
        connections=1,
        timeout_s=5.0,
    )


async def test_starttls_and_login_deliver_over_one_reused_connection(
    certificates: Certificates,
) -> None:
    sink = ProviderSink()
    with provider(sink, certificates.server, implicit=False) as port:
        smtp = sender(port, certificates, "starttls", PASSWORD)
        try:
            await smtp.send(message("pay_tls_1"))
            await smtp.send(message("pay_tls_2"))
        finally:
            await smtp.close()

    assert sink.logins == [(USERNAME, True)]  # one connection, logged in once, reused
    assert [r.message["Message-ID"] for r in sink.received] == [
        "<payment_succeeded.pay_tls_1@example.test>",
        "<payment_succeeded.pay_tls_2@example.test>",
    ]
    assert all(r.encrypted and r.authenticated for r in sink.received)


# aiosmtpd warns when AUTH may come before TLS; on an implicit-TLS port it never does.
@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning")
@pytest.mark.parametrize(
    ("tls", "mechanisms"),
    [
        ("implicit", "all"),
        # A server offering only AUTH LOGIN gets it (PLAIN is preferred where offered).
        ("starttls", "LOGIN"),
    ],
)
async def test_tls_and_login_deliver(certificates: Certificates, tls: str, mechanisms: str) -> None:
    sink = ProviderSink()
    with provider(
        sink, certificates.server, implicit=tls == "implicit", mechanisms=mechanisms
    ) as port:
        smtp = sender(port, certificates, tls, PASSWORD)
        try:
            await smtp.send(message(f"pay_{tls}"))
        finally:
            await smtp.close()

    assert sink.logins == [(USERNAME, True)]
    assert [(r.encrypted, r.authenticated) for r in sink.received] == [(True, True)]


async def test_a_refused_login_is_a_clear_transient_error_and_the_next_send_logs_in_again(
    certificates: Certificates,
) -> None:
    sink = ProviderSink()
    with provider(sink, certificates.server, implicit=False) as port:
        smtp = sender(port, certificates, "starttls", WRONG_PASSWORD)
        try:
            with pytest.raises(SmtpLoginError) as refused:
                await smtp.send(message("pay_refused"))
            # The provider takes the credentials now (rotated there): the retry goes through.
            sink.password = WRONG_PASSWORD
            await smtp.send(message("pay_refused"))
        finally:
            await smtp.close()

    error = refused.value
    # The worker retries what is not permanent (shared/worker/runtime.py), on the ladder, then the
    # DLQ.
    assert isinstance(error, TransientError)
    assert not isinstance(error, PermanentError)
    assert "refused the login (535" in str(error)
    assert "SMTP_USERNAME and SMTP_PASSWORD" in str(error)
    assert WRONG_PASSWORD not in str(error)
    # The refused attempt (AUTH PLAIN, which the server offers), then the one that passed.
    assert sink.logins[-1] == (USERNAME, True)
    assert sink.logins[:-1] == [(USERNAME, False)]
    assert len(sink.received) == 1


async def test_plain_smtp_is_refused_by_a_server_that_requires_starttls(
    certificates: Certificates,
) -> None:
    sink = ProviderSink()
    with provider(sink, certificates.server, implicit=False) as port:
        smtp = sender(port, certificates, "none", None)
        try:
            with pytest.raises(SmtpUnavailableError, match="530"):
                await smtp.send(message("pay_plain"))
        finally:
            await smtp.close()

    assert sink.logins == []
    assert sink.received == []


async def test_a_server_certificate_of_an_unknown_ca_is_refused(
    certificates: Certificates,
) -> None:
    sink = ProviderSink()
    with provider(sink, certificates.server, implicit=False) as port:
        smtp = SmtpSender(
            "127.0.0.1", port, username=USERNAME, password=PASSWORD, tls="starttls"
        )  # no SMTP_CA_FILE: the system's CAs don't know the test CA
        try:
            with pytest.raises(SmtpUnavailableError, match="CERTIFICATE_VERIFY_FAILED"):
                await smtp.send(message("pay_untrusted"))
        finally:
            await smtp.close()

    assert sink.logins == []  # the password never left
    assert sink.received == []


def test_credentials_are_never_sent_without_tls() -> None:
    with pytest.raises(ValueError, match="without TLS"):
        SmtpSender("127.0.0.1", 25, username=USERNAME, password=PASSWORD, tls="none")


# --- the email worker, configured by the environment ----------------------------------------


def write_templates(folder: Path) -> Path:
    (folder / f"{SUCCEEDED_EMAIL}.txt").write_text(
        "Subject: Danke! Zahlung für $order_id erhalten\n\n"
        "Hallo,\n\nwir haben $amount $currency für Bestellung $order_id erhalten.\n"
        "--- html ---\n"
        "<p>Wir haben <b>$amount $currency</b> erhalten.</p>\n",
        encoding="utf-8",
    )
    return folder


@pytest.fixture
def provider_settings(
    make_settings: Any, certificates: Certificates, tmp_path: Path
) -> Iterator[tuple[ProviderSink, Settings]]:
    sink = ProviderSink()
    with provider(sink, certificates.server, implicit=False) as port:
        yield (
            sink,
            make_settings(
                SMTP_PORT=str(port),
                EMAIL_FROM=EMAIL_FROM,
                SMTP_TLS="starttls",
                SMTP_USERNAME=USERNAME,
                SMTP_PASSWORD=PASSWORD,
                SMTP_CA_FILE=str(certificates.ca_file),
                EMAIL_TEMPLATES_DIR=str(write_templates(tmp_path)),
            ),
        )


async def test_the_email_worker_sends_the_shops_text_through_the_provider(
    # Before aiohttp_client: the provider stops after the worker has closed its connections
    # (aiosmtpd stopped under an open TLS session leaves its socket to the garbage collector).
    provider_settings: tuple[ProviderSink, Settings],
    aiohttp_client: Any,
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    sink, settings = provider_settings
    system = await start_system(aiohttp_client, settings, amqp, topology)
    payment_id = f"pay_{uuid.uuid4().hex[:12]}"
    await register(db, payment_id)

    await post(system.ingest, payment_event(payment_id, "paid"))
    await eventually(lambda: _received(sink), lambda n: n == 1, timeout_s=15)

    received = sink.received[0]
    assert (received.encrypted, received.authenticated) == (True, True)
    subject = str(make_header(decode_header(received.message["Subject"])))
    assert subject == f"Danke! Zahlung für ord_{payment_id} erhalten"
    plain, html = (
        p.get_payload(decode=True) for p in received.message.walk() if not p.is_multipart()
    )
    assert (
        plain
        == f"Hallo,\n\nwir haben 100.00 USD für Bestellung ord_{payment_id} erhalten.\n".encode()
    )
    assert html == b"<p>Wir haben <b>100.00 USD</b> erhalten.</p>"
    assert received.message["Message-ID"] == f"<payment_succeeded.{payment_id}@example.test>"


async def test_refused_credentials_pause_the_email_worker_until_the_login_works(
    aiohttp_client: Any,
    make_settings: Any,
    certificates: Certificates,
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    # Not the email's fault: nothing is dead-lettered however long the credentials stay wrong;
    # the worker waits, says why on /readyz, and sends once the login works again.
    sink = ProviderSink()
    with provider(sink, certificates.server, implicit=False) as port:
        settings = make_settings(
            SMTP_PORT=str(port),
            SMTP_TLS="starttls",
            SMTP_USERNAME=USERNAME,
            SMTP_PASSWORD=WRONG_PASSWORD,
            SMTP_CA_FILE=str(certificates.ca_file),
        )
        system = await start_system(
            aiohttp_client, settings, amqp, topology, {"ingest": 1, "orders": 1, "email": 1}
        )
        payment_id = f"pay_{uuid.uuid4().hex[:12]}"
        await register(db, payment_id)
        await post(system.ingest, payment_event(payment_id, "paid"))
        email = system.clients["email"][0]

        async def ready() -> tuple[int, Any]:
            response = await email.get("/readyz")
            return response.status, await response.json()

        status, body = await eventually(ready, lambda r: "paused" in r[1], timeout_s=15)
        assert status == 503
        [paused] = body["paused"]
        assert paused["dependency"] == "smtp"
        assert paused["error"].startswith("SmtpLoginError: SMTP 127.0.0.1:")
        assert WRONG_PASSWORD not in str(body)
        # Longer than the whole ladder (0.2 + 0.4 s): still nothing in the DLQ.
        await asyncio.sleep(3 * sum(settings.retry_delays_s))
        assert await get_one(amqp, topology.work["emails"].dlq) is None
        assert sink.received == []

        sink.password = WRONG_PASSWORD  # the provider takes these credentials now

        async def received() -> int:
            return len(sink.received)

        await eventually(received, lambda n: n == 1, timeout_s=20)
        status, body = await eventually(ready, lambda r: r[0] == 200, timeout_s=10)
        assert "paused" not in body
        # Stopped while the server still runs: its open sessions end with a QUIT.
        for clients in system.clients.values():
            for client in clients:
                await client.close()
    assert await get_one(amqp, topology.work["emails"].dlq) is None
    assert sink.logins[-1] == (USERNAME, True)


def test_a_template_file_overrides_its_default_and_only_it(tmp_path: Path) -> None:
    templates = load_templates(str(write_templates(tmp_path)))

    assert templates[SUCCEEDED_EMAIL].subject.template == "Danke! Zahlung für $order_id erhalten"
    assert templates[REFUNDED_EMAIL] is default_templates()[REFUNDED_EMAIL]  # no file: default


def test_every_bad_template_file_is_named_in_one_error(tmp_path: Path) -> None:
    (tmp_path / f"{SUCCEEDED_EMAIL}.txt").write_bytes(b"Subject: \xff\n\nbody\n")
    (tmp_path / f"{REFUNDED_EMAIL}.txt").write_text(
        "Subject: s\n\nbody $refund_id\n--- html ---\nh"
    )
    (tmp_path / "payment_suceeded.txt").write_text("a misspelt name")
    (tmp_path / "README.md").write_text("not a template, not looked at")

    with pytest.raises(ConfigError) as raised:
        load_templates(str(tmp_path))

    assert str(raised.value) == (
        "invalid configuration: EMAIL_TEMPLATES_DIR"
        " payment_suceeded.txt is no template (known: payment_refunded.txt,"
        " payment_succeeded.txt); payment_succeeded.txt is not UTF-8 text;"
        " payment_refunded.txt uses unknown placeholder $refund_id in its text"
        " (known: $amount, $currency, $order_id)"
    )


def test_the_email_worker_does_not_start_with_a_malformed_template(tmp_path: Path) -> None:
    (tmp_path / f"{SUCCEEDED_EMAIL}.txt").write_text("Payment received\n\nno subject line\n")
    settings = Settings.from_env({"EMAIL_TEMPLATES_DIR": str(tmp_path)})

    with pytest.raises(ConfigError) as raised:
        email_app(settings)

    assert str(raised.value) == (
        "invalid configuration: EMAIL_TEMPLATES_DIR payment_succeeded.txt"
        " must start with a line 'Subject: ...'"
    )


def test_payhooks_run_email_with_a_malformed_template_exits_with_one_line(tmp_path: Path) -> None:
    (tmp_path / f"{REFUNDED_EMAIL}.txt").write_text("Subject: s\n\nno html part\n")
    env = {"PATH": os.environ.get("PATH", ""), "EMAIL_TEMPLATES_DIR": str(tmp_path)}

    done = subprocess.run(
        [*payhooks_command(), "run", "email"],
        env=env,
        cwd=tmp_path,  # away from a developer's .env
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert done.returncode == EXIT_USAGE
    assert done.stderr == (
        "payhooks: invalid configuration: EMAIL_TEMPLATES_DIR payment_refunded.txt"
        " needs exactly one line '--- html ---' before the HTML body\n"
    )


async def _received(sink: ProviderSink) -> int:
    return len(sink.received)
