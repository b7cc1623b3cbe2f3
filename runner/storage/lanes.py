"""Send lanes: a store's big requests spread over threads that each run an event loop and an S3 client of their own.

One aiobotocore client on one event loop sends at most one core's worth: profiled on a commit of 8 files x 256 MiB
to a local sink (bench/commit_parallel.py --store sink), 1.90 of the loop thread's 1.97 CPU-s were ``socket.send``
(the kernel copying the body out), the rest aiohttp's and botocore's Python. ``send`` releases the GIL, as do the
reads and CRC32C of the parts (already in worker threads), so K threads that each send on their own loop use K cores
without the cost of worker processes (no copy of a part between processes, no credentials handed to a child).

A lane's client is made in its own thread and loop (an aiohttp session belongs to one loop). What it signs with is
borrowed from the store's own client on the caller's loop (:class:`BorrowedCredentials`): one refreshable object,
refreshed on that loop only (the attempt's credentials read their key object through another store there), and every
lane signs each request with whatever it holds now. Lanes are started together at first use and stopped in
:meth:`SendLanes.close`, which leaves no thread or loop behind.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any, TypeVar

from aiobotocore.credentials import AioCredentials

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_LANES = 16  # past this a host's NIC or S3's per-prefix rate is the limit, not the client's cores


def default_lane_count(concurrency: int) -> int:
    """One lane per core this process may run on, no more than the requests in flight nor ``MAX_LANES``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, concurrency, MAX_LANES))


class BorrowedCredentials(AioCredentials):  # type: ignore[misc]  # aiobotocore is untyped
    """Credentials for a lane's client that are another loop's: each signing asks the owner's loop for the
    current frozen credentials (a refresh, when due, happens there, once for every lane)."""

    method = "finetune-lane"

    def __init__(self, owner: AioCredentials, owner_loop: asyncio.AbstractEventLoop) -> None:
        super().__init__("borrowed", "borrowed")  # placeholders: signing only ever uses get_frozen_credentials
        self._owner = owner
        self._owner_loop = owner_loop

    async def get_frozen_credentials(self) -> Any:
        frozen = asyncio.run_coroutine_threadsafe(self._owner.get_frozen_credentials(), self._owner_loop)
        return await asyncio.wrap_future(frozen)


class BorrowedCredentialProvider:
    """Put first in a lane session's resolver, so the lane's client signs with :class:`BorrowedCredentials`."""

    METHOD = "finetune-lane"
    CANONICAL_NAME = "FinetuneLane"

    def __init__(self, credentials: BorrowedCredentials) -> None:
        self.credentials = credentials

    async def load(self) -> BorrowedCredentials:
        return self.credentials


ClientFactory = Callable[[], AbstractAsyncContextManager[Any]]


class _Lane:
    """One thread running one event loop, which holds one client."""

    def __init__(self, index: int, make_client: ClientFactory) -> None:
        self.make_client = make_client
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name=f"send-lane-{index}", daemon=True)
        self.busy = 0  # requests the caller's loop has handed it and not yet seen finish
        self._stack = AsyncExitStack()
        self._client: Any = None

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            stray = asyncio.all_tasks(self.loop)
            for task in stray:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*stray, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())  # downloads write to disk in threads
            self.loop.close()

    async def open(self) -> None:
        self._client = await self._stack.enter_async_context(self.make_client())

    async def call(self, request: Callable[[Any], Awaitable[T]]) -> T:
        return await request(self._client)

    async def shut(self) -> None:
        await self._stack.aclose()

    async def on_loop(self, job: Awaitable[T]) -> T:
        """Run ``job`` (a coroutine) on this lane's loop; cancelling the caller cancels it there."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(job, self.loop))  # type: ignore[arg-type]


class SendLanes:
    """``count`` lanes; :meth:`run` hands a request to the least busy one (round robin among equals)."""

    def __init__(self, count: int, make_client: ClientFactory) -> None:
        if count < 1:
            raise ValueError("a store needs at least one send lane")
        self.count = count
        self._make_client = make_client
        self._lanes: list[_Lane] = []
        self._order = itertools.count()
        self._started: asyncio.Future[None] | None = None

    async def start(self) -> None:
        """Start every lane and make its client (concurrently: each is some tens of ms of botocore's setup)."""
        started = self._started
        if started is None:
            started = self._started = asyncio.get_running_loop().create_future()
            self._lanes = [_Lane(index, self._make_client) for index in range(self.count)]
            try:
                for lane in self._lanes:
                    lane.thread.start()
                await asyncio.gather(*(lane.on_loop(lane.open()) for lane in self._lanes))
            except BaseException as exc:
                await self.close()  # a later request tries afresh
                started.set_exception(exc)
                started.exception()  # retrieved here: no "never retrieved" warning when nobody else waits
                raise
            started.set_result(None)
        await asyncio.shield(started)

    async def run(self, request: Callable[[Any], Awaitable[T]]) -> T:
        """``await request(client)`` on a lane's loop with that lane's client; its result or exception comes back."""
        await self.start()
        turn = next(self._order)
        _, lane = min(enumerate(self._lanes), key=lambda at: (at[1].busy, (at[0] - turn) % self.count))
        lane.busy += 1
        try:
            return await lane.on_loop(lane.call(request))
        finally:
            lane.busy -= 1

    async def close(self) -> None:
        """Close every lane's client, stop its loop and join its thread."""
        lanes, self._lanes, self._started = self._lanes, [], None
        for lane in lanes:
            if lane.thread.is_alive():
                try:
                    await lane.on_loop(lane.shut())
                except Exception as exc:
                    log.warning("closing the client of %s failed: %s", lane.thread.name, exc)
                finally:
                    lane.loop.call_soon_threadsafe(lane.loop.stop)  # its thread then ends what is left and closes it
                await asyncio.to_thread(lane.thread.join)
