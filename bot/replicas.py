"""Which replicas are alive, and where each takes runner reports: a sorted set in Redis, renewed while running.

Whatever relays runner reports to the bot without being a replica itself (the local cloud's instances, as a load
balancer would in front of the replicas) asks :meth:`Replicas.live`, so a report reaches the bot as long as any
replica runs, not only the one that launched the instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import redis.asyncio as aioredis

from bot.keys import DEFAULT_KEYS, Keys

log = logging.getLogger(__name__)

REGISTRATION_SECONDS = 15.0


class Replicas:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys = DEFAULT_KEYS,
        ttl: float = REGISTRATION_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.redis = redis
        self.key = keys.replicas
        self.ttl = ttl
        self.clock = clock

    async def register(self, url: str) -> None:
        now = self.clock()
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zadd(self.key, {url: now + self.ttl})
            pipe.zremrangebyscore(self.key, "-inf", now)
            await pipe.execute()

    async def live(self) -> list[str]:
        """The report URLs of the replicas alive now, most recently renewed first."""
        urls = await self.redis.zrevrangebyscore(self.key, "+inf", self.clock())
        return [str(url) for url in urls]

    async def run(self, url: str, stop: asyncio.Event) -> None:
        """Keep ``url`` registered until ``stop``; then take it out (a crashed replica's lapses by itself)."""
        while not stop.is_set():
            try:
                await self.register(url)
            except Exception as exc:
                log.warning("could not renew this replica's registration (%s)", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.ttl / 3)
        with contextlib.suppress(Exception):
            await self.redis.zrem(self.key, url)
