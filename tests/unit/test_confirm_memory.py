"""The ingest's memory of confirmed publishes: kept long enough, then forgotten, oldest first."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.ingest.accept import ConfirmMemory


def test_a_confirm_is_remembered_for_keep_s_then_forgotten() -> None:
    memory = ConfirmMemory(keep_s=10.0)
    memory.remember("evt_1", now=100.0)
    memory.remember("evt_2", now=105.0)

    memory.remember("evt_3", now=110.0)
    assert "evt_1" in memory  # exactly keep_s old: still kept

    memory.remember("evt_4", now=110.5)
    assert "evt_1" not in memory
    assert "evt_2" in memory
    assert len(memory) == 3


def test_a_confirm_noted_again_is_kept_from_its_latest_time() -> None:
    memory = ConfirmMemory(keep_s=10.0)
    memory.remember("evt_1", now=100.0)
    memory.remember("evt_2", now=101.0)
    memory.remember("evt_1", now=108.0)

    memory.remember("evt_3", now=115.0)

    assert "evt_1" in memory
    assert "evt_2" not in memory


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(0, 5)), max_size=60))
def test_exactly_the_ids_confirmed_within_keep_s_of_the_latest_are_remembered(
    confirms: list[tuple[str, float]],
) -> None:
    memory = ConfirmMemory(keep_s=3.0)
    now = 0.0
    latest: dict[str, float] = {}
    for event_id, step in confirms:
        now += step
        memory.remember(event_id, now)
        latest[event_id] = now

    assert {e for e in latest if e in memory} == {e for e, t in latest.items() if now - t <= 3.0}
    assert len(memory) == sum(1 for t in latest.values() if now - t <= 3.0)
