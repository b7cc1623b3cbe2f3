"""The renewal loop: every live attempt's storage session is rewritten well before it expires (AWS, storage role).

A runner's storage credentials are an STS session the bot minted for its attempt, limited to its job's prefix
(:mod:`handlers.storage_sessions`). The bot's own session is role-chained into it, so it lasts one hour at most; the
runner cannot renew it (it may assume nothing), so the bot rewrites the attempt's key object with a fresh session
every ``every`` seconds (15 min: the credentials there never have less than ~40 min left while the bot runs), and the
runner reads the object again as its credentials near their end (runner/storage/attempt_credentials.py).

Live attempts are the current attempt, with an instance and not ended, of every job meant to hold one (``HOLDING``);
an attempt that ends is no longer listed, so its renewals stop, and one that ended while it was being renewed has its
key object taken back. One replica at a time: a round holds ``storage-renewal:lock`` (with a TTL, so a replica that
died mid-round does not hold it for ever), and the replicas share one period through ``storage-renewal:last``
(written with the bot's clock, so tests move it without sleeping). A round in which any renewal failed does not
count: the next look (a third of the period later) tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import redis.asyncio as aioredis

from bot.cloud.base import CloudError, RenewsStorageCredentials
from bot.keys import Keys
from bot.store import JobStore
from handlers.clock import utcnow
from handlers.reconcile import HOLDING
from handlers.storage_sessions import RENEW_SECONDS

log = logging.getLogger(__name__)

LOCK_SECONDS = 300  # a round is an AssumeRole and a PutObject per live attempt: far less than this
LOOKS_PER_PERIOD = 3  # the loop looks this often per period: a replica that missed its turn is late by a third at most

# KEYS: the lock. ARGV: the holder's token. Deletes the lock only if this holder still has it.
_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True, slots=True)
class Renewed:
    """One attempt whose key object a round rewrote."""

    job_id: str
    attempt: int
    instance_id: str


class StorageRenewal:
    def __init__(
        self,
        redis: aioredis.Redis,
        store: JobStore,
        cloud: RenewsStorageCredentials,
        clock: Callable[[], datetime] = utcnow,
        every: float = RENEW_SECONDS,
        owner: str = "",
    ) -> None:
        if every <= 0:
            raise ValueError("the renewal period must be positive")
        self.redis = redis
        self.store = store
        self.keys: Keys = store.keys
        self.cloud = cloud
        self.clock = clock
        self.every = every
        self.owner = owner or secrets.token_hex(6)
        self._unlock = redis.register_script(_UNLOCK)

    async def run(self, stop: asyncio.Event) -> None:
        """A round at once, then a look every third of the period until ``stop``; a failed round is tried again."""
        while not stop.is_set():
            try:
                await self.round()
            except Exception as exc:
                log.warning("storage credential renewal failed (%s); trying again", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every / LOOKS_PER_PERIOD)

    async def round(self, now: datetime | None = None) -> list[Renewed] | None:
        """Renew every live attempt; None when another replica holds the lock or a round ran within the period."""
        now = now or self.clock()
        holder = f"{self.owner}:{secrets.token_hex(8)}"
        if not await self.redis.set(self.keys.renewal_lock, holder, nx=True, ex=LOCK_SECONDS):
            return None
        try:
            if await self._ran_recently(now):
                return None
            renewed, failed = await self._renew_all()
            if not failed:
                await self.redis.set(self.keys.renewal_last, repr(now.timestamp()))
            return renewed
        finally:
            await self._unlock(keys=[self.keys.renewal_lock], args=[holder])

    async def _ran_recently(self, now: datetime) -> bool:
        last = await self.redis.get(self.keys.renewal_last)
        try:
            return last is not None and 0 <= now.timestamp() - float(last) < self.every * 0.9
        except ValueError:
            return False

    async def _renew_all(self) -> tuple[list[Renewed], int]:
        renewed: list[Renewed] = []
        failed = 0
        for job in await self.store.list_jobs(HOLDING):
            attempt = job.current
            if attempt is None or attempt.instance_id is None or attempt.ended_at is not None:
                continue
            one = Renewed(job.id, attempt.number, attempt.instance_id)
            try:
                await self.cloud.renew_storage_credentials(
                    one.job_id, one.attempt, one.instance_id, key_salt=attempt.key_salt
                )
            except CloudError as exc:
                failed += 1
                log.warning("%s", exc)
                continue
            if not await self._still_live(one):  # it ended while we wrote: take back what we wrote
                await self.cloud.drop_storage_credentials(one.instance_id)
                continue
            renewed.append(one)
        if renewed:
            log.info("storage credentials renewed for %d live attempts", len(renewed))
        return renewed, failed

    async def _still_live(self, one: Renewed) -> bool:
        job = await self.store.get(one.job_id)
        current = job.current if job is not None else None
        return (
            job is not None
            and job.state in HOLDING
            and current is not None
            and (current.number, current.instance_id, current.ended_at) == (one.attempt, one.instance_id, None)
        )
