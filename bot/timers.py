"""Delayed bus messages (e.g. "the replacement should have started by now"), kept in Redis.

A timer is a sorted-set member scored by its due time. The loop moves due members onto the bus stream with
one script call (ZREM and XADD together), so with several replicas each timer fires exactly once, and a
restart of the bot neither loses nor repeats one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import redis.asyncio as aioredis

from bot.bus import EVENT_FIELD, EVENTS_STREAM, STREAM_MAXLEN, encode_event
from handlers.events import utcnow

log = logging.getLogger(__name__)

TIMERS_KEY = "finetune:timers"

# KEYS: timers, stream. ARGV: now, max count, maxlen. Moves due members to the stream; returns how many.
_FIRE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  redis.call('ZREM', KEYS[1], member)
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', ARGV[4], member)
end
return #due
"""


class Timers:
    def __init__(
        self,
        redis: aioredis.Redis,
        stream: str = EVENTS_STREAM,
        key: str = TIMERS_KEY,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.redis = redis
        self.clock = clock
        self.stream = stream
        self.key = key
        self._fire = redis.register_script(_FIRE)

    async def schedule(self, event: dict[str, Any], due: datetime) -> None:
        member = encode_event(event)[EVENT_FIELD]
        await self.redis.zadd(self.key, {member: due.timestamp()})

    async def fire_due(self, now: datetime | None = None) -> int:
        moment = (now or self.clock()).timestamp()
        fired = await self._fire(keys=[self.key, self.stream], args=[moment, 100, STREAM_MAXLEN, EVENT_FIELD])
        return int(fired)

    async def pending(self) -> list[dict[str, Any]]:
        members = await self.redis.zrange(self.key, 0, -1)
        return [json.loads(str(member)) for member in members]

    async def run(self, stop: asyncio.Event, interval: float = 0.5) -> None:
        while not stop.is_set():
            try:
                await self.fire_due()
            except Exception:
                log.exception("firing timers")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
