"""`free_port`: the one place every stack, bench and test takes its loopback ports from."""

from __future__ import annotations

import socket

from failslow_cli.stack.processes import free_port


def test_ports_taken_in_a_row_differ_and_are_free() -> None:
    # The kernel offers a just-released port again now and then (124 repeats in 2,000 binds to port 0 here),
    # and a stack takes its ports before binding any: Redis and the remediator once got the same one.
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[-1]))  # free when handed out
