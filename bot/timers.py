"""Delayed bus messages (e.g. "the replacement should have started by now"), kept in Redis.

A timer is a sorted-set member scored by its due time, written there by the job store in the same step as the
change that set it (see :mod:`bot.queues`). The loop moves due members onto the events stream with one script
call (ZREM and XADD together), so with several replicas each timer fires exactly once, and a restart of the bot
neither loses nor repeats one.
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

from bot.bus import encode_event
from bot.keys import DEFAULT_KEYS, Keys
from bot.queues import EVENT_FIELD, STREAM_MAXLEN
from handlers.reports import utcnow

log = logging.getLogger(__name__)

# KEYS: timers, events stream. ARGV: now, max count, maxlen, field. Moves due members to the stream; returns how many.
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
        self, redis: aioredis.Redis, keys: Keys = DEFAULT_KEYS, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self.redis = redis
        self.clock = clock
        self.stream = keys.events
        self.key = keys.timers
        self._fire = redis.register_script(_FIRE)
        self.rounds = 0  # passes of run() that looked for due timers (a test waits on them, not on the clock)

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
                while await self.fire_due() >= 100:  # a backlog (after an outage) goes out at once
                    pass
            except Exception as exc:
                log.warning("firing timers failed (%s); trying again", exc)
            self.rounds += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
