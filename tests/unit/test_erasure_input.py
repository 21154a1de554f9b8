"""An erasure's selector (shared/ops/erasure.py): exactly one, well-formed; and the scrub of
an address out of stored JSON headers."""

from __future__ import annotations

import re

import pytest

from shared.ops.erasure import MARKER, By, ErasureInputError, Selector, _scrub, parse_selector


def test_an_address_is_compared_in_lower_case_without_outer_spaces() -> None:
    assert parse_selector("  Erin@Example.ORG ", None, None) == Selector(
        By.EMAIL, "erin@example.org"
    )
    assert parse_selector(None, "u-1", None) == Selector(By.USER, "u-1")
    assert parse_selector(None, None, "ord-1") == Selector(By.ORDER, "ord-1")


def test_the_audit_target_never_holds_the_address() -> None:
    assert parse_selector("erin@example.org", None, None).target() == "email"
    assert parse_selector(None, "u-1", None).target() == "user:u-1"
    assert parse_selector(None, None, "o-1").target() == "order:o-1"


@pytest.mark.parametrize(
    ("email", "user", "order"),
    [
        (None, None, None),
        ("", "", ""),
        ("a@b.test", "u", None),
        ("a@b.test", None, "o"),
        (None, "u", "o"),
        ("no-at-sign", None, None),
        ("@b.test", None, None),
        ("a@", None, None),
        ("a b@c.test", None, None),
        ("a\x00@b.test", None, None),
        (MARKER, None, None),
        (MARKER.upper(), None, None),
        ("a" * 320 + "@b.test", None, None),
        (7, None, None),
        (None, ["u"], None),
        (None, "u\n1", None),
        (None, None, "o" * 256),
    ],
)
def test_anything_but_one_well_formed_selector_is_refused(
    email: object, user: object, order: object
) -> None:
    with pytest.raises(ErasureInputError):
        parse_selector(email, user, order)


def test_the_scrub_replaces_the_address_in_every_string_and_keeps_the_rest() -> None:
    patterns = [re.compile(re.escape("erin@example.org"), re.IGNORECASE)]
    headers = {"X-Customer": "Erin <ERIN@example.org>", "n": 1, "l": ["erin@example.org", None]}

    assert _scrub(headers, patterns) == {
        "X-Customer": f"Erin <{MARKER}>",
        "n": 1,
        "l": [MARKER, None],
    }
