"""The process's open-file limit: every connection a service holds is a file, and X-Hub
delivers the backlog its circuit breaker held as thousands of connections at once
(docs/ingest-burst.md). Raised at start to the most the system lets the process have."""

from __future__ import annotations

import contextlib
import resource

# Asked for when the hard limit is unlimited (the kernel refuses more than fs.nr_open,
# 1,048,576 by default).
_UNLIMITED_ASK = 1_048_576


def raise_to_hard_limit() -> int:
    """Raise the soft limit on open files to the hard one (where the system allows it) and
    return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_ASK if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        # Above fs.nr_open, or not allowed: the limit stays as it was (ingest says so).
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return open_files_allowed()


def open_files_allowed() -> int:
    """The soft limit on open files now in force."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _UNLIMITED_ASK if soft == resource.RLIM_INFINITY else soft
