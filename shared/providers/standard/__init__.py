"""Standard Webhooks (https://www.standardwebhooks.com/) in one place: its names here,
signatures, the payment event envelope and the registry's entry beside."""

from __future__ import annotations

from typing import Final

PROVIDER: Final = "standard"  # the inbox's provider column, the metrics' provider label
WEBHOOK_PATH: Final = "/webhooks/standard"
SECRETS_VARIABLE: Final = "STANDARD_WEBHOOK_SECRETS"

ID_HEADER: Final = "webhook-id"
TIMESTAMP_HEADER: Final = "webhook-timestamp"
SIGNATURE_HEADER: Final = "webhook-signature"

SECRET_PREFIX: Final = "whsec_"
SIGNATURE_VERSION: Final = "v1"  # HMAC-SHA256; v1a (ed25519) signatures are not checked
