"""The ack window: a multiple-ack never reaches a delivery still being worked on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.worker.acks import AckWindow


def window(tags: range) -> AckWindow:
    w = AckWindow()
    for tag in tags:
        w.received(tag)
    return w


def test_a_batch_behind_an_open_delivery_waits_for_it() -> None:
    w = window(range(1, 7))
    assert w.done([4, 5, 6]) is None  # 1-3 still in another batch
    assert w.done([1, 2, 3]) == 6  # one ack settles all six
    assert len(w) == 0


def test_deliveries_settled_alone_are_passed_over_not_acked_again() -> None:
    w = window(range(1, 5))
    assert w.done([2], settled=True) is None
    assert w.done([1]) == 1
    assert w.done([4], settled=True) is None
    assert w.done([3]) == 3  # 4 was acked alone: the ack stops at 3
    assert w.done([]) is None


@given(st.permutations(list(range(1, 30))), st.sets(st.integers(1, 29)))
def test_every_ack_covers_only_finished_deliveries(order: list[int], alone: set[int]) -> None:
    w = window(range(1, 30))
    finished: set[int] = set()
    acked_to = 0
    for tag in order:
        finished.add(tag)
        ack_to = w.done([tag], settled=tag in alone)
        if ack_to is not None:
            assert ack_to > acked_to
            assert ack_to not in alone
            assert set(range(1, ack_to + 1)) <= finished
            acked_to = ack_to
    assert len(w) == 0
    expected = max((t for t in range(1, 30) if t not in alone), default=0)
    assert acked_to == expected
