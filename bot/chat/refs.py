"""Where each job's chat messages are: its card (and the job version it shows) and its pages, kept in Redis.

Any replica (or the bot after a restart) edits the same card and acknowledges the same pages. Entries expire a
while after the job last changed, so finished jobs do not pile up.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

from bot.chat.delivery import MessageRef
from bot.keys import DEFAULT_KEYS, Keys

REFS_TTL = 30 * 86400


@dataclass(frozen=True, slots=True)
class CardRef:
    message: MessageRef
    version: int  # the job version the card shows


class ChatRefs:
    def __init__(self, redis: aioredis.Redis, keys: Keys = DEFAULT_KEYS, ttl: int = REFS_TTL) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl = ttl

    def card_key(self, job_id: str) -> str:
        return self.keys.card(job_id)

    def pages_key(self, job_id: str) -> str:
        return self.keys.pages(job_id)

    async def card(self, job_id: str) -> CardRef | None:
        raw, version = await self.redis.hmget(self.card_key(job_id), ["ref", "version"])
        if raw is None:
            return None
        return CardRef(MessageRef.load(str(raw)), int(version or -1))

    async def shown_version(self, job_id: str) -> int | None:
        """The job version its card shows; None if no card was delivered yet."""
        version = await self.redis.hget(self.card_key(job_id), "version")
        return None if version is None else int(version)

    async def save_card(self, job_id: str, message: MessageRef, version: int) -> None:
        await self._set(job_id, {"ref": message.dump(), "version": str(version)})

    async def card_shows(self, job_id: str, version: int) -> None:
        """Record that the card now shows ``version`` of the job."""
        await self._set(job_id, {"version": str(version)})

    async def add_page(self, job_id: str, message: MessageRef) -> None:
        key = self.pages_key(job_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.rpush(key, message.dump())
            pipe.expire(key, self.ttl)
            await pipe.execute()

    async def pages(self, job_id: str) -> list[MessageRef]:
        raws = await self.redis.lrange(self.pages_key(job_id), 0, -1)
        return [MessageRef.load(str(raw)) for raw in raws]

    async def drop_pages(self, job_id: str, count: int) -> None:
        """Forget the job's first ``count`` pages (acknowledged: a later incident's ack must not re-edit them)."""
        await self.redis.ltrim(self.pages_key(job_id), count, -1)

    async def _set(self, job_id: str, fields: dict[str, str]) -> None:
        key = self.card_key(job_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
            pipe.expire(key, self.ttl)
            await pipe.execute()
