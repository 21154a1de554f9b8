"""The OpenAPI document's component schemas: every body the api sends or takes."""

from __future__ import annotations

from services.api.openapi.build import (
    INT,
    MONEY,
    STR,
    TIME,
    WEBHOOK,
    Schema,
    list_of,
    nullable,
    object_of,
    ref,
)
from services.api.responses import PROBLEMS
from shared.ops import inbox_view, replay_selection
from shared.queries import audit
from shared.vocabulary import OrderStatus

SCHEMAS: dict[str, Schema] = {
    "Problem": {
        "description": "RFC 9457 problem details, plus `code` and the older `error`.",
        "type": "object",
        "required": ["type", "title", "status", "detail", "code", "error"],
        "properties": {
            "type": {
                "type": "string",
                "description": "urn:payhooks:problem:<code>, or about:blank for http_error",
            },
            "title": STR,
            "status": {"type": "integer", "minimum": 400, "maximum": 599},
            "detail": STR,
            "code": {
                "type": "string",
                "enum": list(PROBLEMS),
                "description": "stable and machine-readable: what clients branch on",
            },
            "error": {
                "type": "string",
                "description": "the message of the api before problem details (kept)",
            },
            "fields": {
                "type": "object",
                "additionalProperties": STR,
                "description": "invalid_order: one message per bad field",
            },
            "field": {**STR, "description": "invalid_request of a replay: the bad field"},
            "published": {
                "type": "object",
                "additionalProperties": INT,
                "description": "replay_unroutable: messages confirmed per worker before it",
            },
            "in_flight": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"event_id": STR, "event": STR, "where": STR},
                },
                "description": "resolve_in_flight: the payment's events not yet processed",
            },
        },
        "additionalProperties": False,
    },
    "Shed": object_of({"status": {"const": "unavailable"}, "error": STR}),
    "NewOrder": {
        "type": "object",
        "required": ["order_id", "payment_id", "user_id", "email", "amount", "currency"],
        "properties": {
            **{
                name: {"type": "string", "minLength": 1, "maxLength": 255}
                for name in ("order_id", "payment_id", "user_id")
            },
            "email": {"type": "string", "maxLength": 255, "examples": ["buyer@example.com"]},
            "amount": {
                "type": "string",
                "pattern": r"^[0-9]{1,15}(\.[0-9]{1,2})?$",
                "description": "greater than 0",
                "examples": ["100.00"],
            },
            "currency": {"type": "string", "pattern": "^[A-Z]{3}$", "examples": ["USD"]},
        },
    },
    "Order": object_of(
        {
            "order_id": STR,
            "payment_id": STR,
            "user_id": STR,
            "email": STR,
            "amount": MONEY,
            "currency": STR,
            "status": {"type": "string", "enum": [s.value for s in OrderStatus]},
            "refunded_amount": MONEY,
            "updated_at": TIME,
        }
    ),
    "DeadLetter": object_of(
        {
            "id": STR,
            "event_id": nullable(STR),
            "event": nullable(STR),
            "payment_id": nullable(STR),
            "reason": STR,
            "error": nullable(STR),
            "attempts": nullable(INT),
            "first_failed_at": nullable(STR),
            "last_failed_at": nullable(STR),
            "original_queue": STR,
            "requeued": INT,
            "provider": {
                **nullable(STR),
                "description": "whose webhook it came from (its `provider` header, else its"
                " event id's prefix)",
            },
        }
    ),
    "PaymentView": object_of(
        {
            "order": nullable(ref("Order")),
            "undecided": nullable(object_of({"reason": nullable(STR), "since": TIME})),
            "events": list_of(
                object_of(
                    {
                        **WEBHOOK,
                        "status": {"description": "the event's status, as the provider sent it"},
                    }
                )
            ),
            "refund_failures": list_of(
                object_of(
                    {
                        "event_id": STR,
                        "event": STR,
                        "refund_id": {"description": "as the provider sent it"},
                        "received_at": TIME,
                    }
                )
            ),
            "transitions": list_of(
                object_of(
                    {
                        "id": INT,
                        "from": STR,
                        "to": STR,
                        "event_id": STR,
                        "at": TIME,
                        "source": {"enum": ["event", "operator"]},
                        "actor": nullable(STR),
                        "forced": {"type": "boolean"},
                        "reason": nullable(STR),
                    }
                )
            ),
            "bonus": list_of(
                object_of(
                    {
                        "kind": {"enum": ["grant", "clawback", "restore"]},
                        "points": INT,
                        "user_id": STR,
                        "event_id": STR,
                        "transition_id": nullable(INT),
                        "created_at": TIME,
                    }
                )
            ),
            "emails": list_of(
                object_of(
                    {
                        "template": STR,
                        "message_id": STR,
                        "recipient": STR,
                        "sent_at": nullable(TIME),
                        "skipped": {"type": "boolean"},
                        "skip_reason": {
                            "type": ["string", "null"],
                            "enum": ["after_refund", "erased", None],
                            "description": "why a skipped email was not sent; null if sent",
                        },
                    }
                )
            ),
            "parked": list_of(
                object_of(
                    {
                        "event_id": STR,
                        "event": STR,
                        "state": {
                            "enum": ["parked", "released", "dead_lettered"],
                            "description": "waiting for the order; released by its"
                            " registration; dead-lettered (unknown_payment) when"
                            " UNKNOWN_PAYMENT_PARK_SECONDS ran out",
                        },
                        "parked_at": TIME,
                        "released_at": nullable(TIME),
                        "dead_lettered_at": nullable(TIME),
                    }
                )
            ),
            "dead_letters": list_of(ref("DeadLetter")),
            "dead_letters_unavailable": {
                "type": "string",
                "description": "present when the DLQs could not be read (RabbitMQ down, busy)",
            },
        },
        optional=("dead_letters_unavailable",),
    ),
    "Event": object_of(WEBHOOK),
    "EventPage": object_of(
        {
            "events": list_of(ref("Event")),
            "next_cursor": {
                **nullable(STR),
                "description": "`cursor` of the next page; null on the last one",
            },
        }
    ),
    "EventDetail": object_of(
        {
            **WEBHOOK,
            "last_seen_at": {**TIME, "description": "when its latest copy came"},
            "headers": {
                "type": "object",
                "additionalProperties": STR,
                "description": "as received, without the signature and other credentials",
            },
            "body": {"description": "the JSON it holds, or its text (body_format)"},
            "body_format": {"enum": ["json", "text"]},
            "dead_letters": list_of(ref("DeadLetter")),
            "dead_letters_unavailable": {
                "type": "string",
                "description": "present when the DLQs could not be read (RabbitMQ down, busy)",
            },
        },
        optional=("dead_letters_unavailable",),
    ),
    "UserBonus": object_of(
        {
            "user_id": STR,
            "balance": INT,
            "entries": list_of(
                object_of(
                    {
                        "payment_id": STR,
                        "kind": {"enum": ["grant", "clawback", "restore"]},
                        "points": INT,
                        "created_at": TIME,
                    }
                )
            ),
        }
    ),
    "DlqList": object_of(
        {
            "queues": list_of(
                object_of(
                    {
                        "queue": STR,
                        "messages": INT,
                        "oldest_age_seconds": nullable({"type": "number"}),
                    }
                )
            )
        }
    ),
    "DlqPage": object_of(
        {
            "queue": STR,
            "total": INT,
            "offset": {"type": "integer", "description": "where this page starts"},
            "limit": INT,
            "messages": list_of(ref("DeadLetter")),
            "next_cursor": {
                **nullable(STR),
                "description": "`cursor` of the next page; null on the last one",
            },
        }
    ),
    "RequeueRequest": {
        "type": "object",
        "description": 'Say what to requeue: "ids", "all": true, or a filter (all must hold).',
        "properties": {
            "ids": {**list_of(STR), "description": "message or event ids"},
            "all": {"type": "boolean", "default": False},
            "dry_run": {"type": "boolean", "default": False},
            "limit": {"type": "integer", "minimum": 1},
            "reason": nullable(STR),
            "event_type": nullable(STR),
            "payment_id": nullable(STR),
            "provider": {**nullable(STR), "description": "whose webhooks: xhub, standard, ..."},
            "since": {**nullable(STR), "description": "ISO 8601, UTC without an offset"},
            "until": {**nullable(STR), "description": "ISO 8601, UTC without an offset"},
        },
    },
    "RequeueResult": object_of(
        {
            "requeued": INT,
            "would_requeue": {**nullable(INT), "description": "dry runs only"},
            "dry_run": {"type": "boolean"},
            "ids": list_of(STR),
            "not_found": list_of(STR),
        }
    ),
    "Unrouted": object_of(
        {
            "queue": STR,
            "total": INT,
            "oldest_age_seconds": nullable({"type": "number"}),
            "by_event": {"type": "object", "additionalProperties": INT},
            "shown": INT,
            "messages": list_of(
                object_of(
                    {
                        "id": STR,
                        "event": nullable(STR),
                        "payment_id": nullable(STR),
                        "provider": nullable(STR),
                        "published_at": nullable(TIME),
                    }
                )
            ),
        }
    ),
    "AuditPage": object_of(
        {
            "actions": list_of(
                object_of(
                    {
                        "id": INT,
                        "at": TIME,
                        "actor": {**STR, "description": "a token's name, or cli:<OS user>"},
                        "source": {"type": "string", "enum": list(audit.SOURCES)},
                        "action": {"type": "string", "enum": list(audit.ACTIONS)},
                        "target": {**STR, "description": "a DLQ's name, or an order id"},
                        "filter": {"type": "object", "description": "a requeue's selection"},
                        "ids": {**list_of(STR), "description": "moved messages, or payment id"},
                        "count": INT,
                    }
                )
            ),
            "next_cursor": nullable(STR),
        }
    ),
    "ReplayRequest": {
        "type": "object",
        "description": (
            "Which stored webhooks to send again, to which workers (all criteria must hold;"
            " at least one of event_type, payment_id, since, until, event_ids)."
        ),
        "additionalProperties": False,
        "properties": {
            "event_type": {**STR, "examples": ["payment.status_changed"]},
            "since": {**STR, "description": "received at or after; ISO 8601, UTC if no offset"},
            "until": {**STR, "description": "received at or before; ISO 8601"},
            "payment_id": STR,
            "provider": {**STR, "examples": ["xhub"]},
            "outcome": {
                "type": "string",
                "enum": list(inbox_view.OUTCOME_FILTERS),
                "description": "what became of the event, as GET /api/events filters it",
            },
            "event_ids": {**list_of(STR), "maxItems": replay_selection.MAX_IDS},
            "workers": {
                **list_of({"type": "string", "enum": list(replay_selection.WORKERS)}),
                "description": "default: the workers each event's type is bound to today",
            },
            "reprocess": {
                "type": "boolean",
                "default": False,
                "description": "apply what a worker marked processed (needs reason); an email"
                " already sent is never sent again",
            },
            "reason": {**STR, "maxLength": replay_selection.MAX_REASON},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": replay_selection.MAX_EVENTS,
                "description": "replay the oldest N of a larger selection",
            },
            "dry_run": {"type": "boolean", "default": False},
        },
    },
    "ReplayResult": object_of(
        {
            "replay_id": {**STR, "description": "the `replay` header of every message sent"},
            "dry_run": {"type": "boolean"},
            "reprocess": {"type": "boolean"},
            "reason": nullable(STR),
            "selection": {"type": "object", "description": "the criteria given"},
            "workers_chosen": list_of(STR),
            "events": {**INT, "description": "stored events selected"},
            "more": {"type": "boolean", "description": "a limit left newer events out"},
            "last_received_at": {
                **nullable(TIME),
                "description": "of the newest event taken: `since` of the next run",
            },
            "workers": {
                "type": "object",
                "additionalProperties": object_of(
                    {
                        "messages": INT,
                        "already_processed": INT,
                        "would_skip": INT,
                        "not_stored": INT,
                        "published": INT,
                    }
                ),
            },
            "no_route": {
                "type": "object",
                "additionalProperties": INT,
                "description": "selected events of types no chosen worker takes today",
            },
        }
    ),
}
