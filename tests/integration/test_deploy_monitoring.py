"""deploy/prometheus and deploy/grafana: promtool checks, the dashboard, and the metric contract.

Every payhooks_* metric the alert rules, their unit tests and the dashboard use must be in
CONTRACT below, with the labels it has there; and each service must really expose its
CONTRACT metrics on /metrics (checked against the running apps, in-process).

promtool comes from the Debian package `prometheus` (.ci/run installs it). Without it these
checks skip locally and fail in CI. No YAML library is a dependency, so the rule files are
read line by line; they keep the layout that relies on (see deploy/prometheus/alerts_test.yml).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.metrics_core import Metric as Family
from prometheus_client.parser import text_string_to_metric_families

from shared.amqp.broker import BROKER
from shared.amqp.topology import build_topology, delete
from shared.config import Settings
from tests.conftest import TEST_AMQP_URL, TEST_SECRETS
from tests.markdown import github_anchors

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
GRAFANA_DIR = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA_DIR / "dashboards" / "payhooks.json"
DATASOURCES = GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = GRAFANA_DIR / "provisioning" / "dashboards" / "payhooks.yml"
SHARED_METRICS = ROOT / "shared" / "metrics.py"


@dataclass(frozen=True)
class Metric:
    kind: str  # counter (name ends in _total), gauge or histogram
    labels: tuple[str, ...] = ()


_WORKER_METRICS = {
    "payhooks_messages_processed_total": Metric("counter", ("worker", "outcome")),
    "payhooks_processing_duration_seconds": Metric("histogram", ("worker",)),
    # Webhook received -> this worker's effect (shared/tracing.py RECEIVED_AT).
    "payhooks_payment_effect_latency_seconds": Metric("histogram", ("worker",)),
    "payhooks_worker_paused": Metric("gauge", ("worker", "dependency")),
    # An operator's pause and rate cap (shared/worker/controls.py): the same on every replica.
    "payhooks_worker_operator_paused": Metric("gauge", ("worker",)),
    "payhooks_worker_operator_paused_since_timestamp_seconds": Metric("gauge", ("worker",)),
    "payhooks_worker_rate_limit_per_second": Metric("gauge", ("worker",)),
}

# Every service's, beside the process_* and python_info collectors' (tests/integration/
# test_metrics.py).
_SERVICE_METRICS = {
    "payhooks_build_info": Metric("gauge", ("version",)),
    "payhooks_dependency_server_info": Metric("gauge", ("dependency", "server")),
}

# The contract: service -> the metrics it exposes (SPEC section 7, issue 4, docs/operations.md).
CONTRACT: dict[str, dict[str, Metric]] = {
    "ingest": {
        "payhooks_webhooks_received_total": Metric("counter", ("provider", "outcome")),
        "payhooks_ingest_duration_seconds": Metric("histogram"),
        "payhooks_publish_confirm_duration_seconds": Metric("histogram"),
        "payhooks_ingest_batch_size": Metric("histogram"),
        "payhooks_ingest_sweeper_published_total": Metric("counter"),
        "payhooks_webhook_clock_skew_seconds": Metric("histogram", ("provider",)),
        "payhooks_webhook_secret_matched_total": Metric("counter", ("provider", "secret_index")),
    },
    "api": {
        "payhooks_queue_messages": Metric("gauge", ("queue",)),
        "payhooks_queue_consumers": Metric("gauge", ("queue",)),
        "payhooks_queue_oldest_message_age_seconds": Metric("gauge", ("queue",)),
        "payhooks_outbox_backlog": Metric("gauge"),
        "payhooks_inbox_unpublished": Metric("gauge"),
        "payhooks_orders_undecided": Metric("gauge"),
        "payhooks_orders_undecided_oldest_seconds": Metric("gauge"),
        "payhooks_parked_events": Metric("gauge"),
        "payhooks_parked_events_oldest_seconds": Metric("gauge"),
    },
    "orders": {
        **_WORKER_METRICS,
        "payhooks_orders_undecided_events_total": Metric("counter", ("reason",)),
        "payhooks_refund_failures_total": Metric("counter", ("event",)),
        "payhooks_parked_events_released_total": Metric("counter"),
        "payhooks_parked_events_dead_lettered_total": Metric("counter"),
    },
    "bonuses": {
        **_WORKER_METRICS,
        "payhooks_bonus_points_granted_total": Metric("counter"),
        "payhooks_bonus_entries_total": Metric("counter", ("kind",)),
    },
    "email": {
        **_WORKER_METRICS,
        "payhooks_emails_sent_total": Metric("counter", ("template",)),
        "payhooks_emails_skipped_total": Metric("counter", ("template",)),
    },
    "reconciler": {
        "payhooks_reconcile_repairs_total": Metric("counter", ("from", "to")),
        "payhooks_reconcile_overdue_seconds": Metric("gauge", ("class",)),
        "payhooks_reconcile_due_orders": Metric("gauge", ("class",)),
        "payhooks_reconcile_interval_seconds": Metric("gauge"),
        # The inbox's retention kept (services/reconciler/jobs.py housekeeping_once).
        "payhooks_inbox_oldest_day_age_seconds": Metric("gauge"),
        "payhooks_inbox_retention_seconds": Metric("gauge"),
        "payhooks_inbox_expiry_total": Metric("counter", ("outcome",)),
        "payhooks_provider_requests_total": Metric("counter", ("outcome", "provider")),
    },
}
for _metrics in CONTRACT.values():
    _metrics.update(_SERVICE_METRICS)
METRICS: dict[str, Metric] = {
    name: metric for metrics in CONTRACT.values() for name, metric in metrics.items()
}
# Metrics of the servers payhooks runs on that the replication alerts read, with the labels
# they carry: RabbitMQ's per-object Raft metrics (rabbitmq_prometheus) and CloudNativePG's
# exporter (its PodMonitor adds namespace and pod).
SERVER_METRICS: dict[str, Metric] = {
    "rabbitmq_raft_term_total": Metric("counter", ("vhost", "queue")),
    "cnpg_pg_replication_streaming_replicas": Metric("gauge", ("namespace", "pod")),
    "cnpg_pg_replication_in_recovery": Metric("gauge", ("namespace", "pod")),
}

RECONCILE_CLASSES = frozenset(("undecided", "money", "settlement", "recheck"))
_QUEUES = frozenset(
    ("orders", "bonuses", "emails", "unrouted", "orders.dlq", "bonuses.dlq", "emails.dlq")
)
# (metric, label) -> every value the label may take, where the set is closed.
LABEL_VALUES: dict[tuple[str, str], frozenset[str]] = {
    ("payhooks_webhooks_received_total", "outcome"): frozenset(
        (
            "accepted",
            "duplicate",
            "malformed",
            "invalid_signature",
            "stale",
            "too_large",
            "unavailable",
        )
    ),
    ("payhooks_messages_processed_total", "outcome"): frozenset(
        ("ok", "skipped_duplicate", "retried", "dead_lettered", "parked")
    ),
    ("payhooks_messages_processed_total", "worker"): frozenset(("orders", "bonuses", "email")),
    ("payhooks_processing_duration_seconds", "worker"): frozenset(("orders", "bonuses", "email")),
    ("payhooks_queue_messages", "queue"): _QUEUES,
    ("payhooks_queue_consumers", "queue"): frozenset(("orders", "bonuses", "emails")),
    ("payhooks_queue_oldest_message_age_seconds", "queue"): _QUEUES,
    ("payhooks_bonus_entries_total", "kind"): frozenset(("grant", "clawback", "restore")),
    ("payhooks_emails_sent_total", "template"): frozenset(
        ("payment_succeeded", "payment_refunded")
    ),
    ("payhooks_emails_skipped_total", "template"): frozenset(("payment_succeeded",)),
    ("payhooks_refund_failures_total", "event"): frozenset(("refund.failed", "refund.rejected")),
    ("payhooks_orders_undecided_events_total", "reason"): frozenset(
        ("reversal_before_refund", "amount_mismatch_ignored", "currency_mismatch")
    ),
    ("payhooks_dependency_server_info", "dependency"): frozenset(("postgresql", "rabbitmq")),
    ("payhooks_reconcile_overdue_seconds", "class"): RECONCILE_CLASSES,
    ("payhooks_inbox_expiry_total", "outcome"): frozenset(
        ("archived", "refused", "failed", "postponed")
    ),
    ("payhooks_reconcile_due_orders", "class"): RECONCILE_CLASSES,
    ("payhooks_provider_requests_total", "outcome"): frozenset(
        (
            "ok",
            "not_found",
            "unauthorized",
            "unexpected_status",
            "invalid_response",
            "server_error",
            "rate_limited",
            "network_error",
            "timeout",
        )
    ),
}

# Metrics shared/metrics.py defined when this test was written: a service must expose them
# (a rename fails here). Any other CONTRACT name that shared/metrics.py defines at test time
# is required too; the rest are being added and only skip while missing.
DEFINED_IN_SHARED_METRICS = frozenset(
    (
        "payhooks_webhooks_received_total",
        "payhooks_ingest_duration_seconds",
        "payhooks_publish_confirm_duration_seconds",
        "payhooks_ingest_batch_size",
        "payhooks_ingest_sweeper_published_total",
        "payhooks_messages_processed_total",
        "payhooks_processing_duration_seconds",
        "payhooks_bonus_points_granted_total",
        "payhooks_bonus_entries_total",
        "payhooks_emails_sent_total",
        "payhooks_queue_messages",
        "payhooks_queue_oldest_message_age_seconds",
        "payhooks_outbox_backlog",
        "payhooks_inbox_unpublished",
    )
)

# What the dashboard must show (issue 4): ingest by outcome, latency, queues and DLQs,
# workers, bonus points, emails, repairs.
DASHBOARD_MUST_QUERY = frozenset(
    (
        "payhooks_webhooks_received_total",
        "payhooks_ingest_duration_seconds_bucket",
        "payhooks_queue_messages",
        "payhooks_queue_oldest_message_age_seconds",
        "payhooks_messages_processed_total",
        "payhooks_processing_duration_seconds_bucket",
        "payhooks_payment_effect_latency_seconds_bucket",
        "payhooks_bonus_points_granted_total",
        "payhooks_emails_sent_total",
        "payhooks_reconcile_repairs_total",
    )
)
# Labels every scraped series carries besides its own.
TARGET_LABELS = frozenset(("job", "instance"))

_NAME = re.compile(r"\bpayhooks_[a-zA-Z0-9_]+")
_SELECTOR = re.compile(r"\b(payhooks_[a-zA-Z0-9_]+)\s*(?:\{([^}]*)\})?")
_SERVER_SELECTOR = re.compile(r"\b((?:rabbitmq|cnpg)_[a-zA-Z0-9_]+)\s*(?:\{([^}]*)\})?")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def queryable_names(name: str, metric: Metric) -> tuple[str, ...]:
    """The series names Prometheus stores for a contract metric."""
    if metric.kind == "histogram":
        return tuple(name + suffix for suffix in _HISTOGRAM_SUFFIXES)
    return (name,)


QUERYABLE: dict[str, str] = {
    series: name for name, metric in METRICS.items() for series in queryable_names(name, metric)
}


# --- reading the files -----------------------------------------------------------------------


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def alert_names() -> list[str]:
    return re.findall(r"^\s*- alert:\s*(\S+)\s*$", read(PROMETHEUS_DIR / "alerts.yml"), re.M)


def alert_blocks() -> dict[str, str]:
    """alert name -> the lines of its rule (up to the next rule or group)."""
    blocks: dict[str, list[str]] = {}
    current: str | None = None
    for line in read(PROMETHEUS_DIR / "alerts.yml").splitlines():
        if match := re.match(r"^\s*- (alert|record|name):\s*(\S+)", line):
            current = match.group(2) if match.group(1) == "alert" else None
        if current is not None:
            blocks.setdefault(current, []).append(line)
    return {name: "\n".join(lines) for name, lines in blocks.items()}


def rule_expressions() -> list[str]:
    """The `expr:` of every rule in alerts.yml, plain or as a YAML block scalar."""
    lines = read(PROMETHEUS_DIR / "alerts.yml").splitlines()
    expressions = []
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)(?:- )?expr:\s*(.*?)\s*$", line)
        if not match:
            continue
        indent, rest = len(match.group(1)), match.group(2)
        if rest and rest[0] not in ">|":
            expressions.append(rest.strip("'\""))
            continue
        block = []
        for following in lines[i + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            block.append(following.strip())
        expressions.append(" ".join(block).strip())
    return expressions


def input_series_selectors() -> list[str]:
    """The `series:` of every input series in alerts_test.yml."""
    text = read(PROMETHEUS_DIR / "alerts_test.yml")
    return [s.strip("'\"") for s in re.findall(r"^\s*- series:\s*(.+?)\s*$", text, re.M)]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(read(DASHBOARD))
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # panels inside collapsed rows


def dashboard_expressions() -> list[str]:
    return [
        target["expr"]
        for panel in panels(dashboard())
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


# --- promtool --------------------------------------------------------------------------------


def promtool(*args: str) -> str:
    executable = shutil.which("promtool")
    if executable is None:
        message = "promtool is not installed (Debian package `prometheus`; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must never silently skip these checks
        pytest.skip(message)
    result = subprocess.run(
        [executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def test_prometheus_config_is_valid() -> None:
    output = promtool("check", "config", "deploy/prometheus/prometheus.yml")
    assert "1 rule files found" in output  # alerts.yml is wired in


def test_alert_rules_are_valid() -> None:
    promtool("check", "rules", "deploy/prometheus/alerts.yml")


def test_alert_rule_unit_tests_pass() -> None:
    promtool("test", "rules", "deploy/prometheus/alerts_test.yml")


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses each dashboard query as a recording rule (Grafana's $__ intervals
    replaced by a duration)."""
    rules = []
    for i, expr in enumerate(dashboard_expressions()):
        promql = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
        assert "$" not in promql, f"unknown Grafana variable in {expr!r}"
        rules.append({"record": f"dashboard:query_{i}", "expr": promql})
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))  # YAML
    promtool("check", "rules", str(path))


def test_scrape_config_has_a_job_per_service() -> None:
    text = read(PROMETHEUS_DIR / "prometheus.yml")
    jobs = dict(
        re.findall(
            r"- job_name:\s*(\S+)\s*\n\s*static_configs:\s*\n\s*- targets:\s*\[\"([^\"]+)\"", text
        )
    )
    assert jobs == {
        "ingest": "ingest:8080",
        "api": "api:8081",
        "orders": "orders:9101",
        "bonuses": "bonuses:9102",
        "email": "email:9103",
        "reconciler": "reconciler:9104",
    }
    assert set(jobs) == set(CONTRACT)


def test_service_down_alert_watches_exactly_the_scrape_jobs() -> None:
    """`up` is Prometheus' own series: its job matcher must name every payhooks job, no other."""
    matchers = [
        value
        for expr in rule_expressions()
        for matchers in re.findall(r"\bup\s*\{([^}]*)\}", expr)
        for label, _, value in _MATCHER.findall(matchers)
        if label == "job"
    ]
    assert len(matchers) == 1, matchers
    candidates = set(CONTRACT) | {"node", "prometheus", "ingest-canary"}
    assert {job for job in candidates if re.fullmatch(matchers[0], job)} == set(CONTRACT)


# --- the alert rules and their tests -----------------------------------------------------------


def test_every_alert_has_severity_summary_and_description() -> None:
    blocks = alert_blocks()
    assert set(blocks) == set(alert_names())
    assert len(blocks) >= 7
    for name, block in blocks.items():
        assert re.search(r"^\s*severity:\s*(critical|warning)\s*$", block, re.M), name
        assert re.search(r"^\s*summary:\s*\S", block, re.M), name
        assert re.search(r"^\s*description:\s*\S", block, re.M), name


def test_every_alert_has_a_runbook_url_to_its_runbook_section() -> None:
    """runbook_url is `docs/runbook.md#<anchor>` (no link leaves the repository), the anchor is
    a heading of the runbook's, and that section names the alert."""
    sections = github_anchors(read(ROOT / "docs" / "runbook.md"))
    for name, block in alert_blocks().items():
        match = re.search(r"^\s*runbook_url:\s*(\S+)\s*$", block, re.M)
        assert match, f"{name} has no runbook_url"
        path, _, anchor = match.group(1).partition("#")
        assert path == "docs/runbook.md", match.group(1)
        assert anchor in sections, f"{name}: docs/runbook.md has no heading for #{anchor}"
        assert name in sections[anchor], f"runbook section #{anchor} does not mention {name}"


def test_every_alert_has_a_firing_and_a_quiet_test_case() -> None:
    """In alerts_test.yml, `exp_alerts: []` is a quiet case, any other value a firing one."""
    firing: dict[str, int] = {}
    quiet: dict[str, int] = {}
    current = None
    for line in read(PROMETHEUS_DIR / "alerts_test.yml").splitlines():
        if match := re.match(r"^\s*(?:- )?alertname:\s*(\S+)\s*$", line):
            current = match.group(1)
        elif match := re.match(r"^\s*exp_alerts:\s*(.*?)\s*$", line):
            assert current is not None, "exp_alerts before alertname in alerts_test.yml"
            counts = quiet if match.group(1) == "[]" else firing
            counts[current] = counts.get(current, 0) + 1
            current = None
    defined = set(alert_names())
    assert set(firing) | set(quiet) <= defined, "alerts_test.yml tests an alert that is not defined"
    assert {name for name in defined if not firing.get(name)} == set(), "alerts never seen firing"
    assert {name for name in defined if not quiet.get(name)} == set(), "alerts never seen quiet"


# --- the dashboard and its provisioning --------------------------------------------------------


def datasource_references(node: Any) -> Iterator[Any]:
    """Every `datasource` value anywhere in the dashboard JSON."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            yield from datasource_references(value)
    elif isinstance(node, list):
        for item in node:
            yield from datasource_references(item)


def test_dashboard_names_no_datasource_uid_but_its_datasource_variable() -> None:
    """A kube-prometheus-stack Grafana has its own Prometheus uid: the dashboard picks one
    with its `datasource` variable (the default datasource, unless chosen otherwise)."""
    board = dashboard()
    (variable,) = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    references = list(datasource_references(board))
    assert references
    for reference in references:
        assert reference == {"type": "prometheus", "uid": "${datasource}"}, reference
    # Nor anywhere else (an annotation query, a link): the only other uid is the board's.
    uids = set(re.findall(r'"uid":\s*"([^"]*)"', read(DASHBOARD)))
    assert uids == {board["uid"], "${datasource}"}, uids


def test_dashboard_parses_and_every_panel_queries_the_provisioned_prometheus() -> None:
    board = dashboard()
    assert re.search(r"^\s*isDefault:\s*true\s*$", read(DATASOURCES), re.M)
    assert "url: http://prometheus:9090" in read(DATASOURCES)
    assert re.search(r"^\s*path:\s*\S+", read(DASHBOARD_PROVIDERS), re.M)
    assert board["uid"]
    assert board["title"]
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    graphs = [panel for panel in panels(board) if panel["type"] != "row"]
    assert graphs
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_panels_do_not_overlap() -> None:
    boxes = [(p["title"], p["gridPos"]) for p in dashboard()["panels"]]
    for title, box in boxes:
        assert box["x"] >= 0, title
        assert box["x"] + box["w"] <= 24, title
    for i, (title_a, a) in enumerate(boxes):
        for title_b, b in boxes[i + 1 :]:
            apart = (
                a["x"] + a["w"] <= b["x"]
                or b["x"] + b["w"] <= a["x"]
                or a["y"] + a["h"] <= b["y"]
                or b["y"] + b["h"] <= a["y"]
            )
            assert apart, f"panels {title_a!r} and {title_b!r} overlap"


def test_dashboard_shows_what_on_call_needs() -> None:
    expressions = dashboard_expressions()
    used = {name for expr in expressions for name in _NAME.findall(expr)}
    assert DASHBOARD_MUST_QUERY - used == set()
    assert any(
        "histogram_quantile" in expr and "payhooks_ingest_duration_seconds_bucket" in expr
        for expr in expressions
    )


# --- metric names and labels against the contract ---------------------------------------------


def test_every_metric_named_in_deploy_is_in_the_contract() -> None:
    sources = {
        "alerts.yml": read(PROMETHEUS_DIR / "alerts.yml"),
        "alerts_test.yml": read(PROMETHEUS_DIR / "alerts_test.yml"),
        "dashboard": "\n".join(dashboard_expressions()),
    }
    unknown = {
        (source, name)
        for source, text in sources.items()
        for name in _NAME.findall(text)
        if name not in QUERYABLE
    }
    assert unknown == set(), (
        f"not in CONTRACT (or a histogram without _bucket/_sum/_count): {unknown}"
    )


@pytest.mark.parametrize(
    ("source", "expressions"),
    [
        ("alerts.yml", rule_expressions),
        ("dashboard", dashboard_expressions),
        ("alerts_test.yml", input_series_selectors),
    ],
)
def test_label_matchers_and_groupings_fit_the_contract(
    source: str, expressions: Callable[[], list[str]]
) -> None:
    """A typo in a label name or a closed label value (outcome="unavailble") would make an
    alert silently never fire; here it fails instead."""
    exprs = expressions()
    assert exprs
    if source == "alerts.yml":
        assert len(exprs) == len(alert_names())
    for expr in exprs:
        labels_here = set(TARGET_LABELS)
        for series, matchers in _SELECTOR.findall(expr) + _SERVER_SELECTOR.findall(expr):
            name = QUERYABLE.get(series, series)
            allowed = set({**METRICS, **SERVER_METRICS}[name].labels) | TARGET_LABELS
            if series.endswith("_bucket"):
                allowed.add("le")
            labels_here |= allowed
            for label, op, value in _MATCHER.findall(matchers):
                assert label in allowed, f"{source}: {series} has no label {label!r}: {expr}"
                known = LABEL_VALUES.get((name, label))
                if known is None or op.startswith("!"):
                    continue
                if op == "=":
                    assert value in known, f"{source}: {label}={value!r} never exists: {expr}"
                else:
                    assert any(re.fullmatch(value, v) for v in known), (
                        f"{source}: {label}=~{value!r} matches no known value: {expr}"
                    )
        for grouping in _GROUPING.findall(expr):
            for label in filter(None, (part.strip() for part in grouping.split(","))):
                assert label in labels_here, f"{source}: no metric here has {label!r}: {expr}"


# --- the running services' /metrics -----------------------------------------------------------


def _app_factory(service: str) -> Callable[[Settings], web.Application] | None:
    try:
        module = importlib.import_module(f"services.{service}.app")
    except ModuleNotFoundError as e:
        if e.name in (f"services.{service}", f"services.{service}.app"):
            return None  # not built yet
        raise
    factory: Callable[[Settings], web.Application] = module.create_app
    return factory


async def _scrape(service: str, app: web.Application) -> str:
    async with TestClient(TestServer(app)) as client:
        if BROKER in app:
            await app[BROKER].wait_connected(10)
        text = ""
        for _ in range(100):  # the api fills its queue gauges once connected
            response = await client.get("/metrics")
            assert response.status == 200, service
            text = await response.text()
            if service != "api" or "payhooks_queue_messages{" in text:
                break
            await asyncio.sleep(0.1)
        return text


async def _scrape_all(settings: Settings) -> dict[str, str | None]:
    texts: dict[str, str | None] = {}
    try:
        for service in CONTRACT:
            factory = _app_factory(service)
            texts[service] = None if factory is None else await _scrape(service, factory(settings))
    finally:
        connection = await aio_pika.connect(TEST_AMQP_URL)
        async with connection:
            channel = await connection.channel()
            await delete(channel, build_topology(settings.amqp_prefix, settings.retry_delays_s))
    return texts


@pytest.fixture(scope="module")
def amqp_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}."


@pytest.fixture(scope="module")
def exposed(migrated_database: str, amqp_prefix: str) -> dict[str, dict[str, Family] | None]:
    """service -> its /metrics families by name (None: the service is not built yet), from
    each real app started once in-process against PostgreSQL and RabbitMQ."""
    settings = Settings.from_env(
        {
            "DATABASE_URL": migrated_database,
            "AMQP_URL": TEST_AMQP_URL,
            "XHUB_WEBHOOK_SECRETS": ",".join(TEST_SECRETS),
            "XHUB_API_URL": "http://127.0.0.1:9/",
            "XHUB_API_KEY": "test-api-key",
            "AMQP_PREFIX": amqp_prefix,
            "RETRY_DELAYS": "0.2,0.4",
            "ADMIN_TOKEN": "test-admin-token",
        }
    )
    texts = asyncio.run(_scrape_all(settings))
    return {
        service: None
        if text is None
        else {family.name: family for family in text_string_to_metric_families(text)}
        for service, text in texts.items()
    }


def _required() -> set[str]:
    defined = set(re.findall(r"[\"'](payhooks_[a-zA-Z0-9_]+)[\"']", read(SHARED_METRICS)))
    at_test_time = {
        name for name in METRICS if name in defined or name.removesuffix("_total") in defined
    }
    return at_test_time | DEFINED_IN_SHARED_METRICS


@pytest.mark.parametrize(
    ("service", "name"),
    [(service, name) for service, metrics in CONTRACT.items() for name in metrics],
)
def test_service_exposes_its_contract_metric(
    service: str,
    name: str,
    exposed: dict[str, dict[str, Family] | None],
    amqp_prefix: str,
) -> None:
    families = exposed[service]
    if families is None:
        pytest.skip(f"services.{service} is not built yet: {name} not checked on /metrics")
    metric = CONTRACT[service][name]
    # prometheus_client's parser names a counter family without its _total suffix.
    family = families.get(name.removesuffix("_total") if metric.kind == "counter" else name)
    if family is None:
        assert name not in _required(), (
            f"{service} /metrics lacks {name}, which shared/metrics.py defines"
        )
        pytest.skip(f"{service} does not expose {name} yet (being added)")
    assert family.type == metric.kind
    allowed = set(queryable_names(name, metric))
    for sample in family.samples:
        assert sample.name in allowed, sample
        assert set(sample.labels) - {"le"} == set(metric.labels), sample
        for label, value in sample.labels.items():
            known = LABEL_VALUES.get((name, label))
            # Queues are named with AMQP_PREFIX, which production leaves empty.
            value = value.removeprefix(amqp_prefix) if label == "queue" else value
            assert known is None or value in known, sample
