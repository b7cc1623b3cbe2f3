"""The Redis edge's mapping: whatever redis-py raises for an outage comes out of the bot's store calls as
:class:`bot.errors.StoreUnavailable`, and nothing else does.

Every failure comes from a real server: a Valkey that is stopped (and started again), one paused with
``CLIENT PAUSE``, a port nothing listens on, and, for the answers a healthy local Valkey never gives (``LOADING``
while it reads its data, ``READONLY`` from a primary a failover demoted, a garbled reply, a hang-up mid-command), a
small TCP server that speaks just enough RESP to give them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from bot.bus import EventBus
from bot.errors import FinetuneError, StoreUnavailable
from bot.keys import Keys
from bot.redis_server import RedisHandle, connect
from bot.store import JobStore
from fakes.ports import free_port
from fakes.restartable_valkey import RestartableValkey
from handlers.change import Change
from handlers.jobs import Job

Call = Callable[[JobStore, EventBus], Awaitable[Any]]


def new_job(job_id: str = "ft-err1") -> Job:
    return Job.model_validate({"id": job_id, "recipe": "tiny", "requested_by": "U1"})


def step_up(job: Job) -> Change:
    return Change(job=job.model_copy(update={"step": (job.step or 0) + 1}), history={"type": "step"})


# One of each way the bot's store and bus reach Redis: a plain command, a Lua script (EVALSHA), a pipeline, a
# WATCH/MULTI transaction (the apply path), a stream append.
CALLS: dict[str, Call] = {
    "command": lambda store, bus: store.get("ft-err1"),
    "script": lambda store, bus: store.create(new_job("ft-err2"), {"type": "created"}),
    "pipeline": lambda store, bus: store.list_jobs(),
    "transaction": lambda store, bus: store.apply("ft-err1", step_up),
    "stream": lambda store, bus: bus.publish({"type": "probe"}),
}


@pytest.fixture
async def valkey(tmp_path: Path) -> AsyncIterator[RestartableValkey]:
    server = RestartableValkey(tmp_path / "redis")
    await server.start()
    yield server
    await server.stop()


def parts(client: aioredis.Redis) -> tuple[JobStore, EventBus]:
    return JobStore(client, Keys("errs:")), EventBus(client, stream="errs:events")


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
async def test_a_stopped_server_is_store_unavailable_and_the_same_client_works_once_it_is_back(
    valkey: RestartableValkey, call: Call
) -> None:
    client = connect(valkey.url)
    store, bus = parts(client)
    try:
        assert await store.create(new_job(), {"type": "created"})
        await valkey.stop()
        with pytest.raises(StoreUnavailable) as caught:
            await call(store, bus)
        assert isinstance(caught.value.__cause__, redis.exceptions.ConnectionError)
        await valkey.start()
        await call(store, bus)  # no new client: the one the bot holds recovers
    finally:
        await client.aclose()


async def test_a_paused_server_times_out_as_store_unavailable(valkey: RestartableValkey) -> None:
    admin = connect(valkey.url)
    client = connect(f"{valkey.url}?socket_timeout=0.2")  # a URL's query sets the read timeout, as in production
    store, _ = parts(client)
    try:
        await client.ping()  # connected before the pause: the command, not the connect, times out
        await admin.execute_command("CLIENT", "PAUSE", "1000", "ALL")  # every client waits, the admin too
        with pytest.raises(StoreUnavailable) as caught:
            await store.get("ft-err1")
        assert isinstance(caught.value.__cause__, redis.exceptions.TimeoutError)
        assert await JobStore(admin, Keys("errs:")).get("ft-err1") is None  # served once the pause ends
    finally:
        await admin.aclose()
        await client.aclose()


async def test_nothing_listening_is_store_unavailable_at_start_and_on_every_call() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(StoreUnavailable, match=rf"cannot use Redis at {url}"):
        await RedisHandle(url=url).start()
    client = connect(url)
    try:
        for call in CALLS.values():
            with pytest.raises(StoreUnavailable):
                await call(*parts(client))
    finally:
        await client.aclose()


class RespServer:
    """A TCP server that answers every RESP command it receives with one fixed reply (``None``: hang up)."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply
        self.port = free_port()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return f"redis://127.0.0.1:{self.port}/0"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                if not line.startswith(b"*"):  # the arguments of a command: its header already got the reply
                    continue
                if self.reply is None:
                    return
                writer.write(self.reply)
                await writer.drain()
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.mark.parametrize(
    ("reply", "cause"),
    [
        (b"-LOADING Valkey is loading the dataset in memory\r\n", redis.exceptions.BusyLoadingError),
        (b"-READONLY You can't write against a read only replica.\r\n", redis.exceptions.ReadOnlyError),
        (b"-MASTERDOWN Link with MASTER is down\r\n", redis.exceptions.MasterDownError),
        (b"?not RESP\r\n", redis.exceptions.InvalidResponse),
        (None, redis.exceptions.ConnectionError),
    ],
    ids=["loading", "readonly-after-failover", "masterdown", "garbled-reply", "hang-up"],
)
async def test_a_server_that_cannot_serve_is_store_unavailable(reply: bytes | None, cause: type[Exception]) -> None:
    server = RespServer(reply)
    client = connect(await server.start())
    try:
        for name, call in CALLS.items():
            with pytest.raises(StoreUnavailable) as caught:
                await call(*parts(client))
            assert isinstance(caught.value.__cause__, cause), name
    finally:
        await client.aclose()
        await server.stop()


async def test_a_wrong_command_is_not_an_outage(valkey: RestartableValkey) -> None:
    """A ResponseError is a bug or a signal (``NOGROUP``, ``WRONGTYPE``), not an outage: it is not mapped."""
    client = connect(valkey.url)
    try:
        await client.set("errs:text", "not a number")
        with pytest.raises(redis.exceptions.ResponseError) as caught:
            await client.incr("errs:text")
        assert not isinstance(caught.value, FinetuneError)
    finally:
        await client.aclose()
