"""The job store: jobs, their indexes and history in Redis, changed only by atomic transitions.

A transition (:meth:`JobStore.apply`) reads the job (and whether its dedup key was seen, in the same round trip),
asks a pure decider what to change, and hands the new record, the state and instance indexes, the history entry,
the dedup key and the outbox to one server-side script. The script runs atomically: it checks that the job is
still exactly what the decider saw and that the dedup key is still unseen, then writes all of it, or none of it
when either check fails; then the transition decides again on what is stored now (optimistic concurrency, as
WATCH/MULTI/EXEC would do it, in two round trips instead of four). :meth:`JobStore.apply_many` does the same for
a run of inputs of one job (the bus hands over a job's lane a batch at a time): one read, each input decided on
the job the one before left, one script writing every input's history, outbox and dedup key with the last job.

The outbox is not published anywhere first: each message goes straight to the queue its executor reads (chat
notes to the chat stream, cloud effects to the cloud stream, timers to the timer set; see :mod:`bot.queues`),
in that same script, so a change and what must follow from it are written together or not at all. The cloud
executor finishes an effect the same way (:meth:`JobStore.finish_effect`): the record that it was done and its
follow-up (``Launched``, a note) in one step.

The scripts keep the indexes ``list`` and retention read (creation, per channel, ended); the create script, given
the node caps (:mod:`handlers.caps`), counts the active jobs' nodes before it writes (a hash of each partition's active
jobs and their nodes, kept by the same scripts), so a cap is checked and taken in one step.
:meth:`JobStore.sweep` deletes ended jobs past their retention (:mod:`bot.retention`).

Every key is named in :mod:`bot.keys`; each script touches one partition's keys only (one cluster slot), and a
read across jobs asks every partition (pipelined: one round trip per server). Commands of concurrent handlers
share round trips (:mod:`bot.pipelining`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pydantic_core
import redis.asyncio as aioredis

from bot.durability import DurableWrites
from bot.errors import FinetuneError
from bot.keys import DEFAULT_KEYS, Keys
from bot.pipelining import Batcher
from bot.queues import DESTINATIONS, EVENT_FIELD, STREAM_MAXLEN, route
from handlers.backoff import backoff
from handlers.caps import Caps, Full, cap_group
from handlers.change import Change
from handlers.jobs import ACTIVE_STATES, TERMINAL_STATES, ChatRef, Job, JobState
from handlers.messages import Message
from handlers.restart_overhead import attempt_restart_s, blend

HISTORY_MAXLEN = 1000
AUDIT_MAXLEN = 10_000  # each of the two audit streams (actions, refusals)
HISTORY_FIELD = "entry"
DEDUP_TTL = 7 * 86400
EFFECT_TTL = 7 * 86400

Decider = Callable[[Job], Change | None]

# Puts ARGV[first…] where opts.routes says; KEYS[base + 1…4] are the events, chat and cloud streams and the timers.
_ROUTE = f"""
local slots = {{events = 1, chat = 2, cloud = 3}}
local function route(opts, base, first)
  for i, destination in ipairs(opts.routes) do
    local payload = ARGV[first + i - 1]
    if destination == 'timers' then
      redis.call('ZADD', KEYS[base + 4], opts.dues[i], payload)
    else
      local stream = KEYS[base + slots[destination]]
      redis.call('XADD', stream, 'MAXLEN', '~', '{STREAM_MAXLEN}', '*', '{EVENT_FIELD}', payload)
    end
  end
end
"""

# The node caps (handlers/caps.py), checked in the write that makes a job active: KEYS[index] is the partition's
# active-nodes hash (job id -> "nodes|group"); opts.caps: false, or the group, the job's nodes, and the room left
# in this partition for the group's nodes and for all (false: no cap), the other partitions counted by the caller.
# The job's own entry is left out (a relaunch of a job already counted). Returns 0 when the job fits, else -2 (its
# group's cap) or -3 (all groups' cap).
_NODE_CAPS = """
local function over_caps(opts, index)
  if not opts.caps then return 0 end
  local group, total = 0, 0
  local entries = redis.call('HGETALL', KEYS[index])
  for i = 1, #entries, 2 do
    if entries[i] ~= opts.job_id then
      local nodes, owner = string.match(entries[i + 1], '^(%d+)|(.*)$')
      total = total + tonumber(nodes)
      if owner == opts.caps.group then group = group + tonumber(nodes) end
    end
  end
  if group + opts.caps.nodes > opts.caps.group_room then return -2 end
  if opts.caps.total_room and total + opts.caps.nodes > opts.caps.total_room then return -3 end
  return 0
end
"""

# The atomic write of a new job. It checks before it writes anything, so it either writes all or nothing. Returns 1
# when written, 0 when the job is present already, -2 or -3 when its nodes do not fit a cap (see _NODE_CAPS).
# KEYS: 1 job, 2 its state set, 3 instances, 4 history, 5-8 the queues (see _ROUTE), 9 the creation index, 10 the
#   job's channel index, 11 the ended index, 12 the active-nodes hash.
# ARGV: 1 the options, JSON: job_id, instances (ids to map to the job), routes and dues (see _ROUTE), created (its
#   score in the indexes), channel (whether KEYS[10] is the job's), ended (the score of a job in a final state,
#   else false), counted (the job's "nodes|group" entry when it is active, else false), caps (see _NODE_CAPS);
#   2 the new job, 3 the history entry, 4… the outbox payloads.
_CREATE = (
    _ROUTE
    + _NODE_CAPS
    + f"""
local opts = cjson.decode(ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local full = over_caps(opts, 12)
if full ~= 0 then return full end
if opts.counted then redis.call('HSET', KEYS[12], opts.job_id, opts.counted) end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SADD', KEYS[2], opts.job_id)
for _, instance in ipairs(opts.instances) do redis.call('HSET', KEYS[3], instance, opts.job_id) end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '{HISTORY_MAXLEN}', '*', '{HISTORY_FIELD}', ARGV[3])
route(opts, 4, 4)
redis.call('ZADD', KEYS[9], opts.created, opts.job_id)
if opts.channel then redis.call('ZADD', KEYS[10], opts.created, opts.job_id) end
if opts.ended then
  redis.call('ZADD', KEYS[11], 'NX', opts.ended, opts.job_id)
else
  redis.call('ZREM', KEYS[11], opts.job_id)
end
return 1
"""
)
_WRITTEN = 1  # the scripts' answer when written (0: the job is not as read; -1: an input was seen meanwhile)
_FULL: dict[int, Full] = {-2: "group", -3: "total"}  # a node cap the write would pass (see _NODE_CAPS)

# The atomic write of a run of transitions of one job (one or more inputs decided one after the other on the job
# as read): each input's dedup key, history entry and outbox, and the job as the last one left it. Checked before
# anything is written, so it writes all or nothing: 1 when written, 0 when the job is not as the caller read it
# (changed or deleted), -1 when one of the dedup keys was seen meanwhile, -2 or -3 when the job, made active, does
# not fit a node cap (see _NODE_CAPS).
# KEYS: 1 job, 2 old state set, 3 new state set, 4 instances, 5 history, 6-9 the queues (see _ROUTE), 10 the ended
#   index, 11 the active-nodes hash, 12… the dedup keys (one per input that has one).
# ARGV: 1 the options, JSON: write (the job, its history and outbox; else only the dedup keys), job_id, dedup_ttl,
#   instances (ids to map to the job), routes and dues (see _ROUTE), ended (the score of a job in a final state,
#   else false), counted (the job's "nodes|group" entry when it is active, else false), caps (see _NODE_CAPS),
#   histories (how many history entries follow); 2 the job as read, 3 the new job, 4… the history entries, then
#   the outbox payloads.
_APPLY = (
    _ROUTE
    + _NODE_CAPS
    + f"""
local opts = cjson.decode(ARGV[1])
for i = 12, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return -1 end
end
if redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
if opts.write then
  local full = over_caps(opts, 11)
  if full ~= 0 then return full end
  if opts.counted then
    redis.call('HSET', KEYS[11], opts.job_id, opts.counted)
  else
    redis.call('HDEL', KEYS[11], opts.job_id)
  end
  redis.call('SET', KEYS[1], ARGV[3])
  redis.call('SREM', KEYS[2], opts.job_id)
  redis.call('SADD', KEYS[3], opts.job_id)
  for _, instance in ipairs(opts.instances) do redis.call('HSET', KEYS[4], instance, opts.job_id) end
  for i = 4, 3 + opts.histories do
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', '{HISTORY_MAXLEN}', '*', '{HISTORY_FIELD}', ARGV[i])
  end
  route(opts, 5, 4 + opts.histories)
  if opts.ended then
    redis.call('ZADD', KEYS[10], 'NX', opts.ended, opts.job_id)
  else
    redis.call('ZREM', KEYS[10], opts.job_id)
  end
end
for i = 12, #KEYS do redis.call('SET', KEYS[i], opts.job_id, 'EX', opts.dedup_ttl) end
return 1
"""
)

# An effect carried out: its record and its follow-up messages, once. Returns false when it was recorded
# already (then nothing is written), else 1.
# KEYS: 1 the effect's record, 2-5 the queues. ARGV: 1 options JSON (ttl, routes, dues), 2 the record, 3… payloads.
_FINISH = (
    _ROUTE
    + """
local opts = cjson.decode(ARGV[1])
if not redis.call('SET', KEYS[1], ARGV[2], 'NX', 'EX', opts.ttl) then return false end
route(opts, 1, 3)
return 1
"""
)

# An ended job past its retention, and everything that names it, deleted at once; nothing when it is no longer
# the job read (resumed meanwhile) or no longer ended before the cutoff. Returns 1 when deleted, else 0.
# KEYS: 1 job, 2 history, 3 its state set, 4 instances, 5 the creation index, 6 its channel index, 7 the ended index,
# 8 and 9 its chart's points and stride.
# ARGV: 1 the job as read, 2 its id, 3 the cutoff (POSIX seconds), 4… its instance ids.
_SWEEP = """
local score = redis.call('ZSCORE', KEYS[7], ARGV[2])
if not score or tonumber(score) > tonumber(ARGV[3]) then return 0 end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[8], KEYS[9])
redis.call('SREM', KEYS[3], ARGV[2])
for i = 4, #ARGV do
  if redis.call('HGET', KEYS[4], ARGV[i]) == ARGV[2] then redis.call('HDEL', KEYS[4], ARGV[i]) end
end
redis.call('ZREM', KEYS[5], ARGV[2])
redis.call('ZREM', KEYS[6], ARGV[2])
redis.call('ZREM', KEYS[7], ARGV[2])
return 1
"""

# Messages routed with no job change (a timer put back until due).
# KEYS: 1-4 the queues. ARGV: 1 options JSON (routes, dues), 2… payloads.
_SEND = _ROUTE + "\nroute(cjson.decode(ARGV[1]), 0, 2)\nreturn 1\n"


class JobCapReached(FinetuneError):
    """A write that makes a job active found its nodes past a node cap (checked and taken in one step): nothing
    written. ``full``: which cap, its group's or all groups'."""

    def __init__(self, full: Full) -> None:
        super().__init__(f"the job's nodes do not fit the {full} cap")
        self.full = full


@dataclass(frozen=True, slots=True)
class Applied:
    """The outcome of :meth:`JobStore.apply`.

    ``job`` is the job as stored afterwards (``None`` if missing or duplicate). ``change`` is the applied change
    with its job as written (version bumped) and every outbox message carrying its ``id``; ``None`` when nothing
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
        keys: Keys | None = None,
        *,
        prefix: str | None = None,
        max_retries: int = 50,
        audit_maxlen: int = AUDIT_MAXLEN,
        durability: DurableWrites | None = None,
    ) -> None:
        self.redis = redis
        self.audit_maxlen = audit_maxlen
        self.keys = keys or (Keys(prefix) if prefix is not None else DEFAULT_KEYS)
        self.max_retries = max_retries
        # Every state change (the create, apply, finish and send scripts) waits as the durability setting asks.
        self._batch = Batcher(redis, durability=durability)
        self._create = redis.register_script(_CREATE)
        self._apply = redis.register_script(_APPLY)
        self._finish = redis.register_script(_FINISH)
        self._send = redis.register_script(_SEND)
        self._sweep = redis.register_script(_SWEEP)
        assert [queue.rsplit(":", 1)[-1] for queue in self.keys.queues(0)] == list(DESTINATIONS)

    @property
    def prefix(self) -> str:
        return self.keys.prefix

    # Writes ---------------------------------------------------------------------------------------------------

    async def create(
        self, job: Job, history: Mapping[str, Any], outbox: Iterable[Message] = (), caps: Caps | None = None
    ) -> bool:
        """Store a new job with its first history entry (and outbox); ``False`` if the id is taken.

        ``caps``: the node caps the job must fit, with every active job's nodes; the count and the write are one
        step, so concurrent starts never pass a cap together. Past one: :class:`JobCapReached`, nothing written."""
        part = self.keys.partition_of(job.id)
        keys = [
            self.keys.job(job.id),
            self.keys.state(job.state, part),
            self.keys.instances_in(part),
            self.keys.history(job.id),
            *self.keys.queues(part),
            self.keys.created_in(part),
            self._channel_index(job),
            self.keys.ended_in(part),
            self.keys.active_nodes_in(part),
        ]
        routes, payloads = _routed(outbox, _platform(job))
        options = {
            "job_id": job.id,
            "instances": job.instance_ids,
            "created": job.created_at.timestamp(),
            "channel": job.chat is not None,
            "ended": job.updated_at.timestamp() if job.state in TERMINAL_STATES else False,
            "counted": _counted(job),
            "caps": await self._room(job, caps, part) if caps is not None else False,
            **routes,
        }
        args = [_json(options), job.model_dump_json(), _json(dict(history)), *payloads]
        written = int(await self._batch.script(self._create, keys, args, durable=True))
        if written in _FULL:
            raise JobCapReached(_FULL[written])
        return written == _WRITTEN

    async def _room(self, job: Job, caps: Caps, partition: int) -> dict[str, Any]:
        """The caps as the write script checks them (see ``_NODE_CAPS``): the room left in ``partition`` once every
        other partition's active nodes are counted (a store of one partition: the caps themselves)."""
        group, total = await self.active_nodes(caps.group, job.id, skip=partition)
        return {
            "group": caps.group,
            "nodes": job.nodes,
            "group_room": caps.max_concurrent_nodes - group,
            "total_room": caps.max_total_nodes - total if caps.max_total_nodes is not None else False,
        }

    async def active_nodes(self, group: str, except_job: str | None = None, skip: int | None = None) -> tuple[int, int]:
        """The nodes active jobs run: ``group``'s and all groups' (a job's own left out with ``except_job``; the
        partition ``skip`` not read)."""
        keys = [self.keys.active_nodes_in(part) for part in self.keys.all_partitions if part != skip]
        hashes = await asyncio.gather(*(self._batch.execute("HGETALL", key) for key in keys))
        in_group = in_all = 0
        for entries in hashes:
            for job_id, entry in _pairs(entries):
                if job_id == except_job:
                    continue
                nodes, owner = entry.split("|", 1)
                in_all += int(nodes)
                in_group += int(nodes) if owner == group else 0
        return in_group, in_all

    async def apply(
        self,
        job_id: str,
        decide: Decider,
        dedup_key: str | None = None,
        dedup_ttl: int = DEDUP_TTL,
        caps: Callable[[Job], Caps] | None = None,
    ) -> Applied:
        """Atomically: skip if ``dedup_key`` was seen, else write ``decide(job)`` with history, dedup and outbox.

        ``decide`` must be pure: it runs again when another writer changed the job in between. It returns
        ``None`` for "nothing to change"; the dedup key is still recorded so a redelivery costs one read.
        ``caps``: the node caps of the job (as decided), checked in the write when it leaves the job active (its own
        nodes not counted twice); past one: :class:`JobCapReached`, nothing written.
        """
        (applied,) = await self.apply_many(job_id, [(decide, dedup_key)], dedup_ttl, caps)
        return applied

    async def apply_many(
        self,
        job_id: str,
        steps: Sequence[tuple[Decider, str | None]],
        dedup_ttl: int = DEDUP_TTL,
        caps: Callable[[Job], Caps] | None = None,
    ) -> list[Applied]:
        """:meth:`apply` for several inputs of one job in one read and one write: each decider in turn, on the job
        as the one before left it; each input skipped when its dedup key was seen (or came earlier in ``steps``).

        The whole run is one atomic write (every input's history, outbox and dedup key, and the job as the last
        left it), so each input is still fenced, deduplicated and applied exactly once, and a crash anywhere
        leaves either all of them or none. One :class:`Applied` per step, in order.
        """
        job_key = self.keys.job(job_id)
        dedups = [self.keys.job_dedup(job_id, key) if key is not None else None for _decide, key in steps]
        wanted = [key for key in dedups if key is not None]
        for attempt in range(self.max_retries):
            *seen_list, raw = await self._batch.execute("MGET", *wanted, job_key)
            seen = {key for key, value in zip(wanted, seen_list, strict=True) if value is not None}
            if raw is None:
                return [Applied(duplicate=True) if key in seen else Applied(missing=True) for key in dedups]
            current = Job.model_validate_json(raw)
            job = current
            results: list[Applied] = []
            recorded: list[str] = []  # the dedup keys this write sets
            changes: list[Change] = []
            for (decide, _key), dedup in zip(steps, dedups, strict=True):
                if dedup is not None and (dedup in seen or dedup in recorded):
                    results.append(Applied(duplicate=True))
                    continue
                change = decide(job)
                if dedup is not None:
                    recorded.append(dedup)
                if change is None:
                    results.append(Applied(job=job))
                    continue
                if change.job.id != job_id:
                    raise ValueError(f"decider for {job_id} returned job {change.job.id}")
                job = change.job.model_copy(update={"version": job.version + 1})
                changes.append(replace(change, job=job))
                results.append(Applied(job=job, change=changes[-1]))
            if not recorded and not changes:
                await self._confirm(job_id)  # every input seen: written before, perhaps never confirmed
                return results
            checked = caps(job) if caps is not None and changes and job.state in ACTIVE_STATES else None
            written = await self._write_changes(raw, current, changes, recorded, dedup_ttl, checked)
            if written == _WRITTEN:
                return results
            if written in _FULL:
                raise JobCapReached(_FULL[written])
            await _backoff(attempt)  # another writer changed the job (or saw an input) since it was read: again
        # Lost the race to other writers every time: an ordinary failure, so the bus retries the whole event.
        raise FinetuneError(f"could not apply a change to {job_id}: too many concurrent writers")

    async def _confirm(self, job_id: str) -> None:
        """With a durability setting: wait until what the job's partition holds now is durable, as a write would
        (a tiny write in its slot, confirmed: replication keeps order, so its confirmation covers every earlier
        write). So an input whose write reached only the primary (StoreUnavailable, then redelivered) is not taken as
        done before its write is durable."""
        if self._batch.durability.wait is not None:
            await self._batch.execute("SET", self.keys.job_dedup(job_id, "confirmed"), "1", "PX", 60_000, durable=True)

    async def _write_changes(
        self,
        raw: str,
        old: Job,
        changes: Sequence[Change],
        dedups: Sequence[str],
        dedup_ttl: int,
        caps: Caps | None = None,
    ) -> int:
        """Run the apply script: the job as the last change left it, its indexes, one history entry and the outbox
        of each change, and the dedup keys; only the dedup keys when nothing changed."""
        new = changes[-1].job if changes else old
        part = self.keys.partition_of(new.id)
        keys = [
            self.keys.job(new.id),
            self.keys.state(old.state, part),
            self.keys.state(new.state, part),
            self.keys.instances_in(part),
            self.keys.history(new.id),
            *self.keys.queues(part),
            self.keys.ended_in(part),
            self.keys.active_nodes_in(part),
            *dedups,
        ]
        routes, payloads = _routed([message for change in changes for message in change.outbox], _platform(new))
        instances = list(dict.fromkeys(instance for change in changes for instance in change.job.instance_ids))
        options = {
            "write": bool(changes),
            "job_id": new.id,
            "dedup_ttl": dedup_ttl,
            "instances": instances,
            "ended": new.updated_at.timestamp() if new.state in TERMINAL_STATES else False,
            "counted": _counted(new),
            "caps": await self._room(new, caps, part) if caps is not None else False,
            "histories": len(changes),
            **routes,
        }
        histories = [_json(dict(change.history)) for change in changes]
        args = [_json(options), raw, new.model_dump_json() if changes else "", *histories, *payloads]
        return int(await self._batch.script(self._apply, keys, args, durable=True))

    async def finish_effect(
        self,
        effect_id: str,
        record: str,
        follow_ups: Iterable[Message] = (),
        platform: str = "",
        job_id: str | None = None,
    ) -> str | None:
        """Record that effect ``effect_id`` (of job ``job_id``) was carried out (``record`` says how) and route its
        follow-ups to the job's partition, in one step. ``None`` when this call recorded it; the record already
        there (and nothing written) otherwise."""
        routes, payloads = _routed(follow_ups, platform)
        key = self.keys.effect_done(effect_id, job_id)
        part = self.keys.partition_of(job_id) if job_id is not None else 0
        args = [_json({"ttl": EFFECT_TTL, **routes}), record, *payloads]
        if await self._batch.script(self._finish, [key, *self.keys.queues(part)], args, durable=True):
            return None
        existing = await self._batch.execute("GET", key)
        return "" if existing is None else str(existing)

    async def effect_record(self, effect_id: str, job_id: str | None = None) -> str | None:
        """How the effect (of job ``job_id``) was carried out, if it was."""
        value = await self._batch.execute("GET", self.keys.effect_done(effect_id, job_id))
        return None if value is None else str(value)

    async def send(self, messages: Iterable[Message], platform: str = "") -> None:
        """Route messages to their queues with no job change (each keeps its ``id``), each to its job's partition
        (partition 0 for a message of no job): one script per partition."""
        by_partition: dict[int, list[Message]] = {}
        for message in messages:
            job_id = getattr(message, "job_id", None)
            part = self.keys.partition_of(job_id) if isinstance(job_id, str) else 0
            by_partition.setdefault(part, []).append(message)
        for part, batch in by_partition.items():
            routes, payloads = _routed(batch, platform)
            await self._batch.script(self._send, self.keys.queues(part), [_json(routes), *payloads], durable=True)

    # Reads ----------------------------------------------------------------------------------------------------

    async def get(self, job_id: str) -> Job | None:
        raw = await self._batch.execute("GET", self.keys.job(job_id))
        return None if raw is None else Job.model_validate_json(raw)

    async def key_salt(self, job_id: str, attempt: int) -> str | None:
        """The key salt of the job's attempt numbered ``attempt`` (one of its attempts, or the one launched ahead of a
        switch of market), as stored with it; None when the store holds no such attempt. What the report gate
        derives the attempt's key from (handlers/report_keys.py)."""
        job = await self.get(job_id)
        if job is None:
            return None
        planned = job.standby if job.standby is not None and job.standby.number == attempt else None
        planned = planned or job.attempt_numbered(attempt)
        return planned.key_salt if planned is not None else None

    async def list_jobs(self, states: Collection[JobState] | None = None) -> list[Job]:
        """Jobs in ``states`` (all if ``None``), oldest first.

        The index is read in one transaction and each job's own state is checked again after loading, so a job
        that moved in between is never reported under a state it left.
        """
        wanted = list(JobState) if states is None else list(states)
        if not wanted:
            return []
        members = await self._pipelined(
            [("SMEMBERS", self.keys.state(state, part)) for part in self.keys.all_partitions for state in wanted]
        )
        ids = sorted(set().union(*members))
        if not ids:
            return []
        raws = await self._get_many([self.keys.job(job_id) for job_id in ids])
        jobs = [Job.model_validate_json(raw) for raw in raws if raw is not None]
        allowed = set(wanted)
        return sorted((job for job in jobs if job.state in allowed), key=lambda job: (job.created_at, job.id))

    async def recent(self, chat: ChatRef | None = None, count: int = 20) -> list[Job]:
        """The latest ``count`` jobs started in ``chat`` (every channel's when None), newest first: read from the
        channel's index, so ``list`` loads ``count`` jobs however many there are."""
        indexes = [
            self.keys.created_in(part) if chat is None else self.keys.channel_jobs(chat.platform, chat.channel, part)
            for part in self.keys.all_partitions
        ]
        async with self.redis.pipeline(transaction=False) as pipe:
            for index in indexes:
                pipe.zrevrange(index, 0, count - 1, withscores=True)
            tails: list[list[tuple[str, float]]] = await pipe.execute()
        scored = sorted(((float(score), str(job_id)) for tail in tails for job_id, score in tail), reverse=True)
        ids = [job_id for _score, job_id in scored[:count]]
        if not ids:
            return []
        raws = await self._get_many([self.keys.job(job_id) for job_id in ids])
        return [Job.model_validate_json(raw) for raw in raws if raw is not None]

    async def active_since(self, start: datetime) -> list[Job]:
        """Every job that may have been active since ``start`` (what ``costs`` reads): the jobs not in a final state
        (their state sets) and those that reached one at ``start`` or later (the ended index from ``start`` on), in
        every partition. A job that ended before ``start`` is not read, so the cost of a report is the jobs of its
        window, not every job retention keeps. The caller filters exactly (a job may have moved in between)."""
        open_states = [state for state in JobState if state not in TERMINAL_STATES]
        commands: list[tuple[Any, ...]] = []
        for part in self.keys.all_partitions:
            commands += [("SMEMBERS", self.keys.state(state, part)) for state in open_states]
            commands.append(("ZRANGEBYSCORE", self.keys.ended_in(part), start.timestamp(), "+inf"))
        found = await self._pipelined(commands)
        ids = sorted({str(job_id) for members in found for job_id in members})
        if not ids:
            return []
        raws = await self._get_many([self.keys.job(job_id) for job_id in ids])
        return [Job.model_validate_json(raw) for raw in raws if raw is not None]

    async def stream_backlog(self) -> list[StreamBacklog]:
        """Each consumer group of the three work streams (events, chat, cloud; every partition's, summed per
        group): the entries not yet delivered to it (``lag``; None when the server cannot tell, e.g. after a trim)
        and those delivered but not acknowledged (``pending``), for ``/metrics``. A stream not created yet has no
        group and is left out."""
        totals: dict[tuple[str, str], tuple[int | None, int]] = {}
        for name in ("events", "chat", "cloud"):
            for stream in self.keys.streams(name):
                if not await self.redis.exists(stream):
                    continue
                for group in await self.redis.xinfo_groups(stream):
                    raw_lag = group.get("lag")
                    key = (name, str(group["name"]))
                    lag, pending = totals.get(key, (0, 0))
                    lag = None if lag is None or raw_lag is None else lag + int(raw_lag)
                    totals[key] = (lag, pending + int(group["pending"]))
        return [StreamBacklog(name, group, lag, pending) for (name, group), (lag, pending) in totals.items()]

    async def counts_by_state(self) -> dict[JobState, int]:
        """How many jobs are in each state (every state present, zeros included), for ``/metrics``."""
        states = list(JobState)
        counts = await self._pipelined(
            [("SCARD", self.keys.state(state, part)) for state in states for part in self.keys.all_partitions]
        )
        width = self.keys.partitions
        return {state: sum(int(n) for n in counts[i * width : (i + 1) * width]) for i, state in enumerate(states)}

    async def _pipelined(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Replies to ``commands`` (reads, each of one key), sent in one pipeline (one per server on a cluster)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute())

    async def _get_many(self, keys: Sequence[str]) -> list[str | None]:
        """GET of each key: one MGET on a single partition, else a pipeline (MGET cannot cross slots)."""
        if self.keys.partitions == 1:
            return [None if raw is None else str(raw) for raw in await self.redis.mget(keys)]
        return await self._pipelined([("GET", key) for key in keys])

    async def history(self, job_id: str, count: int = 200, with_times: bool = False) -> list[dict[str, Any]]:
        """The job's latest ``count`` history entries, oldest first; ``with_times`` adds each one's ``written`` time
        (from the stream entry's id, which Redis stamps when the entry is written)."""
        entries = await self.redis.xrevrange(self.keys.history(job_id), count=count)
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
        return (await self.jobs_for_instances([instance_id])).get(instance_id)

    async def jobs_for_instances(self, instance_ids: Sequence[str]) -> dict[str, str]:
        """The job of each of ``instance_ids`` that one is known for, in one read of every partition's instance
        index (the bus's lanes use it)."""
        if not instance_ids:
            return {}
        indexes = [self.keys.instances_in(part) for part in self.keys.all_partitions]
        found = await asyncio.gather(*(self._batch.execute("HMGET", index, *instance_ids) for index in indexes))
        jobs: dict[str, str] = {}
        for replies in found:
            jobs.update({instance: str(job) for instance, job in zip(instance_ids, replies, strict=True) if job})
        return jobs

    # Retention ----------------------------------------------------------------------------------------------

    async def sweep(self, cutoff: datetime, batch: int = 100) -> int:
        """Delete jobs that ended before ``cutoff``, with their history and every index entry (atomically per job;
        one that was resumed meanwhile is kept). Returns how many were deleted; at most ``batch`` per call (and
        partition)."""
        deleted = 0
        for part in self.keys.all_partitions:
            ended, created = self.keys.ended_in(part), self.keys.created_in(part)
            found = await self.redis.zrangebyscore(ended, "-inf", cutoff.timestamp(), start=0, num=batch)
            for job_id in (str(job_id) for job_id in found):
                raw = await self.redis.get(self.keys.job(job_id))
                if raw is None:  # gone already: only the index entries are left
                    await self.redis.zrem(ended, job_id)
                    await self.redis.zrem(created, job_id)
                    deleted += 1
                    continue
                job = Job.model_validate_json(raw)
                keys = [
                    self.keys.job(job_id),
                    self.keys.history(job_id),
                    self.keys.state(job.state, part),
                    self.keys.instances_in(part),
                    created,
                    self._channel_index(job),
                    ended,
                    self.keys.chart(job_id),
                    self.keys.chart_stride(job_id),
                ]
                args = [raw, job_id, cutoff.timestamp(), *job.instance_ids]
                deleted += int(await self._sweep(keys=keys, args=args))
        return deleted

    def _channel_index(self, job: Job) -> str:
        """The job's channel index in its partition (the creation index stands in for a job with no channel:
        never written)."""
        part = self.keys.partition_of(job.id)
        if job.chat is None:
            return self.keys.created_in(part)
        return self.keys.channel_jobs(job.chat.platform, job.chat.channel, part)

    # Restart overheads measured per (recipe, instance type, nodes) -----------------------------------------------

    async def record_restart(self, job: Job) -> None:
        """Fold the current attempt's measured restart overhead into its (recipe, instance type, nodes) estimate,
        once."""
        current = job.current
        measured = attempt_restart_s(current) if current is not None else None
        if current is None or measured is None or current.instance_type is None:
            return
        if not await self.claim_once(self.keys.restart_measured(job.id, current.number)):
            return
        field = _restart_field(job.recipe, current.instance_type, job.nodes)
        previous = await self.redis.hget(self.keys.restarts, field)
        await self.redis.hset(self.keys.restarts, field, str(blend(float(previous) if previous else None, measured)))

    async def restart_estimate(self, recipe: str, instance_types: Sequence[str], nodes: int = 1) -> float | None:
        """The restart overhead earlier jobs of ``recipe`` of as many ``nodes`` measured: on the first of its types
        that has one."""
        if not instance_types:
            return None
        fields = [_restart_field(recipe, kind, nodes) for kind in instance_types]
        values = await self.redis.hmget(self.keys.restarts, fields)
        return next((float(value) for value in values if value is not None), None)

    # Once-only markers and the audit trail ----------------------------------------------------------------------

    async def mark(self, key: str, value: str, ttl: int) -> None:
        """SET ``key`` (one the chat outbox keeps: a note was sent, or is being sent), as durably as a state change:
        a mark lost in a failover would post its note again."""
        await self._batch.execute("SET", key, value, "EX", ttl, durable=True)

    async def claim_once(self, key: str, ttl: int = DEDUP_TTL) -> bool:
        """Record ``key`` as done; True only for the first caller (across replicas)."""
        return bool(await self._batch.execute("SET", self.keys.dedup(key), "1", "NX", "EX", ttl))

    async def was_done(self, key: str) -> bool:
        return bool(await self._batch.execute("EXISTS", self.keys.dedup(key)))

    async def audit(self, entry: Mapping[str, Any]) -> None:
        """What a person did (a command carried out), kept like a job's history, capped."""
        await self._log(self.keys.audit, entry)

    async def refused(self, entry: Mapping[str, Any]) -> None:
        """A refused command, in a capped stream of its own: refusals never roll actions out of :meth:`audit`."""
        await self._log(self.keys.refusals, entry)

    async def audit_log(self, count: int = 200) -> list[dict[str, Any]]:
        """The latest ``count`` actions, oldest first."""
        return await self._read_log(self.keys.audit, count)

    async def refusal_log(self, count: int = 200) -> list[dict[str, Any]]:
        """The latest ``count`` refusals, oldest first."""
        return await self._read_log(self.keys.refusals, count)

    async def _log(self, stream: str, entry: Mapping[str, Any]) -> None:
        await self.redis.xadd(stream, {HISTORY_FIELD: _json(dict(entry))}, maxlen=self.audit_maxlen, approximate=True)

    async def _read_log(self, stream: str, count: int) -> list[dict[str, Any]]:
        entries = await self.redis.xrevrange(stream, count=count)
        return [pydantic_core.from_json(fields[HISTORY_FIELD]) for _id, fields in reversed(entries or []) if fields]


@dataclass(frozen=True, slots=True)
class StreamBacklog:
    """One consumer group's backlog on one work stream."""

    stream: str  # events, chat or cloud
    group: str
    lag: int | None  # entries not yet delivered to the group
    pending: int  # delivered, not yet acknowledged


def _routed(messages: Iterable[Message], platform: str) -> tuple[dict[str, list[Any]], list[str]]:
    """The script's ``routes`` and ``dues`` options, and the payloads (each message encoded once) in that order."""
    routed = [route(message, platform) for message in messages]
    options: dict[str, list[Any]] = {
        "routes": [item.destination for item in routed],
        "dues": [repr(item.due) for item in routed],
    }
    return options, [item.payload for item in routed]


def _counted(job: Job) -> str | bool:
    """The job's entry in its partition's active-nodes hash ("nodes|group"), or False when it is not active."""
    return f"{job.nodes}|{cap_group(job.team, job.requested_by)}" if job.state in ACTIVE_STATES else False


def _pairs(entries: Any) -> list[tuple[str, str]]:
    """A hash read back (a mapping, or the flat field-value list of a raw reply) as (field, value) pairs."""
    if isinstance(entries, Mapping):
        return [(str(key), str(value)) for key, value in entries.items()]
    flat = list(entries or [])
    return [(str(flat[i]), str(flat[i + 1])) for i in range(0, len(flat), 2)]


def _platform(job: Job) -> str:
    return job.chat.platform if job.chat is not None else ""


def _json(value: Any) -> str:
    return pydantic_core.to_json(value).decode()


async def _backoff(attempt: int) -> None:
    """A short, fully jittered pause so writers racing on one job do not collide again in lockstep."""
    await asyncio.sleep(backoff(attempt + 1, base=0.002, cap=0.02, jitter=1.0))


def _restart_field(recipe: str, instance_type: str, nodes: int) -> str:
    """The restart estimate's field: a gang's nodes start together (node 0 first, then the world's rendezvous), so a
    gang of N keeps its own; one node's keeps the spelling it always had."""
    return f"{recipe}|{instance_type}" if nodes <= 1 else f"{recipe}|{instance_type}|{nodes}"
