"""X-Hub signatures: HMAC-SHA256 over `timestamp + "." + body`, any configured secret matches."""

from __future__ import annotations

import hashlib
import hmac

from hypothesis import given
from hypothesis import strategies as st

from shared.providers.xhub.signatures import matching_secret, sign, verify

TIMESTAMP = "1700000000"
BODY = b'{"event":"payment.status_changed","payment_id":"pay_1"}'
SECRET = b"whsec_test"
# Computed outside Python: printf '%s' '1700000000.<BODY>' | openssl dgst -sha256 -hmac whsec_test
KNOWN_SIGNATURE = "2f3a2e2691da060392c50bfde7d952fbb69e94ed4dd7c13a8be4511f167d757b"


def test_sign_matches_a_known_vector() -> None:
    assert sign(SECRET, TIMESTAMP, BODY) == KNOWN_SIGNATURE


def test_sign_matches_hmac_sha256_of_timestamp_dot_body() -> None:
    expected = hmac.new(b"other", b"42." + b"\x00\xffraw", hashlib.sha256).hexdigest()

    assert sign(b"other", "42", b"\x00\xffraw") == expected


def test_signature_is_lowercase_hex() -> None:
    signature = sign(SECRET, TIMESTAMP, BODY)

    assert len(signature) == 64
    assert signature == signature.lower()
    int(signature, 16)


def test_correct_signature_verifies() -> None:
    assert verify([SECRET], TIMESTAMP, BODY, KNOWN_SIGNATURE)


def test_any_configured_secret_may_match() -> None:
    secrets = [b"new", b"current", b"old"]

    for secret in secrets:
        assert verify(secrets, TIMESTAMP, BODY, sign(secret, TIMESTAMP, BODY))


def test_removed_secret_is_rejected() -> None:
    signed_with_retired = sign(b"retired", TIMESTAMP, BODY)

    assert not verify([b"new", b"current"], TIMESTAMP, BODY, signed_with_retired)


def test_matching_secret_is_its_position_in_the_configured_list() -> None:
    secrets = [b"new", b"current", b"old"]

    for index, secret in enumerate(secrets):
        assert matching_secret(secrets, TIMESTAMP, BODY, sign(secret, TIMESTAMP, BODY)) == index
    assert matching_secret(secrets, TIMESTAMP, BODY, sign(b"retired", TIMESTAMP, BODY)) is None


def test_a_secret_configured_twice_matches_at_its_first_position() -> None:
    assert matching_secret([b"a", b"b", b"b"], TIMESTAMP, BODY, sign(b"b", TIMESTAMP, BODY)) == 1


def test_no_configured_secret_rejects_everything() -> None:
    assert not verify([], TIMESTAMP, BODY, KNOWN_SIGNATURE)


def test_uppercase_hex_is_accepted() -> None:
    assert verify([SECRET], TIMESTAMP, BODY, KNOWN_SIGNATURE.upper())


def test_empty_signature_is_rejected() -> None:
    assert not verify([SECRET], TIMESTAMP, BODY, "")
    assert not verify([SECRET], TIMESTAMP, BODY, "   ")


def test_signature_over_another_body_is_rejected() -> None:
    assert not verify([SECRET], TIMESTAMP, BODY + b" ", KNOWN_SIGNATURE)


def test_signature_over_another_timestamp_is_rejected() -> None:
    assert not verify([SECRET], "1700000001", BODY, KNOWN_SIGNATURE)


def test_truncated_signature_is_rejected() -> None:
    assert not verify([SECRET], TIMESTAMP, BODY, KNOWN_SIGNATURE[:-1])


def test_timestamp_and_body_are_separated_by_a_dot() -> None:
    # "1" + "." + "2..." must differ from "12" + "." + "...": the dot is part of the message.
    assert not verify([SECRET], "17", b"00.x", sign(SECRET, "1", b"700.x"))


@given(
    secret=st.binary(min_size=1, max_size=64),
    timestamp=st.from_regex(r"[0-9]{1,12}", fullmatch=True),
    body=st.binary(max_size=512),
)
def test_own_signature_always_verifies(secret: bytes, timestamp: str, body: bytes) -> None:
    assert verify([b"decoy", secret], timestamp, body, sign(secret, timestamp, body))


@given(
    secret=st.binary(min_size=1, max_size=64),
    timestamp=st.from_regex(r"[0-9]{1,12}", fullmatch=True),
    body=st.binary(max_size=512),
    signature=st.text(max_size=80),
)
def test_random_signature_never_verifies(
    secret: bytes, timestamp: str, body: bytes, signature: str
) -> None:
    assert not verify([secret], timestamp, body, signature)
