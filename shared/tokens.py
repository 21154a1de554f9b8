"""The api's named tokens: ADMIN_TOKENS=name:scope:token,... and ADMIN_TOKEN as `admin`
with scope `operator`. Messages name entries by position or name, never show a token."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ORDERS = "orders"  # the shop's server: orders, payments, bonus, events
OPERATOR = "operator"  # people: everything
SCOPES = (ORDERS, OPERATOR)
LEGACY_NAME = "admin"  # the name ADMIN_TOKEN's token goes by
_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")


@dataclass(frozen=True, slots=True)
class Actor:
    """Who a request is: a token's name and scope."""

    name: str
    scope: str


@dataclass(frozen=True, slots=True)
class AdminToken:
    name: str
    scope: str
    token: str = field(repr=False)

    @property
    def actor(self) -> Actor:
        return Actor(self.name, self.scope)


def parse_admin_tokens(raw: str, admin_token: str | None = None) -> tuple[AdminToken, ...]:
    """`name:scope:token` entries, comma-separated, after ADMIN_TOKEN's (with_legacy);
    ValueError saying which entry is wrong."""
    found: list[AdminToken] = []
    for position, entry in enumerate(raw.split(","), start=1):
        if not entry.strip():
            continue
        name, _, rest = entry.strip().partition(":")
        scope, _, token = rest.partition(":")
        if not _NAME.fullmatch(name) or not token.strip():
            raise ValueError(
                f"entry {position} must be name:scope:token (name: letters, digits, _.@-)"
            )
        if scope not in SCOPES:
            raise ValueError(f"entry {position} ({name}) must have scope {' or '.join(SCOPES)}")
        found.append(AdminToken(name, scope, token.strip()))
    if not found:
        raise ValueError("must hold at least one name:scope:token entry")
    return with_legacy(admin_token, tuple(found))


def with_legacy(admin_token: str | None, tokens: tuple[AdminToken, ...]) -> tuple[AdminToken, ...]:
    """ADMIN_TOKEN (if set) first, as `admin` with scope `operator`, then ADMIN_TOKENS."""
    legacy = [] if admin_token is None else [AdminToken(LEGACY_NAME, OPERATOR, admin_token)]
    return unique([*legacy, *tokens])


def unique(tokens: list[AdminToken]) -> tuple[AdminToken, ...]:
    names = [t.name for t in tokens]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"names a token twice: {', '.join(twice)}")
    secrets = [t.token for t in tokens]
    if same := sorted({t.name for t in tokens if secrets.count(t.token) > 1}):
        raise ValueError(f"gives the same token to {', '.join(same)}")
    return tuple(tokens)
