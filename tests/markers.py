"""The suite's two kinds of test, told apart at collection, and a guard that keeps the ``unit`` kind honest.

``scenario``: the test starts or talks to something real — a server (Valkey, moto, the fake Slack/DingTalk/Alibaba,
an S3 proxy) or a subprocess (a runner, a trainer, the bot's CLI). ``unit``: the pure core and whatever runs in
this process alone, fast. Every test gets exactly one, so ``pytest -m unit`` is the quick check while editing and
``make test`` runs both.

Most tests are classified without a mark in their file: a test is a scenario when it uses a fixture that reaches a
server (:data:`SERVER_FIXTURES`, through any chain of fixtures) or when its own source names something that starts
one (:data:`STARTS_SOMETHING`); otherwise it is a unit. A file or test may still say which it is with
``pytest.mark.unit`` / ``pytest.mark.scenario`` (a helper the words below cannot see through). The guard
(:func:`guard_unit_tests`) makes the classification checkable: while a ``unit`` test runs, starting a process or
binding a socket fails it, with the advice to mark it a scenario.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

UNIT = "unit"
SCENARIO = "scenario"
KINDS = (UNIT, SCENARIO)

# Fixtures that start a server or a process (or depend on one that does, which the fixture closure follows).
SERVER_FIXTURES = frozenset(
    {
        "valkey_url",  # tests/redis_fixtures.py: the session's Valkey
        "valkey_cluster_server",  # tests/cluster_fixtures.py: three primaries, three replicas
        "moto_endpoint",  # tests/conftest.py: moto in server mode
        "valkey",
        "slack",
        "dingtalk",
        "imds",
        "imds_for",
        "bot",
        "serve",
        "runner",
        "reachable",
        "metadata",
        "namespaces",
        "on_the_instance",
        "tiny_qwen",
        "wheel",
        "cert_host",
        "patched_moto",
        "refused_port",
        "trainer_account",
        "reference_run",
        "two_node_reference",
        "make_demo",
    }
)

# Words in a test's own source that start a server or a process. Whole words: ``moto`` matches ``moto`` only.
STARTS_SOMETHING = re.compile(
    r"\b("
    r"subprocess|Popen|create_subprocess_exec|create_subprocess_shell|pexpect|"
    r"running_bot|running_dingtalk_bot|start_runner|run_tiny_directly|Cluster|RestartableValkey|EmbeddedValkey|"
    r"FakeSlack|FakeDingTalk|FakeAliyun|S3FaultProxy|Ec2Proxy|ThreadedMotoServer|moto_server|tls_valkey|"
    r"TlsTerminator|web\.AppRunner|TCPSite|start_server|free_port|BrokenHttp|RespServer|getfixturevalue"
    r")\b"
)


def kind_of(item: pytest.Item) -> str:
    """``unit`` or ``scenario`` for one collected test: its own mark if it (or its file) has one, else inferred."""
    marked = {mark.name for mark in item.iter_markers() if mark.name in KINDS}
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid} is marked both unit and scenario: it is one or the other")
    if marked:
        return marked.pop()
    names = set(getattr(item, "fixturenames", ()))
    if names & SERVER_FIXTURES:
        return SCENARIO
    function = getattr(item, "function", None)
    if function is not None and STARTS_SOMETHING.search(_source(function)):
        return SCENARIO
    if any(STARTS_SOMETHING.search(_source(fixture)) for fixture in _own_fixtures(item)):
        return SCENARIO
    return UNIT


def _own_fixtures(item: pytest.Item) -> Iterator[Any]:
    """The functions of the fixtures the test uses that the suite defines itself (a fixture may start a server by
    a name of its own, or ask for one by ``request.getfixturevalue``)."""
    info = getattr(item, "_fixtureinfo", None)
    for definitions in (getattr(info, "name2fixturedefs", None) or {}).values():
        for definition in definitions:
            function = getattr(definition, "func", None)
            if function is not None and getattr(function, "__module__", "").startswith(("tests", "fakes", "conftest")):
                yield function


def _source(function: Any) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def assign_kinds(items: list[pytest.Item]) -> None:
    """Give every collected test exactly one of the two marks."""
    for item in items:
        kind = kind_of(item)
        if not any(mark.name == kind for mark in item.iter_markers()):
            item.add_marker(kind)


class UnitGuard:
    """An audit hook (installed once per process; hooks cannot be removed) armed only while a ``unit`` test runs."""

    EVENTS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.system", "socket.bind"})

    def __init__(self) -> None:
        self.armed_for: str | None = None
        self.caught: list[str] = []
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.armed_for is not None and event in self.EVENTS:
            self.caught.append(f"{event}{_short(args)}")

    @contextmanager
    def armed(self, nodeid: str) -> Iterator[None]:
        self.armed_for, self.caught = nodeid, []
        try:
            yield
        finally:
            self.armed_for = None


def _short(args: tuple[Any, ...]) -> str:
    text = repr(args)
    return text if len(text) <= 120 else text[:117] + "..."


_guard: UnitGuard | None = None


@contextmanager
def guard_unit_tests(item: pytest.Item) -> Iterator[None]:
    """Run one test phase; a ``unit`` test that starts a process or binds a socket fails, naming what it did."""
    global _guard
    if item.get_closest_marker(UNIT) is None:
        yield
        return
    if _guard is None:
        _guard = UnitGuard()
    with _guard.armed(item.nodeid):
        yield
    if _guard.caught:
        raise AssertionError(
            f"{item.nodeid} is classified unit but started something real ({'; '.join(_guard.caught[:3])}): mark it"
            " pytest.mark.scenario, or name what starts it in tests/markers.py"
        )


def fill_machine_caches() -> None:
    """Fill, before any test is guarded, the caches a library fills once per machine by running a program, so no
    ``unit`` test is blamed for it: matplotlib lists the fonts with ``fc-list`` the first time it is imported on a
    machine (a chart test on a fresh clone did, and failed the guard). Called by the controller alone, so xdist's
    workers find the cache and pay nothing."""
    try:
        from matplotlib import font_manager  # noqa: F401  (its import builds the cache)
    except ImportError:  # a checkout without the bot's extra draws no chart
        return
