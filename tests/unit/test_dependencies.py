"""pyproject.toml declares every third-party module the code imports, pinned, and the lock files
(`make lock` writes them) pin exactly those versions: installing from a lock is installing
what pyproject.toml says.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterable
from importlib.metadata import packages_distributions
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


def imported_distributions(*folders: str) -> set[str]:
    modules: set[str] = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    modules.add(node.module.split(".")[0])
    third_party = modules - OURS - set(sys.stdlib_module_names)
    installed = packages_distributions()
    # A module no installed distribution provides is named as it is imported.
    return {normalized(d) for m in third_party for d in installed.get(m, [m])}


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
