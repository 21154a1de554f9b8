"""The audit trail's vocabulary is written once: the edges an operator acts through, the
operator_actions.source constraint and the OpenAPI document agree."""

from __future__ import annotations

import re
from pathlib import Path

from services.api.openapi import DOCUMENT
from shared.ops.operator_actions import Edge
from shared.queries import audit

MIGRATIONS = Path(__file__).resolve().parents[2] / "shared" / "migrations"


def test_every_edge_is_a_source_the_table_accepts() -> None:
    assert sorted(e.value for e in Edge) == sorted(audit.SOURCES)
    text = "\n".join(m.read_text() for m in sorted(MIGRATIONS.glob("*.sql")))
    constraint = r"operator_actions_source_check\s+CHECK \(source IN \(([^)]*)\)"
    allowed = re.findall(constraint, text)[-1]  # the latest migration's word
    assert sorted(re.findall(r"'([a-z]+)'", allowed)) == sorted(audit.SOURCES)


def test_the_openapi_document_names_every_action_and_source() -> None:
    text = repr(DOCUMENT)
    for name in (*audit.ACTIONS, *audit.SOURCES):
        assert repr(name) in text, name
