"""Markdown as GitHub renders it, for the tests that check the docs: heading anchors and the
relative links of a page."""

from __future__ import annotations

import re

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target), the target up to a space (a title) or the closing paren.
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def outside_code(markdown: str) -> list[str]:
    """The page's lines with fenced code blocks and inline code spans blanked out (kept as
    empty lines, so numbers still match)."""
    lines = []
    fence: str | None = None
    for line in markdown.splitlines():
        if match := _FENCE.match(line):
            if fence is None:
                fence = match.group(1)[0]
            elif match.group(1)[0] == fence:
                fence = None
            lines.append("")
            continue
        lines.append("" if fence is not None else re.sub(r"`[^`]*`", "``", line))
    return lines


def github_anchors(markdown: str) -> dict[str, str]:
    """Heading anchor -> the section's text (up to the next heading of its level or above),
    as GitHub makes them: the heading's text lower-cased, punctuation but `-` and `_` dropped,
    each space a `-`, `-1`, `-2`... after a repeat. Lines in code fences are no headings."""
    headings: list[tuple[int, int, str]] = []  # line, level, anchor
    lines = markdown.splitlines()
    seen: dict[str, int] = {}
    fence: str | None = None
    for number, line in enumerate(lines):
        if match := _FENCE.match(line):
            if fence is None:
                fence = match.group(1)[0]
            elif match.group(1)[0] == fence:
                fence = None
            continue
        match = _HEADING.match(line)
        if fence is not None or not match:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(2)).replace("`", "")
        anchor = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        headings.append((number, len(match.group(1)), f"{anchor}-{count}" if count else anchor))
    sections = {}
    for i, (number, level, anchor) in enumerate(headings):
        end = next((n for n, lv, _ in headings[i + 1 :] if lv <= level), len(lines))
        sections[anchor] = "\n".join(lines[number:end])
    return sections


def links(markdown: str) -> list[str]:
    """Every link target on the page outside code, in order (web addresses included)."""
    return [m.group(1) for line in outside_code(markdown) for m in _LINK.finditer(line)]
