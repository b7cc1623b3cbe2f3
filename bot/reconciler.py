"""The reconcile loop: at start and then every ``policy.lifecycle.reconcile_seconds``, on one replica at a time,
the jobs the bot believes in are compared with what the cloud lists (:func:`handlers.reconcile.reconcile`), and
each difference takes the normal path:

- *instance gone*: a ``CloudEvent`` (source ``reconcile``) onto the events stream, so the usual decision
  relaunches the job (bounded) or ends it. Its id is fixed per (job, attempt, instance), so the bot's dedup drops
  the same event from a second round or replica: nothing is relaunched twice;
- *release* (an orphan that bills): a ``terminate`` for the cloud executor, a log line, and, when the job is
  known, a note in its channel and a line in its history, written together (once per instance and window);
- *probe* (a RUNNING job unheard of for too long whose instance is listed live): one note per silence;
- *release-group* (a cloud that makes a scaling group per job, AWS in Auto Scaling mode: a group that keeps
  capacity for a job that is over or unknown): set to 0 by the reconciler itself (idempotent at the cloud), and
  said so like a release.

One replica at a time: a round holds ``reconcile:lock`` (with a TTL, so a replica that died in a round does not
hold it for ever); the replicas share one period through ``reconcile:last``. A round that fails (the cloud's API
down) is logged and tried again sooner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import redis.asyncio as aioredis

from bot.cloud.base import ListsGroups, ListsInstances
from bot.keys import Keys
from bot.store import JobStore
from handlers.change import Change
from handlers.clock import utcnow
from handlers.jobs import Job
from handlers.lifecycle import Lifecycle
from handlers.reconcile import (
    HOLDING,
    CloudGroup,
    CloudInstance,
    Reconciliation,
    gone_event,
    limits_of,
    orphan_groups,
    probe,
    reconcile,
    release,
    release_effect,
    release_group,
    silence_key,
)

log = logging.getLogger(__name__)

LOCK_SECONDS = 120  # a round lists the cloud and writes a few changes: far less than this
RELEASE_AGAIN_SECONDS = 3600  # an orphan still listed live this long after its release is released again
RETRY_SECONDS = 30.0  # after a failed round, the next one comes this soon (or at the period, if shorter)

# KEYS: the lock. ARGV: the holder's token. Deletes the lock only if this holder still has it.
_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True, slots=True)
class Done:
    """One action of a round, and whether this round carried it out (False: an earlier round or another replica
    did already, or the job moved on since the listing)."""

    action: Reconciliation
    acted: bool


class Reconciler:
    def __init__(
        self,
        redis: aioredis.Redis,
        store: JobStore,
        cloud: ListsInstances,
        lifecycle: Lifecycle,
        clock: Callable[[], datetime] = utcnow,
        owner: str = "",
    ) -> None:
        self.redis = redis
        self.store = store
        self.keys: Keys = store.keys
        self.cloud = cloud
        self.interval = lifecycle.reconcile_seconds
        self.limits = limits_of(lifecycle)
        self.clock = clock
        self.owner = owner or secrets.token_hex(6)
        self.rounds = 0
        self._unlock = redis.register_script(_UNLOCK)

    async def run(self, stop: asyncio.Event) -> None:
        """One round at once, then one per period (shared by the replicas) until ``stop``; off when the period is 0."""
        if self.interval <= 0:
            log.info("reconciliation is off (policy.lifecycle.reconcile_seconds = 0)")
            await stop.wait()  # a loop of the service: it ends with the bot (bot/supervision.py)
            return
        due_now = True
        while not stop.is_set():
            wait = self.interval
            try:
                await self.round(periodic=not due_now)
                due_now = False
            except Exception as exc:
                log.warning("reconciliation round failed (%s); trying again", exc)
                wait = min(self.interval, RETRY_SECONDS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    async def round(self, now: datetime | None = None, *, periodic: bool = False) -> list[Done] | None:
        """One round; None when another replica holds the lock (or, ``periodic``, ran one within the period)."""
        token = secrets.token_hex(8)
        if not await self.redis.set(self.keys.reconcile_lock, f"{self.owner}:{token}", nx=True, ex=LOCK_SECONDS):
            return None
        try:
            if periodic and await self._ran_recently():
                return None
            done = await self._round(now or self.clock())
            await self.redis.set(self.keys.reconcile_last, repr(time.time()))
            self.rounds += 1
            return done
        finally:
            await self._unlock(keys=[self.keys.reconcile_lock], args=[f"{self.owner}:{token}"])

    async def _ran_recently(self) -> bool:
        last = await self.redis.get(self.keys.reconcile_last)
        try:
            return last is not None and time.time() - float(last) < self.interval * 0.9
        except ValueError:
            return False

    async def _round(self, now: datetime) -> list[Done]:
        # Jobs first, then the listing: an instance launched in between is fresh, and left alone.
        known = {job.id: job for job in await self.store.list_jobs(HOLDING)}
        listed = await self.cloud.list_instances()
        groups: list[CloudGroup] = []
        if isinstance(self.cloud, ListsGroups):
            groups = await self.cloud.list_groups()
        named = {instance.job_id for instance in listed if instance.live and instance.job_id is not None}
        named |= {group.job_id for group in groups if group.desired > 0 and group.job_id is not None}
        for job_id in sorted(named - known.keys()):  # ended jobs the tags name (or jobs the bot never had)
            job = await self.store.get(job_id)
            if job is not None:
                known[job_id] = job
        by_instance = {instance.instance_id: instance for instance in listed}
        done = []
        for action in reconcile(known.values(), listed, now, self.limits):
            job = known.get(action.job_id) if action.job_id is not None else None
            done.append(Done(action, await self._act(action, job, by_instance, now)))
        for action in orphan_groups(known.values(), groups):
            job = known.get(action.job_id) if action.job_id is not None else None
            done.append(Done(action, await self._release_group(action, job, now)))
        return done

    async def _release_group(self, action: Reconciliation, job: Job | None, now: datetime) -> bool:
        """Set the group to 0 at once (idempotent at the cloud); the log and the job's channel say so once."""
        assert action.group is not None and isinstance(self.cloud, ListsGroups)
        await self.cloud.release_group(action.group)
        once = Keys.reconciled(f"group:{action.group}:{int(now.timestamp() // RELEASE_AGAIN_SECONDS)}")
        if job is not None:
            applied = await self.store.apply(
                job.id,
                lambda current: release_group(current, action),
                dedup_key=once,
                dedup_ttl=2 * RELEASE_AGAIN_SECONDS,
            )
            acted = applied.changed
        else:
            acted = await self.store.claim_once(once, ttl=2 * RELEASE_AGAIN_SECONDS)
        if acted:
            log.warning("reconcile: group %s tagged for %s set to 0: %s", action.group, action.job_id, action.reason)
        return acted

    async def _act(
        self, action: Reconciliation, job: Job | None, listed: dict[str, CloudInstance], now: datetime
    ) -> bool:
        if action.action == "instance-gone":
            # Every round that still sees it sends it again: the bot's dedup (on the fixed id) drops repeats.
            event = gone_event(action, now)
            log.info("reconcile: %s of %s is gone (%s)", action.instance_id, action.job_id, action.reason)
            await self.store.send([event])
            return True
        if action.action == "release":
            return await self._release(action, job, listed, now)
        assert job is not None
        silence = silence_key(job)
        applied = await self.store.apply(
            job.id, lambda current: probe(current, action, silence), dedup_key=Keys.reconciled(f"silent:{silence}")
        )
        if applied.changed:
            log.warning("reconcile: %s (RUNNING on %s): %s", job.id, action.instance_id, action.reason)
        return applied.changed

    async def _release(
        self, action: Reconciliation, job: Job | None, listed: dict[str, CloudInstance], now: datetime
    ) -> bool:
        assert action.instance_id is not None and action.job_id is not None
        window = int(now.timestamp() // RELEASE_AGAIN_SECONDS)
        once = Keys.reconciled(f"release:{action.instance_id}:{window}")
        instance = listed[action.instance_id]

        def released(current: Job) -> Change | None:
            # Still an orphan of the job as it is now (a resume or a launch may have made it the job's again)?
            still = [a for a in reconcile([current], [instance], now, self.limits) if a.action == "release"]
            return release(current, still[0], window) if still else None

        if job is not None:
            applied = await self.store.apply(job.id, released, dedup_key=once, dedup_ttl=2 * RELEASE_AGAIN_SECONDS)
            acted = applied.changed
        else:
            # No job to tell: the terminate alone (its id per window: the cloud executor carries it out once).
            await self.store.send([release_effect(action, window)])
            acted = await self.store.claim_once(once, ttl=2 * RELEASE_AGAIN_SECONDS)
        if acted:
            log.warning("reconcile: releasing %s tagged for %s: %s", action.instance_id, action.job_id, action.reason)
        return acted
