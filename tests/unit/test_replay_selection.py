"""What a replay selects and where each event goes, checked without I/O
(shared/ops/replay_selection.py), and how a worker reads a replay's REPROCESS header."""

from __future__ import annotations

import datetime as dt

import pytest

from services.email.templates import TEMPLATE_FOR_EVENT
from shared.amqp import topology
from shared.ops.replay_selection import (
    EVENT,
    MAX_EVENTS,
    TRANSITIONS,
    ReplayInputError,
    ReplayRequest,
    outcome_matches,
    takes,
)
from shared.vocabulary import EMAIL_FOR_TRANSITION, REPROCESS
from shared.worker.batches import Delivery, reprocessing


def test_a_request_holds_its_filters_times_in_utc_and_workers_in_their_order() -> None:
    request = ReplayRequest.parse(
        event_type="payment.status_changed",
        since="2026-12-01T10:00:00+01:00",
        until="2026-12-01T12:00:00",
        payment_id="pay_1",
        provider="xhub",
        outcome="processed",
        workers=["emails", "orders", "emails"],
        reason="  after the bad deploy  ",
        limit=50,
    )
    assert request.where.since == dt.datetime(2026, 12, 1, 9, tzinfo=dt.UTC)
    assert request.where.until == dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)
    assert request.workers == ("orders", "emails")
    assert request.reason == "after the bad deploy"
    assert request.as_json() == {
        "event_type": "payment.status_changed",
        "payment_id": "pay_1",
        "provider": "xhub",
        "since": "2026-12-01T09:00:00+00:00",
        "until": "2026-12-01T12:00:00+00:00",
        "outcome": "processed",
        "limit": 50,
    }


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ({}, "selection"),
        ({"workers": ["orders"]}, "selection"),
        ({"since": "yesterday"}, "since"),
        ({"since": "2026-12-02T00:00:00Z", "until": "2026-12-01T00:00:00Z"}, "until"),
        ({"event_type": "payment.status_changed", "outcome": "lost"}, "outcome"),
        ({"event_type": "payment.status_changed", "workers": ["ledger"]}, "workers"),
        ({"event_type": "payment.status_changed", "limit": 0}, "limit"),
        ({"event_type": "payment.status_changed", "limit": MAX_EVENTS + 1}, "limit"),
        ({"event_type": "payment.status_changed", "reprocess": True}, "reason"),
        ({"event_type": "payment.status_changed", "reprocess": True, "reason": " "}, "reason"),
        ({"event_type": "payment.status_changed", "reason": "x" * 501}, "reason"),
        ({"payment_id": "pay\x00"}, "payment_id"),
        ({"event_type": ""}, "event_type"),
        ({"event_ids": [f"evt_{i}" for i in range(1001)]}, "event_ids"),
    ],
)
def test_bad_input_names_the_field(given: dict[str, object], name: str) -> None:
    with pytest.raises(ReplayInputError) as raised:
        ReplayRequest.parse(**given)  # type: ignore[arg-type]
    assert raised.value.name == name


def test_provider_events_go_to_orders_and_their_transitions_to_bonuses_and_emails() -> None:
    assert takes("payment.status_changed", ()) == {"orders": EVENT}
    assert takes("refund.completed", ("bonuses", "emails")) == {
        "bonuses": TRANSITIONS,
        "emails": TRANSITIONS,
    }
    assert takes("refund.completed", ("orders", "bonuses")) == {
        "orders": EVENT,
        "bonuses": TRANSITIONS,
    }


def test_a_type_no_worker_is_bound_to_goes_nowhere_until_a_release_binds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert takes("withdrawal.status_changed", ()) == {}
    assert takes("withdrawal.status_changed", ("orders", "bonuses")) == {}
    bindings = dict(topology.BINDINGS)
    bindings["orders"] = (*bindings["orders"], "withdrawal.*")
    monkeypatch.setattr(topology, "BINDINGS", bindings)
    assert takes("withdrawal.status_changed", ()) == {"orders": EVENT}


def test_the_outcome_filter_reads_like_event_list() -> None:
    processed = {"processed_outcome": "applied", "published": True}
    queued = {"processed_outcome": None, "published": True}
    unpublished = {"processed_outcome": None, "published": False}
    assert outcome_matches(None, queued)
    assert outcome_matches("processed", processed)
    assert not outcome_matches("processed", queued)
    assert outcome_matches("queued", queued)
    assert outcome_matches("unpublished", unpublished)
    assert outcome_matches("applied", processed)
    assert not outcome_matches("applied", queued)


def test_only_the_reprocess_header_lets_a_worker_apply_a_marked_message_again() -> None:
    def delivery(headers: dict[str, object], body: bytes = b"{}") -> Delivery:
        return Delivery("evt_1", "payment.status_changed", body, 0, headers)

    assert reprocessing(delivery({REPROCESS: "rpl_1"}))
    assert reprocessing(delivery({REPROCESS: b"rpl_1"}))
    assert not reprocessing(delivery({}))
    assert not reprocessing(delivery({REPROCESS: ""}))
    assert not reprocessing(delivery({REPROCESS: True}))
    # A webhook's body is the sender's to write: nothing in it grants the power.
    assert not reprocessing(delivery({}, b'{"reprocess": "yes", "headers": {"reprocess": 1}}'))


def test_the_email_worker_and_the_replay_count_the_same_templates() -> None:
    assert TEMPLATE_FOR_EVENT == EMAIL_FOR_TRANSITION
