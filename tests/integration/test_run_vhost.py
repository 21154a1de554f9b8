"""Each test run's RabbitMQ vhost (tests/run_vhost.py): used by the run, capped, and a killed
run's deleted by the next run; no vhost where rabbitmqctl cannot manage the broker."""

from __future__ import annotations

import shutil
import subprocess
import sys
from urllib.parse import unquote, urlsplit

import pytest

from tests import conftest, run_vhost


@pytest.fixture
def local_broker() -> None:
    conftest._require_services()
    if conftest._RUN_VHOST is None:
        pytest.skip("no run vhost: rabbitmqctl cannot manage the broker of TEST_AMQP_URL")


def _vhosts() -> set[str]:
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_vhosts", "name"], capture_output=True, text=True, check=True
    )
    return {line.strip() for line in listed.stdout.splitlines()}


@pytest.mark.usefixtures("local_broker")
def test_the_run_works_in_its_own_capped_vhost() -> None:
    vhost = conftest._RUN_VHOST
    assert vhost is not None
    assert unquote(urlsplit(conftest.TEST_AMQP_URL).path) == f"/{vhost.name}"
    assert vhost.name in _vhosts()
    limits = subprocess.run(
        ["rabbitmqctl", "-q", "list_vhost_limits", "-p", vhost.name],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f'"max-queues":{conftest.RUN_MAX_QUEUES}' in limits.stdout.replace(" ", "")


@pytest.mark.usefixtures("local_broker")
def test_a_killed_runs_vhost_is_deleted_by_the_next_run() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a run that is gone: its pid no longer alive
    dead = f"payhooks_run_test_{child.pid}"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", dead], check=True, capture_output=True)
    try:
        assert dead in run_vhost.delete_vhosts_of_dead_runs()
        assert dead not in _vhosts()
        assert conftest._RUN_VHOST is not None
        assert conftest._RUN_VHOST.name in _vhosts()  # a live run's stays
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", dead], capture_output=True)


@pytest.mark.parametrize(
    "url",
    [
        "amqp://guest:guest@rabbitmq.example:5672/",  # another machine's broker
        "amqp://guest:guest@127.0.0.1:5672/shop",  # a vhost chosen by whoever runs the tests
    ],
)
def test_no_run_vhost_where_the_url_rules_it_out(url: str) -> None:
    assert run_vhost.create(url, "test", 10) is None


def test_no_run_vhost_without_rabbitmqctl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert run_vhost.create("amqp://guest:guest@127.0.0.1:5672/", "test", 10) is None
