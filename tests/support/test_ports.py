"""The one free-port helper: distinct ports, and runs of consecutive ports, that a
listener can bind right after."""

from __future__ import annotations

import socket

from harness.ports import free_port_range, free_ports


def _bind_all(ports: list[int]) -> None:
    socks = []
    try:
        for port in ports:
            s = socket.socket()
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))  # raises OSError if the port was not free
    finally:
        for s in socks:
            s.close()


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(6)
    assert len(set(ports)) == 6
    _bind_all(ports)


def test_free_port_range_gives_consecutive_bindable_ports() -> None:
    base = free_port_range(9)
    assert 1024 < base and base + 8 < 65536
    _bind_all(list(range(base, base + 9)))
