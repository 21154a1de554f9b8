"""The customer emails' texts as files: the defaults in default_templates/, a shop's own in
EMAIL_TEMPLATES_DIR (same names, each overriding its default), and their format."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from shared.config import ConfigError
from shared.vocabulary import REFUNDED_EMAIL, SUCCEEDED_EMAIL

TEMPLATE_NAMES = (SUCCEEDED_EMAIL, REFUNDED_EMAIL)
SUFFIX = ".txt"
PLACEHOLDERS = frozenset({"order_id", "amount", "currency"})
HTML_SEPARATOR = "--- html ---"


@dataclass(frozen=True, slots=True)
class EmailTemplate:
    subject: Template
    text: Template
    html: Template


def parse_template(source: str) -> EmailTemplate:
    """One template file's text; ValueError saying what is wrong with it (never echoing it).

    The format (docs/configuration.md, "The emails' texts"): a line `Subject: ...`, an empty
    line, the plain-text body, a line `--- html ---`, the HTML body. Placeholders $order_id,
    $amount, $currency ($$ is a dollar sign); blank lines around either body are dropped.
    """
    head, _, rest = source.replace("\r\n", "\n").partition("\n")
    if not head.startswith("Subject:"):
        raise ValueError("must start with a line 'Subject: ...'")
    subject = head.removeprefix("Subject:").strip()
    if not subject:
        raise ValueError("has an empty subject")
    lines = rest.split("\n")
    if lines[0].strip():
        raise ValueError("needs an empty line after the subject")
    separators = [i for i, line in enumerate(lines) if line.strip() == HTML_SEPARATOR]
    if len(separators) != 1:
        raise ValueError(f"needs exactly one line '{HTML_SEPARATOR}' before the HTML body")
    text = "\n".join(lines[1 : separators[0]]).strip("\n")
    html = "\n".join(lines[separators[0] + 1 :]).strip("\n")
    if not text.strip() or not html.strip():
        raise ValueError("needs a plain-text body and an HTML body")
    parsed = EmailTemplate(Template(subject), Template(text + "\n"), Template(html))
    for part in ("subject", "text", "html"):
        template: Template = getattr(parsed, part)
        # Checked now: at send time a bad placeholder would fail every email of this template.
        if not template.is_valid():
            raise ValueError(f"has a '$' in its {part} that is no placeholder (write $$ for $)")
        unknown = sorted(set(template.get_identifiers()) - PLACEHOLDERS)
        if unknown:
            known = ", ".join(f"${p}" for p in sorted(PLACEHOLDERS))
            raise ValueError(
                f"uses unknown placeholder {', '.join('$' + u for u in unknown)} in its {part}"
                f" (known: {known})"
            )
    return parsed


@functools.cache
def default_templates() -> Mapping[str, EmailTemplate]:
    """The texts shipped in the package (package data: pyproject.toml)."""
    folder = resources.files("services.email").joinpath("default_templates")
    return {
        name: parse_template(folder.joinpath(name + SUFFIX).read_text("utf-8"))
        for name in TEMPLATE_NAMES
    }


def load_templates(directory: str | None) -> Mapping[str, EmailTemplate]:
    """The defaults, each replaced by its file in `directory` when there is one; a ConfigError
    naming every unreadable, malformed or unknown file."""
    templates = dict(default_templates())
    if directory is None:
        return templates
    folder = Path(directory)
    problems: list[str] = []
    known = {name + SUFFIX for name in TEMPLATE_NAMES}
    try:
        # A misspelt name would otherwise leave the default in place without a word.
        unknown = sorted(p.name for p in folder.glob("*" + SUFFIX) if p.name not in known)
    except OSError as e:
        unknown, problems = [], [f"cannot be listed ({e.strerror})"]
    problems += [f"{name} is no template (known: {', '.join(sorted(known))})" for name in unknown]
    for name in TEMPLATE_NAMES:
        path = folder / (name + SUFFIX)
        if not path.exists():
            continue
        try:
            # utf-8-sig: a byte order mark some editors write is not part of the subject line.
            templates[name] = parse_template(path.read_text("utf-8-sig"))
        except UnicodeDecodeError:
            problems.append(f"{path.name} is not UTF-8 text")
        except OSError as e:
            problems.append(f"{path.name} cannot be read ({e.strerror})")
        except ValueError as e:
            problems.append(f"{path.name} {e}")
    if problems:
        raise ConfigError(f"invalid configuration: EMAIL_TEMPLATES_DIR {'; '.join(problems)}")
    return templates
