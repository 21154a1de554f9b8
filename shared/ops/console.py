"""What terminal commands share: aligned tables, progress on a terminal only (their exit
codes stand beside the errors, in shared/errors.py)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO = sys.stdout) -> None:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    print("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)), file=out)
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Progress:
    """`label done/total` rewritten in place on a terminal; silent when piped."""

    def __init__(self, label: str, out: TextIO = sys.stderr) -> None:
        self._label = label
        self._out = out
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        if not self._out.isatty():
            return
        self._shown = True
        print(f"\r{self._label} {done}/{total}", end="", file=self._out, flush=True)

    def finish(self) -> None:
        if self._shown:
            print(file=self._out)
