"""payhooks ingest beside the reference prototype, with a unique event id per request on both.

    python -m bench.vs_prototype [--conns 64 256] [--runs 3] [--duration 10]

Runs the handbook's yardstick (`../shared/bench/ingest_vs_prototype.py`, same arguments) with
one change: its wrk script for the prototype (`prototype_load.lua`) numbers event ids from 1 in
every wrk run under a prefix that is the same in every run (LuaJIT's `math.random` is never
seeded), so from the second run on the prototype is mostly sent ids it stored before, answers
them as duplicates and publishes nothing (seen: 22,000 rows after the first 4 s run, 8,600 new
ones in a second run of 30,000 requests, 4,300 in a third of 35,000, and its rate climbing run
after run). Here the prefix also carries the wrk run's start time, as payhooks' own script's
does, so both servers store and publish every request. Nothing else is changed: the prototype
and the harness are the handbook's files, copied to a temporary directory beside the new
script.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile

HANDBOOK_BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "bench")
_PREFIX = 'prefix = (args[1] or "run") .. "-" .. tostring(math.random(1, 1000000000)) .. "-"'
_UNIQUE_PREFIX = _PREFIX + ' .. tostring(os.time()) .. "-"'


def main() -> int:
    source = os.path.abspath(os.environ.get("PAYHOOKS_HANDBOOK_BENCH", HANDBOOK_BENCH))
    if not os.path.exists(os.path.join(source, "ingest_vs_prototype.py")):
        print(f"the handbook's bench is not at {source} (set PAYHOOKS_HANDBOOK_BENCH)")
        return 2
    with tempfile.TemporaryDirectory() as here:
        for name in ("ingest_vs_prototype.py", "prototype.py"):
            shutil.copy(os.path.join(source, name), here)
        with open(os.path.join(source, "prototype_load.lua")) as f:
            lua = f.read()
        if _PREFIX not in lua:
            print("prototype_load.lua changed: check whether its ids are still repeated")
            return 2
        with open(os.path.join(here, "prototype_load.lua"), "w") as f:
            f.write(lua.replace(_PREFIX, _UNIQUE_PREFIX))
        spec = importlib.util.spec_from_file_location(
            "ingest_vs_prototype", os.path.join(here, "ingest_vs_prototype.py")
        )
        assert spec is not None
        assert spec.loader is not None
        harness = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(harness)
        code: int = harness.main()
        return code


if __name__ == "__main__":
    sys.exit(main())
