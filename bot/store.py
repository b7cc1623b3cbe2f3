"""The job store: jobs, their indexes, history and outbox in Redis, changed only by atomic transitions.

A transition (:meth:`JobStore.apply`) reads the job (and whether its dedup key was seen, in the same round trip),
asks a pure decider what to change, and hands the new record, the state and instance indexes, the history entry,
the dedup key and the outbox events to one server-side script. The script runs atomically: it checks that the
job is still exactly what the decider saw and that the dedup key is still unseen, then writes all of it, or
none of it when either check fails; then the transition decides again on what is stored now (optimistic
concurrency, as WATCH/MULTI/EXEC would do it, in two round trips instead of four). The outbox goes to the event
bus's stream, so what must follow a change is published with it.

Keys (under ``prefix``): ``job:<id>`` (the job's JSON), ``state:<STATE>`` (set of job ids), ``instances`` (hash
instance id → job id), ``history:<id>`` (stream), ``dedup:<key>`` (with a TTL).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pydantic_core
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError

from bot.bus import EVENT_FIELD, EVENTS_STREAM, STREAM_MAXLEN, encode_event
from handlers.ids import new_event_id
from handlers.jobs import Change, Job, JobState

DEFAULT_PREFIX = "finetune:"
HISTORY_MAXLEN = 1000
HISTORY_FIELD = "entry"
DEDUP_TTL = 7 * 86400

Decider = Callable[[Job], Change | None]

# The atomic write of a transition (or of a new job). It checks before it writes anything, so it either writes
# all or nothing. Returns 1 when written, 0 when the job is not as the caller read it (changed, deleted, or, for
# a create, present), -1 when the dedup key was seen meanwhile.
# KEYS: job, dedup, old state set, new state set, instances, history, events stream.
# ARGV: 1 flags, one character each: "c" (create: the job must be absent) or "a" (apply: it must equal ARGV[2]);
#   then "1"/"0" for: check and set the dedup key; write the job (else the dedup key only); take the id out of
#   the old state set. 2 the job as read, 3 the job id (also the dedup key's value), 4 the dedup key's TTL,
#   5 the new job, 6 the history entry, 7 the number of instance ids, then the instance ids, then the outbox events.
_WRITE = f"""
local flags = ARGV[1]
local dedup, write, old = flags:sub(2, 2) == '1', flags:sub(3, 3) == '1', flags:sub(4, 4) == '1'
if dedup and redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local current = redis.call('GET', KEYS[1])
if flags:sub(1, 1) == 'c' then
  if current then return 0 end
elseif current ~= ARGV[2] then
  return 0
end
if write then
  redis.call('SET', KEYS[1], ARGV[5])
  if old then redis.call('SREM', KEYS[3], ARGV[3]) end
  redis.call('SADD', KEYS[4], ARGV[3])
  local instances = tonumber(ARGV[7])
  for i = 1, instances do redis.call('HSET', KEYS[5], ARGV[7 + i], ARGV[3]) end
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', '{HISTORY_MAXLEN}', '*', '{HISTORY_FIELD}', ARGV[6])
  for i = 8 + instances, #ARGV do
    redis.call('XADD', KEYS[7], 'MAXLEN', '~', '{STREAM_MAXLEN}', '*', '{EVENT_FIELD}', ARGV[i])
  end
end
if dedup then redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4]) end
return 1
"""
_WRITTEN, _CONFLICT, _DUPLICATE = 1, 0, -1


class _AutoPipeline:
    """Send the commands that concurrent tasks issue to Redis together, in pipelines.

    Up to ``connections`` batches are on their way at a time, each on a connection taken once from the client's
    pool and kept; commands issued meanwhile wait and then go together in the next batch, so under load (the bus
    runs many jobs' events at once) dozens of round trips become one, and when idle a command goes at once.
    Each caller still awaits its own command and gets its own reply or error; a lost connection fails the
    commands of its batch and connects again for the next. A pipeline is not a transaction: every command keeps
    its own atomicity, no more and no less. The commands of the hot path have plain ``str`` / ``int``
    arguments, so they are encoded here (a third of what the client's general encoder costs).
    """

    def __init__(self, redis: aioredis.Redis, connections: int = 2) -> None:
        self.redis = redis
        self.connections = connections
        self._queue: list[tuple[bytes, asyncio.Future[Any]]] = []
        self._senders = 0  # running, each on its own connection
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: list[Any] = []  # taken from the pool once and kept: checking one out costs a lot

    async def execute(self, *command: str | int) -> Any:
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((_pack(command), reply))
        if self._senders < self.connections:
            # Starts on the next turn of the loop, so whatever else is issued in this one goes along.
            self._senders += 1
            sender = asyncio.ensure_future(self._send())
            self._tasks.add(sender)
            sender.add_done_callback(self._tasks.discard)
        return await reply

    async def _send(self) -> None:
        if not self._queue:  # another sender took it all
            self._senders -= 1
            return
        if self._connections:
            connection = self._connections.pop()
        else:
            try:
                connection = await self.redis.connection_pool.get_connection()  # type: ignore[no-untyped-call]
            except BaseException as exc:
                self._senders -= 1
                self._fail(self._take(), exc)
                raise
        try:
            while self._queue:
                batch = self._take()
                try:
                    results = await self._round_trip(connection, batch)
                except BaseException as exc:
                    await connection.disconnect()  # replies may be left unread: it connects again when next used
                    self._fail(batch, exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for (_packed, reply), result in zip(batch, results, strict=True):
                    if reply.done():
                        continue  # its caller was cancelled
                    if isinstance(result, Exception):
                        reply.set_exception(result)
                    else:
                        reply.set_result(result)
        finally:
            self._senders -= 1  # a command issued from now on starts a sender
            self._connections.append(connection)

    def _take(self) -> list[tuple[bytes, asyncio.Future[Any]]]:
        batch, self._queue = self._queue, []
        return batch

    @staticmethod
    async def _round_trip(connection: Any, batch: list[tuple[bytes, asyncio.Future[Any]]]) -> list[Any]:
        await connection.send_packed_command([packed for packed, _reply in batch], check_health=False)
        results: list[Any] = []
        for _ in batch:
            try:
                results.append(await connection.read_response())
            except ResponseError as exc:  # an error reply is that command's own outcome
                results.append(exc)
        return results

    @staticmethod
    def _fail(batch: list[tuple[bytes, asyncio.Future[Any]]], exc: BaseException) -> None:
        """The connection failed: every command of the batch fails with it (or is cancelled with its sender)."""
        for _packed, reply in batch:
            if reply.done():
                continue
            if isinstance(exc, Exception):
                reply.set_exception(exc)
            else:
                reply.cancel()


def _pack(command: tuple[str | int, ...]) -> bytes:
    """One command in the Redis protocol (RESP): an array of bulk strings."""
    parts = [b"*%d\r\n" % len(command)]
    for argument in command:
        data = argument.encode() if isinstance(argument, str) else b"%d" % argument
        parts += (b"$%d\r\n" % len(data), data, b"\r\n")
    return b"".join(parts)


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
    """Jobs in Redis; every write is one atomic script so indexes, history and outbox never drift apart."""

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
        self._write_sha = hashlib.sha1(_WRITE.encode()).hexdigest()
        self._pipe = _AutoPipeline(redis)

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
        written = await self._write_job("create", None, None, job, history, _with_ids(outbox), None, 0)
        return written == _WRITTEN

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
        for attempt in range(self.max_retries):
            if dedup is None:
                raw = await self._pipe.execute("GET", job_key)
            else:
                seen, raw = await self._pipe.execute("MGET", dedup, job_key)
                if seen is not None:
                    return Applied(duplicate=True)
            if raw is None:
                return Applied(missing=True)
            current = Job.model_validate_json(raw)
            change = decide(current)
            if change is None:
                if dedup is None:
                    return Applied(job=current)
                written = await self._write_job("apply", raw, current, current, {}, [], dedup, dedup_ttl, write=False)
                if written == _WRITTEN:
                    return Applied(job=current)
            else:
                if change.job.id != job_id:
                    raise ValueError(f"decider for {job_id} returned job {change.job.id}")
                new_job = change.job.model_copy(update={"version": current.version + 1})
                events = _with_ids(change.outbox)
                written = await self._write_job(
                    "apply", raw, current, new_job, change.history, events, dedup, dedup_ttl
                )
                if written == _WRITTEN:
                    return Applied(job=new_job, change=replace(change, job=new_job, outbox=events))
            if written == _DUPLICATE:
                return Applied(duplicate=True)
            await _backoff(attempt)  # another writer changed the job since it was read: decide again
        raise StoreConflict(f"could not apply a change to {job_id}: too many concurrent writers")

    async def _write_job(
        self,
        mode: str,
        raw: str | None,
        old: Job | None,
        new: Job,
        history: Mapping[str, Any],
        events: list[dict[str, Any]],
        dedup: str | None,
        dedup_ttl: int,
        *,
        write: bool = True,
    ) -> int:
        """Run the write script: the record, its indexes, one history entry, the outbox events and the dedup key."""
        keys: list[str] = [
            self.job_key(new.id),
            dedup or self.job_key(new.id),
            self.state_key(old.state if old is not None else new.state),
            self.state_key(new.state),
            self.instances_key,
            self.history_key(new.id),
            self.events_stream,
        ]
        instance_ids = new.instance_ids if write else []
        flags = ("c" if mode == "create" else "a") + "".join(
            "1" if flag else "0" for flag in (dedup is not None, write, old is not None)
        )
        args: list[str | int] = [
            flags,
            raw or "",
            new.id,
            dedup_ttl,
            new.model_dump_json() if write else "",
            pydantic_core.to_json(dict(history)).decode() if write else "",
            len(instance_ids),
            *instance_ids,
            *(encode_event(event)[EVENT_FIELD] for event in events),
        ]
        try:
            return int(await self._pipe.execute("EVALSHA", self._write_sha, len(keys), *keys, *args))
        except NoScriptError:  # a server that has not seen the script yet (or restarted since)
            await self.redis.script_load(_WRITE)
            return int(await self._pipe.execute("EVALSHA", self._write_sha, len(keys), *keys, *args))

    # Reads ----------------------------------------------------------------------------------------------------

    async def get(self, job_id: str) -> Job | None:
        raw = await self._pipe.execute("GET", self.job_key(job_id))
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

    async def history(self, job_id: str, count: int = 200, with_times: bool = False) -> list[dict[str, Any]]:
        """The job's latest ``count`` history entries, oldest first; ``with_times`` adds each one's ``written`` time
        (from the stream entry's id, which Redis stamps when the entry is written)."""
        entries = await self.redis.xrevrange(self.history_key(job_id), count=count)
        result: list[dict[str, Any]] = []
        for entry_id, fields in reversed(entries or []):
            if fields and HISTORY_FIELD in fields:
                entry = pydantic_core.from_json(fields[HISTORY_FIELD])
                if with_times:
                    millis = int(str(entry_id).split("-", 1)[0])
                    entry["written"] = datetime.fromtimestamp(millis / 1000, UTC)
                result.append(entry)
        return result

    async def job_for_instance(self, instance_id: str) -> str | None:
        job_id = await self.redis.hget(self.instances_key, instance_id)
        return None if job_id is None else str(job_id)

    # Once-only effects and the audit trail ----------------------------------------------------------------------

    async def claim_once(self, key: str, ttl: int = DEDUP_TTL) -> bool:
        """Record ``key`` as done; True only for the first caller (across replicas)."""
        return bool(await self._pipe.execute("SET", self.dedup_key(key), "1", "NX", "EX", ttl))

    async def was_done(self, key: str) -> bool:
        return bool(await self._pipe.execute("EXISTS", self.dedup_key(key)))

    async def job_unless_done(self, key: str, job_id: str) -> tuple[bool, Job | None]:
        """``(was_done(key), get(job_id))`` in one command; the job is not parsed when the key was done."""
        done, raw = await self._pipe.execute("MGET", self.dedup_key(key), self.job_key(job_id))
        if done is not None:
            return True, None
        return False, None if raw is None else Job.model_validate_json(raw)

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


def _with_ids(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every outbox event an ``id`` (consumers deduplicate on it) without changing the caller's dicts."""
    return [event if "id" in event else {"id": new_event_id(), **event} for event in events]


async def _backoff(attempt: int) -> None:
    """A short jittered pause so writers racing on one job do not collide again in lockstep."""
    await asyncio.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))
