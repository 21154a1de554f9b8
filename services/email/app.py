"""The email worker: consumes order transitions, sends customer emails over SMTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from services.email.handler import WORKER, make_handler
from services.email.sender import SmtpSender
from services.email.template_files import load_templates
from shared.config import Settings
from shared.db import DB_POOL
from shared.errors import Dependency
from shared.metrics import EmailMetrics, WorkerMetrics
from shared.process.service import Service
from shared.worker.app import PROBES, worker_app

log = structlog.get_logger(__name__)

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
    # Read before anything starts: a bad template stops the service with a ConfigError.
    templates = load_templates(settings.email_templates_dir)
    if settings.email_templates_dir is not None:
        log.info("email.templates", directory=settings.email_templates_dir)

    async def sender_ctx(app: web.Application) -> AsyncIterator[None]:
        app[SENDER] = SmtpSender.from_settings(settings)
        app[PROBES][Dependency.SMTP] = app[SENDER].probe
        yield
        await app[SENDER].close()

    return worker_app(
        settings,
        metrics,
        "emails",
        lambda app: make_handler(
            app[DB_POOL], app[SENDER], settings.email_from, email_metrics, templates
        ),
        contexts=[sender_ctx],
        batch_size=batch_size,
        batchers=batchers,
    )


SERVICE = Service("email", create_app, lambda s: s.email_port)
