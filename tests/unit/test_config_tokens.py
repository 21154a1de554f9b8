"""ADMIN_TOKENS: named tokens with scopes, ADMIN_TOKEN kept as `admin`, mistakes named
without ever showing a token."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.config import ConfigError, Settings, is_set
from shared.tokens import Actor, AdminToken


def test_named_tokens_are_parsed_with_their_scopes() -> None:
    settings = Settings.from_env({"ADMIN_TOKENS": "shop:orders:s3cret-a, ann:operator:s3:cret-b"})
    assert settings.admin_tokens == (
        AdminToken("shop", "orders", "s3cret-a"),
        AdminToken("ann", "operator", "s3:cret-b"),  # a token may hold a colon
    )
    assert settings.admin_tokens[0].actor == Actor("shop", "orders")
    assert "s3cret" not in repr(settings)
    assert "s3cret" not in repr(settings.admin_tokens)
    assert "admin_tokens" not in settings.redacted()


def test_admin_token_is_one_operator_token_named_admin() -> None:
    settings = Settings.from_env({"ADMIN_TOKEN": "old-token", "ADMIN_TOKENS": "shop:orders:t1"})
    assert settings.admin_tokens == (
        AdminToken("admin", "operator", "old-token"),
        AdminToken("shop", "orders", "t1"),
    )
    assert Settings.from_env({"ADMIN_TOKEN": "x"}).admin_tokens == (
        AdminToken("admin", "operator", "x"),
    )
    assert Settings.from_env({}).admin_tokens == ()


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("shop:orders", "entry 1 must be name:scope:token"),
        (
            "shop:orders:hunter2,ann:root:hunter3",
            "entry 2 (ann) must have scope orders or operator",
        ),
        (":orders:hunter2", "entry 1 must be name:scope:token"),
        ("bad name:orders:hunter2", "entry 1 must be name:scope:token"),
        ("shop:orders:hunter2,shop:operator:hunter3", "names a token twice: shop"),
        ("shop:orders:hunter2,ann:operator:hunter2", "gives the same token to ann, shop"),
        (" , ", "must hold at least one"),
    ],
)
def test_a_malformed_entry_or_a_duplicate_is_named_never_the_token(raw: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"ADMIN_TOKENS": raw})
    assert f"ADMIN_TOKENS {says}" in str(caught.value)
    assert "hunter" not in str(caught.value)


def test_a_named_token_clashing_with_admin_token_is_an_error() -> None:
    for tokens in ("admin:orders:other", "shop:orders:hunter2"):
        with pytest.raises(ConfigError, match="ADMIN_TOKENS") as caught:
            Settings.from_env({"ADMIN_TOKEN": "hunter2", "ADMIN_TOKENS": tokens})
        assert "hunter2" not in str(caught.value)


def test_admin_tokens_may_come_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "tokens"
    secret.write_text("shop:orders:from-file\n")
    settings = Settings.from_env({"ADMIN_TOKENS_FILE": str(secret)})
    assert settings.admin_tokens == (AdminToken("shop", "orders", "from-file"),)


def test_the_api_needs_one_of_admin_token_or_admin_tokens() -> None:
    required = ("ADMIN_TOKEN|ADMIN_TOKENS",)
    with pytest.raises(ConfigError, match="ADMIN_TOKEN or ADMIN_TOKENS is required"):
        Settings.from_env({}, required=required)
    Settings.from_env({"ADMIN_TOKEN": "t"}, required=required)
    Settings.from_env({"ADMIN_TOKENS": "shop:orders:t"}, required=required)
    assert is_set({"ADMIN_TOKENS_FILE": "/run/secrets/t"}, required[0])
    assert not is_set({"ADMIN_TOKEN": " "}, required[0])
