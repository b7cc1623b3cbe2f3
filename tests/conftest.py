"""Shared fixtures: real servers (moto in server mode, the S3 fault proxy), AWS test credentials, a clean moto per
test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests import cpu_log
from tests.demo_checkout import Demo, made_demo
from tests.gang_reference import ADAPTER, GANG_STEPS, two_node_adapter
from tests.markers import assign_kinds, fill_machine_caches, guard_unit_tests
from tests.runner_harness import made_once, run_tiny_directly
from tests.s3_proxy import S3FaultProxy
from tests.servers import AWS_TEST_ENV, moto_server, reset_moto


def pytest_configure(config: pytest.Config) -> None:
    """``FINETUNE_TEST_CPU_LOG=<dir>``: log each test's CPU, its subprocesses' included (tests/cpu_log.py); the
    machine's one-time caches filled before xdist starts its workers (tests/markers.py)."""
    cpu_log.register(config)
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        fill_machine_caches()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test is ``unit`` or ``scenario`` (tests/markers.py)."""
    assign_kinds(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with guard_unit_tests(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with guard_unit_tests(item):
        return (yield)


@pytest.fixture(scope="session", autouse=True)
def trainers_run_as_the_tests() -> Iterator[None]:
    """Run as root, the runner would start its trainers as finetune-train, which cannot reach them here: they are
    this interpreter (under /root on a development host) and write in pytest's private temporary directories
    (mode 0700). So the runners the tests start keep their trainers as root (``FINETUNE_TRAINER_USER=root``),
    except where a test names the user: tests/test_trainer_sandbox.py, with a trainer any user can run. Their metadata
    guard is off (``FINETUNE_METADATA_GUARD=off``): this host's firewall is not the tests' to change; the tests that
    install it do so in a network namespace of their own (tests/test_metadata_guard.py)."""
    with pytest.MonkeyPatch.context() as patch:
        if os.geteuid() == 0:
            patch.setenv("FINETUNE_TRAINER_USER", os.environ.get("FINETUNE_TRAINER_USER", "root"))
        patch.setenv("FINETUNE_METADATA_GUARD", "off")
        yield


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_server(tmp_path_factory.mktemp("moto")) as endpoint:
        yield endpoint


@pytest.fixture
def aws(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """AWS variables pointing every SDK client at a freshly reset moto server; yields the endpoint."""
    reset_moto(moto_endpoint)
    for name, value in AWS_TEST_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    yield moto_endpoint


@pytest.fixture
async def proxy(aws: str) -> AsyncIterator[S3FaultProxy]:
    """The network between a runner and S3, able to fail (see ``tests.s3_proxy``); a module may define its own."""
    server = await S3FaultProxy(aws).start()
    yield server
    await server.stop()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted tiny run (its checkpoints every 5 steps, and its final adapter): what every recovered run
    must reproduce exactly."""
    return made_once(tmp_path_factory, "tiny-reference", run_tiny_directly)


@pytest.fixture(scope="session")
def two_node_reference(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The final adapter of an uninterrupted two-node run (two trainers, one world, no runner) of
    :data:`~tests.gang_reference.GANG_STEPS`: what the gang runner's and the gang bot's recovered runs reproduce."""
    root = made_once(tmp_path_factory, "gang-reference", lambda root: two_node_adapter(root, GANG_STEPS))
    assert not (root / "node-1" / ADAPTER).exists()  # the final adapter is global rank 0's to write
    return (root / "node-0" / ADAPTER).read_bytes()


@pytest.fixture(scope="session")
def make_demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """``make demo`` in a fresh checkout, run once for every test that begins with it (tests/demo_checkout.py)."""
    return made_demo(tmp_path_factory)


@pytest.fixture(scope="session")
def reference_adapter(reference_run: Path) -> bytes:
    """Final LoRA weights of the uninterrupted run."""
    return (reference_run / "adapter_model.safetensors").read_bytes()
