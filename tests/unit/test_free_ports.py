"""The ports tests and benchmarks give the servers they start."""

from __future__ import annotations

import socket
from pathlib import Path

from bench.processes import free_ports


def _ephemeral_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_ports_of_one_call_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    ports = free_ports(300)
    assert len(set(ports)) == 300
    low, high = _ephemeral_range()
    assert not [p for p in ports if low <= p <= high]
    assert min(ports) > 25672  # RabbitMQ's distribution port, and the services' below it
    for port in ports[:20]:  # each one a server can bind at once
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", port))


def test_a_port_something_listens_on_is_not_given() -> None:
    listeners = []
    try:
        for port in free_ports(50):
            s = socket.socket()
            s.bind(("0.0.0.0", port))
            s.listen()
            listeners.append(s)
        taken = {s.getsockname()[1] for s in listeners}
        assert not taken & set(free_ports(500))
    finally:
        for s in listeners:
            s.close()
