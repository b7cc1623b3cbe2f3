"""Delayed bus messages (e.g. "the replacement should have started by now"), kept in Redis.

A timer is a sorted-set member scored by its due time, written there by the job store in the same step as the
change that set it (see :mod:`bot.queues`). The loop moves due members onto the events stream with one script
call (ZREM and XADD together), so with several replicas each timer fires exactly once, and a restart of the bot
neither loses nor repeats one. Each partition (see :mod:`bot.keys`) has its own set, firing onto its own events
stream in one slot: a timer stays with its job.

Timers are typed messages (:data:`handlers.messages.TIMERS`) both ways: :meth:`Timers.schedule` encodes one as the
store does (:func:`bot.queues.route`), and :meth:`Timers.pending` reads each member through
:func:`handlers.messages.parse_message`, the one edge where a stored entry becomes a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import cast

import redis.asyncio as aioredis

from bot.keys import DEFAULT_KEYS, Keys
from bot.queues import EVENT_FIELD, STREAM_MAXLEN, route
from handlers.clock import utcnow
from handlers.messages import TIMERS, BusMessage, Message, parse_message

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
        self.keys = keys
        self.stream = keys.events
        self.key = keys.timers
        self._fire = redis.register_script(_FIRE)
        self.rounds = 0  # passes of run() that looked for due timers (a test waits on them, not on the clock)

    async def schedule(self, timer: Message) -> None:
        """Put ``timer`` (one of :data:`~handlers.messages.TIMERS`) in the set, due at its ``due``, encoded once as
        the store encodes it. Any other message is a ValueError, and nothing is written."""
        if not isinstance(timer, TIMERS):
            raise ValueError(f"a {timer.type} message is not a timer (timers: {', '.join(t.__name__ for t in TIMERS)})")
        routed = route(timer, platform="")
        partition = self.keys.partition_of(timer.job_id)
        await self.redis.zadd(self.keys.timers_in(partition), {routed.payload: routed.due})

    async def fire_due(self, now: datetime | None = None) -> int:
        """Move the timers due by ``now`` onto the events streams (at most 100 per partition); how many moved."""
        moment = (now or self.clock()).timestamp()
        fired = 0
        for partition in self.keys.all_partitions:
            keys = [self.keys.timers_in(partition), self.keys.events_in(partition)]
            fired += int(await self._fire(keys=keys, args=[moment, 100, STREAM_MAXLEN, EVENT_FIELD]))
        return fired

    async def pending(self) -> list[BusMessage]:
        """Every timer not yet fired, earliest first, as typed messages."""
        scored: list[tuple[float, str]] = []
        for partition in self.keys.all_partitions:
            members = await self.redis.zrange(self.keys.timers_in(partition), 0, -1, withscores=True)
            scored.extend((float(score), str(member)) for member, score in cast(list[tuple[str, float]], members))
        return [parse_message(json.loads(member)) for _score, member in sorted(scored)]

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
