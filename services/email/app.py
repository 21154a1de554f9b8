"""The email worker: consumes order transitions, sends customer emails over SMTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from services.email.handler import WORKER, make_handler
from services.email.sender import SmtpSender
from shared.config import Settings
from shared.db import DB_POOL
from shared.metrics import EmailMetrics, WorkerMetrics
from shared.service import Service
from shared.worker_app import worker_app

SENDER = web.AppKey("smtp_sender", SmtpSender)


# A batch's emails are sent before its commit, over the sender's SMTP connections: smaller
# batches than the other workers', so that a slow SMTP server holds a transaction less long.
EMAIL_BATCH_SIZE = 32
EMAIL_BATCHERS = 2


def create_app(
    settings: Settings, *, batch_size: int = EMAIL_BATCH_SIZE, batchers: int = EMAIL_BATCHERS
) -> web.Application:
    metrics = WorkerMetrics.create(WORKER)
    email_metrics = EmailMetrics.create(metrics.registry)

    async def sender_ctx(app: web.Application) -> AsyncIterator[None]:
        app[SENDER] = SmtpSender(settings.smtp_host, settings.smtp_port)
        yield
        await app[SENDER].close()

    return worker_app(
        settings,
        metrics,
        "emails",
        lambda app: make_handler(app[DB_POOL], app[SENDER], settings.email_from, email_metrics),
        contexts=[sender_ctx],
        batch_size=batch_size,
        batchers=batchers,
    )


SERVICE = Service("email", create_app, lambda s: s.email_port)
