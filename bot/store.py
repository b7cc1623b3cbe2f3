"""The job store: jobs, their indexes, history and outbox in Redis, changed only by atomic transitions.

A transition (:meth:`JobStore.apply`) reads the job under WATCH, asks a pure decider what to change, and writes
the new record, the state and instance indexes, the history entry, the dedup key and the outbox events in one
MULTI/EXEC. Either all of it happens or none, and a concurrent writer makes it retry rather than lose an
update. The outbox goes to the event bus's stream, so what must follow a change is published with it.

Keys (under ``prefix``): ``job:<id>`` (the job's JSON), ``state:<STATE>`` (set of job ids), ``instances`` (hash
instance id → job id), ``history:<id>`` (stream), ``dedup:<key>`` (with a TTL).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pydantic_core
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError
from redis.typing import EncodableT, FieldT

from bot.bus import EVENTS_STREAM, STREAM_MAXLEN, encode_event
from handlers.ids import new_event_id
from handlers.jobs import Change, Job, JobState

DEFAULT_PREFIX = "finetune:"
HISTORY_MAXLEN = 1000
HISTORY_FIELD = "entry"
DEDUP_TTL = 7 * 86400

Decider = Callable[[Job], Change | None]


class StoreConflict(RuntimeError):
    """A transition kept losing the race against other writers; the caller may retry the whole event."""


@dataclass(frozen=True, slots=True)
class Applied:
    """The outcome of :meth:`JobStore.apply`.

    ``job`` is the job as stored afterwards (``None`` if missing or duplicate). ``change`` is the applied change
    with its job as written (version bumped) and every outbox event carrying its ``id``; ``None`` when nothing
    changed.
    """

    job: Job | None = None
    change: Change | None = None
    duplicate: bool = False
    missing: bool = False

    @property
    def changed(self) -> bool:
        return self.change is not None


class JobStore:
    """Jobs in Redis; every write goes through one MULTI/EXEC so indexes, history and outbox never drift apart."""

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str = DEFAULT_PREFIX,
        events_stream: str = EVENTS_STREAM,
        max_retries: int = 50,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.events_stream = events_stream
        self.max_retries = max_retries

    # Keys -----------------------------------------------------------------------------------------------------

    def job_key(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def state_key(self, state: JobState) -> str:
        return f"{self.prefix}state:{state.value}"

    def history_key(self, job_id: str) -> str:
        return f"{self.prefix}history:{job_id}"

    def dedup_key(self, key: str) -> str:
        return f"{self.prefix}dedup:{key}"

    @property
    def audit_key(self) -> str:
        return f"{self.prefix}audit"

    @property
    def instances_key(self) -> str:
        return f"{self.prefix}instances"

    # Writes ---------------------------------------------------------------------------------------------------

    async def create(self, job: Job, history: Mapping[str, Any], outbox: Iterable[dict[str, Any]] = ()) -> bool:
        """Store a new job with its first history entry (and outbox); ``False`` if the id is taken."""
        key = self.job_key(job.id)
        events = _with_ids(outbox)
        for attempt in range(self.max_retries):
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(key)
                    if await pipe.exists(key):
                        return False
                    _multi(pipe)
                    self._queue_write(pipe, None, job, history, events)
                    await pipe.execute()
                    return True
                except WatchError:
                    await _backoff(attempt)
        raise StoreConflict(f"could not create {job.id}: too many concurrent writers")

    async def apply(
        self,
        job_id: str,
        decide: Decider,
        dedup_key: str | None = None,
        dedup_ttl: int = DEDUP_TTL,
    ) -> Applied:
        """Atomically: skip if ``dedup_key`` was seen, else write ``decide(job)`` with history, dedup and outbox.

        ``decide`` must be pure: it runs again when another writer changed the job in between. It returns
        ``None`` for "nothing to change"; the dedup key is still recorded so a redelivery costs one read.
        """
        job_key = self.job_key(job_id)
        dedup = self.dedup_key(dedup_key) if dedup_key is not None else None
        watched = [job_key] if dedup is None else [job_key, dedup]
        for attempt in range(self.max_retries):
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(*watched)
                    if dedup is not None and await pipe.exists(dedup):
                        return Applied(duplicate=True)
                    raw = await pipe.get(job_key)
                    if raw is None:
                        return Applied(missing=True)
                    current = Job.model_validate_json(raw)
                    change = decide(current)
                    if change is None:
                        if dedup is not None:
                            _multi(pipe)
                            pipe.set(dedup, job_id, ex=dedup_ttl)
                            await pipe.execute()
                        return Applied(job=current)
                    if change.job.id != job_id:
                        raise ValueError(f"decider for {job_id} returned job {change.job.id}")
                    new_job = change.job.model_copy(update={"version": current.version + 1})
                    events = _with_ids(change.outbox)
                    _multi(pipe)
                    self._queue_write(pipe, current, new_job, change.history, events)
                    if dedup is not None:
                        pipe.set(dedup, job_id, ex=dedup_ttl)
                    await pipe.execute()
                    return Applied(job=new_job, change=replace(change, job=new_job, outbox=events))
                except WatchError:
                    await _backoff(attempt)
        raise StoreConflict(f"could not apply a change to {job_id}: too many concurrent writers")

    def _queue_write(
        self,
        pipe: Pipeline,
        old: Job | None,
        new: Job,
        history: Mapping[str, Any],
        events: list[dict[str, Any]],
    ) -> None:
        """Queue (inside MULTI) the record, its indexes, one history entry and the outbox events."""
        pipe.set(self.job_key(new.id), new.model_dump_json())
        if old is not None:
            pipe.srem(self.state_key(old.state), new.id)
        pipe.sadd(self.state_key(new.state), new.id)
        if new.instance_ids:
            pipe.hset(self.instances_key, mapping=dict.fromkeys(new.instance_ids, new.id))
        entry: dict[FieldT, EncodableT] = {HISTORY_FIELD: pydantic_core.to_json(dict(history)).decode()}
        pipe.xadd(self.history_key(new.id), entry, maxlen=HISTORY_MAXLEN, approximate=True)
        for event in events:
            fields: dict[FieldT, EncodableT] = {}
            fields.update(encode_event(event))
            pipe.xadd(self.events_stream, fields, maxlen=STREAM_MAXLEN, approximate=True)

    # Reads ----------------------------------------------------------------------------------------------------

    async def get(self, job_id: str) -> Job | None:
        raw = await self.redis.get(self.job_key(job_id))
        return None if raw is None else Job.model_validate_json(raw)

    async def list_jobs(self, states: Collection[JobState] | None = None) -> list[Job]:
        """Jobs in ``states`` (all if ``None``), oldest first.

        The index is read in one transaction and each job's own state is checked again after loading, so a job
        that moved in between is never reported under a state it left.
        """
        wanted = list(JobState) if states is None else list(states)
        if not wanted:
            return []
        async with self.redis.pipeline(transaction=True) as pipe:
            for state in wanted:
                pipe.smembers(self.state_key(state))
            members: list[set[str]] = await pipe.execute()
        ids = sorted(set().union(*members))
        if not ids:
            return []
        raws = await self.redis.mget([self.job_key(job_id) for job_id in ids])
        jobs = [Job.model_validate_json(raw) for raw in raws if raw is not None]
        allowed = set(wanted)
        return sorted((job for job in jobs if job.state in allowed), key=lambda job: (job.created_at, job.id))

    async def counts_by_state(self) -> dict[JobState, int]:
        """How many jobs are in each state (every state present, zeros included), for ``/metrics``."""
        states = list(JobState)
        async with self.redis.pipeline(transaction=True) as pipe:
            for state in states:
                pipe.scard(self.state_key(state))
            counts: list[int] = await pipe.execute()
        return {state: int(count) for state, count in zip(states, counts, strict=True)}

    async def history(self, job_id: str, count: int = 200) -> list[dict[str, Any]]:
        """The job's latest ``count`` history entries, oldest first."""
        entries = await self.redis.xrevrange(self.history_key(job_id), count=count)
        result: list[dict[str, Any]] = []
        for _id, fields in reversed(entries or []):
            if fields and HISTORY_FIELD in fields:
                result.append(pydantic_core.from_json(fields[HISTORY_FIELD]))
        return result

    async def job_for_instance(self, instance_id: str) -> str | None:
        job_id = await self.redis.hget(self.instances_key, instance_id)
        return None if job_id is None else str(job_id)

    # Once-only effects and the audit trail ----------------------------------------------------------------------

    async def claim_once(self, key: str, ttl: int = DEDUP_TTL) -> bool:
        """Record ``key`` as done; True only for the first caller (across replicas)."""
        return bool(await self.redis.set(self.dedup_key(key), "1", nx=True, ex=ttl))

    async def was_done(self, key: str) -> bool:
        return bool(await self.redis.exists(self.dedup_key(key)))

    async def audit(self, entry: Mapping[str, Any]) -> None:
        """Things that concern no job (e.g. a refused ``start``), kept like a job's history."""
        await self.redis.xadd(
            self.audit_key,
            {HISTORY_FIELD: pydantic_core.to_json(dict(entry)).decode()},
            maxlen=HISTORY_MAXLEN,
            approximate=True,
        )

    async def audit_log(self, count: int = 200) -> list[dict[str, Any]]:
        entries = await self.redis.xrevrange(self.audit_key, count=count)
        return [pydantic_core.from_json(fields[HISTORY_FIELD]) for _id, fields in reversed(entries or []) if fields]


def _multi(pipe: Pipeline) -> None:
    """Switch a watching pipeline to queueing (MULTI); ``Pipeline.multi`` has no annotations in redis-py."""
    pipe.multi()  # type: ignore[no-untyped-call]


def _with_ids(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every outbox event an ``id`` (consumers deduplicate on it) without changing the caller's dicts."""
    return [event if "id" in event else {"id": new_event_id(), **event} for event in events]


async def _backoff(attempt: int) -> None:
    """A short jittered pause so writers racing on one job do not collide again in lockstep."""
    await asyncio.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))
