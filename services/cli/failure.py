"""How a command says it failed: one line on stderr, `payhooks: <what is wrong>`, and the exit
code the runbook gives for it (shared/errors.py EXIT_*)."""

from __future__ import annotations

import sys


def fail(message: str, code: int) -> int:
    print(f"payhooks: {message}", file=sys.stderr)
    return code
