"""The console at the HTTP level: who gets a session and how it ends (bad and shop tokens
refused, sign-out, token rotation, expiry), the cookie's flags, CSRF on every form, headers,
hostile input, and a console requeue recorded once in the audit trail with its actor. The
browser drives the whole operator story in test_console_browser.py."""

from __future__ import annotations

import hashlib
import re
import socket
from typing import Any
from urllib.parse import quote

import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient

from services.api import monitor
from services.api.app import create_app
from services.api.console import sessions
from shared.queries import parked as parked_sql
from tests.integration.api_contract import running_api
from tests.integration.test_dlq import Letter, put_dead_letters, queue_ids, settled

TOKENS = "ann:operator:ann-token,shop:orders:shop-token"
PAGES = ["/", "/dlq", "/dlq/orders", "/unrouted", "/audit", "/search?q=x", "/payments/x"]
_CSRF_FIELD = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
async def console(aiohttp_client: Any, make_settings: Any, db: Any, channel: Any) -> TestClient:
    return await running_api(aiohttp_client, make_settings(ADMIN_TOKENS=TOKENS))


async def csrf_of(client: TestClient, path: str = "/console/sign-in") -> str:
    """The CSRF value a page's forms carry (its cookie is in the client's jar now)."""
    page = await client.get(path)
    found = _CSRF_FIELD.search(await page.text())
    assert found is not None, f"{path} has no form with a csrf field"
    return found.group(1)


async def sign_in(client: TestClient, token: str, **extra: str) -> Any:
    form = {"csrf": await csrf_of(client), "token": token, **extra}
    return await client.post("/console/sign-in", data=form, allow_redirects=False)


def session_cookie(client: TestClient) -> str:
    for cookie in client.session.cookie_jar:
        if cookie.key == sessions.SESSION_COOKIE:
            return cookie.value
    raise AssertionError("no session cookie")


async def actions_on(db: Any, target: str) -> list[Any]:
    return list(await db.fetch("SELECT * FROM operator_actions WHERE target = $1", target))


async def refused(client: TestClient, path: str) -> bool:
    """A GET of `path` is sent to the sign-in page."""
    answer = await client.get("/console" + path, allow_redirects=False)
    return answer.status == 303 and answer.headers["Location"].startswith("/console/sign-in?next=")


async def test_every_page_sends_a_visitor_without_a_session_to_sign_in(
    console: TestClient,
) -> None:
    for path in PAGES:
        assert await refused(console, path), path
    answer = await console.get("/console/audit?older=5", allow_redirects=False)
    assert answer.headers["Location"] == "/console/sign-in?next=" + quote("/console/audit?older=5")
    # The JSON api's token is no key to the console either.
    with_bearer = await console.get(
        "/console/", headers={"Authorization": "Bearer ann-token"}, allow_redirects=False
    )
    assert with_bearer.status == 303


async def test_an_operator_token_signs_in_with_a_strict_httponly_cookie(
    console: TestClient, db: Any
) -> None:
    answer = await sign_in(console, "ann-token", next="/console/dlq")

    assert (answer.status, answer.headers["Location"]) == (303, "/console/dlq")
    cookie = answer.cookies[sessions.SESSION_COOKIE]
    assert cookie["httponly"]
    assert cookie["samesite"] == "Strict"
    assert cookie["path"] == "/console"
    assert not cookie["secure"]  # plain HTTP here
    page = await console.get("/console/")
    assert page.status == 200
    assert '<strong id="operator">ann</strong>' in await page.text()
    # Only the cookie's hash is stored: the table's contents sign nobody in.
    value = session_cookie(console)
    row = await db.fetchrow(
        "SELECT actor, expires_at - created_at AS lifetime FROM console_sessions"
        " WHERE id_hash = $1",
        hashlib.sha256(value.encode()).digest(),
    )
    assert (row["actor"], row["lifetime"]) == ("ann", sessions.LIFETIME)
    assert (
        await db.fetchval(
            "SELECT count(*) FROM console_sessions WHERE id_hash = $1", value.encode()
        )
        == 0
    )


async def test_the_cookie_is_secure_behind_an_https_proxy(console: TestClient) -> None:
    form = {"csrf": await csrf_of(console), "token": "ann-token"}
    answer = await console.post(
        "/console/sign-in",
        data=form,
        headers={"X-Forwarded-Proto": "https"},
        allow_redirects=False,
    )
    assert answer.cookies[sessions.SESSION_COOKIE]["secure"]


async def test_bad_and_shop_tokens_get_no_session(console: TestClient, db: Any) -> None:
    before = await db.fetchval("SELECT count(*) FROM console_sessions")
    bad = await sign_in(console, "not-a-token")
    shop = await sign_in(console, "shop-token")

    assert bad.status == 401
    assert "That token is not valid" in await bad.text()
    assert shop.status == 403
    assert "Token shop has scope orders: the console needs an operator token" in await shop.text()
    assert sessions.SESSION_COOKIE not in bad.cookies
    assert sessions.SESSION_COOKIE not in shop.cookies
    assert await db.fetchval("SELECT count(*) FROM console_sessions") == before
    assert await refused(console, "/")


async def test_after_sign_in_it_goes_only_to_console_pages(console: TestClient) -> None:
    for target in ["https://evil.example/", "//evil.example/console/", "/api/dlq", "/console\\x"]:
        answer = await sign_in(console, "ann-token", next=target)
        assert answer.headers["Location"] == "/console/", target


async def test_sign_out_ends_the_session_for_a_copy_of_the_cookie_too(
    console: TestClient, db: Any
) -> None:
    await sign_in(console, "ann-token")
    value = session_cookie(console)
    out = await console.post(
        "/console/sign-out",
        data={"csrf": await csrf_of(console, "/console/")},
        allow_redirects=False,
    )

    assert (out.status, out.headers["Location"]) == (303, "/console/sign-in")
    stored = "SELECT count(*) FROM console_sessions WHERE id_hash = $1"
    assert await db.fetchval(stored, hashlib.sha256(value.encode()).digest()) == 0
    console.session.cookie_jar.update_cookies({sessions.SESSION_COOKIE: value})
    assert await refused(console, "/")


async def test_rotating_a_token_ends_its_sessions(
    aiohttp_client: Any, make_settings: Any, console: TestClient
) -> None:
    await sign_in(console, "ann-token")
    value = session_cookie(console)
    assert (await console.get("/console/")).status == 200
    # The api restarted with ann's token rotated: the same database, the same cookie.
    rotated = await running_api(
        aiohttp_client, make_settings(ADMIN_TOKENS="ann:operator:ann-new-token")
    )
    rotated.session.cookie_jar.update_cookies({sessions.SESSION_COOKIE: value})

    assert await refused(rotated, "/")


async def test_an_expired_session_is_refused(console: TestClient, db: Any) -> None:
    await sign_in(console, "ann-token")
    await db.execute("UPDATE console_sessions SET expires_at = now() - interval '1 second'")
    assert await refused(console, "/")


async def test_every_form_needs_its_csrf_field_and_this_origin(
    console: TestClient, channel: AbstractChannel, topology: Any, db: Any
) -> None:
    orders = topology.work["orders"]
    letter = Letter()
    await put_dead_letters(channel, orders, [letter])
    csrf = await csrf_of(console)
    no_field = await console.post("/console/sign-in", data={"token": "ann-token"})
    wrong = await console.post("/console/sign-in", data={"token": "ann-token", "csrf": "x" + csrf})
    assert (no_field.status, wrong.status) == (403, 403)
    assert sessions.SESSION_COOKIE not in wrong.cookies
    await sign_in(console, "ann-token")
    csrf = await csrf_of(console, "/console/")
    requeue = {"step": "confirm", "ids": letter.id}
    forged = [
        ({**requeue}, {}),  # no field: what another site's form would send
        ({**requeue, "csrf": csrf}, {"Origin": "https://evil.example"}),
    ]
    for form, headers in forged:
        answer = await console.post("/console/dlq/orders/requeue", data=form, headers=headers)
        assert answer.status == 403
        assert "did not come from this console" in await answer.text()
    assert await actions_on(db, orders.dlq) == []
    assert await queue_ids(channel, {orders.dlq: [letter.id]}) == {orders.dlq: [letter.id]}


async def test_console_pages_answer_with_protective_headers(console: TestClient) -> None:
    await sign_in(console, "ann-token")
    for path in ["/", "/sign-in", "/dlq", "/payments/nobody"]:
        answer = await console.get("/console" + path)
        assert answer.content_type == "text/html", path
        csp = answer.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp, path
        assert "frame-ancestors 'none'" in csp, path
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert answer.headers["Cache-Control"] == "no-store"
    style = await console.get("/console/static/console.css")
    assert style.status == 200
    assert style.content_type == "text/css"
    assert (await console.get("/console", allow_redirects=False)).headers["Location"] == "/console/"


async def test_hostile_input_gets_a_page_never_a_5xx(console: TestClient) -> None:
    await sign_in(console, "ann-token")
    paths = [
        "/search?q=%00",
        "/search?q=" + "x" * 5000,
        "/payments/%00",
        "/payments/%3Cscript%3E",
        "/dlq/orders?since=yesterday",
        "/dlq/orders?payment_id=%00",
        "/dlq/%2e%2e",
        "/audit?older=99999999999999999999999",
        "/audit?older=-1",
    ]
    for path in paths:
        answer = await console.get("/console" + path)
        text = await answer.text()
        assert 400 <= answer.status < 500 or answer.status == 200, (path, answer.status)
        assert "<script>" not in text, path  # whatever comes back is escaped


async def test_a_requeue_from_the_console_moves_the_confirmed_ids_and_is_audited_once(
    console: TestClient, channel: AbstractChannel, topology: Any, db: Any
) -> None:
    orders = topology.work["orders"]
    chosen, other = Letter(), Letter(reason="retries_exhausted")
    await put_dead_letters(channel, orders, [chosen, other])
    await sign_in(console, "ann-token")
    csrf = await csrf_of(console, "/console/dlq/orders")
    form = {"csrf": csrf, "reason": "unknown_payment", "payment_id": "", "since": "", "until": ""}

    dry = await console.post("/console/dlq/orders/requeue", data={**form, "step": "dry-run"})
    dry_page = await dry.text()
    assert dry.status == 200
    assert re.search(r'id="would-requeue".*<strong>1</strong>', dry_page)
    assert f'name="ids" value="{chosen.id}"' in dry_page
    assert other.id not in dry_page
    await settled(channel, {orders.dlq: 2, orders.name: 0})  # nothing moved
    assert await actions_on(db, orders.dlq) == []

    done = await console.post(
        "/console/dlq/orders/requeue", data={**form, "step": "confirm", "ids": chosen.id}
    )

    assert done.status == 200
    assert re.search(r'id="requeued".*<strong>1</strong>', await done.text())
    [action] = await actions_on(db, orders.dlq)
    assert (action["actor"], action["source"], action["action"]) == (
        "ann",
        "console",
        "dlq.requeue",
    )
    assert (list(action["ids"]), action["count"], action["target"]) == (
        [chosen.id],
        1,
        orders.dlq,
    )
    assert action["filter"]["reason"] == "unknown_payment"
    audit_page = await (await console.get("/console/audit")).text()
    assert chosen.id in audit_page
    assert ">console<" in audit_page
    moved = {orders.name: [chosen.id], orders.dlq: [other.id]}
    assert await queue_ids(channel, moved) == moved


async def test_a_confirmation_moves_nothing_that_left_the_filter_meanwhile(
    console: TestClient, channel: AbstractChannel, topology: Any
) -> None:
    orders = topology.work["orders"]
    letter = Letter(reason="retries_exhausted")
    await put_dead_letters(channel, orders, [letter])
    await sign_in(console, "ann-token")
    csrf = await csrf_of(console, "/console/dlq/orders")
    # A confirmation naming the id, with a filter it does not match (a page edited, or a
    # letter that changed): the filter still holds.
    form = {"csrf": csrf, "step": "confirm", "ids": letter.id, "reason": "unknown_payment"}
    done = await console.post("/console/dlq/orders/requeue", data=form)
    assert re.search(r'id="requeued".*<strong>0</strong>', await done.text())
    assert letter.id in await done.text()  # named as not requeued
    assert await queue_ids(channel, {orders.dlq: [letter.id]}) == {orders.dlq: [letter.id]}


async def test_without_rabbitmq_dlq_pages_say_so_and_the_payment_page_still_answers(
    aiohttp_client: Any, make_settings: Any, db: Any
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = make_settings(ADMIN_TOKENS=TOKENS, AMQP_URL=f"amqp://guest:guest@127.0.0.1:{port}/")
    client: TestClient = await aiohttp_client(create_app(settings))
    await sign_in(client, "ann-token")

    answer = await client.get("/console/dlq")
    assert answer.status == 503
    assert answer.headers["Retry-After"] == "5"
    assert "RabbitMQ is not available" in await answer.text()
    assert (await client.get("/console/payments/nobody")).status == 404  # the database answered


def consumer_cells(page: str) -> dict[str, str]:
    """Each work queue's consumers cell of the overview, as written."""
    rows = re.findall(r'<th scope="row">(\w+)</th>\s*<td[^>]*>.*?</td>\s*(<td.*?</td>)', page, re.S)
    return dict(rows)


async def test_the_overview_says_not_measured_yet_where_no_pass_has_counted(
    aiohttp_client: Any, make_settings: Any, db: Any, channel: Any
) -> None:
    # Before the monitor's first pass (RabbitMQ is not there): no figure, not a red 0.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    unmeasured = make_settings(
        ADMIN_TOKENS=TOKENS, AMQP_URL=f"amqp://guest:guest@127.0.0.1:{port}/"
    )
    client = await aiohttp_client(create_app(unmeasured, monitor_interval_s=3600))
    await sign_in(client, "ann-token")
    page = await (await client.get("/console/")).text()
    cells = consumer_cells(page)
    assert sorted(cells) == ["bonuses", "emails", "orders"]
    assert all("not measured yet" in cell and "bad" not in cell for cell in cells.values())
    assert "not measured yet" in page.split('id="backlogs"')[1]

    # The pass at the api's start counted no consumers: workers started with it may still be
    # attaching, so still not measured; a pass later than that shows a red 0.
    api = await running_api(aiohttp_client, make_settings(ADMIN_TOKENS=TOKENS))
    await sign_in(api, "ann-token")
    cells = consumer_cells(await (await api.get("/console/")).text())
    assert all("not measured yet" in cell and "bad" not in cell for cell in cells.values())
    assert api.app is not None
    passes = api.app[monitor.PASSES]
    passes.started_at -= monitor.STARTING_S  # as if that pass came STARTING_S after the start
    cells = consumer_cells(await (await api.get("/console/")).text())
    assert cells == dict.fromkeys(cells, '<td class="num bad">0</td>')


async def test_the_payment_page_shows_its_parked_events(console: TestClient, db: Any) -> None:
    event = parked_sql.ParkedEvent(
        "evt_early", "xhub", "pay_early", "payment.status_changed", "k", b"{}", {}
    )
    await parked_sql.park(db, event)
    await sign_in(console, "ann-token")

    page = await (await console.get("/console/payments/pay_early")).text()

    parked = page.split('id="parked"')[1].split("</section>")[0]
    assert "evt_early" in parked
    assert '<td class="state">parked</td>' in parked
    assert "its events are parked until the shop registers it" in page


async def test_the_overview_counts_the_parked_events_and_the_oldest_ones_age(
    aiohttp_client: Any, make_settings: Any, db: Any
) -> None:
    for n in range(2):
        await parked_sql.park(
            db,
            parked_sql.ParkedEvent(
                f"evt_wait{n}", "xhub", "pay_wait", "payment.status_changed", "k", b"{}", {}
            ),
        )
    await db.execute("UPDATE parked_events SET parked_at = now() - interval '90 seconds'")
    api = await running_api(aiohttp_client, make_settings(ADMIN_TOKENS=TOKENS))
    await sign_in(api, "ann-token")

    page = await (await api.get("/console/")).text()

    row = page.split('id="parked"')[1].split("</tr>")[0]
    assert re.search(r'<td class="num">2 \(oldest 1 min', row), row
