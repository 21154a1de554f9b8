"""README.md and docs/*.md: the README stays a newcomer's page, and every relative link and
#anchor on these pages leads somewhere (GitHub's anchor rules, tests/markdown.py)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.markdown import github_anchors, links

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted([README, ROOT / "deploy" / "README.md", *(ROOT / "docs").glob("*.md")])
README_MAX_LINES = 250
# A dated diary line: "On 2026-12-03 ...", "Earlier, 2026-12-01", "as before 2026-12-05".
DIARY = re.compile(r"\b(?:[Oo]n|[Ee]arlier,?|[Bb]efore|[Ss]ince|[Uu]ntil) 20\d\d-\d\d-\d\d\b")


def test_github_anchors_are_computed_as_github_does() -> None:
    text = '# A\n```sh\n# not a heading\n```\n## "DLQ not empty"\n### Rejected: `x_y` (`Z`)\n## A'
    assert list(github_anchors(text)) == ["a", "dlq-not-empty", "rejected-x_y-z", "a-1"]


def test_links_skip_code_and_keep_targets() -> None:
    text = "[a](x.md#b) `[no](c.md)` ![img](s/p.png)\n```\n[no](d.md)\n```\n[web](https://e.org)"
    assert links(text) == ["x.md#b", "s/p.png", "https://e.org"]


def test_readme_is_a_newcomers_page() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; depth goes in docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        path, _, anchor = unquote(target).partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no {file.relative_to(ROOT)}")
        elif anchor and file.suffix == ".md" and anchor not in github_anchors(file.read_text()):
            broken.append(f"{target}: no heading for #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dated_diary_lines(page: Path) -> None:
    """History stays in git; a measurement's date may stand in its table's caption."""
    dated = [line for line in page.read_text().splitlines() if DIARY.search(line)]
    assert not dated, dated


def test_every_make_target_the_readme_names_exists() -> None:
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    named = set(re.findall(r"`make ([a-z-]+)", README.read_text()))
    assert named, "README names its make commands"
    assert named <= targets, named - targets
