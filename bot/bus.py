"""The event bus: one Redis stream read by a consumer group, so replicas share the work and none loses it.

Delivery is at least once. A consumer reads messages in batches and runs them concurrently, one *lane* per
partition key (the job a message is about, see :func:`partition_key`): messages of one lane are handled one
after the other in stream order, lanes run side by side, and a message without a key waits for everything read
before it and holds up everything read after it. Given a batch handler, a lane hands it the messages that wait in
it together (the job store applies them in one write); a batch that fails runs again one message at a time. A
message is acknowledged only after its handler returned (the acknowledgements of whatever finished meanwhile go in
one XACK). One whose consumer died stays pending and is claimed by a live consumer once idle for ``claim_idle_ms``
(a few seconds: a dead replica's work is taken over that soon). While a consumer holds messages (running or
waiting for their turn), their idle time is reset every second or so, so a slow handler or a message queued behind
one is not mistaken for an abandoned one.
A handler that fails because Redis is unreachable is run again once it answers, without counting a delivery:
an outage, however long, parks nothing. On stop, handlers already running finish; messages read but not started, and
those whose handler raised :class:`HandBack` then, are handed back (marked idle, so the next consumer that looks
for stale work takes them at once). A message that failed ``max_tries`` deliveries is parked on
``<stream>:parked`` with its error, so a poison event never blocks the stream. Handlers must be idempotent (the
job store's dedup keys make them so). The bus runs the job store's inputs (``events``), and the same class
carries the chat outbox (``chat``) and the cloud executor (``cloud``), each with its own consumer group.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import json
import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pydantic_core
import redis.asyncio as aioredis
from pydantic import BaseModel
from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT, StreamIdT

from bot.errors import FinetuneError, StoreUnavailable
from bot.keys import DEFAULT_KEYS, Keys
from bot.queues import EVENT_FIELD, STREAM_MAXLEN
from handlers.backoff import backoff
from handlers.ids import new_event_id

log = logging.getLogger(__name__)

EVENTS_STREAM = DEFAULT_KEYS.events
# How long a message may sit unrenewed before another consumer takes it: its holder renews every
# ``claim_idle_ms / 4``, so only a replica that is dead (or frozen that long) loses its messages.
CLAIM_IDLE_MS = 4_000
CLAIM_EVERY_MS = 1_000
LATENCY_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# The idle time given to messages handed back on stop: past any consumer's ``claim_idle_ms``, so they are stale.
RELEASED_IDLE_MS = 86_400_000
# How many ids go in one XCLAIM when leases are renewed.
LEASE_CHUNK = 500

Handler = Callable[[dict[str, Any]], Awaitable[None]]
# Several messages of one lane, in stream order, handled together (e.g. one store write for the lot); raising
# hands them to the one-at-a-time handler, each as if alone (handlers are idempotent, so what got done is skipped).
BatchHandler = Callable[[Sequence[dict[str, Any]]], Awaitable[None]]
# The most messages of one lane handed to a batch handler at once.
LANE_BATCH = 32
PartitionKey = Callable[[dict[str, Any]], str | None]
# Which job each of these instances runs (those it knows): so a cloud's word about an instance joins its job's lane.
JobsOfInstances = Callable[[Sequence[str]], Awaitable[Mapping[str, str]]]


def encode_event(event: Mapping[str, Any] | BaseModel) -> dict[str, str]:
    """The stream entry for ``event``: its JSON in one field, so nested values survive. A typed message (which has
    its ``id``) is encoded once, from the model; a dict gets an ``id`` if it has none."""
    if isinstance(event, BaseModel):
        return {EVENT_FIELD: event.model_dump_json()}
    if "id" not in event:
        event = {"id": new_event_id(), **event}
    return {EVENT_FIELD: pydantic_core.to_json(event).decode()}


def default_consumer_name() -> str:
    """Unique per replica and per process: a restarted bot must not inherit the old one's pending list."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def partition_key(event: Mapping[str, Any]) -> str | None:
    """The lane of a bus message: its job (a runner report's, or the message's own ``job_id``), else its instance,
    else the ``lane`` it names.

    A cloud event names only its instance; a bus given ``jobs_of_instances`` adds the instance's job (read once,
    as the message is taken) so it runs in the job's lane, one after the other with the runner's reports of the same
    fact. ``None`` (nothing to go by) puts the message in stream order with respect to every other message.
    """
    report = event.get("report")
    if isinstance(report, Mapping) and isinstance(report.get("job_id"), str):
        return f"job:{report['job_id']}"
    if isinstance(event.get("job_id"), str):
        return f"job:{event['job_id']}"
    if isinstance(event.get("instance_id"), str):
        return f"instance:{event['instance_id']}"
    if isinstance(event.get("lane"), str):  # an entry that names its own lane (a costs chart: its channel's)
        return f"lane:{event['lane']}"
    return None


@dataclass
class LatencySummary:
    """Handler latency in the shape Prometheus histograms want: count, sum and cumulative bucket counts."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    count: int = 0
    sum: float = 0.0
    bucket_counts: list[int] = field(default_factory=list)  # per bucket; cumulative() adds them up

    def __post_init__(self) -> None:
        self.bucket_counts = [0] * len(self.buckets)

    def observe(self, seconds: float) -> None:
        """Count it in its own bucket only (the first bound at or above it); :meth:`cumulative` adds them up."""
        self.count += 1
        self.sum += seconds
        index = bisect.bisect_left(self.buckets, seconds)
        if index < len(self.buckets):
            self.bucket_counts[index] += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= bound)`` pairs, ending with ``+Inf``."""
        return [*zip(self.buckets, itertools.accumulate(self.bucket_counts), strict=True), (float("inf"), self.count)]


class HandBack(FinetuneError):
    """Raised by a handler that cannot finish because the consumer is stopping (e.g. it was waiting for an
    outside service to come back): the message goes back as if it had never been read, and this delivery does
    not count towards ``max_tries``. Raised while the consumer is not stopping, it is an ordinary failure.
    """


class Outcome(Enum):
    DONE = "done"  # handled: acknowledge
    FAILED = "failed"  # left pending for a retry
    PARKED = "parked"  # moved aside (already acknowledged)


class EventBus:
    """Publish events and run a consumer of the group; see the module docstring for the delivery rules."""

    def __init__(
        self,
        redis: aioredis.Redis,
        stream: str = EVENTS_STREAM,
        group: str = "bot",
        consumer: str | None = None,
        max_tries: int = 5,
        claim_idle_ms: int = CLAIM_IDLE_MS,
        *,
        block_ms: int = 1000,
        claim_every_ms: int | None = None,
        batch_size: int = 64,
        max_in_flight: int = 256,
        key: PartitionKey = partition_key,
        jobs_of_instances: JobsOfInstances | None = None,
    ) -> None:
        if max_tries < 1:
            raise ValueError("max_tries must be >= 1")
        if batch_size < 1 or max_in_flight < 1:
            raise ValueError("batch_size and max_in_flight must be >= 1")
        self.redis = redis
        self.stream = stream
        self.group = group
        self.consumer = consumer or default_consumer_name()
        self.max_tries = max_tries
        self.claim_idle_ms = claim_idle_ms
        self.block_ms = block_ms
        self.claim_every_ms = min(CLAIM_EVERY_MS, claim_idle_ms // 2) if claim_every_ms is None else claim_every_ms
        self.batch_size = batch_size
        self.max_in_flight = max_in_flight
        self.key = key
        self.jobs_of_instances = jobs_of_instances
        self.parked_stream = Keys.parked(stream)
        self.handled = 0
        self.failed = 0
        self.parked = 0
        self.claimed = 0
        self.claim_scans = 0  # passes looking for stale messages (a test waits on them, not on the clock)
        self.released = 0
        self.outages = 0  # handler runs that waited for Redis to come back
        self.unreachable = 0  # passes of the consume loop that found Redis unreachable (and backed off)
        self.latency = LatencySummary()

    async def ensure_group(self) -> None:
        """Create the group (and the stream) if missing; it starts at ``0`` so nothing published earlier is lost."""
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def publish(self, event: Mapping[str, Any] | BaseModel) -> str:
        """Append ``event`` (a typed message, or a dict that gets an ``id`` if missing); the stream message id."""
        fields = _fields(encode_event(event))
        message_id = await self.redis.xadd(self.stream, fields, maxlen=STREAM_MAXLEN, approximate=True)
        return str(message_id)

    async def run(self, handler: Handler, stop: asyncio.Event, batch: BatchHandler | None = None) -> None:
        """Consume until ``stop`` is set. Handlers running then finish; what was not handled stays pending.

        ``batch``: when given, the messages waiting in one lane together (read in one go, none without a key
        between them) go to it at once, and to ``handler`` one by one only when it raises.

        Handler errors never end the loop, nor does losing Redis for a while (it backs off and tries again) or
        losing the group with its stream (it is created again). Cancelling it is a crash: nothing more is
        acknowledged, and what this consumer held is reclaimed by another once idle.
        """
        lanes = _Lanes(self, handler, stop, batch)
        group_ready = False
        next_claim = 0.0
        outage = 0
        try:
            while not stop.is_set():
                try:
                    if not group_ready:
                        await self.ensure_group()
                        group_ready = True
                    if time.monotonic() >= next_claim:
                        await self._claim_stale(lanes, stop)
                        next_claim = time.monotonic() + self.claim_every_ms / 1000
                    if stop.is_set():
                        break
                    block = max(1, min(self.block_ms, int((next_claim - time.monotonic()) * 1000)))
                    if lanes.room() <= 0:
                        await lanes.wait_for_room(block / 1000)
                        continue
                    await self._read_new(lanes, block)
                    outage = 0
                except ResponseError as exc:
                    if "NOGROUP" not in str(exc):
                        raise
                    log.warning("consumer group %s of %s vanished: creating it again", self.group, self.stream)
                    group_ready = False
                except StoreUnavailable as exc:
                    outage += 1
                    self.unreachable += 1
                    delay = backoff(outage, base=0.1, cap=5.0, jitter=0)
                    log.warning("event bus cannot reach Redis (%s): retrying in %.2fs", exc, delay)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
            await lanes.drain()
        finally:
            await lanes.abort()

    async def _read_new(self, lanes: _Lanes, block_ms: int) -> None:
        count = min(self.batch_size, lanes.room())
        reply = await self.redis.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms)
        entries = [_Read(message_id, fields) for message_id, fields in _read_entries(reply)]
        await self._join_jobs(entries)
        for entry in entries:
            lanes.dispatch(entry, deliveries=1)

    async def _join_jobs(self, entries: Sequence[_Read]) -> None:
        """Give each message that names only an instance its job (one read for the whole batch), when known."""
        if self.jobs_of_instances is None:
            return
        waiting = [
            (entry.event, instance)
            for entry in entries
            if entry.event is not None
            and not isinstance(entry.event.get("job_id"), str)
            and isinstance(instance := entry.event.get("instance_id"), str)
        ]
        if not waiting:
            return
        jobs = await self.jobs_of_instances(sorted({instance for _event, instance in waiting}))
        for event, instance in waiting:
            job_id = jobs.get(instance)
            if job_id is not None:
                event["job_id"] = job_id

    async def _claim_stale(self, lanes: _Lanes, stop: asyncio.Event) -> None:
        """Take over messages idle longer than ``claim_idle_ms`` (a crashed consumer's, or failed ones) and retry."""
        self.claim_scans += 1
        cursor = "0-0"
        while not stop.is_set() and lanes.room() > 0:
            reply = await self.redis.xautoclaim(
                self.stream,
                self.group,
                self.consumer,
                self.claim_idle_ms,
                start_id=cursor,
                count=min(self.batch_size, lanes.room()),
            )
            # Entries trimmed away while pending come back in reply[2] and are already dropped from the group.
            cursor = str(reply[0])
            # One of our own could only be here if renewing its lease failed; it is in hand already.
            entries = [_Read(*entry) for entry in _entries(reply[1]) if not lanes.holds(entry[0])]
            deliveries = await self._deliveries([entry.message_id for entry in entries])
            await self._join_jobs(entries)
            for entry in entries:
                self.claimed += 1
                lanes.dispatch(entry, deliveries.get(entry.message_id, 1))
            if cursor == "0-0":
                return

    async def _deliveries(self, message_ids: Sequence[str]) -> dict[str, int]:
        """How many times each of ``message_ids`` was delivered (one round trip for all)."""
        if not message_ids:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for message_id in message_ids:
                pipe.xpending_range(self.stream, self.group, min=message_id, max=message_id, count=1)
            replies = await pipe.execute()
        return {str(entry["message_id"]): int(entry["times_delivered"]) for reply in replies for entry in reply}

    async def process(
        self,
        handler: Handler,
        message_id: str,
        fields: dict[str, str],
        event: dict[str, Any],
        deliveries: int,
        stop: asyncio.Event,
    ) -> Outcome:
        """Run ``handler`` on one message read by this consumer: DONE (acknowledge it), FAILED (retried once
        idle) or PARKED (its ``max_tries``-th failure). While Redis is unreachable the handler runs again once it
        answers (the message stays in hand); :class:`HandBack` when ``stop`` is set meanwhile."""
        started = time.perf_counter()
        outage = 0
        try:
            while True:
                try:
                    await handler(event)
                    return Outcome.DONE
                except HandBack:
                    raise
                except StoreUnavailable as exc:
                    outage += 1
                    self.outages += 1
                    delay = backoff(outage, base=0.1, cap=2.0, jitter=0)
                    if outage == 1 or outage % 20 == 0:
                        log.warning("event %s waits for Redis (%s): again in %.2fs", event.get("id"), exc, delay)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    if stop.is_set():
                        raise HandBack() from exc
                except Exception as exc:
                    self.failed += 1
                    if deliveries >= self.max_tries:
                        log.exception("event %s failed %d times: parked", event.get("id"), deliveries)
                        await self.park(message_id, fields, f"{type(exc).__name__}: {exc}", deliveries)
                        return Outcome.PARKED
                    log.exception("event %s failed (delivery %d/%d)", event.get("id"), deliveries, self.max_tries)
                    return Outcome.FAILED
        finally:
            self.latency.observe(time.perf_counter() - started)

    async def park(self, message_id: str, fields: dict[str, str], error: str, deliveries: int) -> None:
        """Move the message aside with its error, in one transaction with its ack."""
        entry = {
            EVENT_FIELD: fields.get(EVENT_FIELD, json.dumps(fields)),
            "error": error[:4000],
            "deliveries": str(deliveries),
            "message_id": message_id,
            "consumer": self.consumer,
        }
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.parked_stream, _fields(entry), maxlen=STREAM_MAXLEN, approximate=True)
            pipe.xack(self.stream, self.group, message_id)
            await pipe.execute()
        self.parked += 1

    async def parked_events(self, count: int = 100) -> Sequence[dict[str, Any]]:
        """The parked entries, oldest first, each with its event decoded (for an operator or a test)."""
        result: list[dict[str, Any]] = []
        for _id, fields in _entries(await self.redis.xrange(self.parked_stream, count=count)):
            item: dict[str, Any] = dict(fields)
            with contextlib.suppress(ValueError):
                item[EVENT_FIELD] = json.loads(fields[EVENT_FIELD])
            item["deliveries"] = int(fields.get("deliveries", "0"))
            result.append(item)
        return result


class _Read:
    """A stream entry as read: its fields and, when they hold a JSON object, its event (else why not)."""

    __slots__ = ("error", "event", "fields", "message_id")

    def __init__(self, message_id: str, fields: dict[str, str]) -> None:
        self.message_id = message_id
        self.fields = fields
        self.event: dict[str, Any] | None = None
        self.error = ""
        try:
            event = pydantic_core.from_json(fields[EVENT_FIELD])  # a fraction of json.loads's cost
            if not isinstance(event, dict):
                raise TypeError(f"event is a {type(event).__name__}, not an object")
            self.event = event
        except (KeyError, TypeError, ValueError) as exc:
            self.error = f"malformed: {exc!r}"


class _Entry:
    """A message read, waiting for its turn or running."""

    __slots__ = ("_done", "barrier", "deliveries", "event", "fields", "finished", "message_id")

    def __init__(
        self, message_id: str, fields: dict[str, str], event: dict[str, Any], deliveries: int, barrier: _Entry | None
    ) -> None:
        self.message_id = message_id
        self.fields = fields
        self.event = event
        self.deliveries = deliveries
        self.barrier = barrier  # the message without a key read last before this one: it runs first
        self.finished = False
        self._done: asyncio.Future[None] | None = None

    def done_future(self) -> asyncio.Future[None]:
        """Resolved once this message has run (or was handed back); made only for a message someone waits for."""
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
            if self.finished:
                self._done.set_result(None)
        return self._done

    def finish(self) -> None:
        self.finished = True
        if self._done is not None and not self._done.done():
            self._done.set_result(None)


class _Lane:
    """The messages of one partition key, run in stream order by one worker task."""

    __slots__ = ("current", "queue")

    def __init__(self) -> None:
        self.queue: deque[_Entry] = deque()
        self.current: _Entry | None = None

    def last(self) -> _Entry:
        """The message read last in this lane (a lane exists only while it has one)."""
        if self.queue:
            return self.queue[-1]
        assert self.current is not None
        return self.current


class _Lanes:
    """The messages one :meth:`EventBus.run` holds: their ordering, leases, acknowledgements and hand-back.

    Each partition key with messages in hand has a lane whose worker runs them one after the other, so one lane
    runs in stream order while lanes run concurrently. A message without a key waits for the last message of
    every lane (and the previous keyless one) and holds up every message read after it. ``held`` maps every
    message this consumer owns and has neither acknowledged nor given up to its delivery count: those leases are
    renewed, and their number bounds how much is read ahead.
    """

    def __init__(self, bus: EventBus, handler: Handler, stop: asyncio.Event, batch: BatchHandler | None) -> None:
        self.bus = bus
        self.handler = handler
        self.batch = batch
        self.stop = stop
        self._held: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._lanes: dict[str, _Lane] = {}  # the lanes with messages to run, each with its worker
        self._barrier: _Entry | None = None  # the last message read without a key, until it has run
        self._unstarted: list[tuple[str, int]] = []  # read, not started before stop: to hand back
        self._to_ack: list[str] = []
        self._ack_wanted = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._closing = False
        self._lease_lock = asyncio.Lock()
        self._acker = asyncio.create_task(self._ack_loop(), name=f"bus-ack-{bus.consumer}")
        self._leaser = asyncio.create_task(self._lease_loop(), name=f"bus-lease-{bus.consumer}")

    # -- what the reader asks ----------------------------------------------------------------------------

    def room(self) -> int:
        return self.bus.max_in_flight - len(self._held)

    def holds(self, message_id: str) -> bool:
        return message_id in self._held

    async def wait_for_room(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._room.wait(), timeout)

    def dispatch(self, read: _Read, deliveries: int) -> None:
        """Take a message read (or claimed) by this consumer; it runs when its turn in its lane comes."""
        message_id, fields, event = read.message_id, read.fields, read.event
        if message_id in self._held:
            return
        self._hold(message_id, deliveries)
        if event is None:
            # Malformed: no retry can fix it, and it has no place in any lane.
            self._spawn(self._park_malformed(message_id, fields, read.error, deliveries))
            return
        entry = _Entry(message_id, fields, event, deliveries, self._barrier)
        key = self.bus.key(event)
        if key is None:
            # After everything read before it, before everything read after it.
            before = [lane.last() for lane in self._lanes.values()]
            if self._barrier is not None:
                before.append(self._barrier)
            self._barrier = entry
            self._spawn(self._run_barrier(entry, [other.done_future() for other in before]))
            return
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
            lane.queue.append(entry)
            self._spawn(self._run_lane(key, lane))
        else:
            lane.queue.append(entry)

    # -- running messages --------------------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_lane(self, key: str, lane: _Lane) -> None:
        """One lane's worker: its messages one after the other (those waiting together in one batch, when the
        bus has a batch handler); it ends (and the lane with it) once none is left."""
        try:
            while lane.queue:
                entries = self._take(lane)
                lane.current = entries[-1]
                try:
                    barrier = entries[0].barrier
                    if barrier is not None and not barrier.finished:
                        await asyncio.wait([barrier.done_future()])
                    if len(entries) == 1:
                        await self._run(entries[0])
                    else:
                        await self._run_batch(entries)
                finally:
                    for entry in entries:
                        entry.finish()
                    lane.current = None
        finally:
            if self._lanes.get(key) is lane:
                del self._lanes[key]

    def _take(self, lane: _Lane) -> list[_Entry]:
        """The lane's next message, and with a batch handler those behind it that wait for the same barrier."""
        first = lane.queue.popleft()
        entries = [first]
        if self.batch is not None:
            while lane.queue and len(entries) < LANE_BATCH and lane.queue[0].barrier is first.barrier:
                entries.append(lane.queue.popleft())
        return entries

    async def _run_batch(self, entries: list[_Entry]) -> None:
        """Hand ``entries`` to the batch handler; if it raises, run each alone (retries, parking, hand-back)."""
        assert self.batch is not None
        if self.stop.is_set():
            for entry in entries:
                self._release_later(entry.message_id)
            return
        started = time.perf_counter()
        try:
            await self.batch([entry.event for entry in entries])
        except Exception as exc:
            log.info("a batch of %d events failed (%r): each runs alone", len(entries), exc)
            for entry in entries:
                await self._run(entry)
            return
        elapsed = time.perf_counter() - started
        for entry in entries:
            self.bus.latency.observe(elapsed)
            self._to_ack.append(entry.message_id)
        self._ack_wanted.set()

    async def _run_barrier(self, entry: _Entry, before: list[asyncio.Future[None]]) -> None:
        try:
            if before:
                await asyncio.wait(before)
            await self._run(entry)
        finally:
            entry.finish()
            if self._barrier is entry:
                self._barrier = None

    async def _run(self, entry: _Entry) -> None:
        if self.stop.is_set():
            self._release_later(entry.message_id)
            return
        try:
            outcome = await self.bus.process(
                self.handler, entry.message_id, entry.fields, entry.event, entry.deliveries, self.stop
            )
        except HandBack:
            if self.stop.is_set():
                self._release_later(entry.message_id)
                return
            log.warning("event %s handed back while not stopping: retried once idle", entry.event.get("id"))
            outcome = Outcome.FAILED
        except Exception:
            # Parking failed (Redis gone?): it stays pending, and a consumer retries it once idle.
            log.exception("event %s: could not park it", entry.event.get("id"))
            outcome = Outcome.FAILED
        if outcome is Outcome.DONE:
            self._to_ack.append(entry.message_id)
            self._ack_wanted.set()
        else:
            self._let_go(entry.message_id)  # a failed one goes idle (its lease lapses): retried after claim_idle_ms

    async def _park_malformed(self, message_id: str, fields: dict[str, str], error: str, deliveries: int) -> None:
        try:
            await self.bus.park(message_id, fields, error, deliveries)
        except Exception:
            log.exception("could not park malformed message %s", message_id)
        finally:
            self._let_go(message_id)

    def _hold(self, message_id: str, deliveries: int) -> None:
        self._held[message_id] = deliveries
        if self.room() <= 0:
            self._room.clear()

    def _let_go(self, message_id: str) -> int | None:
        deliveries = self._held.pop(message_id, None)
        if self.room() > 0:
            self._room.set()
        return deliveries

    def _release_later(self, message_id: str) -> None:
        deliveries = self._let_go(message_id)
        if deliveries is not None:
            self._unstarted.append((message_id, deliveries))

    # -- acknowledgements and leases ---------------------------------------------------------------------

    async def _ack_loop(self) -> None:
        """Acknowledge what finished, many at once: whatever completes while one XACK is on its way goes next."""
        failures = 0
        while True:
            await self._ack_wanted.wait()
            self._ack_wanted.clear()
            ids, self._to_ack = self._to_ack, []
            if ids:
                try:
                    await self.bus.redis.xack(self.bus.stream, self.bus.group, *ids)
                except StoreUnavailable as exc:
                    failures += 1
                    self._to_ack = ids + self._to_ack
                    self._ack_wanted.set()
                    if self._closing and failures >= 5:
                        log.warning("giving up acknowledging %d events (%s): they will be redelivered", len(ids), exc)
                        for message_id in self._to_ack:
                            self._let_go(message_id)
                        self._to_ack = []
                        return
                    delay = backoff(failures, base=0.1, cap=5.0, jitter=0)
                    log.warning("cannot acknowledge %d events (%s): retrying in %.2fs", len(ids), exc, delay)
                    await asyncio.sleep(delay)
                    continue
                except ResponseError as exc:
                    # e.g. NOGROUP: the stream and its group are gone, and these entries with them.
                    log.warning("could not acknowledge %d events: %s", len(ids), exc)
                else:
                    self.bus.handled += len(ids)
                failures = 0
                for message_id in ids:
                    self._let_go(message_id)
            if self._closing and not self._to_ack:
                return

    async def _lease_loop(self) -> None:
        """Reset the idle time of every message held (XCLAIM JUSTID does not count a delivery)."""
        interval = max(self.bus.claim_idle_ms / 4000, 0.01)
        while True:
            await asyncio.sleep(interval)
            ids = list(self._held)
            if not ids:
                continue
            try:
                async with self._lease_lock:
                    for start in range(0, len(ids), LEASE_CHUNK):
                        chunk: list[StreamIdT] = list(ids[start : start + LEASE_CHUNK])
                        await self.bus.redis.xclaim(
                            self.bus.stream, self.bus.group, self.bus.consumer, 0, chunk, justid=True
                        )
            except Exception:
                log.warning("could not renew the leases of %d events", len(ids), exc_info=True)

    async def _release(self) -> None:
        """Hand back what was read but not started: idle at once, delivery count as before it was read."""
        unstarted, self._unstarted = self._unstarted, []
        by_count: dict[int, list[StreamIdT]] = {}
        for message_id, deliveries in unstarted:
            by_count.setdefault(deliveries, []).append(message_id)
        try:
            async with self._lease_lock:
                for deliveries, ids in by_count.items():
                    await self.bus.redis.xclaim(
                        self.bus.stream,
                        self.bus.group,
                        self.bus.consumer,
                        0,
                        ids,
                        idle=RELEASED_IDLE_MS,
                        retrycount=max(deliveries - 1, 0),
                        justid=True,
                    )
            self.bus.released += len(unstarted)
        except Exception:
            log.warning("could not hand back %d events: reclaimed once idle", len(unstarted), exc_info=True)

    # -- the end -----------------------------------------------------------------------------------------

    async def drain(self) -> None:
        """On stop: let running handlers finish, hand back what did not start, acknowledge what finished."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))
        if self._unstarted:
            await self._release()
        self._closing = True
        self._ack_wanted.set()
        await self._acker

    async def abort(self) -> None:
        """Cancel whatever is left (everything, when the consumer itself was cancelled) and let it unwind."""
        tasks = {*self._tasks, self._acker, self._leaser}
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=1.0)


def _fields(entry: Mapping[str, str]) -> dict[FieldT, EncodableT]:
    fields: dict[FieldT, EncodableT] = {}
    fields.update(entry)
    return fields


def _entries(raw: Any) -> list[tuple[str, dict[str, str]]]:
    """Stream entries as ``(id, fields)`` with str everywhere (clients here use ``decode_responses=True``)."""
    return [(str(message_id), {str(k): str(v) for k, v in (fields or {}).items()}) for message_id, fields in raw or []]


def _read_entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """The entries of an XREADGROUP reply on one stream, in either the RESP2 or the RESP3 shape."""
    if isinstance(reply, dict):
        per_stream = [entries[0] if entries and isinstance(entries[0], list) else entries for entries in reply.values()]
    else:
        per_stream = [entries for _stream, entries in reply or []]
    return [entry for entries in per_stream for entry in _entries(entries)]
