"""deploy/alertmanager: `amtool check-config`, what it must agree with, and an alert that reaches
a person through real Prometheus and Alertmanager.

The end-to-end test runs Debian's `prometheus` and `prometheus-alertmanager` (binaries
`prometheus`, `prometheus-alertmanager`, `amtool`; .ci/run installs both packages) as child
processes on free loopback ports with temporary data directories. Prometheus scrapes a real api
(in-process, its queue gauges) and the orders and bonuses workers, down (ports nothing listens
on), with the shipped rules, where only the `for:` of the alerts it provokes is shortened.
Alertmanager runs the shipped routing and inhibition, where only the receivers' addresses point
at this test and the group waits are 1 s. Without the packages these tests skip locally and fail
in CI.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import asyncpg
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench.processes import free_ports
from services.api.app import create_app
from shared.amqp.topology import Topology
from shared.config import Settings
from tests.conftest import SmtpSink

ROOT = Path(__file__).resolve().parents[2]
ALERTMANAGER_DIR = ROOT / "deploy" / "alertmanager"
ALERTMANAGER_CONFIG = ALERTMANAGER_DIR / "alertmanager.yml"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
K8S = ROOT / "deploy" / "k8s"
K8S_CONFIG = K8S / "alertmanagerconfig.yaml"

# The alerts this test provokes, with the `for:` it gives them (the shipped rules say minutes).
SHORT_FOR = {
    "PayhooksServiceDown": "1s",
    "PayhooksWorkQueueNoConsumer": "1s",
    "PayhooksDLQNotEmpty": "1s",
}
DEADLINE_S = 20.0


def binary(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package `{package}`; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must never silently skip these checks
        pytest.skip(message)
    return path


def load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict), path
    return document


def dump(document: dict[str, Any]) -> str:
    text: str = yaml.safe_dump(document, sort_keys=False)
    return text


def alert_rules() -> dict[str, dict[str, Any]]:
    return {
        rule["alert"]: rule
        for group in load(ALERTS)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


# --- the configuration, statically -------------------------------------------------------------


def test_alertmanager_config_is_valid() -> None:
    amtool = binary("amtool", "prometheus-alertmanager")
    result = subprocess.run(
        [amtool, "check-config", str(ALERTMANAGER_CONFIG)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"amtool check-config failed:\n{output}"
    assert "1 templates" in output  # the glob found templates/payhooks.tmpl


def _matcher_values(matchers: list[str], label: str) -> list[str]:
    """The values a list of matchers like ['alertname=~"A|B"'] allows for `label`."""
    values = []
    for matcher in matchers:
        name, _, rest = matcher.partition("=")
        if name == label:
            values.extend(rest.lstrip("~").strip('"').split("|"))
    return values


def test_routes_and_inhibitions_name_real_alerts_and_severities() -> None:
    config = load(ALERTMANAGER_CONFIG)
    rules = alert_rules()
    severities = {rule["labels"]["severity"] for rule in rules.values()}
    routed = {
        value
        for route in config["route"]["routes"]
        for value in _matcher_values(route["matchers"], "severity")
    }
    assert severities <= routed, "an alert severity without its route"
    receivers = {receiver["name"] for receiver in config["receivers"]}
    used = {config["route"]["receiver"]} | {r["receiver"] for r in config["route"]["routes"]}
    assert used == receivers
    # One notification per alert name, whichever queues, workers or providers it names.
    assert config["route"]["group_by"] == ["alertname"]
    for inhibit in config["inhibit_rules"]:
        for side in ("source_matchers", "target_matchers"):
            names = _matcher_values(inhibit[side], "alertname")
            assert names, f"{inhibit}: {side} must name its alerts"
            assert set(names) <= set(rules), f"{inhibit}: unknown alert in {side}"
        # A warning never mutes a critical alert.
        sources = _matcher_values(inhibit["source_matchers"], "alertname")
        targets = _matcher_values(inhibit["target_matchers"], "alertname")
        order = {"warning": 0, "critical": 1}
        weakest_source = min(order[rules[name]["labels"]["severity"]] for name in sources)
        strongest_target = max(order[rules[name]["labels"]["severity"]] for name in targets)
        assert weakest_source >= strongest_target, inhibit


def test_email_goes_through_payhooks_smtp_relay_in_compose() -> None:
    """Alertmanager sends its mail as payhooks' email worker does (SMTP_HOST:SMTP_PORT,
    EMAIL_FROM of docker-compose.yml), to the service compose runs beside it."""
    config = load(ALERTMANAGER_CONFIG)
    services = load(COMPOSE)["services"]
    env = services["email"]["environment"]
    assert config["global"]["smtp_smarthost"] == f"{env['SMTP_HOST']}:{env['SMTP_PORT']}"
    assert config["global"]["smtp_from"] == env["EMAIL_FROM"]
    assert config["global"]["smtp_require_tls"] is False  # SMTP_TLS unset: none
    assert "SMTP_TLS" not in env
    assert "SMTP_PASSWORD" not in env


def test_compose_runs_alertmanager_with_this_config_and_prometheus_sends_to_it() -> None:
    services = load(COMPOSE)["services"]
    alertmanager = services["alertmanager"]
    assert alertmanager["image"].startswith("prom/alertmanager:v")  # a pinned release
    assert "./deploy/alertmanager:/etc/alertmanager:ro" in alertmanager["volumes"]
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in alertmanager["command"]
    assert "127.0.0.1:9093:9093" in alertmanager["ports"]
    assert "mailpit" in alertmanager["depends_on"]
    assert "alertmanager" in services["prometheus"]["depends_on"]
    (manager,) = load(PROMETHEUS_CONFIG)["alerting"]["alertmanagers"]
    (static,) = manager["static_configs"]
    assert static["targets"] == ["alertmanager:9093"]
    # The mail relay it is given is compose's SMTP sink, the one payhooks' email worker uses.
    host, _, _ = load(ALERTMANAGER_CONFIG)["global"]["smtp_smarthost"].partition(":")
    assert host in services


def _matcher(entry: dict[str, str]) -> str:
    return f'{entry["name"]}{entry.get("matchType", "=")}"{entry["value"]}"'


def rendered_k8s_config() -> dict[str, Any]:
    """deploy/k8s/alertmanagerconfig.yaml in alertmanager.yml's terms, as the Prometheus
    Operator renders it (less the namespace matchers it adds, and its route a root's child)."""
    document = load(K8S_CONFIG)
    assert (document["apiVersion"], document["kind"]) == (
        "monitoring.coreos.com/v1alpha1",
        "AlertmanagerConfig",
    )
    spec = document["spec"]
    assert set(spec) == {"route", "inhibitRules", "receivers"}

    def route(node: dict[str, Any]) -> dict[str, Any]:
        keys = {
            "receiver": "receiver", "groupBy": "group_by", "groupWait": "group_wait",
            "groupInterval": "group_interval", "repeatInterval": "repeat_interval",
            "matchers": "matchers", "routes": "routes",
        }  # fmt: skip
        assert set(node) <= set(keys), set(node) - set(keys)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "matchers":
                value = [_matcher(m) for m in value]
            elif key == "routes":
                value = [route(child) for child in value]
            out[keys[key]] = value
        return out

    def receiver(node: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": node["name"]}
        for email in node.get("emailConfigs", []):
            assert set(email) <= {"to", "from", "smarthost", "requireTLS", "sendResolved"}
            out.setdefault("email_configs", []).append(
                {
                    "to": email["to"],
                    "from": email["from"],
                    "smarthost": email["smarthost"],
                    "require_tls": email["requireTLS"],
                    "send_resolved": email["sendResolved"],
                }
            )
        for webhook in node.get("webhookConfigs", []):
            assert set(webhook) <= {"url", "sendResolved"}
            out.setdefault("webhook_configs", []).append(
                {"url": webhook["url"], "send_resolved": webhook["sendResolved"]}
            )
        return out

    inhibit_rules = []
    for rule in spec["inhibitRules"]:
        assert set(rule) <= {"sourceMatch", "targetMatch", "equal"}
        rendered = {
            "source_matchers": [_matcher(m) for m in rule["sourceMatch"]],
            "target_matchers": [_matcher(m) for m in rule["targetMatch"]],
        }
        if "equal" in rule:
            rendered["equal"] = rule["equal"]
        inhibit_rules.append(rendered)
    return {
        "route": route(spec["route"]),
        "inhibit_rules": inhibit_rules,
        "receivers": [receiver(r) for r in spec["receivers"]],
    }


def test_k8s_alertmanager_config_routes_and_inhibits_as_the_shipped_one(tmp_path: Path) -> None:
    k8s = rendered_k8s_config()
    shipped = load(ALERTMANAGER_CONFIG)
    # Its one addition: the top route takes payhooks' alerts only.
    top = dict(k8s["route"])
    assert top.pop("matchers") == ['alertname=~"Payhooks.+"']
    assert top == shipped["route"]
    assert k8s["inhibit_rules"] == shipped["inhibit_rules"]
    # The same receivers and integrations, the mail through the cluster's payhooks relay.
    assert [r["name"] for r in k8s["receivers"]] == [r["name"] for r in shipped["receivers"]]
    (configmap,) = [
        d
        for d in yaml.safe_load_all((K8S / "configmap.yaml").read_text())
        if d and d["kind"] == "ConfigMap"
    ]
    env = configmap["data"]
    for ours, theirs in zip(k8s["receivers"], shipped["receivers"], strict=True):
        assert set(ours) == set(theirs) - {"headers", "text"}, ours["name"]
        for email, shipped_email in zip(
            ours.get("email_configs", []), theirs.get("email_configs", []), strict=True
        ):
            assert email["to"] == shipped_email["to"]
            assert email["smarthost"] == f"{env['SMTP_HOST']}:{env['SMTP_PORT']}"
            assert email["from"] == env["EMAIL_FROM"]
            assert email["require_tls"] is (env.get("SMTP_TLS", "none") != "none")
    # Valid for Alertmanager itself, once rendered.
    path = tmp_path / "rendered.yml"
    # The operator hangs the route under your Alertmanager's root route.
    root = {"receiver": "cluster-default", "routes": [k8s["route"]]}
    receivers = [*k8s["receivers"], {"name": "cluster-default"}]
    path.write_text(dump({**k8s, "route": root, "receivers": receivers}))
    amtool = binary("amtool", "prometheus-alertmanager")
    result = subprocess.run(
        [amtool, "check-config", str(path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_k8s_kustomization_applies_the_alertmanager_config() -> None:
    kustomization = load(K8S / "kustomization.yaml")
    assert K8S_CONFIG.name in kustomization["resources"]
    labels = load(K8S_CONFIG)["metadata"]["labels"]
    (rule,) = [d for d in yaml.safe_load_all((K8S / "prometheusrule.yaml").read_text()) if d]
    assert labels == rule["metadata"]["labels"]  # the same release selector


# --- an alert that reaches a person ------------------------------------------------------------


class Receiver:
    """A chat tool's webhook endpoint: keeps every Alertmanager notification, by receiver."""

    def __init__(self) -> None:
        self.notifications: list[tuple[str, dict[str, Any]]] = []

    async def post(self, request: web.Request) -> web.Response:
        self.notifications.append((request.match_info["receiver"], await request.json()))
        return web.Response(text="ok")

    def alerts(self, receiver: str) -> list[dict[str, Any]]:
        return [
            alert
            for name, body in self.notifications
            if name == receiver
            for alert in body["alerts"]
        ]


def prometheus_config(rules: Path, alertmanager_port: int, targets: dict[str, int]) -> str:
    """The shipped rules with SHORT_FOR, scraped and evaluated every second."""
    document = load(ALERTS)
    for group in document["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in SHORT_FOR:
                rule["for"] = SHORT_FOR[rule["alert"]]
    rules.write_text(dump(document))
    return dump(
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "alerting": {
                "alertmanagers": [
                    {"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}
                ]
            },
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                for job, port in targets.items()
            ],
        }
    )


def alertmanager_config(webhook_port: int, smtp_port: int) -> str:
    """The shipped configuration with this test's receivers and 1 s group waits."""
    config = load(ALERTMANAGER_CONFIG)
    config["global"]["smtp_smarthost"] = f"127.0.0.1:{smtp_port}"
    config["templates"] = [str(ALERTMANAGER_DIR / t) for t in config["templates"]]
    config["route"].update(group_wait="1s", group_interval="1s")
    for receiver in config["receivers"]:
        for webhook in receiver.get("webhook_configs", []):
            webhook["url"] = f"http://127.0.0.1:{webhook_port}/{receiver['name']}"
    return dump(config)


@contextmanager
def child(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A child process (its own process group), stopped and reaped at exit; also stopped by
    the kernel should this test's process die first (setpriv's parent-death signal)."""
    setpriv = shutil.which("setpriv")  # util-linux
    guard = [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*guard, *argv], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@dataclass
class Stack:
    """The running Prometheus and Alertmanager, their logs and APIs, and an HTTP client."""

    processes: list[subprocess.Popen[bytes]]
    logs: list[Path]
    prometheus_url: str
    alertmanager_url: str
    http: aiohttp.ClientSession

    async def get(self, url: str, **params: str) -> Any:
        async with self.http.get(url, params=params) as response:
            return await response.json()

    async def state(self) -> str:
        """What Prometheus and Alertmanager hold now, for a failure's message."""
        parts = []
        for url in (
            f"{self.prometheus_url}/api/v1/targets",
            f"{self.prometheus_url}/api/v1/alerts",
            f"{self.alertmanager_url}/api/v2/alerts",
        ):
            try:
                parts.append(f"--- {url}\n{json.dumps(await self.get(url))[:3000]}")
            except (aiohttp.ClientError, ValueError) as e:
                parts.append(f"--- {url}\n{e!r}")
        for log in self.logs:
            parts.append(f"--- {log.name}\n{log.read_text()[-3000:]}")
        return "\n".join(parts)

    async def wait_for(self, what: str, check: Callable[[], Awaitable[Any]]) -> Any:
        """Poll `check` until it returns something truthy; fail saying what each holds."""
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            for process, log in zip(self.processes, self.logs, strict=True):
                assert process.poll() is None, f"{log.name}: exited\n{log.read_text()}"
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.2)
        pytest.fail(f"no {what} within {DEADLINE_S:.0f} s\n{await self.state()}")


def firing(alerts: list[dict[str, Any]], **labels: str) -> list[dict[str, Any]]:
    return [a for a in alerts if a["status"] == "firing" and labels.items() <= a["labels"].items()]


async def answer_metrics(request: web.Request) -> web.Response:
    """A worker's /metrics, answering again (Prometheus' `up` is all this test reads)."""
    return web.Response(text="payhooks_build_info 1\n")


@pytest.fixture
async def api_server(
    settings: Settings, channel: aio_pika.abc.AbstractChannel
) -> AsyncIterator[TestServer]:
    """The api, serving its queue gauges (refreshed every 0.2 s) on a loopback port."""
    server = TestServer(create_app(settings, monitor_interval_s=0.2), host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


async def test_stopped_workers_page_on_call_once_a_dlq_reaches_the_team_and_recovery_resolves(
    api_server: TestServer,
    channel: aio_pika.abc.AbstractChannel,
    topology: Topology,
    smtp: tuple[SmtpSink, int],
    db: asyncpg.Connection[Any],  # empty tables: no other alert of the api's gauges fires
) -> None:
    prometheus = binary("prometheus", "prometheus")
    alertmanager = binary("prometheus-alertmanager", "prometheus-alertmanager")
    sink, smtp_port = smtp
    receiver = Receiver()
    webhook_app = web.Application()
    webhook_app.router.add_post("/{receiver}", receiver.post)
    webhook = TestServer(webhook_app, host="127.0.0.1")
    await webhook.start_server()

    prometheus_port, alertmanager_port, *stopped = free_ports(4)
    # Configs, logs and both data directories: all removed at the end.
    temporary = tempfile.TemporaryDirectory(prefix="payhooks-alerting-")
    tmp_path = Path(temporary.name)
    (tmp_path / "prometheus.yml").write_text(
        prometheus_config(
            tmp_path / "rules.yml",
            alertmanager_port,
            {"api": api_server.port or 0, "orders": stopped[0], "bonuses": stopped[1]},
        )
    )
    (tmp_path / "alertmanager.yml").write_text(alertmanager_config(webhook.port or 0, smtp_port))
    logs = [tmp_path / "prometheus.log", tmp_path / "alertmanager.log"]
    http = aiohttp.ClientSession()
    try:
        with (
            child(
                [
                    alertmanager,
                    f"--config.file={tmp_path / 'alertmanager.yml'}",
                    f"--storage.path={tmp_path / 'alertmanager-data'}",
                    f"--web.listen-address=127.0.0.1:{alertmanager_port}",
                    "--cluster.listen-address=",  # no gossip port: one instance
                ],
                logs[1],
            ) as am_process,
            child(
                [
                    prometheus,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                ],
                logs[0],
            ) as prom_process,
        ):
            stack = Stack(
                [prom_process, am_process],
                logs,
                f"http://127.0.0.1:{prometheus_port}",
                f"http://127.0.0.1:{alertmanager_port}",
                http,
            )

            # 1. The orders and bonuses workers are down (their /metrics do not answer): one
            #    page listing both, by chat and by email, through the critical route.
            async def paged() -> list[dict[str, Any]]:
                return [
                    body
                    for name, body in receiver.notifications
                    if name == "payhooks-oncall"
                    and {
                        a["labels"].get("job")
                        for a in firing(body["alerts"], alertname="PayhooksServiceDown")
                    }
                    == {"orders", "bonuses"}
                ]

            page = (await stack.wait_for("one page for both stopped workers", paged))[0]
            assert page["groupLabels"] == {"alertname": "PayhooksServiceDown"}
            assert page["commonLabels"]["severity"] == "critical"
            assert {a["annotations"]["runbook_url"] for a in page["alerts"]} == {
                "docs/runbook.md#a-service-is-down"
            }

            async def mailed() -> list[Any]:
                return [m for m in sink.messages if "PayhooksServiceDown" in m["Subject"]]

            mail = (await stack.wait_for("email for the stopped workers", mailed))[0]
            assert mail["From"] == "payments@shop.example"
            assert mail["To"] == "oncall@shop.example"
            (text,) = [p for p in mail.walk() if p.get_content_type() == "text/plain"]
            body = text.get_payload(decode=True).decode()
            assert "is down" in body
            assert "/docs/runbook.md#a-service-is-down" in body

            # 2. Messages wait in the orders queue (and one in its DLQ). The queue has no
            #    consumer: Prometheus fires, Alertmanager holds it back behind the worker's
            #    page. The DLQ's warning goes to the team's channel, not by email.
            for queue in (topology.work["orders"].name, topology.work["orders"].dlq):
                await channel.default_exchange.publish(
                    aio_pika.Message(b"{}", message_id=f"alerting-{queue}"), routing_key=queue
                )

            async def team_told() -> list[dict[str, Any]]:
                return firing(
                    receiver.alerts("payhooks-team"),
                    alertname="PayhooksDLQNotEmpty",
                    queue="orders.dlq",
                )

            dlq = (await stack.wait_for("DLQ notification", team_told))[0]
            assert dlq["labels"]["severity"] == "warning"

            async def inhibited() -> list[dict[str, Any]]:
                alerts = await stack.get(f"{stack.alertmanager_url}/api/v2/alerts")
                (down,) = [
                    a["fingerprint"]
                    for a in alerts
                    if a["labels"]["alertname"] == "PayhooksServiceDown"
                    and a["labels"]["job"] == "orders"
                ]
                return [
                    a
                    for a in alerts
                    if a["labels"]["alertname"] == "PayhooksWorkQueueNoConsumer"
                    and a["labels"]["queue"] == "orders"
                    and a["status"]["state"] == "suppressed"
                    and a["status"]["inhibitedBy"] == [down]
                ]

            await stack.wait_for("no-consumer alert held back by the worker's", inhibited)
            heard = {
                a["labels"]["alertname"] for _, b in receiver.notifications for a in b["alerts"]
            }
            assert "PayhooksWorkQueueNoConsumer" not in heard
            assert not [m for m in sink.messages if "PayhooksServiceDown" not in m["Subject"]]

            # 3. The bonuses worker answers again: on-call hears that it resolved, while the
            #    orders worker's page stands.
            revived = web.Application()
            revived.router.add_get("/metrics", answer_metrics)
            bonuses = TestServer(revived, host="127.0.0.1", port=stopped[1])
            await bonuses.start_server()
            try:

                async def resolved() -> list[dict[str, Any]]:
                    return [
                        body
                        for name, body in receiver.notifications
                        if name == "payhooks-oncall"
                        and {(a["labels"].get("job"), a["status"]) for a in body["alerts"]}
                        == {("orders", "firing"), ("bonuses", "resolved")}
                    ]

                await stack.wait_for("the bonuses worker's page resolved", resolved)
            finally:
                await bonuses.close()
    finally:
        await http.close()
        await webhook.close()
        temporary.cleanup()
