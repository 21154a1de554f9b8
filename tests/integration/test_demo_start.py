"""A newcomer's first command never hangs: `make demo` and `make run` with PostgreSQL or
RabbitMQ missing stop at once, naming the missing one and how to start it.

Nothing listens on the ports these tests configure, so no service is ever started (the
dependency check stops them first); the other dependency is the suite's own, reachable. Each
run is bounded, and its whole process group is killed if it overruns.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import TEST_AMQP_URL, TEST_DATABASE_URL

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo.sh"
MAKEFILE = ROOT / "Makefile"
VENV_STAMP = ".venv/bin/payhooks"  # `make install`'s target
LIMIT_S = 60.0

pytestmark = pytest.mark.timeout(LIMIT_S + 20)  # each run is bounded by LIMIT_S itself


def closed_port() -> int:
    """A port nothing listens on: the kernel's pick, released before anyone connects."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def run(argv: list[str], **env: str) -> tuple[int, str, float]:
    return run_in(ROOT, argv, env)


def run_in(cwd: Path, argv: list[str], env: dict[str, str]) -> tuple[int, str, float]:
    """Exit status, output (stdout and stderr) and seconds; the process group killed (and
    the test failed) past LIMIT_S. An `env` value of "" leaves that variable out."""
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env={k: v for k, v in {**os.environ, **env}.items() if v != ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: everything it started can be killed at once
    )
    try:
        output, _ = process.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{argv} still running after {LIMIT_S:g} s:\n{output}")
    return process.returncode, output, time.monotonic() - started


def make(target: str, **env: str) -> tuple[int, str, float]:
    # -o: take the venv as current; the test is about the target, not about installing.
    return run(["make", "-o", VENV_STAMP, target], **env)


def test_demo_without_postgresql_names_it_and_stops() -> None:
    port = closed_port()
    status, output, seconds = make(
        "demo",
        DATABASE_URL=f"postgresql://postgres@127.0.0.1:{port}/payhooks",
        AMQP_URL=TEST_AMQP_URL,
    )
    assert status != 0, output
    assert seconds < LIMIT_S
    assert f"PostgreSQL (DATABASE_URL, 127.0.0.1:{port}): nothing listens" in output, output
    assert "docker compose up -d --wait postgres rabbitmq" in output
    assert "RabbitMQ" not in output.split("start it:")[0], "only the missing one is named"
    assert "payhooks run all" not in output  # nothing was started


def test_demo_without_rabbitmq_names_it_and_stops() -> None:
    port = closed_port()
    status, output, seconds = run(
        ["bash", str(DEMO)],
        DATABASE_URL=TEST_DATABASE_URL,
        AMQP_URL=f"amqp://guest:guest@127.0.0.1:{port}/",
    )
    assert status != 0, output
    assert seconds < LIMIT_S
    assert f"RabbitMQ (AMQP_URL, 127.0.0.1:{port}): nothing listens" in output, output
    assert "PostgreSQL" not in output.split("start it:")[0], "only the missing one is named"


def test_run_without_either_names_both_and_stops() -> None:
    pg, amqp = closed_port(), closed_port()
    status, output, seconds = make(
        "run",
        DATABASE_URL=f"postgresql://postgres@127.0.0.1:{pg}/payhooks",
        AMQP_URL=f"amqp://guest:guest@127.0.0.1:{amqp}/",
    )
    assert status != 0, output
    assert seconds < LIMIT_S
    assert f"PostgreSQL (DATABASE_URL, 127.0.0.1:{pg})" in output, output
    assert f"RabbitMQ (AMQP_URL, 127.0.0.1:{amqp})" in output, output
    assert "systemctl start postgresql" in output
    assert "systemctl start rabbitmq-server" in output


def test_a_server_that_never_answers_is_given_up_on_in_bounded_time() -> None:
    """Something accepts connections on the port and closes them (Docker's port proxy while
    the container is still starting): waited for --wait seconds, then named."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        port = server.getsockname()[1]
        done = threading.Event()

        def close_every_connection() -> None:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    server.accept()[0].close()

        closer = threading.Thread(target=close_every_connection)
        closer.start()
        try:
            status, output, seconds = run(
                [".venv/bin/python", "scripts/preflight.py", "--wait", "1"],
                DATABASE_URL=f"postgresql://postgres@127.0.0.1:{port}/payhooks",
                AMQP_URL=TEST_AMQP_URL,
            )
        finally:
            done.set()
            closer.join()
    assert status == 1, output
    assert seconds < 15
    assert "waiting up to 1 s for PostgreSQL to start" in output, output
    assert f"PostgreSQL (DATABASE_URL, 127.0.0.1:{port}): accepts connections but" in output


def test_the_demo_script_is_strict_and_cleans_up() -> None:
    text = DEMO.read_text()
    subprocess.run(["bash", "-n", str(DEMO)], check=True, timeout=10)
    assert "set -euo pipefail" in text
    assert re.search(r"^trap stop_all EXIT$", text, re.MULTILINE)
    assert "scripts/preflight.py" in text
    # What the demo does: the whole system, then the simulator's checked 300 payments per
    # provider (X-Hub's alone unless PROVIDERS names more).
    assert '"$BIN/payhooks" run all' in text
    assert "PER_PROVIDER=${DEMO_PAYMENTS:-300}" in text
    one_line = text.replace("\n", " ")
    assert re.search(r'sim --provider "\$PROVIDERS" .*--payments "\$PAYMENTS" .*--check', one_line)
    makefile = MAKEFILE.read_text()
    demo = re.search(r"^demo: install\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert demo
    assert "scripts/demo.sh" in demo.group(1)
    run_target = re.search(r"^run: install\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert run_target
    assert run_target.group(1).index("scripts/preflight.py") < run_target.group(1).index(
        "payhooks run all"
    )


def test_the_dependency_check_reads_dot_env_as_payhooks_does(tmp_path: Path) -> None:
    """`make run` checks what `payhooks run all` will use: ./.env's values, the environment's
    where both set one."""
    port = closed_port()
    (tmp_path / ".env").write_text(
        f"DATABASE_URL=postgresql://postgres@127.0.0.1:{port}/payhooks\nAMQP_URL={TEST_AMQP_URL}\n"
    )
    preflight = [str(ROOT / ".venv/bin/python"), str(ROOT / "scripts/preflight.py"), "--wait", "1"]

    from_file = run_in(tmp_path, preflight, {"DATABASE_URL": "", "AMQP_URL": ""})
    overridden = run_in(tmp_path, preflight, {"DATABASE_URL": TEST_DATABASE_URL, "AMQP_URL": ""})

    assert from_file[0] == 1, from_file[1]
    assert f"PostgreSQL (DATABASE_URL, 127.0.0.1:{port}): nothing listens" in from_file[1]
    assert overridden[0] == 0, overridden[1]
