"""Which deliveries of a channel one `basic.ack(multiple=True)` may settle: batches finish out
of order, so a multiple-ack may only go as far as the lowest delivery still being worked on."""

from __future__ import annotations

from collections import deque

_OPEN, _TO_ACK, _SETTLED = 0, 1, 2


class AckWindow:
    """A channel's delivery tags in the order they arrived (RabbitMQ numbers them upwards per
    channel); a tag is open until its batch is done with it, then settled either by the next
    multiple-ack or on its own (a message sent to a retry queue or the DLQ is acked alone)."""

    def __init__(self) -> None:
        self._tags: deque[int] = deque()
        self._state: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._tags)

    def is_open(self, tag: int) -> bool:
        return self._state.get(tag) == _OPEN

    def received(self, tag: int) -> None:
        self._tags.append(tag)
        self._state[tag] = _OPEN

    def done(self, tags: list[int], *, settled: bool = False) -> int | None:
        """Mark `tags` finished (`settled`: already acked or nacked alone); return the tag
        up to which one multiple-ack now settles everything finished, or None."""
        mark = _SETTLED if settled else _TO_ACK
        for tag in tags:
            if tag in self._state:
                self._state[tag] = mark
        ack_to = None
        while self._tags and self._state[self._tags[0]] != _OPEN:
            tag = self._tags.popleft()
            if self._state.pop(tag) == _TO_ACK:
                ack_to = tag
        return ack_to
