"""The customer emails' deterministic Message-ID (SPEC: <{template}.{payment_id}@{domain}>)."""

from __future__ import annotations

import pytest

from services.email.templates import message_id, render


@pytest.mark.parametrize(
    "email_from",
    [
        "payments@shop.example",
        "Shop <payments@shop.example>",
        '"Shop, Inc." <payments@shop.example>',
        " payments@shop.example ",
    ],
)
def test_message_id_uses_the_domain_of_the_address(email_from: str) -> None:
    assert message_id("payment_succeeded", "pay_1", email_from) == (
        "<payment_succeeded.pay_1@shop.example>"
    )


def test_message_id_without_a_domain_falls_back_to_a_local_one() -> None:
    assert message_id("payment_refunded", "pay_1", "payments") == (
        "<payment_refunded.pay_1@payhooks.localhost>"
    )


def test_rendered_email_carries_the_message_id_once() -> None:
    msg = render(
        "payment_succeeded",
        payment_id="pay_1",
        order_id="ord_1",
        amount="100.00",
        currency="USD",
        recipient="buyer@example.com",
        sender="Shop <payments@shop.example>",
    )
    assert msg.get_all("Message-ID") == ["<payment_succeeded.pay_1@shop.example>"]
