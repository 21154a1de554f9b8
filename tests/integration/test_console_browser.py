"""The operator console in a real browser (headless chromium through selenium), against the api,
ingest and the workers on real PostgreSQL and RabbitMQ:

- every page sends a browser without a session to the sign-in page and shows none of its data;
- the whole operator story: an event for an unregistered order dead-letters, the shop registers
  the order, and an operator signs in (a shop token refused), finds the payment, filters the
  orders DLQ, requeues the letter in two steps (the dry run moves nothing), sees it processed
  exactly once and the requeue in the audit trail, and signs out;
- signing in with the keyboard alone;
- resolving an order with the payment page's form (a forbidden move refused, then forced and
  shown as forced) and finding an undecided payment on the "Missing" page.

The story saves screenshots of the main pages to build/console-screenshots/ (git-ignored);
`CONSOLE_SCREENSHOTS=docs/screenshots` writes them over the runbook's copies instead. The
HTTP-level rules (cookies, CSRF, headers, hostile input) are in test_console.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.wait import WebDriverWait

from shared.amqp.topology import Topology
from shared.ops import dlq
from shared.queries import orders as orders_sql
from tests.conftest import SmtpSink
from tests.helpers import eventually, payment_event
from tests.integration.api_contract import running_api
from tests.integration.system import (
    EMAIL_FROM,
    effects,
    paid_once,
    post,
    quiescent,
    register,
    smtp_messages,
    start_system,
    system_settings,
)
from tests.integration.test_api_operators import AUTH, done_with, new_order
from tests.integration.test_dlq import Letter, new_id, put_dead_letters, queue_ids
from tests.integration.test_replay import lost_event

# Found on PATH, under any of the names distributions give them.
CHROMIUM = next(
    (p for n in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(n))), None
)
CHROMEDRIVER = shutil.which("chromedriver")
TOKENS = "ann:operator:ann-token,shop:orders:shop-token"
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / os.environ.get("CONSOLE_SCREENSHOTS", "build/console-screenshots")
WAIT_S = 10.0
SIGN_IN = "/console/sign-in"
# What the signed-in pages show: none of it may reach a browser without a session.
PAGE_DATA = [
    "#operator",
    "#sign-out",
    "#queues",
    "#backlogs",
    "#dlqs",
    "#filter",
    "#matching",
    "#letters",
    "#requeue",
    "#unrouted-total",
    "#actions",
    "#nothing",
    "#order",
    "#events",
    "#transitions",
    "#parked",
    "#dead-letters",
    "#resolve",
    "#undecided",
    "#refused",
]

T = TypeVar("T")
Locator = str | tuple[str, str]  # a CSS selector, or (By.<how>, what)


@pytest.fixture(scope="module")
def chromium() -> Iterator[webdriver.Chrome]:
    """One headless chromium for the module (it takes a second or two to start)."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(
            "chromium/chromedriver not installed (apt-get install chromium chromium-driver):"
            " console browser tests skipped"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,900")
    # The driver's path given: selenium-manager never downloads anything.
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium: webdriver.Chrome) -> webdriver.Chrome:
    """The module's chromium without cookies: every test's api is on 127.0.0.1 (cookies do not
    tell ports apart), so a previous test's session must not come along."""
    chromium.execute_cdp_cmd("Network.clearBrowserCookies", {})
    return chromium


class Console:
    """A browser on one api's console. Selenium blocks while the api runs on this event loop,
    so every call goes to a thread."""

    def __init__(self, driver: webdriver.Chrome, api: TestClient) -> None:
        self.driver = driver
        self.api = api

    async def _off_loop(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(call, *args)

    # Going places

    async def open(self, path_qs: str) -> None:
        await self._off_loop(self.driver.get, str(self.api.make_url(path_qs)))

    async def click(self, locator: Locator) -> None:
        """Click a link or a submit button, and wait for the page it leads to."""
        await self._off_loop(self._and_wait, lambda: self._find(locator).click())

    async def click_here(self, locator: Locator) -> None:
        """Click something that changes this page only (a summary, a checkbox)."""
        await self._off_loop(lambda: self._find(locator).click())

    async def keys(self, *keys: str) -> str:
        """Type into whatever has the focus; the focused element's id (or tag) afterwards."""
        return await self._off_loop(self._keys, keys)

    async def keys_to_next_page(self, *keys: str) -> None:
        await self._off_loop(self._and_wait, lambda: self._keys(keys))

    async def path(self) -> str:
        return urlsplit(await self._off_loop(lambda: self.driver.current_url)).path

    async def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(await self._off_loop(lambda: self.driver.current_url)).query)

    # Reading and filling in

    async def text(self, locator: Locator = "main") -> str:
        return await self._off_loop(lambda: self._find(locator).text)

    async def value(self, locator: Locator) -> str:
        return await self._off_loop(lambda: self._find(locator).get_attribute("value") or "")

    async def has(self, locator: Locator) -> bool:
        return await self._off_loop(self._has, locator)

    async def rows(self, table: str) -> list[list[str]]:
        """The text of each body row's cells (th and td) of `table`."""

        def read() -> list[list[str]]:
            rows = self._find(table).find_elements(By.CSS_SELECTOR, "tbody tr")
            return [
                [cell.text for cell in row.find_elements(By.CSS_SELECTOR, "th, td")] for row in rows
            ]

        return await self._off_loop(read)

    async def type(self, locator: Locator, text: str) -> None:
        def fill() -> None:
            field = self._find(locator)
            field.clear()
            field.send_keys(text)

        await self._off_loop(fill)

    async def choose(self, locator: Locator, option: str) -> None:
        await self._off_loop(lambda: Select(self._find(locator)).select_by_visible_text(option))

    async def chosen(self, locator: Locator) -> str:
        return await self._off_loop(lambda: Select(self._find(locator)).first_selected_option.text)

    async def screenshot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"console-{name}.png"
        assert await self._off_loop(self.driver.save_screenshot, str(path)), path

    # In the thread

    def _find(self, locator: Locator) -> WebElement:
        how, what = (By.CSS_SELECTOR, locator) if isinstance(locator, str) else locator
        return self.driver.find_element(how, what)

    def _has(self, locator: Locator) -> bool:
        try:
            self._find(locator)
        except NoSuchElementException:
            return False
        return True

    def _keys(self, keys: tuple[str, ...]) -> str:
        focused = self.driver.switch_to.active_element
        focused.send_keys(*keys)
        now = self.driver.switch_to.active_element
        return now.get_attribute("id") or now.tag_name

    def _and_wait(self, action: Callable[[], object]) -> None:
        """Do `action`, then wait until another page has replaced this one."""
        page = self.driver.find_element(By.TAG_NAME, "html")
        action()
        wait = WebDriverWait(self.driver, WAIT_S)
        wait.until(lambda _: _left(page))
        wait.until(expected_conditions.presence_of_element_located((By.ID, "main")))


def _left(page: WebElement) -> bool:
    """The browser has left the page `page` belongs to. Chromedriver says so with a stale
    element reference, or sometimes "Node with given id does not belong to the document"
    (a plain WebDriverException, which selenium's staleness_of lets through)."""
    try:
        page.is_enabled()
    except WebDriverException:
        return True
    return False


async def requeues(db: Any) -> list[tuple[str, str, list[str]]]:
    """The DLQ requeues in the audit trail: (source, actor, ids)."""
    rows = await db.fetch(
        "SELECT source, actor, ids FROM operator_actions WHERE action = 'dlq.requeue' ORDER BY id"
    )
    return [(row["source"], row["actor"], list(row["ids"])) for row in rows]


async def on_sign_in_page(console: Console) -> bool:
    return await console.path() == SIGN_IN and await console.has("form#sign-in")


async def sign_in(console: Console, token: str) -> None:
    await console.type("#token", token)
    await console.click("#sign-in button[type=submit]")


async def test_every_console_page_sends_a_browser_without_a_session_to_sign_in(
    browser: webdriver.Chrome,
    aiohttp_client: Any,
    make_settings: Any,
    db: Any,
    channel: AbstractChannel,
    topology: Topology,
) -> None:
    # Something to see on every page: a registered order, a dead letter of its payment.
    letter = Letter()
    await register(db, letter.payment_id)
    await put_dead_letters(channel, topology.work["orders"], [letter])
    console = Console(
        browser, await running_api(aiohttp_client, make_settings(ADMIN_TOKENS=TOKENS))
    )
    pages = [
        "/console/",
        "/console/dlq",
        "/console/dlq/orders",
        "/console/unrouted",
        "/console/audit",
        "/console/missing",
        f"/console/search?q={letter.payment_id}",
        f"/console/payments/{letter.payment_id}",
    ]

    for page in pages:
        await console.open(page)

        assert await on_sign_in_page(console), page
        assert await console.value("input[name=next]") == page  # back there after sign-in
        shown = [data for data in PAGE_DATA if await console.has(data)]
        assert shown == [], page
        text = await console.text("body")
        assert letter.payment_id not in text, page
        assert letter.id not in text, page
    assert await queue_ids(channel, {topology.work["orders"].dlq: [letter.id]}) == {
        topology.work["orders"].dlq: [letter.id]
    }


async def test_an_operator_finds_requeues_and_audits_a_dead_letter_in_the_browser(
    browser: webdriver.Chrome,
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    db: Any,
    channel: AbstractChannel,
    topology: Topology,
) -> None:
    work = topology.work["orders"]
    system = await start_system(
        aiohttp_client, system_settings(make_settings, smtp[1]), channel, topology
    )
    # The provider's event comes before the shop registered the order: it dead-letters.
    payment_id, event_id = new_id("pay"), new_id("evt")
    await post(system.ingest, payment_event(payment_id, "paid"), event_id)
    await done_with(db, system, channel, topology, orders=1, transitions=0, dead=1)
    # Two dead letters of other payments the filter has to leave out, one of another reason.
    now = dt.datetime.now(dt.UTC)
    others = [
        Letter(reason="retries_exhausted", failed_at=now - dt.timedelta(minutes=7)),
        Letter(failed_at=now - dt.timedelta(minutes=2)),
    ]
    await put_dead_letters(channel, work, others)
    # The api started now: its monitor's one pass sees the three dead letters.
    api_settings = make_settings(ADMIN_TOKENS=TOKENS, SMTP_PORT=str(smtp[1]), EMAIL_FROM=EMAIL_FROM)
    api = await running_api(aiohttp_client, api_settings)
    order = new_order(payment_id, user_id=new_id("user"))
    assert (await api.post("/api/orders", json=order, headers=AUTH)).status == 201
    console = Console(browser, api)

    # Sign in: the shop's token is refused, ann's operator token lets her in.
    await console.open("/console/")
    assert await on_sign_in_page(console)
    await console.screenshot("sign-in")
    await sign_in(console, "shop-token")
    assert await on_sign_in_page(console)
    assert "needs an operator token" in await console.text("p#problem")
    assert not await console.has("#operator")
    await sign_in(console, "ann-token")
    assert await console.path() == "/console/"
    assert await console.text("strong#operator") == "ann"

    # The overview: the three dead letters of orders, the one webhook received.
    queues = {row[0]: row for row in await console.rows("table#queues")}
    assert sorted(queues) == ["bonuses", "emails", "orders"]
    assert (queues["orders"][2], queues["orders"][4]) == ("1", "3")  # consumers, dead letters
    assert await console.text("td#recent") == "1"
    await console.screenshot("overview")

    # The search finds the payment; its page shows the dead letter.
    await console.type("#q", payment_id)
    await console.click("form[role=search] button[type=submit]")
    assert await console.path() == f"/console/payments/{payment_id}"
    assert "PENDING" in await console.text("#order")
    dead = await console.rows("#dead-letters table")
    assert [(row[0], row[2], row[4]) for row in dead] == [("orders", "unknown_payment", event_id)]

    # The orders DLQ, filtered down to that payment's unknown_payment letter.
    await console.click((By.LINK_TEXT, "Dead letters"))
    assert await console.path() == "/console/dlq"
    dlqs = {row[0]: row for row in await console.rows("table#dlqs")}
    assert dlqs["orders"][2] == "3"
    await console.click((By.CSS_SELECTOR, "table#dlqs a[href$='/dlq/orders']"))
    assert await console.path() == "/console/dlq/orders"
    assert await console.text("p#matching") == "3 of 3 match."
    await console.choose("select#reason", "unknown_payment")
    await console.type("input#payment_id", payment_id)
    await console.click("#filter button[type=submit]")
    assert (await console.path(), await console.query()) == (
        "/console/dlq/orders",
        {"reason": ["unknown_payment"], "payment_id": [payment_id]},
    )
    assert await console.chosen("select#reason") == "unknown_payment"
    assert await console.value("input#payment_id") == payment_id
    assert await console.text("p#matching") == "1 of 3 match."
    letters = await console.rows("table#letters")
    assert [(row[1], row[4], row[7]) for row in letters] == [
        ("unknown_payment", payment_id, event_id)
    ]
    await console.screenshot("dlq")

    # The dry run lists what would move, and moves nothing.
    assert await console.text("#requeue button") == "Requeue 1 message…"
    await console.click("#requeue button")
    assert await console.path() == "/console/dlq/orders/requeue"
    assert await console.text("p#would-requeue strong") == "1"
    assert [row[0] for row in await console.rows("table#selected")] == [event_id]
    still = [letter.id for letter in await dlq.show(channel, work.dlq)]
    assert still == [event_id] + [other.id for other in others]
    assert await requeues(db) == []
    await console.screenshot("confirm")

    # Confirmed: exactly that letter goes back to orders and is processed once.
    assert await console.text("#confirm button") == "Requeue 1 message"
    await console.click("#confirm button")
    assert await console.text("p#requeued strong") == "1"
    assert event_id in await console.text("main")
    await done_with(db, system, channel, topology, orders=2, transitions=1, dead=2)
    assert system.finished("orders") == 2  # dead-lettered once, then processed once
    await paid_once(db, smtp[0], payment_id, event_id)

    # The payment's page tells the whole story now, without a dead letter of that event.
    await console.open(f"/console/payments/{payment_id}")
    assert "PAID" in await console.text("#order")
    transitions = await console.rows("#transitions table")
    assert [row[1:] for row in transitions] == [["PENDING", "PAID", event_id]]
    assert [row[1:3] for row in await console.rows("#bonus table")] == [["grant", "500"]]
    assert [row[1] for row in await console.rows("#emails table")] == ["payment_succeeded"]
    assert not await console.has("#dead-letters table")
    assert await console.text("#dead-letters p") == "None."
    await console.screenshot("payment")

    # The audit trail: the shop's registration, then one console requeue, by ann, of that id.
    await console.click((By.LINK_TEXT, "Audit"))
    assert await console.path() == "/console/audit"
    actions = await console.rows("table#actions")
    assert [row[1:4] for row in actions] == [
        ["ann", "console", "dlq.requeue"],  # newest first
        ["admin", "api", "order.register"],
    ]
    assert actions[0][4:6] == [work.dlq, "1"]
    assert actions[0][7] == event_id
    await console.screenshot("audit")
    assert await requeues(db) == [("console", "ann", [event_id])]

    # Signing out ends the session.
    await console.click("#sign-out button[type=submit]")
    assert await on_sign_in_page(console)
    await console.open("/console/")
    assert await on_sign_in_page(console)
    assert not await console.has("#operator")
    assert await queue_ids(channel, {work.dlq: [o.id for o in others], work.name: []}) == {
        work.dlq: [o.id for o in others],
        work.name: [],
    }


async def test_the_sign_in_form_works_with_the_keyboard_alone(
    browser: webdriver.Chrome,
    aiohttp_client: Any,
    make_settings: Any,
    db: Any,
    channel: AbstractChannel,
) -> None:
    console = Console(
        browser, await running_api(aiohttp_client, make_settings(ADMIN_TOKENS=TOKENS))
    )
    await console.open("/console/audit")
    assert await on_sign_in_page(console)

    # The token field has the focus; Tab goes to the button; Enter signs in.
    assert await console.keys("ann-token") == "token"
    assert await console.keys(Keys.TAB) == "button"
    assert await console.text((By.CSS_SELECTOR, ":focus")) == "Sign in"
    await console.keys_to_next_page(Keys.ENTER)

    assert await console.path() == "/console/audit"
    assert await console.text("strong#operator") == "ann"


async def test_an_operator_replays_stored_webhooks_with_a_dry_run_then_a_confirmation(
    browser: webdriver.Chrome,
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    db: Any,
    channel: AbstractChannel,
    topology: Topology,
) -> None:
    """One payment paid and done, one whose webhook was stored but never reached a worker:
    the replay page's dry run counts both for orders and says one would be skipped, sends
    nothing; the confirmation sends both, the lost one takes effect once, the done one
    changes nothing, and the audit trail has the replay under ann's name."""
    system = await start_system(
        aiohttp_client, system_settings(make_settings, smtp[1]), channel, topology
    )
    done, lost = new_id("pay"), new_id("pay")
    for payment_id in (done, lost):
        await register(db, payment_id)
    await post(system.ingest, payment_event(done, "paid"))
    await quiescent(db, system)
    lost_id = await lost_event(db, lost)
    api_settings = make_settings(ADMIN_TOKENS=TOKENS, SMTP_PORT=str(smtp[1]), EMAIL_FROM=EMAIL_FROM)
    console = Console(browser, await running_api(aiohttp_client, api_settings))

    await console.open("/console/replay")
    assert await on_sign_in_page(console)
    assert await console.value("input[name=next]") == "/console/replay"
    await sign_in(console, "ann-token")
    assert await console.path() == "/console/replay"

    await console.type("input#event_type", "payment.status_changed")
    await console.click("#replay button[type=submit]")
    assert "Dry run" in await console.text("p#replay-summary")
    assert await console.text("p#replay-summary strong") == "2"
    # worker, messages, already processed, would skip, not stored, sent
    assert await console.rows("table#per-worker") == [["orders", "2", "1", "1", "0", "0"]]
    assert await db.fetchval("SELECT count(*) FROM operator_actions") == 0
    assert (await effects(db, lost))["status"] == "PENDING"
    await console.screenshot("replay")

    assert await console.text("#confirm button") == "Replay 2 events"
    await console.click("#confirm button")
    assert await console.text("strong#published") == "2"
    assert await console.rows("table#per-worker") == [["orders", "2", "1", "1", "0", "2"]]

    async def both_paid() -> list[dict[str, Any]]:
        return [await effects(db, p) for p in (done, lost)]

    paid = {"status": "PAID", "bonus": 500, "ledger": ["grant"], "emails": ["payment_succeeded"]}
    await eventually(both_paid, lambda found: found == [paid, paid], timeout_s=20)
    for payment_id in (done, lost):
        assert smtp_messages(smtp[0], payment_id) == ["payment_succeeded"]

    await console.click((By.LINK_TEXT, "Audit"))
    actions = await console.rows("table#actions")
    assert [row[1:4] for row in actions] == [["ann", "console", "event.replay"]]
    [row] = await db.fetch("SELECT ids, count FROM operator_actions")
    assert row["count"] == 2
    assert lost_id in list(row["ids"])


async def test_an_operator_resolves_an_order_in_the_browser_and_a_forced_move_shows(
    browser: webdriver.Chrome,
    aiohttp_client: Any,
    make_settings: Any,
    db: Any,
    channel: AbstractChannel,
) -> None:
    payment_id, undecided = new_id("pay"), new_id("pay")
    await register(db, payment_id)
    await register(db, undecided)
    await orders_sql.flag_undecided(db, undecided, "currency_mismatch")
    console = Console(
        browser, await running_api(aiohttp_client, make_settings(ADMIN_TOKENS=TOKENS))
    )
    await console.open("/console/")
    await sign_in(console, "ann-token")

    # The "Missing" page lists the undecided payment: what to ask X-Hub about.
    await console.click((By.LINK_TEXT, "Missing"))
    assert await console.path() == "/console/missing"
    assert [row[0] for row in await console.rows("#undecided table")] == [undecided]

    # PENDING -> PAID through the form: the operator's transition.
    await console.open(f"/console/payments/{payment_id}")
    await console.click_here("#resolve summary")
    await console.choose("select#resolve-to", "PAID")
    await console.type("textarea#resolve-reason", "paid per bank statement")
    await console.click("#resolve-submit")
    assert await console.path() == f"/console/payments/{payment_id}"
    assert "PAID" in await console.text("#order")
    assert [row[1:] for row in await console.rows("#transitions table")] == [
        ["PENDING", "PAID", "operator ann: paid per bank statement"]
    ]

    # PAID -> CANCELLED: the order machine never makes it; refused without force, kept typed.
    await console.click_here("#resolve summary")
    await console.choose("select#resolve-to", "CANCELLED")
    await console.type("textarea#resolve-reason", "fraud confirmed")
    await console.click("#resolve-submit")
    assert "never moves PAID to CANCELLED" in await console.text("#resolve-problem")
    assert "PAID" in await console.text("#order")
    assert await console.chosen("select#resolve-to") == "CANCELLED"
    await console.click_here("#resolve-force")
    await console.click("#resolve-submit")
    assert "CANCELLED" in await console.text("#order")
    rows = await console.rows("#transitions table")
    assert [row[1:] for row in rows][-1] == [
        "PAID",
        "CANCELLED FORCED",
        "operator ann: fraud confirmed",
    ]
    await console.screenshot("resolve")
    actions = await db.fetch(
        "SELECT source, actor, filter FROM operator_actions WHERE action = 'order.resolve'"
        " ORDER BY id"
    )
    assert [(a["source"], a["actor"], a["filter"]["forced"]) for a in actions] == [
        ("console", "ann", False),
        ("console", "ann", True),
    ]
