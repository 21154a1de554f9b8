"""The JSON log line survives what orjson refuses (lone surrogates from undecodable bytes);
JSON lines for collectors, the console form for a person at a terminal."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from shared.process.logs import _dumps, chosen_format, configure_logging


def test_a_lone_surrogate_is_logged_not_raised() -> None:
    render = structlog.processors.JSONRenderer(serializer=_dumps)

    line = render(None, "info", {"event": "webhook.received", "event_id": "evt\udce9"})

    assert json.loads(line) == {"event": "webhook.received", "event_id": "evt\udce9"}


def test_ordinary_events_are_rendered_by_orjson() -> None:
    line = _dumps({"event": "x", "n": 1})

    assert line == b'{"event":"x","n":1}'  # orjson's compact form


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    ("log_format", "tty", "expected"),
    [
        (None, True, "console"),  # a person at a terminal
        (None, False, "json"),  # Docker, Kubernetes, a pipe, a file: a collector reads it
        ("json", True, "json"),  # LOG_FORMAT wins both ways
        ("console", False, "console"),
    ],
)
def test_the_format_follows_the_terminal_unless_log_format_says(
    log_format: str | None, tty: bool, expected: str
) -> None:
    assert chosen_format(log_format, Stream(tty)) == expected


def test_a_closed_stream_gets_json() -> None:
    stream = io.StringIO()
    stream.close()  # isatty() raises on it

    assert chosen_format(None, stream) == "json"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize("log_format", ["json", "console"])
def test_both_formats_render_structlog_and_stdlib_lines(
    log_format: str, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO", log_format)

    structlog.get_logger("t").info("webhook.received", event_id="evt_1")
    logging.getLogger("t").warning("from the stdlib")
    lines = capsys.readouterr().out.splitlines()

    assert len(lines) == 2, lines
    if log_format == "json":
        first, second = (json.loads(line) for line in lines)
        assert (first["event"], first["event_id"], first["level"]) == (
            "webhook.received",
            "evt_1",
            "info",
        )
        assert second["event"] == "from the stdlib"
    else:
        assert "webhook.received" in lines[0]
        assert "event_id=evt_1" in lines[0]
        assert "from the stdlib" in lines[1]
        assert not lines[0].startswith("{")
        assert "\x1b[" not in lines[0]  # no colours into something that is not a terminal
