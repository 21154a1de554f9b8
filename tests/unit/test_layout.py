"""The layout rules of STYLE.md that a reader relies on, checked on the source (no I/O).

SQL lives in shared/queries/ (DML) and shared/migrations/ (DDL); domain modules take values and
return decisions, importing no I/O library; shared/ imports nothing from services/ at import
time (the CLI picks a service by name, lazily).
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
    ROOT / "services" / "orders" / "domain.py",
    ROOT / "services" / "bonuses" / "domain.py",
    ROOT / "services" / "sim" / "delivery_rules.py",
]
IO_LIBRARIES = {"asyncpg", "aio_pika", "aiormq", "aiohttp", "aiosmtplib", "socket", "structlog"}


def sources(*folders: str) -> Iterator[Path]:
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


def imported_modules(tree: ast.AST, *, top_level_only: bool = False) -> set[str]:
    nodes = tree.body if top_level_only and isinstance(tree, ast.Module) else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_sql_outside_shared_queries() -> None:
    offenders = []
    for path in sources("shared", "services"):
        if path in SQL_ALLOWED or (ROOT / "shared" / "queries") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            is_text = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if is_text and DML.match(node.value):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_the_sql_check_sees_sql() -> None:
    assert DML.match("SELECT payment_id FROM orders")
    assert DML.match(" DELETE FROM inbox_unpublished WHERE id = ANY($1)")
    assert not DML.match("Select the orders a reconciler should ask about.")


def test_domain_modules_import_no_io_library() -> None:
    for path in DOMAIN_MODULES:
        roots = {name.split(".")[0] for name in imported_modules(ast.parse(path.read_text()))}
        assert not roots & IO_LIBRARIES, f"{path.relative_to(ROOT)} imports {roots & IO_LIBRARIES}"


def test_shared_imports_nothing_from_services_at_import_time() -> None:
    for path in sources("shared"):
        tree = ast.parse(path.read_text())
        services = {
            name
            for name in imported_modules(tree, top_level_only=True)
            if name.split(".")[0] == "services"
        }
        assert not services, f"{path.relative_to(ROOT)} imports {services}"
