"""The layout rules of STYLE.md that a reader relies on, checked on the source (no I/O).

SQL lives in shared/queries/ (DML) and shared/migrations/ (DDL); domain modules take values and
return decisions, importing no I/O library; shared/ imports nothing from services/, neither
statically nor by name.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Besides shared/queries/: migrate.py keeps its own bookkeeping table, db.py pings readiness.
SQL_ALLOWED = {ROOT / "shared" / "migrate.py", ROOT / "shared" / "db.py"}
DML = re.compile(r"^\s*(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM|WITH \w+ AS)\b")
DOMAIN_MODULES = [
    ROOT / "shared" / "order_machine.py",
    ROOT / "shared" / "bonus_rules.py",
    ROOT / "shared" / "vocabulary.py",
    ROOT / "shared" / "providers" / "xhub" / "events.py",
    ROOT / "shared" / "providers" / "xhub" / "signatures.py",
    ROOT / "services" / "ingest" / "webhook.py",
    ROOT / "services" / "sim" / "delivery_rules.py",
]
# Stand-ins for a service in a benchmark: they run the service's statements (the rest of
# bench/ seeds and checks with SQL of its own).
BASELINES = [ROOT / "bench" / "naive_ingest.py"]
# The composition root: the one service that imports the others (to run them by name).
COMPOSITION_ROOT = "cli"
IO_LIBRARIES = {"asyncpg", "aio_pika", "aiormq", "aiohttp", "socket", "structlog"}


def sources(*folders: str) -> Iterator[Path]:
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


def imported_modules(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_sql_outside_shared_queries() -> None:
    offenders = []
    for path in [*sources("shared", "services"), *BASELINES]:
        if path in SQL_ALLOWED or (ROOT / "shared" / "queries") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            is_text = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if is_text and DML.match(node.value):  # type: ignore[attr-defined]
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")  # type: ignore[attr-defined]
    assert offenders == []


def test_the_sql_check_sees_sql() -> None:
    assert DML.match("SELECT payment_id FROM orders")
    assert DML.match(" DELETE FROM inbox_unpublished WHERE id = ANY($1)")
    assert not DML.match("Select the orders a reconciler should ask about.")


def test_domain_modules_import_no_io_library() -> None:
    for path in DOMAIN_MODULES:
        roots = {name.split(".")[0] for name in imported_modules(ast.parse(path.read_text()))}
        assert not roots & IO_LIBRARIES, f"{path.relative_to(ROOT)} imports {roots & IO_LIBRARIES}"


def _imports_by_name(tree: ast.AST) -> list[str]:
    """Modules named in strings or loaded by name (importlib, __import__): hidden imports."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"services(\.\w+)+", node.value):
                found.append(node.value)
        elif isinstance(node, ast.Attribute) and node.attr == "import_module":
            found.append("importlib.import_module")
        elif isinstance(node, ast.Name) and node.id == "__import__":
            found.append("__import__")
    return found


def test_shared_imports_nothing_from_services() -> None:
    for path in sources("shared"):
        tree = ast.parse(path.read_text())
        services = {name for name in imported_modules(tree) if name.split(".")[0] == "services"}
        assert not services, f"{path.relative_to(ROOT)} imports {services}"
        assert _imports_by_name(tree) == [], f"{path.relative_to(ROOT)} imports by name"


def test_the_import_check_sees_hidden_imports() -> None:
    hidden = "import importlib\ndef f():\n    return importlib.import_module('services.sim.run')"
    assert _imports_by_name(ast.parse(hidden)) == ["importlib.import_module", "services.sim.run"]
    inner = ast.parse("def f():\n    from services.ingest import app")
    assert imported_modules(inner) == {"services.ingest"}


def test_no_service_imports_a_sibling() -> None:
    offenders = []
    for path in sources("services"):
        own = path.relative_to(ROOT / "services").parts[0]
        if own == COMPOSITION_ROOT or path.parent == ROOT / "services":
            continue
        tree = ast.parse(path.read_text())
        for name in imported_modules(tree) | set(_imports_by_name(tree)):
            parts = name.split(".")
            if parts[0] == "services" and len(parts) > 1 and parts[1] != own:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


# An operator action done or recorded anywhere but shared/ops/operator_actions.py (found by its
# name, wherever it lives) could skip the audit: the edges call that module's functions.
# By the defining module's own name, so that moving it into a sub-package keeps the rule.
ACTIONS = {
    "dlq_moves": {"requeue", "purge"},
    "audit": {"record", "Action"},
    "orders": {"register_order"},
    "worker_controls": {"pause", "resume", "throttle", "unthrottle"},
}
ACTION_ATTRIBUTES = {("dlq_moves", "requeue"), ("dlq_moves", "purge"), ("audit", "record")}
ACTION_ATTRIBUTES |= {("audit", "Action"), ("orders_sql", "register_order")}
ACTION_ATTRIBUTES |= {("worker_sql", a) for a in ("pause", "resume", "throttle", "unthrottle")}
# The queries that define them, and the simulator, which plays the shop (its orders are no
# operator's). operator_actions.py is known by its name, wherever it lives.
ACTIONS_DEFINED = {ROOT / "services" / "sim" / "scenario.py"}


def unaudited_actions(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            wanted = ACTIONS.get(node.module.rsplit(".", 1)[-1], set())
            found += [a.name for a in node.names if a.name in wanted]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr) in ACTION_ATTRIBUTES
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_operator_actions_are_done_and_audited_in_one_module() -> None:
    offenders = []
    for path in sources("shared", "services"):
        queries = (ROOT / "shared" / "queries") in path.parents
        if path.stem == "operator_actions" or path in ACTIONS_DEFINED or queries:
            continue
        for name in unaudited_actions(ast.parse(path.read_text())):
            offenders.append(f"{path.relative_to(ROOT)} uses {name}")
    assert offenders == []


def test_the_action_check_sees_actions() -> None:
    code = (
        "from shared.ops.dlq_moves import Selection, requeue\n"
        "from shared.queries import audit\n"
        "async def f(db):\n    await audit.record(db, audit.Action('a', 'api', 'x', 't'))"
    )
    assert unaudited_actions(ast.parse(code)) == ["requeue", "audit.record", "audit.Action"]


# shared/ as a map: a concern is found by its folder, and a folder leans only on those below it.
# process/ runs one service process; amqp/ is RabbitMQ plumbing; worker/ is the worker runtime;
# ops/ is what operators read and move. The ground (shared/'s own modules, queries/, xhub/) is
# config, errors, words, domain and SQL, which every folder may use.
WINGS = ("amqp", "worker", "ops", "process")
GROUND = ""  # a module at shared/'s top level, or in a folder that is no wing
NEVER = {
    "process": {"amqp", "worker", "ops"},  # serving a process knows no broker, worker or operator
    "amqp": {"worker", "ops"},  # plumbing knows nothing of who consumes or reads
    "worker": {"ops"},  # the runtime and the operators' reads are siblings, neither above
    "ops": {"worker"},  # ... so the DLQ reads take int_header from vocabulary, not failures
    GROUND: {"worker", "ops"},  # the ground stands under both top floors
}
# Beyond this, a new module belongs in a folder (or a new one): a newcomer reads shared/ as a map.
MAX_TOP_LEVEL_MODULES = 15


def _wing_of(path: Path) -> str:
    parts = path.relative_to(ROOT / "shared").parts
    return parts[0] if len(parts) > 1 and parts[0] in WINGS else GROUND


def _wings_imported(tree: ast.AST) -> set[str]:
    """The wings of shared/ a module imports: `shared.ops.dlq`, `from shared.ops import dlq`,
    `from shared import ops`, at any depth (an import inside a function counts too)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name.split(".")[1] for name in names if name.startswith("shared.")} & set(WINGS)


def test_shared_keeps_few_top_level_modules() -> None:
    top = sorted(p.name for p in (ROOT / "shared").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at shared/'s top: {top}"


def test_each_wing_is_a_package_that_says_what_it_holds() -> None:
    for wing in WINGS:
        init = ROOT / "shared" / wing / "__init__.py"
        tree = ast.parse(init.read_text())
        assert ast.get_docstring(tree), f"shared/{wing}/__init__.py: one docstring, its map"
        assert len(tree.body) == 1, f"shared/{wing}/__init__.py: no re-exports, nothing runs"


def test_shared_folders_lean_only_on_those_below() -> None:
    offenders = []
    for path in sources("shared"):
        wing = _wing_of(path)
        wrong = _wings_imported(ast.parse(path.read_text())) & NEVER[wing]
        if wrong:
            offenders.append(f"{path.relative_to(ROOT)} imports shared/{sorted(wrong)}")
    assert offenders == []


def test_the_folder_check_sees_every_spelling() -> None:
    spelled = (
        "import shared.ops.dlq\n"
        "from shared.worker.failures import route\n"
        "from shared import amqp\n"
        "def f():\n    from shared.process import tasks\n"
        "from shared.errors import EXIT_USAGE\n"
    )
    assert _wings_imported(ast.parse(spelled)) == {"ops", "worker", "amqp", "process"}
    assert _wing_of(ROOT / "shared" / "ops" / "dlq.py") == "ops"
    assert _wing_of(ROOT / "shared" / "queries" / "inbox.py") == GROUND
    assert _wing_of(ROOT / "shared" / "errors.py") == GROUND


# Providers: what differs per provider lives in its package under shared/providers/ (a
# `Provider` in its adapter.py); the registry alone names them all. X-Hub's body shape is
# payhooks' canonical event and its API the reconciler's, so these modules, which predate the
# seam, import shared.providers.xhub directly: a closed list, a new module goes through the
# registry (or, for the canonical event, shared/providers/xhub/events.py's users here).
PROVIDERS_ROOT = ROOT / "shared" / "providers"
PROVIDER_REGISTRY = PROVIDERS_ROOT / "registry.py"
XHUB_USERS = {
    ROOT / path
    for path in (
        "shared/metrics.py",  # the provider label's default, the signing evidence's provider
        "shared/order_machine.py",  # the canonical event's names and ProviderEvent
        "shared/ops/inbox_view.py",  # operators' views: issue 35 item 5
        "services/api/console/pages.py",  # ditto
        "services/orders/handler.py",  # parse_event: the canonical event
        "services/reconciler/app.py",  # X-Hub's API client (the only provider API so far)
        "services/reconciler/jobs.py",  # ditto, and its synthetic canonical events
        "services/sim/deliverer.py",  # the simulator speaks X-Hub: issue 35 item 4
        "services/sim/scenario.py",  # ditto
        "services/cli/send.py",  # `payhooks send` signs as X-Hub: issue 35 item 4
    )
}


def provider_packages() -> list[str]:
    return sorted(p.parent.name for p in PROVIDERS_ROOT.glob("*/__init__.py"))


def _provider_imported(tree: ast.AST) -> set[str]:
    """The provider packages a module imports, however spelled."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    packages = set(provider_packages())
    prefix = "shared.providers."
    return {
        name.removeprefix(prefix).split(".")[0] for name in names if name.startswith(prefix)
    } & packages


def test_provider_packages_are_reached_through_the_registry() -> None:
    offenders = []
    for path in sources("shared", "services"):
        own = path.relative_to(PROVIDERS_ROOT).parts[0] if PROVIDERS_ROOT in path.parents else ""
        if path == PROVIDER_REGISTRY:
            continue
        allowed = {own} | ({"xhub"} if path in XHUB_USERS else set())
        wrong = _provider_imported(ast.parse(path.read_text())) - allowed
        if wrong:
            offenders.append(f"{path.relative_to(ROOT)} imports shared/providers/{sorted(wrong)}")
    assert offenders == []


def test_every_provider_package_has_an_adapter_in_the_registry() -> None:
    from shared.providers.registry import PROVIDERS

    registered = {p.name for p in PROVIDERS}
    for package in provider_packages():
        assert (PROVIDERS_ROOT / package / "adapter.py").exists(), package
    assert len(registered) == len(PROVIDERS) == len(provider_packages())
    assert len({p.webhook_path for p in PROVIDERS}) == len(PROVIDERS)
    assert len({p.secrets_variable for p in PROVIDERS}) == len(PROVIDERS)
    # Message ids (the workers' idempotency keys) never collide across providers, nor with
    # the reconciler's synthetic `reconcile:...` ids: X-Hub's bare, since before the seam.
    for p in PROVIDERS:
        assert p.message_id_prefix == ("" if p.name == "xhub" else f"{p.name}:"), p.name
    assert "reconcile" not in registered


def test_provider_packages_are_domain_modules_but_their_api_clients() -> None:
    for path in PROVIDERS_ROOT.rglob("*.py"):
        if path.stem == "client":  # the reconciler's HTTP client, the one I/O module
            continue
        roots = {name.split(".")[0] for name in imported_modules(ast.parse(path.read_text()))}
        assert not roots & IO_LIBRARIES, f"{path.relative_to(ROOT)} imports {roots & IO_LIBRARIES}"


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


# Spelled outside their package on purpose: SPEC section 2 makes XHUB_WEBHOOK_SECRETS
# ingest's required variable (config.py reads it for the tools' `webhook_secrets`, and
# `payhooks run all` makes a dev one when it is missing).
NAMES_ALLOWED = {
    (ROOT / "shared" / "config.py", "XHUB_WEBHOOK_SECRETS"),
    (ROOT / "services" / "ingest" / "app.py", "XHUB_WEBHOOK_SECRETS"),
    (ROOT / "services" / "cli" / "run_all.py", "XHUB_WEBHOOK_SECRETS"),
}


def test_provider_specific_names_are_spelled_only_in_their_package() -> None:
    """Header names, routes and secrets variables of a provider appear as literals nowhere in
    shared/ or services/ but its own package: ingest reads them from its `Provider`."""
    from shared.providers.registry import PROVIDERS

    owner = {}
    for p in PROVIDERS:
        for name in (p.id_header, p.timestamp_header, p.signature_header, p.webhook_path):
            if name is not None:  # Stripe's id is in the body, its timestamp in its signature
                owner[name.lower()] = p.name
        owner[p.secrets_variable.lower()] = p.name
    offenders = []
    for path in sources("shared", "services"):
        for lineno, text in _strings(ast.parse(path.read_text())):
            provider = owner.get(text.lower())
            if provider is None or (path, text) in NAMES_ALLOWED:
                continue
            inside = (PROVIDERS_ROOT / provider) in path.parents
            if not inside:
                offenders.append(f"{path.relative_to(ROOT)}:{lineno} spells {text!r}")
    assert offenders == []


def test_the_provider_check_sees_every_spelling() -> None:
    spelled = (
        "from shared.providers import standard\n"
        "def f():\n    import shared.providers.xhub.events\n"
        "from shared.providers.base import Provider\n"
        "from shared.providers.registry import PROVIDERS\n"
    )
    assert _provider_imported(ast.parse(spelled)) == {"standard", "xhub"}
