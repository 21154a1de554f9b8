"""`py-spy record` of one service during the measured phase, and a text summary of where it
spent its CPU (own time and time including callees)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench.processes import terminate


class Profiler:
    """`py-spy record` of one service during the measured phase; a text summary at the end."""

    def __init__(self, pid: int, name: str, log_dir: Path, rate: int) -> None:
        self.output = log_dir / f"profile-{name}.txt"
        self._log = log_dir / "py-spy.log"
        self.name = name
        self._command = [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--nonblocking",
            "--function",
            "--format",
            "raw",
            "--output",
            str(self.output),
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self._log, "ab") as log:
            self.process = subprocess.Popen(self._command, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        terminate(self.process, 30, signal.SIGINT)  # py-spy writes its output on SIGINT

    def summary(self, top: int = 25) -> str:
        """The functions with the most samples on CPU: own (leaf) and including callees."""
        own: Counter[str] = Counter()
        inclusive: Counter[str] = Counter()
        total = 0
        with contextlib.suppress(OSError):
            for line in self.output.read_text().splitlines():
                stack, _, count = line.rpartition(" ")
                if not stack or not count.isdigit():
                    continue
                frames = [f.strip() for f in stack.split(";")]
                n = int(count)
                total += n
                if frames:
                    own[frames[-1]] += n
                for frame in set(frames):
                    inclusive[frame] += n
        if not total:
            return f"  no samples from py-spy (see {self._log})"
        lines = [f"  {total:,} samples on CPU; own time (leaf frame):"]
        lines += [f"  {100 * n / total:6.1f}%  {frame}" for frame, n in own.most_common(top)]
        lines.append("  including callees:")
        lines += [f"  {100 * n / total:6.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
        return "\n".join(lines)
