"""Standard Webhooks deliveries through ingest's own checks (services/ingest/webhook.py with
the registry's STANDARD), signed by the official `standardwebhooks` package from PyPI."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from standardwebhooks.webhooks import Webhook as OfficialSigner

from services.ingest.webhook import (
    MalformedWebhookError,
    RejectedWebhookError,
    Webhook,
    authenticate,
    parse_body,
    read_headers,
)
from shared.providers.standard import ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER
from shared.providers.standard.adapter import STANDARD
from shared.providers.standard.events import canonical, canonical_body, envelope
from shared.providers.standard.signatures import matching_secret, parse_secrets, sign
from shared.providers.xhub.events import parse_event

# Secrets as a Standard Webhooks sender shows them: whsec_ + base64 of the key.
SECRET = "whsec_" + base64.b64encode(b"current key of 24 bytes!").decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"the previous key, rotated").decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"a key nobody configured").decode()
KEYS = parse_secrets(f"{SECRET},{OLD_SECRET}")
NOW_S = 1_700_000_000
TOLERANCE_S = 300
BODY = orjson.dumps(
    envelope(
        "payment.status_changed",
        "2023-11-14T22:13:20Z",
        payment_id="pay_1",
        external_id="order_1",
        status="paid",
        amount="100.00",
        currency="EUR",
        created_at="2023-11-14T22:13:19Z",
    )
)


def official_headers(
    body: bytes, *, secret: str = SECRET, timestamp: int = NOW_S, event_id: str = "msg_1"
) -> dict[str, str]:
    """The headers the official library's signer gives `body`."""
    signature = OfficialSigner(secret).sign(
        event_id, datetime.fromtimestamp(timestamp, tz=UTC), body.decode()
    )
    return {ID_HEADER: event_id, TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: signature}


def receive(headers: dict[str, str], body: bytes, keys: tuple[bytes, ...] = KEYS) -> Webhook:
    """The whole no-I/O path the handler runs for /webhooks/standard, in its order."""
    delivery = read_headers(headers, STANDARD)
    authenticate(delivery, body, keys, NOW_S, TOLERANCE_S, STANDARD)
    return parse_body(delivery, body, STANDARD)


def test_a_delivery_signed_by_the_official_library_is_accepted() -> None:
    webhook = receive(official_headers(BODY), BODY)

    assert webhook == Webhook("msg_1", "payment.status_changed", "pay_1", BODY)


def test_a_tampered_body_is_rejected() -> None:
    headers = official_headers(BODY)
    tampered = BODY.replace(b"100.00", b"999.00")

    with pytest.raises(RejectedWebhookError) as e:
        receive(headers, tampered)
    assert e.value.outcome == "invalid_signature"


def test_a_signature_under_a_secret_not_configured_is_rejected() -> None:
    with pytest.raises(RejectedWebhookError) as e:
        receive(official_headers(BODY, secret=OTHER_SECRET), BODY)
    assert e.value.outcome == "invalid_signature"


def test_the_event_id_is_signed_too() -> None:
    headers = official_headers(BODY)
    headers[ID_HEADER] = "msg_2"

    with pytest.raises(RejectedWebhookError):
        receive(headers, BODY)


@pytest.mark.parametrize("offset_s", [-(TOLERANCE_S + 1), TOLERANCE_S + 1, -86_400, 86_400])
def test_a_stale_or_future_timestamp_is_rejected_as_stale(offset_s: int) -> None:
    with pytest.raises(RejectedWebhookError) as e:
        receive(official_headers(BODY, timestamp=NOW_S + offset_s), BODY)
    assert e.value.outcome == "stale"
    assert e.value.signed is not None  # authentic: a clock problem, not a forgery


@pytest.mark.parametrize("offset_s", [-TOLERANCE_S, 0, TOLERANCE_S])
def test_a_timestamp_within_the_tolerance_is_accepted(offset_s: int) -> None:
    receive(official_headers(BODY, timestamp=NOW_S + offset_s), BODY)


@pytest.mark.parametrize("missing", [ID_HEADER, TIMESTAMP_HEADER])
def test_a_missing_id_or_timestamp_header_is_malformed(missing: str) -> None:
    headers = official_headers(BODY)
    del headers[missing]

    with pytest.raises(MalformedWebhookError, match=missing):
        receive(headers, BODY)


def test_a_missing_signature_header_is_an_invalid_signature() -> None:
    headers = official_headers(BODY)
    del headers[SIGNATURE_HEADER]

    with pytest.raises(RejectedWebhookError) as e:
        receive(headers, BODY)
    assert e.value.outcome == "invalid_signature"


def test_one_right_signature_among_several_is_enough() -> None:
    right = official_headers(BODY)[SIGNATURE_HEADER]
    wrong = official_headers(BODY, secret=OTHER_SECRET)[SIGNATURE_HEADER]
    headers = official_headers(BODY)
    headers[SIGNATURE_HEADER] = f"{wrong} v1a,{'A' * 88} v2,whatever {right} v1,not-base64!"

    assert receive(headers, BODY).event_id == "msg_1"


def test_several_signatures_none_right_are_rejected() -> None:
    wrong = official_headers(BODY, secret=OTHER_SECRET)[SIGNATURE_HEADER]
    headers = official_headers(BODY)
    headers[SIGNATURE_HEADER] = f"{wrong} {wrong} v1a,{'A' * 88}"

    with pytest.raises(RejectedWebhookError):
        receive(headers, BODY)


def test_rotation_any_configured_secret_matches_and_says_which() -> None:
    for index, secret in enumerate((SECRET, OLD_SECRET)):
        delivery = read_headers(official_headers(BODY, secret=secret), STANDARD)
        signed = authenticate(delivery, BODY, KEYS, NOW_S, TOLERANCE_S, STANDARD)
        assert signed.secret_index == index


def test_a_sender_signing_with_old_and_new_secret_matches_the_first_configured() -> None:
    old = official_headers(BODY, secret=OLD_SECRET)[SIGNATURE_HEADER]
    new = official_headers(BODY)[SIGNATURE_HEADER]
    headers = official_headers(BODY)
    headers[SIGNATURE_HEADER] = f"{old} {new}"

    delivery = read_headers(headers, STANDARD)
    assert authenticate(delivery, BODY, KEYS, NOW_S, TOLERANCE_S, STANDARD).secret_index == 0


def test_our_signer_is_the_official_one() -> None:
    ours = sign(parse_secrets(SECRET)[0], "msg_1", str(NOW_S), BODY)

    assert ours == official_headers(BODY)[SIGNATURE_HEADER]
    assert OfficialSigner(SECRET).sign("msg_1", datetime.fromtimestamp(NOW_S, tz=UTC), "{}") == (
        sign(parse_secrets(SECRET)[0], "msg_1", str(NOW_S), b"{}")
    )


def test_matching_secret_is_none_for_junk_signatures() -> None:
    for junk in ["", " ", "v1,", "v1", ",,,", "v1,====", "v1a,abc", "v1," + "A" * 10_000]:
        assert matching_secret(KEYS, "msg_1", str(NOW_S), BODY, junk) is None


@pytest.mark.parametrize(
    "raw",
    [
        SECRET,
        SECRET.removeprefix("whsec_"),  # the prefix is optional, as in the official library
        SECRET.rstrip("="),  # unpadded base64
    ],
)
def test_secrets_are_whsec_base64(raw: str) -> None:
    assert parse_secrets(raw) == (b"current key of 24 bytes!",)


@pytest.mark.parametrize("raw", ["whsec_!!!", "whsec_", "not base64 at all", ",", "whsec_a"])
def test_malformed_secrets_are_refused_without_echoing_them(raw: str) -> None:
    with pytest.raises(ValueError, match=r"^must ") as e:
        parse_secrets(raw)
    shapes = {"must be comma-separated whsec_<base64> secrets", "must hold at least one secret"}
    assert str(e.value) in shapes


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ({"data": {"payment_id": "p"}}, '"type"'),
        ({"type": "", "data": {}}, '"type"'),
        ({"type": 7, "data": {}}, '"type"'),
        ({"type": "payment.status_changed"}, '"data"'),
        ({"type": "payment.status_changed", "data": [1]}, '"data"'),
        ({"event": "payment.status_changed", "payment_id": "p"}, '"type"'),  # X-Hub's shape
    ],
)
def test_a_body_that_is_no_envelope_is_malformed(payload: dict[str, Any], why: str) -> None:
    body = orjson.dumps(payload)

    with pytest.raises(MalformedWebhookError, match=why):
        receive(official_headers(body), body)


def test_the_canonical_event_is_data_with_event_from_type() -> None:
    event = orjson.loads(canonical_body(BODY))

    assert event == {
        "event": "payment.status_changed",
        "payment_id": "pay_1",
        "external_id": "order_1",
        "status": "paid",
        "amount": "100.00",
        "currency": "EUR",
        "created_at": "2023-11-14T22:13:19Z",
    }
    assert parse_event(event).status == "paid"


def test_type_wins_over_an_event_field_in_data_and_timestamp_fills_created_at() -> None:
    payload = envelope("refund.completed", "2023-11-14T22:13:20Z", event="x", payment_id="p")

    assert canonical(payload) == {
        "event": "refund.completed",
        "payment_id": "p",
        "created_at": "2023-11-14T22:13:20Z",
    }


def test_a_body_that_is_no_envelope_is_passed_on_as_it_is() -> None:
    for body in [b"not json", b"[1]", b'{"type":"x"}']:
        assert canonical_body(body) == body
