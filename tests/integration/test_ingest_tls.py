"""INGEST_TLS_CERT / INGEST_TLS_KEY: the ingest process serves HTTPS itself (SPEC section 3)."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest

from bench.processes import free_port
from shared.config import Settings
from tests.conftest import TEST_SECRETS
from tests.helpers import delivery, eventually, payment_event
from tests.processes import payhooks_command


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_ingest_serves_https_with_the_configured_certificate(
    settings: Settings, certificate: tuple[Path, Path], amqp: object, db: object
) -> None:
    cert, key = certificate
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "DATABASE_URL": settings.database_url,
        "AMQP_URL": settings.amqp_url,
        "AMQP_PREFIX": settings.amqp_prefix,
        "XHUB_WEBHOOK_SECRETS": ",".join(TEST_SECRETS),
        "INGEST_PORT": str(port),
        "INGEST_TLS_CERT": str(cert),
        "INGEST_TLS_KEY": str(key),
        "LOG_LEVEL": "WARNING",
    }
    process = await asyncio.create_subprocess_exec(
        *payhooks_command(),
        "run",
        "ingest",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    trusting = ssl.create_default_context(cafile=str(cert))
    base = f"https://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:

            async def ready() -> int:
                try:
                    async with session.get(f"{base}/readyz", ssl=trusting) as response:
                        return response.status
                except aiohttp.ClientError:
                    return 0

            await eventually(ready, lambda status: status == 200, timeout_s=15)
            body, headers = delivery(payment_event(), TEST_SECRETS[0])
            async with session.post(
                f"{base}/webhooks/xhub", data=body, headers=headers, ssl=trusting
            ) as response:
                assert response.status == 200
                assert await response.json() == {"status": "accepted"}
            with pytest.raises(aiohttp.ClientError):  # plain HTTP is not served on that port
                async with session.get(f"http://127.0.0.1:{port}/healthz"):
                    pass
    finally:
        process.terminate()
        async with asyncio.timeout(20):
            assert await process.wait() == 0  # graceful on SIGTERM
