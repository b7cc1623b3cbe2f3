"""Per-user command rates: a token bucket in Redis, so every replica draws on the same bucket.

A bucket holds up to ``per_minute`` tokens and refills at ``per_minute`` a minute; each command takes one. The
check and the take are one Lua script (:data:`_TAKE`), so two replicas answering one user's burst at the same
moment never both spend the last token. The time comes from the caller (the bot's clock, which tests step), not
from the server; a replica whose clock is behind the bucket's last look refills nothing, so skewed clocks never
make tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Literal

import redis.asyncio as aioredis

from bot.keys import Keys

Bucket = Literal["commands", "starts"]

# KEYS: 1 the bucket (hash: tokens, at). ARGV: 1 capacity, 2 refill per second, 3 now (POSIX seconds).
# Returns {1, "0"} when a token was taken, else {0, seconds until one is there}. The bucket expires once full again.
_TAKE = """
local capacity, rate, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local held = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(held[1]) or capacity, tonumber(held[2]) or now
if now > at then
  tokens = math.min(capacity, tokens + (now - at) * rate)
  at = now
end
local taken, wait = 0, 0
if tokens >= 1 then
  tokens, taken = tokens - 1, 1
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(at))
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate * 1000) + 1000)
return {taken, tostring(wait)}
"""


class RateLimiter:
    """``take(bucket, user, per_minute)``: None when the command may run, else the seconds until it may."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, clock: Callable[[], datetime]) -> None:
        self.keys = keys
        self.clock = clock
        self._take = redis.register_script(_TAKE)

    async def take(self, bucket: Bucket, user: str, per_minute: int) -> float | None:
        now = self.clock().timestamp()
        taken, wait = await self._take(keys=[self.keys.rate(bucket, user)], args=[per_minute, per_minute / 60, now])
        return None if int(taken) == 1 else float(wait)
