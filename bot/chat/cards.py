"""Job card edits, coalesced: a chatty job costs at most one edit per card every ``interval`` seconds.

A card note does not edit anything itself: it *marks* the job (a Redis hash, so a mark survives a restart and
any replica may serve it). A loop edits each marked card once its per-job throttle allows, rendering the job's
latest state from the store, and skips the edit when the card already shows that version of the job. A mark is
cleared only if no newer mark came in while the card was being edited, so the last change always gets shown.
The throttle is a Redis key with a time to live, so with several replicas a card is still edited at most once
per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping

import redis.asyncio as aioredis

from bot.chat.delivery import (
    CardDeliverer,
    Deliverer,
    PermanentDeliveryError,
    Platform,
    TransientDeliveryError,
)
from bot.chat.refs import ChatRefs
from bot.keys import DEFAULT_KEYS, Keys
from bot.store import JobStore
from handlers.backoff import backoff
from handlers.jobs import Job
from handlers.messages import Notify
from handlers.notes import CardRefresh

log = logging.getLogger(__name__)

# Held while an edit is on its way (longer than any HTTP timeout), then shortened to the interval.
EDIT_LEASE_MS = 60_000

# KEYS: marks. ARGV: job id, token. Clears the mark only if it is still the one that was served.
_CLEAR = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""


class CardRefresher:
    def __init__(
        self,
        redis: aioredis.Redis,
        store: JobStore,
        refs: ChatRefs,
        platforms: Mapping[str, Platform],
        interval: float = 2.0,
        tick: float = 0.2,
        keys: Keys = DEFAULT_KEYS,
    ) -> None:
        self.redis = redis
        self.store = store
        self.refs = refs
        self.platforms = platforms
        self.interval = interval
        self.tick = tick
        self.marks_key = keys.card_marks
        self.keys = keys
        self.edits = 0
        self._failures = 0
        self._clear = redis.register_script(_CLEAR)

    def throttle_key(self, job_id: str) -> str:
        return self.keys.card_throttle(job_id)

    async def mark(self, job_id: str) -> None:
        """The job changed: its card should show it (soon, not necessarily now)."""
        await self.redis.hset(self.marks_key, job_id, uuid.uuid4().hex)

    async def marked(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in (await self.redis.hgetall(self.marks_key)).items()}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.flush()
            except Exception:
                log.warning("refreshing job cards failed; trying again", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.tick)

    async def flush(self) -> None:
        """Edit every marked card whose throttle allows it (concurrently: one slow card holds up no other)."""
        marks = await self.marked()
        if marks:
            await asyncio.gather(*(self._refresh(job_id, token) for job_id, token in marks.items()))

    async def _refresh(self, job_id: str, token: str) -> None:
        job = await self.store.get(job_id)
        platform = self.platforms.get(job.chat.platform) if job is not None and job.chat is not None else None
        if job is None or platform is None:
            await self._done(job_id, token)
            return
        if not platform.gate.open:
            return
        throttle = self.throttle_key(job_id)
        if not await self.redis.set(throttle, "1", nx=True, px=EDIT_LEASE_MS):
            return
        hold_ms = int(self.interval * 1000)
        try:
            job = await self.store.get(job_id) or job  # the latest, now that this replica holds the card
            if not await self._edit(platform.deliverer, job):
                await self._done(job_id, token)
                return
            self.edits += 1
            self._failures = 0
            await self.refs.card_shows(job_id, job.version)
            await self._done(job_id, token)
        except TransientDeliveryError as exc:
            self._failures += 1
            delay = exc.retry_after if exc.retry_after is not None else backoff(self._failures)
            platform.gate.close_for(delay)
            hold_ms = max(hold_ms, int(delay * 1000))
            log.info("card of %s not edited (%s): again in %.1fs", job_id, exc, delay)
        except PermanentDeliveryError as exc:
            log.warning("card of %s cannot be edited: %s", job_id, exc)
            await self._done(job_id, token)
        except Exception:
            log.exception("card of %s: edit failed unexpectedly; dropped", job_id)
            await self._done(job_id, token)
        finally:
            await self.redis.pexpire(throttle, hold_ms)

    async def _edit(self, deliverer: Deliverer | CardDeliverer, job: Job) -> bool:
        """Show ``job`` on its card; False when there is no card yet or it already shows this version."""
        if isinstance(deliverer, CardDeliverer):
            card = await self.refs.card(job.id)
            if card is None or card.version >= job.version:
                return False
            await deliverer.edit_card(job, card.message)
            return True
        shown = await self.refs.shown_version(job.id)
        if shown is None or shown >= job.version:
            return False
        await deliverer.deliver(job, Notify(job_id=job.id, channel="card", note=CardRefresh(cause="refresh")))
        return True

    async def _done(self, job_id: str, token: str) -> None:
        await self._clear(keys=[self.marks_key], args=[job_id, token])
