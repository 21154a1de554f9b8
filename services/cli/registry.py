"""Every service `payhooks run` knows, by name, in the order `run all` starts them."""

from __future__ import annotations

from services.api.app import SERVICE as API
from services.bonuses.app import SERVICE as BONUSES
from services.email.app import SERVICE as EMAIL
from services.ingest.app import SERVICE as INGEST
from services.orders.app import SERVICE as ORDERS
from services.reconciler.app import SERVICE as RECONCILER
from shared.process.service import Service

SERVICES: dict[str, Service] = {
    s.name: s for s in (INGEST, ORDERS, BONUSES, EMAIL, API, RECONCILER)
}
