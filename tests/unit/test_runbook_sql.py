"""The runbook fixes money through audited commands, never by writing SQL (issue 34): no
statement that writes (INSERT, UPDATE, DELETE, TRUNCATE, MERGE, COPY … FROM) is left in it."""

from __future__ import annotations

import re
from pathlib import Path

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "runbook.md"
WRITES = re.compile(
    r"\b(insert\s+into|update\s+[\w.\"]+\s+set|delete\s+from|truncate\s+(table\s+)?[\w.\"]+"
    r"|merge\s+into|copy\s+[\w.\"]+\s+from|alter\s+table|drop\s+table)\b",
    re.IGNORECASE,
)


def test_the_runbook_has_no_sql_that_writes() -> None:
    found = [
        f"line {n}: {line.strip()}"
        for n, line in enumerate(RUNBOOK.read_text().splitlines(), 1)
        if WRITES.search(line)
    ]
    # A statement broken over two lines: the whole text, newlines as spaces.
    whole = WRITES.findall(" ".join(RUNBOOK.read_text().split()))
    assert not found, found
    assert not whole, whole


def test_the_pattern_catches_what_the_runbook_had() -> None:
    for text in (
        "UPDATE orders SET undecided_since = NULL",
        "insert into bonus_ledger (payment_id) values ('p')",
        "DELETE FROM outbox",
        "TRUNCATE processed_events",
    ):
        assert WRITES.search(text), text
    assert not WRITES.search("the order's update, then its deletion from the DLQ")
