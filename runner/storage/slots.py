"""A counting semaphore that serves waiters by priority: the checkpoint that must commit first gets the bandwidth.

Every transfer of a store holds one slot while its buffer is in memory and its request is on the wire, so
the slots bound both memory and requests in flight. When slots are short, the lowest priority number goes
next (the runner uses the step: the older checkpoint, nearer to committing, before the newer), first come
first served within one priority.

Each slot comes with its buffer (:class:`BufferSlots`), reused from one part to the next: a fresh 16 MiB
``bytes`` per part costs the kernel 4,096 page faults and a zeroing of every page, about half of an
upload's client CPU before (measured with bench/upload_throughput.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator


class PrioritySlots:
    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.slots = slots
        self._free = slots
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    @property
    def free(self) -> int:
        return self._free

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, waiter in self._waiting if not waiter.done())

    @contextlib.asynccontextmanager
    async def hold(self, priority: int = 0) -> AsyncIterator[None]:
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: int) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), waiter))
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()  # granted and cancelled in the same breath: hand the slot on
            else:
                self._waiting = [entry for entry in self._waiting if entry[2] is not waiter]
                heapq.heapify(self._waiting)
            raise

    def _release(self) -> None:
        self._free += 1
        while self._waiting and self._free > 0:
            _, _, waiter = heapq.heappop(self._waiting)
            if waiter.done():
                continue
            self._free -= 1
            waiter.set_result(None)


class BufferSlots(PrioritySlots):
    """Priority slots that each lend a ``bytearray`` of ``buffer_size`` bytes while held."""

    def __init__(self, slots: int, buffer_size: int) -> None:
        super().__init__(slots)
        self.buffer_size = buffer_size
        self._buffers: list[bytearray] = []

    @contextlib.asynccontextmanager
    async def lend(self, priority: int = 0) -> AsyncIterator[bytearray]:
        async with self.hold(priority):
            buffer = self._buffers.pop() if self._buffers else bytearray(self.buffer_size)
            # Taken back only after a clean exit: after a failure or a cancellation a worker thread may still
            # be reading into it, so it must not be lent to anyone else (a fresh one is made when needed).
            yield buffer
            self._buffers.append(buffer)
