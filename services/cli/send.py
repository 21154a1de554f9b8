"""`payhooks send`: one signed webhook (X-Hub's, or --provider's) from flags (like `stripe
trigger`), the request and the answer printed; exit 0 when ingest answers 2xx."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from datetime import UTC, datetime

import aiohttp

from shared.config import Settings
from shared.errors import EXIT_NOTHING, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from shared.providers import registry
from shared.providers.base import Provider
from shared.providers.xhub import STATUS_CHANGED
from shared.providers.xhub.events import status_changed

_TIMEOUT_S = 10.0


def _playable() -> dict[str, Provider]:
    return {
        p.name: p
        for p in registry.PROVIDERS
        if p.encode is not None and p.signed_headers is not None
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--provider",
        choices=sorted(_playable()),
        default=registry.DEFAULT.name,
        help="who sends it: its route, body shape, headers and secret (default %(default)s)",
    )
    parser.add_argument("--event", default=STATUS_CHANGED, help="event type (default %(default)s)")
    parser.add_argument("--status", default="paid", help="payment status (default %(default)s)")
    parser.add_argument("--payment-id", required=True)
    parser.add_argument("--amount", default="100.00", help="decimal string (default %(default)s)")
    parser.add_argument("--currency", default="USD", help="(default %(default)s)")
    parser.add_argument("--refund-id", help="for refund.* events")
    parser.add_argument("--event-id", help="the event id header (default: a new evt_...)")
    parser.add_argument(
        "--url",
        help="default: http://127.0.0.1:$INGEST_PORT + the provider's route (https with TLS set)",
    )


def default_url(settings: Settings, provider: Provider = registry.DEFAULT) -> str:
    scheme = "https" if settings.ingest_tls_cert else "http"
    return f"{scheme}://127.0.0.1:{settings.ingest_port}{provider.webhook_path}"


async def command(settings: Settings, args: argparse.Namespace) -> int:
    provider = _playable()[getattr(args, "provider", registry.DEFAULT.name)]
    secrets = settings.provider_secrets.get(provider.name) or ()
    if not secrets:
        print(
            f"payhooks: send --provider {provider.name} needs {provider.secrets_variable} (or"
            f" {provider.secrets_variable}_FILE): it signs with the first secret, as the"
            " provider does",
            file=sys.stderr,
        )
        return EXIT_USAGE
    created_at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    payload = status_changed(args.payment_id, args.status, args.amount, args.currency, created_at)
    payload["event"] = args.event
    if args.refund_id:
        payload["refund_id"] = args.refund_id
    event_id = args.event_id or f"evt_{uuid.uuid4().hex}"
    assert provider.encode is not None
    assert provider.signed_headers is not None
    try:
        body = provider.encode(event_id, payload)
    except ValueError as e:  # an event this provider never sends (Stripe's `settled`)
        print(f"payhooks: send --provider {provider.name}: {e}", file=sys.stderr)
        return EXIT_USAGE
    headers = provider.signed_headers(secrets[0], event_id, body, time.time())
    url = args.url or default_url(settings, provider)

    print(f"> POST {url}")
    for name, value in headers.items():
        print(f"> {name}: {value}")
    print(">")
    print(f"> {body.decode()}\n")
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_TIMEOUT_S)) as session,
            session.post(url, data=body, headers=headers) as response,
        ):
            answer = await response.text(errors="replace")
    except aiohttp.InvalidURL:
        print(f"payhooks: --url {url} is not an http(s) URL", file=sys.stderr)
        return EXIT_USAGE
    except (aiohttp.ClientError, TimeoutError) as e:
        print(
            f"payhooks: cannot reach ingest at {url}: {str(e) or type(e).__name__}", file=sys.stderr
        )
        return EXIT_UNREACHABLE
    print(f"< {response.status} {response.reason or ''}".rstrip())
    print(f"< {answer}")
    return EXIT_OK if 200 <= response.status < 300 else EXIT_NOTHING
