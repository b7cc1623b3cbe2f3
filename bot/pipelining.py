"""Commands issued in the same turn of the event loop go to Redis together, in one redis-py pipeline.

Many jobs' handlers run side by side (see :mod:`bot.bus`), each waiting on its own few reads and writes. Sent
one by one, every command is a round trip of its own; here whatever is issued while a pipeline is on its way
goes in the next one, so a burst costs a few round trips, not hundreds. ``senders`` pipelines may be in flight
at once (each on its own pooled connection). A command that fails (an error reply) fails only its caller; a
lost connection fails every command of its pipeline.

A command sent ``durable`` (a state change, see :mod:`bot.durability`) is followed in its pipeline by the wait the
setting asks for, on the same connection (on a cluster: one wait per node that took such a write); it answers
only once that wait confirms it, else it fails with :class:`~bot.errors.StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from bot.durability import DurableWrites
from bot.partitions import is_cluster_client

_Queued = tuple[tuple[Any, ...], "asyncio.Future[Any]", bool]  # a command, its caller's reply, whether durable


class Batcher:
    def __init__(self, redis: aioredis.Redis, senders: int = 2, durability: DurableWrites | None = None) -> None:
        self.redis = redis
        self.senders = senders
        self.durability = durability or DurableWrites()
        self._cluster = is_cluster_client(redis)
        self._queue: list[_Queued] = []
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def execute(self, *command: Any, durable: bool = False) -> Any:
        """Run one command (``"GET", key``…) in the next pipeline; its reply, or its error raised. ``durable``: a
        state change, confirmed as the durability setting asks before it answers."""
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((command, reply, durable and self.durability.wait is not None))
        if self._running < self.senders:
            # Starts on the next turn of the loop, so whatever else is issued in this one goes along.
            self._running += 1
            sender = asyncio.ensure_future(self._send())
            self._tasks.add(sender)
            sender.add_done_callback(self._tasks.discard)
        return await reply

    async def script(self, script: AsyncScript, keys: list[str], args: list[Any], durable: bool = False) -> Any:
        """Run a registered script by its hash in the next pipeline; loads it when the server does not know it."""
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            return await self.execute(*command, durable=durable)
        except NoScriptError:  # a server that has not seen it yet (or restarted since): load it, run it again
            await self.redis.script_load(script.script)
            return await self.execute(*command, durable=durable)

    async def _send(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    async with self.redis.pipeline(transaction=False) as pipe:
                        for command, _reply, _durable in batch:
                            pipe.execute_command(*command)
                        waits = self._add_waits(pipe, batch)
                        results = await pipe.execute(raise_on_error=False)
                except BaseException as exc:
                    for _command, reply, _durable in batch:
                        if reply.done():
                            continue
                        if isinstance(exc, Exception):
                            reply.set_exception(exc)
                        else:
                            reply.cancel()
                    if not isinstance(exc, Exception):
                        raise
                    continue
                confirmed = dict(zip(waits, results[len(batch) :], strict=True))
                for (command, reply, durable), result in zip(batch, results[: len(batch)], strict=True):
                    if reply.done():
                        continue  # its caller was cancelled
                    if isinstance(result, Exception):
                        reply.set_exception(result)
                        continue
                    if durable:
                        try:
                            moved = RuntimeError("its slot moved to another node meanwhile")  # a failover
                            self.durability.check(confirmed.get(self._node_of(command), moved))
                        except Exception as exc:
                            reply.set_exception(exc)
                            continue
                    reply.set_result(result)
        finally:
            self._running -= 1

    def _add_waits(self, pipe: Any, batch: list[_Queued]) -> list[str]:
        """Queue the durability wait after the batch's durable writes: once on a single server, once per node that
        takes one on a cluster (on the connection the node's writes go on). The names of the waits, in order."""
        wait = self.durability.wait
        if wait is None or not any(durable for _command, _reply, durable in batch):
            return []
        if not self._cluster:
            pipe.execute_command(*wait)
            return [""]
        nodes: dict[str, Any] = {}
        for command, _reply, durable in batch:
            if durable:
                node = self.redis.get_node_from_key(_first_key(command))  # type: ignore[attr-defined]
                nodes[node.name] = node
        for node in nodes.values():
            pipe.execute_command(*wait, target_nodes=node)
        return list(nodes)

    def _node_of(self, command: tuple[Any, ...]) -> str:
        if not self._cluster:
            return ""
        return str(self.redis.get_node_from_key(_first_key(command)).name)  # type: ignore[attr-defined]


def _first_key(command: tuple[Any, ...]) -> str:
    """The first key of a command the store sends durably: a script's (EVALSHA sha numkeys key…), else argument 1."""
    return str(command[3] if str(command[0]).upper() in ("EVALSHA", "EVAL") else command[1])
