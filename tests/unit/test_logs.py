"""The JSON log line survives what orjson refuses (lone surrogates from undecodable bytes)."""

from __future__ import annotations

import json

import structlog

from shared.logs import _dumps


def test_a_lone_surrogate_is_logged_not_raised() -> None:
    render = structlog.processors.JSONRenderer(serializer=_dumps)

    line = render(None, "info", {"event": "webhook.received", "event_id": "evt\udce9"})

    assert json.loads(line) == {"event": "webhook.received", "event_id": "evt\udce9"}


def test_ordinary_events_are_rendered_by_orjson() -> None:
    line = _dumps({"event": "x", "n": 1})

    assert line == b'{"event":"x","n":1}'  # orjson's compact form
