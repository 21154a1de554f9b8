"""What `payhooks payment show` says of a payment with no order: what is true at that moment."""

from __future__ import annotations

from services.cli.commands import _where_events_wait


def test_events_not_dead_yet_are_said_to_be_parked_not_to_wait_in_the_dlq() -> None:
    said = _where_events_wait({"dead_letters": []})
    assert "parked" in said
    assert "wait in orders.dlq" not in said


def test_dead_lettered_events_are_said_to_wait_in_the_dlq() -> None:
    said = _where_events_wait({"dead_letters": [{"id": "x"}]})
    assert "wait in orders.dlq" in said
    assert "requeue" in said
