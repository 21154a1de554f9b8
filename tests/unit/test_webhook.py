"""From HTTP delivery to verified webhook: every rejection reason, and properties over junk."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from services.ingest import webhook
from services.ingest.webhook import (
    MalformedWebhookError,
    RejectedWebhookError,
    Signed,
    Webhook,
    WebhookHeaders,
    storable_headers,
)
from shared.providers.xhub import ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER
from shared.providers.xhub.adapter import XHUB
from shared.providers.xhub.signatures import sign

SECRET = b"whsec-current"
OLD_SECRET = b"whsec-previous"
SECRETS = (SECRET, OLD_SECRET)
NOW_S = 1_700_000_000
TOLERANCE_S = 300
BODY = b'{"event":"payment.status_changed","payment_id":"pay_1","status":"paid"}'


# The checks as the X-Hub route runs them (tests/unit/test_standard_webhooks.py: Standard's).
def read_headers(headers: Any) -> WebhookHeaders:
    return webhook.read_headers(headers, XHUB)


def authenticate(
    delivery: WebhookHeaders, body: bytes, secrets: tuple[bytes, ...], now_s: float, tol: int
) -> Signed:
    return webhook.authenticate(delivery, body, secrets, now_s, tol, XHUB)


def parse_body(delivery: WebhookHeaders, body: bytes) -> Webhook:
    return webhook.parse_body(delivery, body, XHUB)


def headers_for(
    body: bytes, *, secret: bytes = SECRET, timestamp: int = NOW_S, event_id: str = "evt_1"
) -> dict[str, str]:
    ts = str(timestamp)
    return {ID_HEADER: event_id, TIMESTAMP_HEADER: ts, SIGNATURE_HEADER: sign(secret, ts, body)}


def receive(headers: dict[str, str], body: bytes, secrets: tuple[bytes, ...] = SECRETS) -> Webhook:
    """The whole no-I/O path the handler runs, in the handler's order."""
    delivery = read_headers(headers)
    authenticate(delivery, body, secrets, NOW_S, TOLERANCE_S)
    return parse_body(delivery, body)


# read_headers


def test_delivery_headers_are_read_and_trimmed() -> None:
    delivery = read_headers({ID_HEADER: " evt_1 ", TIMESTAMP_HEADER: " 1700000000 "})

    assert delivery == WebhookHeaders("evt_1", "1700000000", "")


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({TIMESTAMP_HEADER: "1700000000"}, f"missing {ID_HEADER}"),
        ({ID_HEADER: "   ", TIMESTAMP_HEADER: "1700000000"}, f"missing {ID_HEADER}"),
        ({ID_HEADER: "x" * 256, TIMESTAMP_HEADER: "1700000000"}, "printable"),
        ({ID_HEADER: "evt\x00one", TIMESTAMP_HEADER: "1700000000"}, "printable"),
        ({ID_HEADER: "evt\tone", TIMESTAMP_HEADER: "1700000000"}, "printable"),
        ({ID_HEADER: "evt_1"}, f"missing {TIMESTAMP_HEADER}"),
        ({ID_HEADER: "evt_1", TIMESTAMP_HEADER: " "}, f"missing {TIMESTAMP_HEADER}"),
        ({ID_HEADER: "evt_1", TIMESTAMP_HEADER: "soon"}, "Unix seconds"),
        ({ID_HEADER: "evt_1", TIMESTAMP_HEADER: "1700000000.5"}, "Unix seconds"),
        ({ID_HEADER: "evt_1", TIMESTAMP_HEADER: "1.7e9"}, "Unix seconds"),
        ({ID_HEADER: "evt_1", TIMESTAMP_HEADER: "\u0661\u0667" + "\u0660" * 8}, "Unix seconds"),
    ],
)
def test_malformed_delivery_headers_are_rejected(headers: dict[str, str], reason: str) -> None:
    with pytest.raises(MalformedWebhookError, match=reason):
        read_headers(headers)


def test_event_id_of_255_characters_is_accepted() -> None:
    delivery = read_headers({ID_HEADER: "x" * 255, TIMESTAMP_HEADER: "1"})

    assert delivery.event_id == "x" * 255


# authenticate


def test_signed_fresh_delivery_authenticates() -> None:
    delivery = read_headers(headers_for(BODY))

    assert authenticate(delivery, BODY, SECRETS, NOW_S, TOLERANCE_S) == Signed(0, 0)


def test_delivery_signed_with_the_previous_secret_authenticates() -> None:
    delivery = read_headers(headers_for(BODY, secret=OLD_SECRET))

    assert authenticate(delivery, BODY, SECRETS, NOW_S, TOLERANCE_S).secret_index == 1


@pytest.mark.parametrize("skew_s", [-TOLERANCE_S + 1, -7, 0, 42, TOLERANCE_S - 1])
def test_clock_skew_is_our_clock_minus_the_timestamp(skew_s: int) -> None:
    """Positive: the delivery's timestamp lies in our past (our clock is ahead)."""
    delivery = read_headers(headers_for(BODY, timestamp=NOW_S - skew_s))

    assert authenticate(delivery, BODY, SECRETS, NOW_S + 0.25, TOLERANCE_S) == Signed(
        0, skew_s + 0.25
    )


def test_delivery_signed_with_a_removed_secret_is_rejected() -> None:
    delivery = read_headers(headers_for(BODY, secret=OLD_SECRET))

    with pytest.raises(RejectedWebhookError) as raised:
        authenticate(delivery, BODY, (SECRET,), NOW_S, TOLERANCE_S)
    assert raised.value.outcome == "invalid_signature"


def test_missing_signature_is_rejected_as_invalid_signature() -> None:
    headers = headers_for(BODY)
    del headers[SIGNATURE_HEADER]

    with pytest.raises(RejectedWebhookError, match=f"missing {SIGNATURE_HEADER}") as raised:
        authenticate(read_headers(headers), BODY, SECRETS, NOW_S, TOLERANCE_S)
    assert raised.value.outcome == "invalid_signature"


def test_signature_of_another_body_is_rejected() -> None:
    delivery = read_headers(headers_for(BODY))

    with pytest.raises(RejectedWebhookError, match="does not match") as raised:
        authenticate(delivery, BODY.replace(b"paid", b"PAID"), SECRETS, NOW_S, TOLERANCE_S)
    assert raised.value.outcome == "invalid_signature"


def test_signature_rejection_does_not_echo_the_signature() -> None:
    headers = headers_for(BODY, secret=b"attacker")

    with pytest.raises(RejectedWebhookError) as raised:
        authenticate(read_headers(headers), BODY, SECRETS, NOW_S, TOLERANCE_S)
    assert headers[SIGNATURE_HEADER] not in str(raised.value)


@pytest.mark.parametrize("skew_s", [-TOLERANCE_S - 1, TOLERANCE_S + 1, -86_400, 86_400])
def test_timestamp_outside_tolerance_is_rejected_as_stale(skew_s: int) -> None:
    delivery = read_headers(headers_for(BODY, timestamp=NOW_S + skew_s))

    with pytest.raises(RejectedWebhookError) as raised:
        authenticate(delivery, BODY, SECRETS, NOW_S, TOLERANCE_S)
    assert raised.value.outcome == "stale"
    # Authentic, only late or early: which secret and how far off still reach the metrics.
    assert raised.value.signed == Signed(0, -skew_s)


def test_stale_delivery_signed_with_the_previous_secret_says_so() -> None:
    delivery = read_headers(headers_for(BODY, secret=OLD_SECRET, timestamp=NOW_S - 1000))

    with pytest.raises(RejectedWebhookError) as raised:
        authenticate(delivery, BODY, SECRETS, NOW_S, TOLERANCE_S)
    assert raised.value.signed == Signed(1, 1000)


@pytest.mark.parametrize(
    "timestamp",
    [str(NOW_S * 1000), "-1", str(-NOW_S), "0", "9" * 16, "1" * 5000],
    ids=["milliseconds", "minus_one", "negative", "zero", "sixteen_digits", "five_thousand"],
)
def test_numeric_timestamp_far_from_now_is_stale_not_malformed(timestamp: str) -> None:
    """SPEC: only a non-numeric timestamp is 400; a numeric one out of tolerance is 401 stale
    (a provider sending milliseconds shows up as `stale`, the clock problem it is)."""
    headers = headers_for(BODY) | {TIMESTAMP_HEADER: timestamp}
    headers[SIGNATURE_HEADER] = sign(SECRET, timestamp, BODY)

    with pytest.raises(RejectedWebhookError) as raised:
        authenticate(read_headers(headers), BODY, SECRETS, NOW_S, TOLERANCE_S)
    assert raised.value.outcome == "stale"
    assert raised.value.signed is not None
    assert raised.value.signed.secret_index == 0
    if len(timestamp) > 15:  # no clock is near it: not measured
        assert raised.value.signed.clock_skew_s is None
    else:
        assert raised.value.signed.clock_skew_s == NOW_S - int(timestamp)


@pytest.mark.parametrize("timestamp", ["12a", "1.5", "+5", "--1", "\u0661\u0667\u0660\u0660", " "])
def test_non_numeric_timestamp_is_malformed(timestamp: str) -> None:
    headers = headers_for(BODY) | {TIMESTAMP_HEADER: timestamp}

    with pytest.raises(MalformedWebhookError, match=r"Unix seconds|missing"):
        read_headers(headers)


def test_payment_id_longer_than_any_order_id_is_no_lookup_key() -> None:
    """Kept in the body, not in the inbox's indexed payment_id column (which cannot hold it)."""
    for payment_id, expected in (("p" * 255, "p" * 255), ("p" * 256, None), ("p" * 8000, None)):
        body = orjson.dumps({"event": "payment.status_changed", "payment_id": payment_id})
        webhook = parse_body(read_headers(headers_for(body)), body)
        assert webhook.payment_id == expected
        assert webhook.body == body


@pytest.mark.parametrize("skew_s", [-TOLERANCE_S, TOLERANCE_S, 0])
def test_timestamp_at_the_tolerance_edge_is_accepted(skew_s: int) -> None:
    delivery = read_headers(headers_for(BODY, timestamp=NOW_S + skew_s))

    authenticate(delivery, BODY, SECRETS, NOW_S, TOLERANCE_S)


def test_bad_signature_wins_over_stale_timestamp() -> None:
    delivery = read_headers(headers_for(BODY, secret=b"attacker", timestamp=NOW_S - 10_000))

    with pytest.raises(RejectedWebhookError) as raised:
        authenticate(delivery, BODY, SECRETS, NOW_S, TOLERANCE_S)
    assert raised.value.outcome == "invalid_signature"
    assert raised.value.signed is None  # anyone can send this: no skew, no secret recorded


# parse_body


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "not valid JSON"),
        (b"{not json", "not valid JSON"),
        (b'{"event": "x"', "not valid JSON"),
        (b'{"event": "\xff"}', "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'"payment.status_changed"', "JSON object"),
        (b"null", "JSON object"),
        (b"42", "JSON object"),
        (b'{"payment_id": "p"}', '"event"'),
        (b'{"event": null}', '"event"'),
        (b'{"event": 7}', '"event"'),
        (b'{"event": ["payment.status_changed"]}', '"event"'),
        (b'{"event": ""}', '"event"'),
        (b'{"event": "  "}', '"event"'),
    ],
)
def test_malformed_body_is_rejected(body: bytes, reason: str) -> None:
    delivery = WebhookHeaders("evt_1", str(NOW_S), "")

    with pytest.raises(MalformedWebhookError, match=reason):
        parse_body(delivery, body)


def test_parsed_webhook_keeps_the_exact_raw_body() -> None:
    body = b'{ "event" : "refund.completed",\n "refund_id": "r1", "payment_id": "pay_9" }'

    webhook = parse_body(WebhookHeaders("evt_9", str(NOW_S), ""), body)

    assert webhook == Webhook("evt_9", "refund.completed", "pay_9", body)


@pytest.mark.parametrize(
    ("payment_id", "expected"),
    [("pay_1", "pay_1"), (12345, "12345"), (None, None), (1.5, None), ({"id": 1}, None)],
)
def test_payment_id_is_kept_when_it_is_a_string_or_integer(
    payment_id: object, expected: str | None
) -> None:
    body = orjson.dumps({"event": "payment.status_changed", "payment_id": payment_id})

    assert parse_body(WebhookHeaders("e", "1", ""), body).payment_id == expected


def test_payment_id_absent_is_none() -> None:
    assert (
        parse_body(WebhookHeaders("e", "1", ""), b'{"event": "kyc.status_changed"}').payment_id
        is None
    )


# storable_headers


def test_credentials_are_left_out_of_stored_headers() -> None:
    headers = {
        "Authorization": "Bearer x",
        "cookie": "session=y",
        "Proxy-Authorization": "Basic z",
        ID_HEADER: "evt_1",
        SIGNATURE_HEADER: "abc",
    }

    assert storable_headers(headers) == {ID_HEADER: "evt_1", SIGNATURE_HEADER: "abc"}


# properties

EXPECTED_ERRORS = (MalformedWebhookError, RejectedWebhookError)
header_names = st.one_of(
    st.sampled_from([ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER]), st.text()
)
timestamps = st.one_of(
    st.integers(NOW_S - 2 * TOLERANCE_S, NOW_S + 2 * TOLERANCE_S).map(str), st.text()
)
random_headers = st.fixed_dictionaries(
    {},
    optional={ID_HEADER: st.text(), TIMESTAMP_HEADER: timestamps, SIGNATURE_HEADER: st.text()},
).flatmap(lambda known: st.dictionaries(header_names, st.text()).map(lambda junk: junk | known))


@given(headers=random_headers, body=st.binary(max_size=1024))
def test_random_deliveries_are_rejected_with_a_reason(headers: dict[str, str], body: bytes) -> None:
    with pytest.raises(EXPECTED_ERRORS):
        receive(headers, body)


@given(headers=st.dictionaries(header_names, st.text()))
def test_read_delivery_returns_valid_headers_or_says_malformed(headers: dict[str, str]) -> None:
    try:
        delivery = read_headers(headers)
    except MalformedWebhookError:
        return
    assert 1 <= len(delivery.event_id) <= 255
    assert delivery.event_id.isprintable()
    assert delivery.timestamp.isascii()
    assert delivery.timestamp.removeprefix("-").isdigit()


@given(body=st.binary(max_size=2048), skew_s=st.integers(-TOLERANCE_S, TOLERANCE_S))
def test_signed_random_bytes_either_parse_or_are_malformed(body: bytes, skew_s: int) -> None:
    headers = headers_for(body, timestamp=NOW_S + skew_s)

    try:
        webhook = receive(headers, body)
    except MalformedWebhookError:
        return
    assert webhook.body == body


@given(
    body=st.binary(max_size=512),
    signature=st.one_of(st.text(), st.from_regex(r"[0-9a-fA-F]{64}", fullmatch=True)),
)
def test_random_signature_never_authenticates(body: bytes, signature: str) -> None:
    headers = {ID_HEADER: "evt_1", TIMESTAMP_HEADER: str(NOW_S), SIGNATURE_HEADER: signature}

    with pytest.raises(RejectedWebhookError) as raised:
        receive(headers, body)
    assert raised.value.outcome == "invalid_signature"


@given(
    body=st.binary(max_size=512),
    wrong_secret=st.binary(min_size=1, max_size=64),
    skew_s=st.integers(-TOLERANCE_S, TOLERANCE_S),
)
def test_signature_from_an_unknown_secret_never_authenticates(
    body: bytes, wrong_secret: bytes, skew_s: int
) -> None:
    assume(wrong_secret not in SECRETS)
    headers = headers_for(body, secret=wrong_secret, timestamp=NOW_S + skew_s)

    with pytest.raises(RejectedWebhookError):
        receive(headers, body)


json_text = st.text(st.characters(exclude_categories=("Cs",)))  # type: ignore[arg-type]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(json_text, children, max_size=4)
    ),
    max_leaves=12,
)
event_types = json_text.filter(lambda s: s.strip() != "")


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(
    event=event_types,
    extra=st.dictionaries(json_text.filter(lambda k: k != "event"), json_values, max_size=6),
    event_id=st.text(st.characters(categories=("L", "N", "P", "S")), min_size=1, max_size=255),
    secret=st.sampled_from(SECRETS),
    skew_s=st.integers(-TOLERANCE_S, TOLERANCE_S),
)
def test_signed_json_object_with_an_event_always_parses(
    event: str, extra: dict[str, Any], event_id: str, secret: bytes, skew_s: int
) -> None:
    body = orjson.dumps({**extra, "event": event})
    headers = headers_for(body, secret=secret, timestamp=NOW_S + skew_s, event_id=event_id)

    webhook = receive(headers, body)

    assert webhook.event_type == event
    assert webhook.event_id == event_id
    assert webhook.body == body
