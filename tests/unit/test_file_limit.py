"""shared/process/file_limit.py and ingest's in-flight cap derived from it."""

from __future__ import annotations

import resource

from services.ingest.app import FILES_KEPT_FREE, MAX_IN_FLIGHT, in_flight_cap
from shared.process.file_limit import open_files_allowed, raise_to_hard_limit


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if soft == hard and hard != resource.RLIM_INFINITY and hard > 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard // 2, hard))
        allowed = raise_to_hard_limit()
        assert allowed == open_files_allowed()
        raised = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        # An unlimited hard limit: as much as the kernel gives (fs.nr_open), or unchanged.
        assert raised == hard or (hard == resource.RLIM_INFINITY and raised >= soft)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_ingest_keeps_files_free_and_caps_what_it_handles_at_once() -> None:
    assert in_flight_cap(20_000) == 20_000 - FILES_KEPT_FREE
    assert in_flight_cap(1_048_576) == MAX_IN_FLIGHT
    assert in_flight_cap(1_024) == 1_024 - FILES_KEPT_FREE
    assert in_flight_cap(100) == 64  # never below a few dozen, whatever the limit says
