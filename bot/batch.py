"""Commands issued in the same turn of the event loop go to Redis together, in one redis-py pipeline.

Many jobs' handlers run side by side (see :mod:`bot.bus`), each waiting on its own few reads and writes. Sent
one by one, every command is a round trip of its own; here whatever is issued while a pipeline is on its way
goes in the next one, so a burst costs a few round trips, not hundreds. ``senders`` pipelines may be in flight
at once (each on its own pooled connection). A command that fails (an error reply) fails only its caller; a
lost connection fails every command of its pipeline.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError


class Batcher:
    def __init__(self, redis: aioredis.Redis, senders: int = 2) -> None:
        self.redis = redis
        self.senders = senders
        self._queue: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def execute(self, *command: Any) -> Any:
        """Run one command (``"GET", key``…) in the next pipeline; its reply, or its error raised."""
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((command, reply))
        if self._running < self.senders:
            # Starts on the next turn of the loop, so whatever else is issued in this one goes along.
            self._running += 1
            sender = asyncio.ensure_future(self._send())
            self._tasks.add(sender)
            sender.add_done_callback(self._tasks.discard)
        return await reply

    async def script(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """Run a registered script by its hash in the next pipeline; loads it when the server does not know it."""
        try:
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:  # a server that has not seen it yet (or restarted since): the script loads it
            return await script(keys=keys, args=args)

    async def _send(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    async with self.redis.pipeline(transaction=False) as pipe:
                        for command, _reply in batch:
                            pipe.execute_command(*command)
                        results = await pipe.execute(raise_on_error=False)
                except BaseException as exc:
                    for _command, reply in batch:
                        if reply.done():
                            continue
                        if isinstance(exc, Exception):
                            reply.set_exception(exc)
                        else:
                            reply.cancel()
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for (_command, reply), result in zip(batch, results, strict=True):
                    if reply.done():
                        continue  # its caller was cancelled
                    if isinstance(result, Exception):
                        reply.set_exception(result)
                    else:
                        reply.set_result(result)
        finally:
            self._running -= 1
