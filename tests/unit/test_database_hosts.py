"""Whether a DATABASE_URL names several hosts (then pools follow the primary and migrate waits
for a database just created to reach the standby)."""

from __future__ import annotations

import pytest

from shared.config_values import several_hosts


@pytest.mark.parametrize(
    ("dsn", "several"),
    [
        ("postgresql://postgres@127.0.0.1:5432/payhooks", False),
        ("postgresql://u:p,w@127.0.0.1:5432/payhooks", False),  # a comma in the password
        ("postgresql://u@h1:5432,h2:5432/payhooks?target_session_attrs=read-write", True),
        ("postgresql://h1,h2/payhooks", True),
    ],
)
def test_a_url_with_several_hosts_is_told_apart(dsn: str, several: bool) -> None:
    assert several_hosts(dsn) is several
