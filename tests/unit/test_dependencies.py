"""pyproject.toml declares every third-party module the code imports, pinned, and the lock files
(`make lock` writes them) pin exactly those versions: installing from a lock is installing
what pyproject.toml says.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from collections.abc import Iterable
from importlib.metadata import distributions, packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
RUNTIME: list[str] = PYPROJECT["project"]["dependencies"]
DEV: list[str] = PYPROJECT["dependency-groups"]["dev"]
OURS = {"shared", "services", "tests", "bench"}
# Imported only when it is installed: the dev SMTP sink of `payhooks run all`.
OPTIONAL_AT_RUNTIME = {"aiosmtpd"}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(requirements: Iterable[str]) -> dict[str, str]:
    found = {}
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!-]+)", requirement)
        assert match, f"not pinned to one version: {requirement}"
        found[normalized(match[1])] = match[2]
    return found


def locked(lock_file: str) -> dict[str, str]:
    text = (ROOT / lock_file).read_text()
    return {
        normalized(name): version
        for name, version in re.findall(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)", text, re.MULTILINE)
    }


# Namespace packages several distributions share: the distribution is found by the full module.
NAMESPACES = {"opentelemetry"}


def imported_distributions(*folders: str) -> set[str]:
    modules: set[str] = set()
    namespaced: set[str] = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    (namespaced if top in NAMESPACES else modules).add(
                        name if top in NAMESPACES else top
                    )
    third_party = modules - OURS - set(sys.stdlib_module_names)
    installed = packages_distributions()
    # A module no installed distribution provides is named as it is imported.
    found = {normalized(d) for m in third_party for d in installed.get(m, [m])}
    return found | {d for m in namespaced if (d := _namespaced_distribution(m))}


def _namespaced_distribution(module: str) -> str | None:
    """The distribution with the file of `module` (a package's __init__ or a module), if any
    (`from opentelemetry.x import Y`: Y may be a name, not a module)."""
    parts = tuple(module.split("."))
    files = _namespace_files()
    return files.get((*parts, "__init__.py")) or files.get((*parts[:-1], parts[-1] + ".py"))


@functools.cache
def _namespace_files() -> dict[tuple[str, ...], str]:
    return {
        tuple(f.parts): normalized(dist.metadata["Name"])
        for dist in distributions()
        for f in dist.files or []
        if f.parts and f.parts[0] in NAMESPACES
    }


def test_the_package_imports_only_its_dependencies() -> None:
    optional = {normalized(d) for d in OPTIONAL_AT_RUNTIME}
    assert imported_distributions("shared", "services") - optional <= pins(RUNTIME).keys()


def test_tests_and_benchmarks_import_only_declared_distributions() -> None:
    declared = pins(RUNTIME).keys() | pins(DEV).keys()
    assert imported_distributions("tests", "bench") <= declared


def test_the_lock_files_pin_what_pyproject_pins() -> None:
    runtime, dev = pins(RUNTIME), pins(DEV)
    assert runtime.items() <= locked("requirements.lock").items()
    assert (runtime | dev).items() <= locked("requirements-dev.lock").items()
    assert not dev.keys() & locked("requirements.lock").keys()  # no dev tool in the image
