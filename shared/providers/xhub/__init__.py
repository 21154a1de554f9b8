"""The X-Hub contract in one place: its names here, signatures, events and API client beside."""

from __future__ import annotations

from typing import Final

PROVIDER: Final = "xhub"  # the inbox's provider column, the metrics' provider label
WEBHOOK_PATH: Final = "/webhooks/xhub"

ID_HEADER: Final = "X-Webhook-Id"
TIMESTAMP_HEADER: Final = "X-Webhook-Timestamp"
SIGNATURE_HEADER: Final = "X-Webhook-Signature"

# Event types the orders worker applies (the rest are stored, published and left unrouted).
STATUS_CHANGED: Final = "payment.status_changed"
REFUND_COMPLETED: Final = "refund.completed"
REFUND_REVERSED: Final = "refund.reversed"
REFUND_FAILED: Final = "refund.failed"
REFUND_REJECTED: Final = "refund.rejected"
