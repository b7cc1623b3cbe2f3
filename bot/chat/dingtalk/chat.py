"""The ChatPort for DingTalk jobs, in front of :class:`DingTalkDeliverer`, until the durable chat outbox.

Integration point: once ``bot/chat/outbox.py`` keeps notifications in Redis, hand it the deliverer (its
``deliver`` already raises transient / permanent errors) and drop this class. Until then this gives the same
behaviour in memory: ``notify`` only queues, so the bus never waits on DingTalk; each job has a lane that sends
its notifications in order in the background; a card refresh still waiting is replaced by a newer one; transient
failures are retried (after DingTalk's Retry-After when it gave one), permanent ones are logged and dropped.
What is still queued when the process dies is lost: that is what the durable outbox adds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from bot.chat.delivery import Deliverer, PermanentDeliveryError, TransientDeliveryError
from handlers.jobs import Job
from handlers.messages import Notify

log = logging.getLogger(__name__)


class DingTalkChat:
    def __init__(
        self,
        deliverer: Deliverer,
        attempts: int = 8,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.deliverer = deliverer
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.sleep = sleep
        self.dropped = 0  # notifications given up on (permanent error, or out of attempts)
        self._lanes: dict[str, deque[tuple[Job, Notify]]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}

    async def notify(self, job: Job, note: Notify) -> None:
        lane = self._lanes.setdefault(job.id, deque())
        if note.channel == "card" and lane and lane[-1][1].channel == "card":
            lane[-1] = (job, note)  # the newer card supersedes the one not yet sent
        else:
            lane.append((job, note))
        if job.id not in self._workers:
            self._workers[job.id] = asyncio.create_task(self._drain(job.id), name=f"dingtalk:{job.id}")

    async def close(self) -> None:
        """Stop sending; what is still queued is dropped (and said so)."""
        waiting = sum(len(lane) for lane in self._lanes.values())
        if waiting:
            log.warning("DingTalk: %d notification(s) not sent at shutdown", waiting)
        workers = list(self._workers.values())
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    async def _drain(self, job_id: str) -> None:
        lane = self._lanes[job_id]
        try:
            while lane:
                job, note = lane.popleft()
                await self._send(job, note)
        finally:
            del self._workers[job_id]
            if not lane:
                del self._lanes[job_id]

    async def _send(self, job: Job, note: Notify) -> None:
        for attempt in range(self.attempts):
            try:
                await self.deliverer.deliver(job, note)
                return
            except TransientDeliveryError as exc:
                wait = exc.retry_after if exc.retry_after is not None else self.backoff * 2**attempt
                log.warning("DingTalk %s/%s of %s: %s; again in %.0fs", note.channel, note.topic, job.id, exc, wait)
                await self.sleep(min(wait, self.max_backoff))
            except PermanentDeliveryError as exc:
                log.error("DingTalk %s/%s of %s dropped: %s", note.channel, note.topic, job.id, exc)
                self.dropped += 1
                return
            except Exception:  # a bug must not stop the job's lane
                log.exception("DingTalk %s/%s of %s failed", note.channel, note.topic, job.id)
                self.dropped += 1
                return
        log.error("DingTalk %s/%s of %s dropped after %d attempts", note.channel, note.topic, job.id, self.attempts)
        self.dropped += 1
