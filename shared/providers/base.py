"""The provider seam: what ingest needs to know of one provider's webhooks (route, headers,
signature scheme, secrets, event type and payment id), as one frozen value per provider.
No I/O: each provider package builds its `Provider` from pure functions."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from shared.errors import PermanentError


class MalformedWebhookError(ValueError):
    """The request can never be a valid webhook (400, outcome `malformed`)."""


@dataclass(frozen=True, slots=True)
class Headline:
    """What ingest reads from a verified body: the event type (the routing key) and the
    payment id as sent (ingest keeps a lookup copy; the workers read the canonical body)."""

    event_type: str
    payment_id: Any
    # The event id, for a provider whose id is in the body rather than a header (Stripe's
    # `id`, `evt_...`); None for one whose `id_header` carries it.
    event_id: Any = None


class ProviderResponseError(PermanentError):
    """The provider answered something we cannot use: a bad body or an unexpected status."""


@dataclass(frozen=True, slots=True)
class ProviderPayment:
    """A provider's answer about one payment, in payhooks' words: `status` one of the
    canonical statuses (paid, settled, refunded, failed, expired, cancelled, ...; one the
    order machine does not know, such as pending, changes nothing)."""

    payment_id: str
    status: str
    amount: Decimal
    currency: str
    updated_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class PaymentApi:
    """How the reconciler asks a provider about one payment (GET, Bearer key): the shared
    HTTP client (timeouts, retries, rate limit, metrics) with the provider's URL and reading."""

    url_variable: str  # the API's base URL
    url_default: str | None  # None: the variable is required with the key
    key_variable: str  # the Bearer key; unset, the reconciler does not ask this provider
    # A payment id as the path (and query) after the base URL, its id percent-encoded.
    path: Callable[[str], str]
    # The answer's body (HTTP 200) about a payment id; ProviderResponseError if unusable.
    parse: Callable[[bytes, str], ProviderPayment]
    headers: Mapping[str, str] | None = None  # sent with every question besides the key
    rate_per_s: float = 10.0  # questions a second, the client's own budget
    # The inverse, for the simulator's fake API (tools and tests, never the reconciler): the
    # route it serves (aiohttp's pattern, `{payment_id}` in it) and a payment as the body
    # this provider answers there, which `parse` reads back. None: the simulator cannot
    # answer as this provider.
    route: str | None = None
    answer: Callable[[ProviderPayment], bytes] | None = None


# (event id, canonical event as a dict) -> the body this provider sends for it: the inverse of
# canonical_body, for the simulator and `payhooks send` (tools and tests, never ingest).
Encode = Callable[[str, Mapping[str, Any]], bytes]
# (one key as parse_secrets gives it, event id, body, wall clock in Unix seconds) -> every
# header this provider sends with the body (id, timestamp, signature, content type).
SignedHeaders = Callable[[bytes, str, bytes, float], dict[str, str]]


# (secrets, event id, timestamp, raw body, signature header) -> position of the first secret
# the signature matches under, or None. Every secret is tried, in constant time each.
MatchingSecret = Callable[[Sequence[bytes], str, str, bytes, str], int | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Provider:
    # The inbox's provider column, the metrics' provider label, the messages' provider header.
    name: str
    webhook_path: str
    # The variable holding its secrets (comma-separated, any one may match: rotation); a
    # provider whose variable is unset has no route.
    secrets_variable: str
    # Its text as the keys to sign with; ValueError (saying the expected shape, never echoing
    # the value) if malformed.
    parse_secrets: Callable[[str], tuple[bytes, ...]]
    # The event id's header; None: the id is in the body (`Headline.event_id`, Stripe's).
    id_header: str | None
    # The timestamp's header (Unix seconds of the delivery attempt); None: the signature
    # header carries it (`timestamp_in_signature`, Stripe's `t=`).
    timestamp_header: str | None
    signature_header: str
    matching_secret: MatchingSecret
    # The parsed JSON object's event type and payment id; MalformedWebhookError if the body
    # is no event of this provider at all.
    headline: Callable[[Mapping[str, Any]], Headline]
    # The stored raw body as the message body the workers read: payhooks' canonical event
    # (the X-Hub body shape, SPEC section 3). None: the raw body already is one (no copy).
    canonical_body: Callable[[bytes], bytes] | None = None
    # Put before its event ids to make its messages' ids (the workers' idempotency keys,
    # which know no provider): "" only for X-Hub, whose ids are the messages' ids since
    # before the seam; every other provider's is its name and a colon, so two providers'
    # equal event ids stay two events past the inbox too.
    message_id_prefix: str
    # Whether the reconciler can ask this provider's API about a payment (GET /payments/:id);
    # a provider without one is repaired by its own redeliveries only.
    has_payment_api: bool = False
    # Whether it tells a settlement (canonical `settled`): X-Hub and Standard do; Stripe has no
    # settlement per payment (payouts are per balance), so the simulator sends it none and
    # expects PAID where X-Hub's would be SETTLED.
    has_settlement: bool = True
    # Its API as the reconciler asks it, for a provider other than X-Hub (whose API settings
    # predate the seam: XHUB_API_URL, XHUB_API_KEY).
    payment_api: PaymentApi | None = None
    # Settings of its own besides secrets (not secret), by variable: each parsed by its
    # function (ValueError naming the expected values); Settings.provider_options holds them.
    options: Mapping[str, Callable[[str], str]] | None = None
    # The headline as this deployment takes the event, given the parsed body and its options
    # (those set): a provider may keep an event it must not apply under its own type, which no
    # worker takes (stored, unrouted, visible), as Stripe's test-mode events in a live one.
    screen: Callable[[Mapping[str, Any], Headline, Mapping[str, str]], Headline] | None = None
    # For a provider without a timestamp header: the timestamp as the signature header gives
    # it ("" when it gives none: the delivery is then refused as unsigned, 401).
    timestamp_in_signature: Callable[[str], str] | None = None
    # How this provider sends a canonical event (the simulator's and `payhooks send`'s hook):
    # its body and its signed headers. None: the tools cannot play this provider.
    encode: Encode | None = None
    signed_headers: SignedHeaders | None = None


def comma_separated(raw: str) -> tuple[str, ...]:
    """A secrets variable's entries: comma-separated, trimmed, blanks dropped."""
    return tuple(part.strip() for part in raw.split(",") if part.strip())
