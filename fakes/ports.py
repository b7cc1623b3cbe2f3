"""A free loopback port for a server the fakes, the tests or a bench start.

Alone, the OS picks (bind to port 0). Under pytest-xdist (``PYTEST_XDIST_WORKER=gwN``) the OS's pick is not enough:
a port is only chosen here and bound later by the server, and between the two another worker may be handed the
same port, or an outgoing connection may take it as its ephemeral port. So each worker hands out ports from a range
of its own, below the kernel's ephemeral range, in turn (a port is not handed out again until the range wraps),
skipping any port something already holds.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Iterator

WORKER_PORTS_FROM = 20_000  # the ephemeral range starts at 32768 by default (net.ipv4.ip_local_port_range)
WORKER_PORTS_SPAN = 500  # per worker: gw0 20000-20499, gw1 20500-20999, …
WORKER_PORTS_UNTIL = 32_000


def free_port() -> int:
    """A port nothing listens on now, and (under xdist) one no other worker is handed."""
    ports = _worker_ports()
    if ports is None:
        return _os_pick()
    for _ in range(WORKER_PORTS_SPAN):
        port = next(ports)
        if _bindable(port):
            return port
    return _os_pick()  # the whole range held: fall back rather than fail


def _os_pick() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


_cycles: dict[str, Iterator[int]] = {}


def _worker_ports() -> Iterator[int] | None:
    """This worker's ports in turn, or None outside xdist (or past the room for workers' ranges)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    first = WORKER_PORTS_FROM + int(worker[2:]) * WORKER_PORTS_SPAN
    if first + WORKER_PORTS_SPAN > WORKER_PORTS_UNTIL:
        return None
    if worker not in _cycles:
        # A subprocess of the worker inherits its variable: start it elsewhere in the range than its parent.
        start = os.getpid() % WORKER_PORTS_SPAN
        span = range(first, first + WORKER_PORTS_SPAN)
        _cycles[worker] = itertools.cycle([*span[start:], *span[:start]])
    return _cycles[worker]
