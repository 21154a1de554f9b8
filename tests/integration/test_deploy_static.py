"""docker-compose.yml and deploy/k8s, checked statically (no Docker engine, no cluster here).

Compose: it parses; every payhooks service runs a real CLI command; every variable it sets is
one shared/config.py reads (and the values parse); host ports do not clash; depends_on and
healthchecks are wired. Kubernetes: every manifest parses; core kinds validate against the
Kubernetes JSON schemas bundled with `kubernetes-validate` (offline, strict); the operators'
custom resources are checked for structure; Deployments run real CLI services and probe the
port their settings give them; ConfigMap and Secret only hold variables the settings know; the
PrometheusRule holds exactly the rules of deploy/prometheus/alerts.yml. High availability: k8s
runs the settings `make chaos-cluster` measured (tests/cluster.py, tests/chaos/cluster.py): a
broker list of every RabbitMQ node, a two-host DSN with target_session_attrs=read-write, quorum
queues led from every node, synchronous commit that waits rather than goes on unreplicated, two
or more copies of every service spread over nodes, a PodDisruptionBudget for each; compose stays
the single-node dev stack (docs/high-availability.md says why).
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import re
import shutil
import subprocess
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import pytest
import yaml

from services.cli.main import _parser
from services.cli.registry import SERVICES
from shared.amqp.topology import build_topology
from shared.config import Settings
from shared.config_values import amqp_nodes, several_hosts
from shared.providers.registry import PROVIDERS
from tests import cluster
from tests.chaos import cluster as chaos_cluster
from tests.faults import PgCluster

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
MAKEFILE = ROOT / "Makefile"
CONFTEST = ROOT / "tests" / "conftest.py"
README = ROOT / "README.md"
CONFIGURATION_DOC = ROOT / "docs" / "configuration.md"
K8S = ROOT / "deploy" / "k8s"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
CONFIG_SOURCE = ROOT / "shared" / "config.py"
RABBITMQ_LIMITS_DOC = ROOT / "docs" / "rabbitmq-limits.md"
HA_DOC = ROOT / "docs" / "high-availability.md"

KUBERNETES_VERSION = "1.33.0"  # a recent release; its schemas ship with kubernetes-validate
IMAGE = "payhooks:0.1.0"
PORT_FIELD = {name: f"{name}_port" for name in SERVICES}  # Settings attribute per service
CRD_GROUPS = ("rabbitmq.com/", "postgresql.cnpg.io/", "monitoring.coreos.com/")
HPA_SERVICES = {"ingest", "orders", "bonuses", "email"}
PUBLIC_SERVICES = {"ingest", "api"}
SECRET_KEYS = {"XHUB_WEBHOOK_SECRETS", "ADMIN_TOKEN", "XHUB_API_KEY", "DATABASE_URL", "AMQP_URL"}
# RabbitmqCluster spec fields (rabbitmq.com/v1beta1) this repository may use.
RABBITMQ_SPEC_FIELDS = {
    "replicas", "image", "resources", "persistence", "rabbitmq", "affinity", "service",
    "tolerations", "override", "tls", "terminationGracePeriodSeconds",
}  # fmt: skip


# docs/rabbitmq-limits.md, measured on RabbitMQ 3.10: at an open-files limit of 1,024 the
# node's file handle budget is 927; a quorum queue reserves 2 + (its cluster size) handles on
# its leader's node, 2 on a follower's, and every connection takes one more. Past the budget
# no new AMQP connection completes its handshake.
RABBITMQ_MIN_NOFILE = 65536
HANDLE_BUDGET_AT_1024_FILES = 927
CONNECTIONS_HEADROOM = 150  # sockets of every payhooks pod at its HPA maximum, and some


def within_the_default_handle_budget(max_queues: int, cluster_size: int) -> bool:
    """Even where the open-files limit was left at 1,024, `max_queues` quorum queues all led
    from one node (the others down or just restarted) leave room for the connections."""
    return max_queues * (2 + cluster_size) + CONNECTIONS_HEADROOM <= HANDLE_BUDGET_AT_1024_FILES


@cache
def config_env() -> frozenset[str]:
    """The variables shared/config.py names itself: the first argument of each reader.* call."""
    names = set()
    for node in ast.walk(ast.parse(CONFIG_SOURCE.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "reader"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(node.args[0].value)
    return frozenset(names)  # type: ignore[arg-type]


def provider_env() -> frozenset[str]:
    """The variables Settings.from_env reads for the providers, as the registry names them
    (their secrets, their payment API, their options): config.py spells none of them."""
    names = set()
    for provider in PROVIDERS:
        names.add(provider.secrets_variable)
        if provider.payment_api is not None:
            names |= {provider.payment_api.url_variable, provider.payment_api.key_variable}
        names |= set(provider.options or {})
    return frozenset(names)


@cache
def known_env() -> frozenset[str]:
    """Every variable Settings.from_env reads."""
    return config_env() | provider_env()


def test_known_env_matches_the_settings() -> None:
    # One variable per Settings field but the three that hold every provider's by name: if
    # the AST walk above misses a reader call, this fails.
    by_provider = {"provider_secrets", "provider_apis", "provider_options"}
    assert by_provider <= set(Settings.__dataclass_fields__)
    assert len(config_env()) == len(Settings.__dataclass_fields__) - len(by_provider)
    # X-Hub's secrets are SPEC's own setting too (Settings.webhook_secrets).
    assert config_env() & provider_env() == {"XHUB_WEBHOOK_SECRETS"}
    assert {"DATABASE_URL", "XHUB_WEBHOOK_SECRETS", "INGEST_PORT", "LOG_LEVEL"} <= known_env()


def parses_as_cli(argv: list[str]) -> bool:
    try:
        _parser().parse_args(argv)
    except SystemExit:
        return False
    return True


def settings_from(env: dict[str, str], service: str | None = None) -> Settings:
    required: tuple[str, ...] = ()
    if service is not None:
        required = SERVICES[service].required_env(env)
    return Settings.from_env(env, required=required)


# ---------------------------------------------------------------------------------------------
# docker-compose.yml


@cache
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())  # anchors and `<<` merge keys resolved
    assert isinstance(document, dict)
    return document


def payhooks_services() -> dict[str, dict[str, Any]]:
    """Services that run the payhooks image (the test stage's image is checked on its own)."""
    return {
        name: service
        for name, service in compose()["services"].items()
        if service.get("image") == "payhooks:dev"
        or ("build" in service and "target" not in service["build"])
    }


def compose_env(service: dict[str, Any]) -> dict[str, str]:
    """The service's environment with `${VAR:-default}` taken at its default."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {key: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value)) for key, value in raw.items()}


def host_bindings(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) of every published port; no address: all."""
    bindings = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            address = entry.get("host_ip", "0.0.0.0")
            bindings.append((address, int(entry["published"]), int(entry["target"])))
            continue
        parts = str(entry).split("/")[0].split(":")
        assert len(parts) in (2, 3), f"{entry!r}: publish host ports explicitly"
        address = parts[0] if len(parts) == 3 else "0.0.0.0"
        bindings.append((address, int(parts[-2]), int(parts[-1])))
    return bindings


def host_ports(service: dict[str, Any]) -> list[int]:
    return [port for _, port, _ in host_bindings(service)]


def test_compose_has_the_payhooks_services() -> None:
    assert {"migrate", "ingest", "orders", "bonuses", "email", "api"} <= set(payhooks_services())
    for name, service in payhooks_services().items():
        assert service.get("image") == "payhooks:dev", name
        assert service["build"]["dockerfile"] == "deploy/Dockerfile", name
        assert (ROOT / service["build"]["dockerfile"]).is_file()


def test_compose_runs_every_cli_service() -> None:
    commands = {tuple(service["command"]) for service in payhooks_services().values()}
    assert {("run", name) for name in SERVICES} <= commands


def test_compose_has_the_simulator_under_the_demo_profile() -> None:
    demo = [
        service
        for service in payhooks_services().values()
        if "demo" in service.get("profiles", []) and service.get("command", [None])[0] == "sim"
    ]
    assert demo


def test_compose_commands_are_real_cli_commands() -> None:
    for name, service in payhooks_services().items():
        command = service.get("command")
        assert isinstance(command, list), f"{name}: command must be an exec-form list"
        assert parses_as_cli([str(part) for part in command]), f"{name}: {command}"


def test_compose_env_vars_are_known_settings_and_parse() -> None:
    for name, service in payhooks_services().items():
        env = compose_env(service)
        # The OpenTelemetry SDK reads the OTEL_* variables itself (shared/tracing.py).
        unknown = {k for k in set(env) - known_env() if not k.startswith("OTEL_")}
        assert not unknown, f"{name} sets variables shared/config.py never reads: {unknown}"
        command = service["command"]
        settings = settings_from(env, command[1] if command[0] == "run" else None)
        assert settings.database_url == env["DATABASE_URL"]


def test_compose_host_ports_do_not_clash() -> None:
    published = Counter(
        port for service in compose()["services"].values() for port in host_ports(service)
    )
    assert published, "nothing published"
    assert not [port for port, count in published.items() if count > 1]
    # The documented ones (README): ingest 8080 and api 8081.
    services = compose()["services"]
    assert host_ports(services["ingest"]) == [8080]
    assert host_ports(services["api"]) == [8081]


def test_compose_publishes_on_loopback_only() -> None:
    # Dev credentials (PostgreSQL with trust, guest/guest, dev secrets, anonymous Grafana):
    # never on 0.0.0.0, where the machine's network reaches them.
    for name, service in compose()["services"].items():
        for address, port, _ in host_bindings(service):
            assert address == "127.0.0.1", f"{name}: port {port} published on {address}"


def test_compose_backing_services_serve_the_default_urls() -> None:
    """`docker compose up -d --wait postgres rabbitmq`, then `make run`, `make demo` and
    `make test` with no variable set: the defaults' ports, users and passwords."""
    services = compose()["services"]
    postgres, rabbitmq = services["postgres"], services["rabbitmq"]
    defaults = Settings.from_env({})
    database = urlsplit(defaults.database_url)
    broker = urlsplit(defaults.amqp_url)
    assert (database.hostname, database.port, broker.hostname, broker.port) == (
        "127.0.0.1", 5432, "127.0.0.1", 5672,
    )  # fmt: skip
    assert ("127.0.0.1", 5432, 5432) in host_bindings(postgres)
    assert ("127.0.0.1", 5672, 5672) in host_bindings(rabbitmq)
    assert ("127.0.0.1", 15672, 15672) in host_bindings(rabbitmq)  # management UI
    # The tests' defaults (tests/conftest.py) are the same servers and users.
    conftest = CONFTEST.read_text()
    for variable, default in (("TEST_DATABASE_URL", database), ("TEST_AMQP_URL", broker)):
        match = re.search(rf'"{variable}",\s*"([^"]+)"', conftest)
        assert match, variable
        test_url = urlsplit(match.group(1))
        assert (test_url.hostname, test_url.port) == (default.hostname, default.port), variable
        assert (test_url.username, test_url.password) == (default.username, default.password)
    # PostgreSQL: the default's user, and no password asked when the default has none.
    environment = postgres["environment"]
    assert database.username == environment.get("POSTGRES_USER", "postgres")
    if database.password is None:
        assert environment.get("POSTGRES_HOST_AUTH_METHOD") == "trust"
    else:
        assert environment.get("POSTGRES_PASSWORD") == database.password
    # The services inside compose log in as the default user too (one set of dev credentials).
    inside = urlsplit(compose_env(services["ingest"])["DATABASE_URL"])
    assert (inside.username, inside.password) == (database.username, database.password)
    # RabbitMQ: definitions.json holds the compose AMQP_URL's user (compose_rabbitmq_max_queues
    # checks its password hash); the default URL logs in with the same.
    inside = urlsplit(compose_env_amqp_url())
    assert (inside.username, inside.password) == (broker.username, broker.password)
    compose_rabbitmq_max_queues()
    # Healthy means accepting connections (`--wait` waits for it), not merely running.
    assert "127.0.0.1" in postgres["healthcheck"]["test"]  # pg_isready over TCP
    assert "check_port_connectivity" in rabbitmq["healthcheck"]["test"]


def test_compose_depends_on_and_healthchecks() -> None:
    services = compose()["services"]
    for name, service in services.items():
        depends = service.get("depends_on", {})
        targets = depends if isinstance(depends, list) else list(depends)
        for target in targets:
            assert target in services, f"{name} depends on unknown {target}"
        if isinstance(depends, dict):
            for target, rule in depends.items():
                if rule.get("condition") == "service_healthy":
                    assert "healthcheck" in services[target], f"{target} has no healthcheck"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["migrate"].get("restart") == "no"
    for name, service in payhooks_services().items():
        if name == "migrate":
            continue
        depends = service["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["rabbitmq"]["condition"] == "service_healthy", name
        if service["command"][0] == "sim":
            continue  # a one-shot job, not a server: nothing to probe
        # The healthcheck asks the service's own /readyz on the port its settings give it.
        test = " ".join(service["healthcheck"]["test"])
        match = re.search(r"http://127\.0\.0\.1:(\d+)/readyz", test)
        assert match, f"{name}: healthcheck does not call /readyz"
        port = getattr(settings_from(compose_env(service)), PORT_FIELD[name])
        assert int(match.group(1)) == port, name


def compose_rabbitmq_max_queues() -> int:
    """The vhost / queue cap of compose's RabbitMQ (its definitions file)."""
    rabbit = compose()["services"]["rabbitmq"]
    mounts = {}
    for volume in rabbit["volumes"]:
        source, target, *mode = volume.split(":")
        assert mode == ["ro"], volume
        mounts[target] = ROOT / source
    conf_d = [t for t in mounts if re.fullmatch(r"/etc/rabbitmq/conf\.d/\d\d-[\w-]+\.conf", t)]
    assert len(conf_d) == 1, "mount one file into the image's conf.d"
    conf = mounts[conf_d[0]].read_text()
    (target,) = re.findall(r"^load_definitions\s*=\s*(\S+)\s*$", conf, re.MULTILINE)
    definitions = json.loads(mounts[target].read_text())
    (limits,) = [
        p["value"]
        for p in definitions["parameters"]
        if p["component"] == "vhost-limits" and p["vhost"] == "/"
    ]
    # Definitions replace the default user: the file must carry the one AMQP_URL uses.
    parts = re.match(r"amqp://([^:]+):([^@]+)@rabbitmq:5672/$", compose_env_amqp_url())
    assert parts, compose_env_amqp_url()
    (user,) = [u for u in definitions["users"] if u["name"] == parts.group(1)]
    assert user["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    salted = base64.b64decode(user["password_hash"])
    salt, digest = salted[:4], salted[4:]
    assert hashlib.sha256(salt + parts.group(2).encode()).digest() == digest, "wrong password"
    assert {"user": user["name"], "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"} in (
        definitions["permissions"]
    )
    assert {"name": "/"} in definitions["vhosts"]
    max_queues = limits["max-queues"]
    assert isinstance(max_queues, int)
    return max_queues


def compose_env_amqp_url() -> str:
    return compose_env(compose()["services"]["ingest"])["AMQP_URL"]


def test_compose_rabbitmq_has_enough_open_files_and_a_queue_cap() -> None:
    rabbit = compose()["services"]["rabbitmq"]
    nofile = rabbit["ulimits"]["nofile"]
    assert nofile["soft"] >= RABBITMQ_MIN_NOFILE
    assert nofile["hard"] >= nofile["soft"]
    max_queues = compose_rabbitmq_max_queues()
    # payhooks needs 22 queues with the default RETRY_DELAYS; the rest is room for a changed
    # ladder (new retry queues) and the DLQ readers' lock queues.
    assert max_queues >= 50
    assert within_the_default_handle_budget(max_queues, cluster_size=1)
    assert "docs/rabbitmq-limits.md" in COMPOSE.read_text()


def dockerfile_stages() -> dict[str, list[str]]:
    """Instructions per stage of deploy/Dockerfile (continuation lines joined); unnamed: final."""
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            words = line.split()
            current = stages.setdefault(words[3] if len(words) == 4 else "final", [])
        current.append(line)
    return stages


def test_dockerfile_has_a_build_a_test_and_a_non_root_final_stage() -> None:
    stages = dockerfile_stages()
    assert list(stages) == ["build", "test", "final"]
    for instructions in stages.values():
        base = instructions[0].split()[1]
        assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*", base), f"unpinned base {base}"
    final = stages["final"]
    assert "COPY --from=build /install /usr/local" in final
    assert any(i.startswith("USER ") and i.split()[1] not in ("root", "0") for i in final)
    assert final[-2:] == ['ENTRYPOINT ["payhooks"]', 'CMD ["run", "ingest"]']
    test = stages["test"]
    assert "RUN make install" in test
    assert test[-1] == 'CMD ["make", "test"]'


def test_compose_test_service_runs_make_test_against_compose_services() -> None:
    services = compose()["services"]
    test = services["test"]
    assert test["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile", "target": "test"}
    assert test["image"] != "payhooks:dev"  # never the runtime image's tag
    # Under a profile: `docker compose up` leaves it out, `docker compose run --rm test` runs it.
    assert test["profiles"] == ["test"]
    assert test["restart"] == "no"
    command = test["command"]
    assert command[0] == "make"
    assert re.search(rf"^{command[1]}:", MAKEFILE.read_text(), re.MULTILINE), command
    # It sets exactly the variables tests/conftest.py reads, pointing at compose's services.
    read_by_conftest = set(
        re.findall(r'os\.environ\.get\(\s*"(TEST_[A-Z_]+)"', CONFTEST.read_text())
    )
    assert set(test["environment"]) == read_by_conftest == {"TEST_DATABASE_URL", "TEST_AMQP_URL"}
    assert "@postgres:5432/" in test["environment"]["TEST_DATABASE_URL"]
    assert "@rabbitmq:5672/" in test["environment"]["TEST_AMQP_URL"]
    assert test["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "rabbitmq": {"condition": "service_healthy"},
    }


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def readme_section(title: str) -> str:
    return section(README.read_text(), title)


def test_readme_start_here_commands_exist() -> None:
    start = readme_section("Start here")
    targets = set(re.findall(r"^([a-z-]+):", MAKEFILE.read_text(), re.MULTILINE))
    for target in ("run", "demo", "test"):
        assert f"`make {target}`" in start, target
        assert target in targets, target
    assert "`docker compose up`" in start
    assert "`docker compose run --rm test`" in start
    # Docker for the backing services only, then the make targets on this machine.
    backing = re.search(r"`docker compose up -d --wait ([a-z ]+)`", start)
    assert backing, "README's command for PostgreSQL and RabbitMQ in Docker"
    assert backing.group(1).split() == ["postgres", "rabbitmq"]
    assert "test" in compose()["services"]
    demo = re.search(
        r"`RECONCILE_AFTER=(\d+) RECONCILE_INTERVAL=(\d+) docker compose --profile demo up`", start
    )
    assert demo, "README's compose demo command"
    # SPEC 6: a lost webhook is repaired within RECONCILE_AFTER + 2 x RECONCILE_INTERVAL; the
    # simulator must keep its payments API up that long, or the demo fails its own check.
    command = compose()["services"]["simulator"]["command"]
    linger = float(command[command.index("--linger") + 1])
    assert int(demo.group(1)) + 2 * int(demo.group(2)) < linger
    reconciler_env = compose()["services"]["reconciler"]["environment"]
    assert reconciler_env["RECONCILE_AFTER"].startswith("${RECONCILE_AFTER:-")
    assert reconciler_env["RECONCILE_INTERVAL"].startswith("${RECONCILE_INTERVAL:-")
    for link in re.findall(r"\]\(([^)#]+)\)", README.read_text()):
        assert (ROOT / link).exists(), f"README links to missing {link}"


def documented_settings(text: str) -> set[str]:
    """The variables the first column of a section's tables names."""
    first_cells = [line.split("|")[1] for line in text.splitlines() if line[:1] == "|"]
    return {name for cell in first_cells for name in re.findall(r"`([A-Z0-9_]+)`", cell)}


def test_configuration_page_names_every_setting() -> None:
    documented = documented_settings(section(CONFIGURATION_DOC.read_text(), "Every variable"))
    assert known_env() <= documented, known_env() - documented
    assert documented <= known_env(), documented - known_env()


def test_readme_configuration_table_names_only_settings() -> None:
    documented = documented_settings(readme_section("Configuration"))
    assert documented, "README's short configuration table"
    assert documented <= known_env(), documented - known_env()
    assert "docs/configuration.md" in readme_section("Configuration")


# ---------------------------------------------------------------------------------------------
# deploy/k8s


@cache
def kustomization() -> dict[str, Any]:
    document = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert isinstance(document, dict)
    return document


@cache
def manifests() -> tuple[dict[str, Any], ...]:
    """The manifest files kustomization.yaml lists (folders it lists: `generated()`)."""
    documents = []
    for name in kustomization()["resources"]:
        if (K8S / name).is_dir():
            continue
        for document in yaml.safe_load_all((K8S / name).read_text()):
            if document is not None:
                assert isinstance(document, dict), name
                documents.append(document)
    return tuple(documents)


@cache
def generated() -> tuple[dict[str, Any], ...]:
    """The ConfigMaps the kustomizations in folders kustomization.yaml lists generate, built
    here as kustomize builds them (names fixed: no hash suffix)."""
    documents = []
    for name in kustomization()["resources"]:
        folder = K8S / name
        if not folder.is_dir():
            continue
        document = yaml.safe_load((folder / "kustomization.yaml").read_text())
        assert set(document) <= {"apiVersion", "kind", "configMapGenerator"}, name
        for generator in document["configMapGenerator"]:
            options = generator.get("options", {})
            assert options.get("disableNameSuffixHash") is True, generator["name"]
            data = {}
            for entry in generator["files"]:
                key, _, path = entry.rpartition("=")
                source = (folder / path).resolve()
                assert source.is_relative_to(folder.resolve()), "kustomize refuses it"
                data[key or source.name] = source.read_text()
            metadata = {
                "name": generator["name"],
                **{k: options[k] for k in ("labels", "annotations") if k in options},
            }
            documents.append(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}
            )
    return tuple(documents)


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in manifests() if d["kind"] == kind}


@cache
def k8s_env() -> dict[str, str]:
    """ConfigMap data plus the Secret's (placeholder) values: what every pod gets via envFrom."""
    (config,) = of_kind("ConfigMap").values()
    (secret,) = of_kind("Secret").values()
    return {**config["data"], **secret["stringData"]}


def test_kustomization_lists_every_manifest_and_only_existing_ones() -> None:
    listed = kustomization()["resources"]
    assert len(listed) == len(set(listed))
    folders = {name for name in listed if (K8S / name).is_dir()}
    for name in set(listed) - folders:
        assert (K8S / name).is_file(), f"kustomization.yaml lists missing {name}"
    for name in folders:
        assert (K8S / name / "kustomization.yaml").is_file(), name
    assert folders == {"../grafana"}
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk == set(listed) - folders, "a manifest in deploy/k8s is not in kustomization.yaml"


def test_kustomize_build() -> None:
    if shutil.which("kustomize"):
        command = ["kustomize", "build", str(K8S)]
    elif shutil.which("kubectl"):
        command = ["kubectl", "kustomize", str(K8S)]
    else:
        pytest.skip("neither kustomize nor kubectl installed")
    built = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
    documents = [d for d in yaml.safe_load_all(built.stdout) if d]
    assert len(documents) == len(manifests()) + len(generated())
    for expected in generated():
        (built_one,) = [
            d
            for d in documents
            if (d["kind"], d["metadata"]["name"]) == ("ConfigMap", expected["metadata"]["name"])
        ]
        assert built_one["data"] == expected["data"]
        assert built_one["metadata"]["labels"].items() >= expected["metadata"]["labels"].items()
    for document in documents:
        if document["kind"] != "Namespace":
            assert document["metadata"]["namespace"] == "payhooks", document["metadata"]
        assert document["metadata"]["labels"]["app.kubernetes.io/part-of"] == "payhooks"


def test_core_kinds_validate_against_the_kubernetes_schemas() -> None:
    core = [d for d in manifests() if not d["apiVersion"].startswith(CRD_GROUPS)]
    assert len(core) > 20
    for document in core:
        try:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = f"{document['kind']}/{document['metadata']['name']}"
            pytest.fail(f"{where}: {e.message} at {list(e.path)}")


def test_custom_resources_have_the_expected_structure() -> None:
    by_kind = Counter((d["apiVersion"], d["kind"]) for d in manifests())
    assert by_kind[("rabbitmq.com/v1beta1", "RabbitmqCluster")] == 1
    assert by_kind[("postgresql.cnpg.io/v1", "Cluster")] == 1
    assert by_kind[("monitoring.coreos.com/v1", "ServiceMonitor")] >= 1
    assert by_kind[("monitoring.coreos.com/v1", "PrometheusRule")] == 1

    (rabbit,) = of_kind("RabbitmqCluster").values()
    assert rabbit["spec"]["replicas"] == 3
    assert set(rabbit["spec"]) <= RABBITMQ_SPEC_FIELDS

    (postgres,) = of_kind("Cluster").values()
    assert postgres["spec"]["instances"] == 3
    assert postgres["spec"]["bootstrap"]["initdb"] == {"database": "payhooks", "owner": "payhooks"}
    assert {"storage", "resources", "postgresql"} <= set(postgres["spec"])
    # DATABASE_URL and AMQP_URL name the Cluster's Services and the RabbitmqCluster's nodes:
    # test_k8s_database_url_is_two_hosts_read_write, test_k8s_amqp_url_lists_every_node.

    services = of_kind("Service")
    for monitor in of_kind("ServiceMonitor").values():
        spec = monitor["spec"]
        assert spec["endpoints"]
        assert all(e["path"] == "/metrics" for e in spec["endpoints"])
        (expression,) = spec["selector"]["matchExpressions"]
        assert expression["key"] == "app.kubernetes.io/name"
        assert expression["operator"] == "In"
        assert set(expression["values"]) == set(SERVICES)  # every service's /metrics
        for name in expression["values"]:
            port_names = {p["name"] for p in services[name]["spec"]["ports"]}
            assert {e["port"] for e in spec["endpoints"]} <= port_names, name
            assert services[name]["metadata"]["labels"][expression["key"]] == name


def test_grafana_sidecar_gets_the_dashboard_from_its_one_file() -> None:
    """kube-prometheus-stack's Grafana sidecar loads every ConfigMap labelled
    grafana_dashboard: "1"; the data is deploy/grafana/dashboards/payhooks.json itself."""
    (dashboard,) = generated()
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard_file = ROOT / "deploy" / "grafana" / "dashboards" / "payhooks.json"
    assert dashboard["data"] == {"payhooks.json": dashboard_file.read_text()}
    assert json.loads(dashboard["data"]["payhooks.json"])["uid"] == "payhooks"
    # kubectl apply keeps a copy in an annotation, whose total is capped at 256 KiB.
    assert len(dashboard_file.read_bytes()) < 200_000
    kubernetes_validate.validate(dashboard, KUBERNETES_VERSION, strict=True)


def test_rabbitmq_cluster_raises_open_files_and_caps_queues() -> None:
    (rabbit,) = of_kind("RabbitmqCluster").values()
    pod = rabbit["spec"]["override"]["statefulSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "rabbitmq"  # the operator's container, merged by name
    shell, flag, script = container["command"]
    assert (shell, flag) == ("sh", "-c")
    subprocess.run(["sh", "-n", "-c", script], check=True, timeout=10)
    lines = script.strip().splitlines()
    # Raised first, and the start refused where it can't be; then the image's own start.
    nofile = re.fullmatch(r"ulimit -n (\d+) \|\| exit 1", lines[0])
    assert nofile, lines[0]
    assert int(nofile.group(1)) >= RABBITMQ_MIN_NOFILE
    assert lines[-1] == "exec docker-entrypoint.sh rabbitmq-server"
    assert "args" not in container
    limit = re.search(r"set_vhost_limits -p / '(\{[^']*\})'", script)
    assert limit, "the vhost's queue cap"
    max_queues = json.loads(limit.group(1))["max-queues"]
    assert max_queues == compose_rabbitmq_max_queues(), "compose and k8s cap queues alike"
    assert within_the_default_handle_budget(max_queues, rabbit["spec"]["replicas"])
    assert "docs/rabbitmq-limits.md" in (K8S / "rabbitmq.yaml").read_text()
    assert RABBITMQ_LIMITS_DOC.is_file()


def test_prometheus_rule_equals_the_alert_rules() -> None:
    (rule,) = of_kind("PrometheusRule").values()
    alerts = yaml.safe_load(ALERTS.read_text())
    assert rule["spec"] == {"groups": alerts["groups"]}, (
        "deploy/k8s/prometheusrule.yaml differs from deploy/prometheus/alerts.yml: copy it again"
    )


def test_a_deployment_per_service_from_one_image() -> None:
    deployments = of_kind("Deployment")
    assert set(deployments) == set(SERVICES)
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["image"] == IMAGE
        assert container["args"] == ["run", name]
        assert parses_as_cli(container["args"])
        assert {"command"}.isdisjoint(container), "keep the image's ENTRYPOINT (payhooks)"
        assert deployment["spec"]["selector"]["matchLabels"].items() <= (
            deployment["spec"]["template"]["metadata"]["labels"].items()
        )


def test_probes_use_the_port_from_the_settings() -> None:
    settings = settings_from(k8s_env())
    for name, deployment in of_kind("Deployment").items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        port = getattr(settings, PORT_FIELD[name])
        assert [p["containerPort"] for p in container["ports"]] == [port], name
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}


def test_pods_are_non_root_with_resources() -> None:
    pods = [d["spec"]["template"]["spec"] for d in of_kind("Deployment").values()]
    pods += [j["spec"]["template"]["spec"] for j in of_kind("Job").values()]
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for container in pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert {"cpu", "memory"} <= set(container["resources"]["requests"])
            assert {"cpu", "memory"} <= set(container["resources"]["limits"])
            refs = {next(iter(source.values()))["name"] for source in container.get("envFrom", [])}
            assert refs == set(of_kind("ConfigMap")) | set(of_kind("Secret"))


def test_migrate_job() -> None:
    (job,) = of_kind("Job").values()
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE
    assert container["args"] == ["migrate"]
    assert parses_as_cli(container["args"])


def test_services_pdbs_and_hpas() -> None:
    deployments = of_kind("Deployment")
    services = of_kind("Service")
    assert set(services) >= PUBLIC_SERVICES
    for name in PUBLIC_SERVICES:
        assert services[name]["spec"].get("clusterIP") != "None"
    for name, service in services.items():
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        (container,) = deployments[name]["spec"]["template"]["spec"]["containers"]
        port_names = {p["name"] for p in container["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names

    pdbs = of_kind("PodDisruptionBudget")
    (rabbit,) = of_kind("RabbitmqCluster")
    assert set(pdbs) == set(deployments) | {rabbit}  # CloudNativePG makes its own
    for name in deployments:
        pdb = pdbs[name]
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()

    hpas = of_kind("HorizontalPodAutoscaler")
    assert {h["spec"]["scaleTargetRef"]["name"] for h in hpas.values()} == HPA_SERVICES
    for hpa in hpas.values():
        target = hpa["spec"]["scaleTargetRef"]
        assert target["kind"] == "Deployment"
        assert target["name"] in deployments
        assert "replicas" not in deployments[target["name"]]["spec"], "the HPA owns replicas"
        assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    (ingest_metric,) = hpas["ingest"]["spec"]["metrics"]
    assert ingest_metric["resource"]["name"] == "cpu"


def test_ingress_terminates_tls_for_ingest() -> None:
    (ingress,) = of_kind("Ingress").values()
    assert ingress["spec"]["tls"]
    assert ingress["spec"]["tls"][0]["secretName"]
    hosts = {rule["host"] for rule in ingress["spec"]["rules"]}
    assert hosts <= set(ingress["spec"]["tls"][0]["hosts"])
    backends = {
        path["backend"]["service"]["name"]
        for rule in ingress["spec"]["rules"]
        for path in rule["http"]["paths"]
    }
    assert backends == {"ingest"}
    # SPEC: TLS ends at the ingress when ingest itself has no certificate.
    assert not {"INGEST_TLS_CERT", "INGEST_TLS_KEY"} & set(k8s_env())


def test_configmap_and_secret_hold_known_settings_only() -> None:
    (config,) = of_kind("ConfigMap").values()
    (secret,) = of_kind("Secret").values()
    assert set(config["data"]) | set(secret["stringData"]) <= known_env()
    assert set(secret["stringData"]) == SECRET_KEYS
    assert not set(config["data"]) & set(secret["stringData"])
    assert "data" not in secret, "placeholders only, in stringData"
    for key, value in secret["stringData"].items():
        assert "REPLACE_ME" in value, f"{key}: the Secret manifest holds placeholders only"
    # Every service starts with these (its REQUIRED_ENV set, every value well-formed).
    for name in SERVICES:
        settings_from(k8s_env(), name)


# ---------------------------------------------------------------------------------------------
# High availability: what `make chaos-cluster` measured (tests/cluster.py, tests/chaos/cluster.py,
# docs/high-availability.md), in deploy/k8s


def rabbitmq_config() -> dict[str, str]:
    """The RabbitmqCluster's additionalConfig as key = value pairs (comments left out)."""
    (rabbit,) = of_kind("RabbitmqCluster").values()
    pairs = {}
    for line in rabbit["spec"]["rabbitmq"]["additionalConfig"].splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def alert_expression(name: str) -> str:
    (rule,) = [
        rule
        for group in yaml.safe_load(ALERTS.read_text())["groups"]
        for rule in group["rules"]
        if rule.get("alert") == name
    ]
    return str(rule["expr"])


def test_k8s_database_url_is_two_hosts_read_write() -> None:
    """As the one-box stack's: several hosts, only the one taking writes used (each pool then
    checks once a second that its server still does). Here the Cluster's read-write Service
    first, its every-instance Service second."""
    (postgres,) = of_kind("Cluster").values()
    name = postgres["metadata"]["name"]
    dsn = k8s_env()["DATABASE_URL"]
    url = urlsplit(dsn)
    assert url.netloc.rpartition("@")[2].split(",") == [f"{name}-rw:5432", f"{name}-r:5432"]
    assert url.path == "/" + postgres["spec"]["bootstrap"]["initdb"]["database"]
    assert parse_qs(url.query) == {"target_session_attrs": ["read-write"]}
    assert several_hosts(dsn)
    measured = cluster.PgPair(PgCluster("15", "a", 1), PgCluster("15", "b", 2)).database_url()
    assert urlsplit(measured).query == url.query
    assert settings_from(k8s_env()).database_url == dsn


def test_k8s_amqp_url_lists_every_node() -> None:
    """A broker list, tried in turn on connect and reconnect: every pod of the RabbitmqCluster
    by its name under the operator's headless Service, as the one-box stack lists its nodes."""
    (rabbit,) = of_kind("RabbitmqCluster").values()
    name = rabbit["metadata"]["name"]
    nodes = amqp_nodes(k8s_env()["AMQP_URL"])
    hosts = [urlsplit(node).hostname for node in nodes]
    assert hosts == [f"{name}-server-{i}.{name}-nodes" for i in range(rabbit["spec"]["replicas"])]
    assert {urlsplit(node).port for node in nodes} == {5672}
    assert {urlsplit(node).path for node in nodes} == {"/"}
    assert len({(urlsplit(n).username, urlsplit(n).password) for n in nodes}) == 1
    assert settings_from(k8s_env()).amqp_url == k8s_env()["AMQP_URL"]


def test_rabbitmq_cluster_runs_quorum_queues_on_three_nodes_as_measured() -> None:
    (rabbit,) = of_kind("RabbitmqCluster").values()
    assert rabbit["spec"]["replicas"] == cluster.NODES == 3
    config = rabbitmq_config()
    # Leaders spread over the nodes, as on the one-box nodes (tests/cluster.py writes it).
    assert config["queue_leader_locator"] == "balanced"
    assert "queue_leader_locator = balanced" in Path(cluster.__file__).read_text()
    assert config["cluster_partition_handling"] == "pause_minority"
    # Every payhooks queue a quorum queue with no group size: a member on each of the 3 nodes.
    settings = settings_from(k8s_env())
    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    assert topology.queues
    for spec in topology.queues:
        assert spec.arguments.get("x-queue-type") == "quorum", spec.name
        assert "x-quorum-initial-group-size" not in spec.arguments, spec.name
    assert not any(key.startswith("quorum_queue.") for key in config), "no group size set"
    # PayhooksQuorumQueueReplicasOffline counts members against the nodes there are.
    assert alert_expression("PayhooksQuorumQueueReplicasOffline").endswith(
        f"< {rabbit['spec']['replicas']}"
    )
    # One node per Kubernetes node; a drain takes one at a time (a majority stays).
    (term,) = rabbit["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    pods = {"app.kubernetes.io/name": rabbit["metadata"]["name"]}
    assert term["labelSelector"]["matchLabels"] == pods
    pdb = of_kind("PodDisruptionBudget")[rabbit["metadata"]["name"]]
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": pods}}


def test_cloudnativepg_commits_synchronously_as_measured() -> None:
    """A commit is on the primary and a standby before it returns (synchronous_commit as the
    one-box stack's), and with no standby streaming commits wait, as they did in
    make chaos-cluster's standby-stop round, instead of going on unreplicated."""
    (postgres,) = of_kind("Cluster").values()
    spec = postgres["spec"]
    standbys = spec["instances"] - 1
    assert standbys >= 1
    assert spec["postgresql"]["synchronous"] == {
        "method": "any", "number": 1, "dataDurability": "required",
    }  # fmt: skip
    assert spec["postgresql"]["synchronous"]["number"] <= standbys
    # The legacy fields drop to asynchronous commit when no standby is left (and CloudNativePG
    # refuses them beside `synchronous`).
    assert not {"minSyncReplicas", "maxSyncReplicas"} & set(spec)
    parameters = spec["postgresql"]["parameters"]
    assert parameters["synchronous_commit"] == cluster.SYNCHRONOUS_COMMIT == "on"
    assert "synchronous_standby_names" not in parameters  # the operator's
    # Every instance on its own node; the operator's PDBs kept.
    assert spec["affinity"] == {
        "enablePodAntiAffinity": True,
        "topologyKey": "kubernetes.io/hostname",
        "podAntiAffinityType": "required",
    }
    assert spec.get("enablePDB", True) is True
    # The standby alerts count the standbys there are.
    assert (
        alert_expression("PayhooksPostgresStandbyNotStreaming").rstrip().endswith(f"< {standbys}")
    )
    assert alert_expression("PayhooksPostgresNoStandbyStreaming").rstrip().endswith("< 1")


def test_every_service_runs_two_copies_on_two_nodes_with_a_pdb() -> None:
    """`payhooks run all --replicas 2` as Deployments: at least the copies chaos-cluster ran,
    spread over nodes, a PDB that leaves one running, a rollout that adds before it removes."""
    assert chaos_cluster.REPLICAS == 2
    deployments = of_kind("Deployment")
    hpas = {
        h["spec"]["scaleTargetRef"]["name"]: h for h in of_kind("HorizontalPodAutoscaler").values()
    }
    pdbs = of_kind("PodDisruptionBudget")
    for name, deployment in deployments.items():
        spec = deployment["spec"]
        fewest = hpas[name]["spec"]["minReplicas"] if name in hpas else spec["replicas"]
        assert fewest >= chaos_cluster.REPLICAS, name
        assert pdbs[name]["spec"]["maxUnavailable"] == 1, name
        assert "minAvailable" not in pdbs[name]["spec"], name
        assert spec["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}, name
        pod = spec["template"]["spec"]
        (spread,) = pod["topologySpreadConstraints"]
        assert spread["topologyKey"] == "kubernetes.io/hostname", name
        assert spread["maxSkew"] == 1, name
        assert spread["whenUnsatisfiable"] == "DoNotSchedule", name  # not merely preferred
        assert spread["nodeTaintsPolicy"] == "Honor", name  # cordoned nodes don't count
        assert spread["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"], name
        # A stopping copy finishes what it took (the rolling-restart round: no 5xx).
        assert pod["terminationGracePeriodSeconds"] >= 30, name


def test_compose_stays_the_single_node_dev_stack_and_the_docs_say_so() -> None:
    """docs/high-availability.md decides it: compose is one Docker host (one failure domain),
    the measured HA stack is `make cluster-up`, the deployed one deploy/k8s."""
    services = compose()["services"]
    images = [str(s.get("image", "")) for s in services.values()]
    assert len([i for i in images if i.startswith("rabbitmq:")]) == 1
    assert len([i for i in images if i.startswith("postgres:")]) == 1
    assert "docs/high-availability.md" in COMPOSE.read_text()
    text = HA_DOC.read_text()
    section = text.split("\n## Running it highly available\n", 1)[1].split("\n## ", 1)[0]
    for needed in (
        "make cluster-up", "export AMQP_URL=", "export DATABASE_URL=",
        "payhooks run all --replicas 2", "make chaos-cluster", "make cluster-down",
        "deploy/k8s", "docker-compose.yml",
    ):  # fmt: skip
        assert needed in section, needed
