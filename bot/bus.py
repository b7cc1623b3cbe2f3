"""The event bus: one Redis stream read by a consumer group, so replicas share the work and none loses it.

Delivery is at least once. A message is acknowledged only after its handler returned; one whose consumer died
stays pending and is claimed by a live consumer once idle for ``claim_idle_ms``. While a handler runs, its
message's idle time is reset regularly so a slow handler is not mistaken for a dead one; messages are taken
one at a time for the same reason (a fetched message waiting behind a slow one would look abandoned). A message
that failed ``max_tries`` deliveries is parked on ``<stream>:parked`` with its error, so a poison event never
blocks the stream. Handlers must be idempotent (the job store's dedup keys make them so).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic_core
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT, FieldT

from handlers.ids import new_event_id

log = logging.getLogger(__name__)

EVENTS_STREAM = "finetune:events"
EVENT_FIELD = "event"
# Approximate cap on the stream's length: far above any backlog the bot could have, so trimming only drops
# messages long since acknowledged.
STREAM_MAXLEN = 100_000
LATENCY_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

Handler = Callable[[dict[str, Any]], Awaitable[None]]


def encode_event(event: dict[str, Any]) -> dict[str, str]:
    """The stream entry for ``event``: its JSON in one field, so nested values survive. Adds an ``id`` if absent."""
    if "id" not in event:
        event = {"id": new_event_id(), **event}
    return {EVENT_FIELD: pydantic_core.to_json(event).decode()}


def default_consumer_name() -> str:
    """Unique per replica and per process: a restarted bot must not inherit the old one's pending list."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class LatencySummary:
    """Handler latency in the shape Prometheus histograms want: count, sum and cumulative bucket counts."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    count: int = 0
    sum: float = 0.0
    bucket_counts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bucket_counts = [0] * len(self.buckets)

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.sum += seconds
        for index, bound in enumerate(self.buckets):
            if seconds <= bound:
                self.bucket_counts[index] += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= bound)`` pairs, ending with ``+Inf``."""
        return [*zip(self.buckets, self.bucket_counts, strict=True), (float("inf"), self.count)]


class EventBus:
    """Publish events and run a consumer of the group; see the module docstring for the delivery rules."""

    def __init__(
        self,
        redis: aioredis.Redis,
        stream: str = EVENTS_STREAM,
        group: str = "bot",
        consumer: str | None = None,
        max_tries: int = 5,
        claim_idle_ms: int = 30_000,
        *,
        block_ms: int = 1000,
        claim_every_ms: int | None = None,
    ) -> None:
        if max_tries < 1:
            raise ValueError("max_tries must be >= 1")
        self.redis = redis
        self.stream = stream
        self.group = group
        self.consumer = consumer or default_consumer_name()
        self.max_tries = max_tries
        self.claim_idle_ms = claim_idle_ms
        self.block_ms = block_ms
        self.claim_every_ms = claim_idle_ms // 2 if claim_every_ms is None else claim_every_ms
        self.parked_stream = f"{stream}:parked"
        self.handled = 0
        self.failed = 0
        self.parked = 0
        self.claimed = 0
        self.latency = LatencySummary()

    async def ensure_group(self) -> None:
        """Create the group (and the stream) if missing; it starts at ``0`` so nothing published earlier is lost."""
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def publish(self, event: dict[str, Any]) -> str:
        """Append ``event`` (an ``id`` is added if missing); returns the stream message id."""
        fields = _fields(encode_event(event))
        message_id = await self.redis.xadd(self.stream, fields, maxlen=STREAM_MAXLEN, approximate=True)
        return str(message_id)

    async def run(self, handler: Handler, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set. The handler in flight finishes first; what was not handled stays pending.

        Handler errors never end the loop, nor does losing Redis for a while (it backs off and tries again) or
        losing the group with its stream (it is created again).
        """
        group_ready = False
        next_claim = 0.0
        outage = 0
        while not stop.is_set():
            try:
                if not group_ready:
                    await self.ensure_group()
                    group_ready = True
                if time.monotonic() >= next_claim:
                    await self._claim_stale(handler, stop)
                    next_claim = time.monotonic() + self.claim_every_ms / 1000
                if stop.is_set():
                    break
                block = max(1, min(self.block_ms, int((next_claim - time.monotonic()) * 1000)))
                await self._read_new(handler, stop, block)
                outage = 0
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                log.warning("consumer group %s of %s vanished: creating it again", self.group, self.stream)
                group_ready = False
            except (RedisConnectionError, RedisTimeoutError) as exc:
                outage += 1
                delay = min(0.05 * 2**outage, 5.0)
                log.warning("event bus cannot reach Redis (%s): retrying in %.2fs", exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)

    async def _read_new(self, handler: Handler, stop: asyncio.Event, block_ms: int) -> None:
        reply = await self.redis.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=1, block=block_ms)
        for message_id, fields in _read_entries(reply):
            if stop.is_set():
                return  # fetched but unhandled: pending, a live consumer claims it
            await self._process(handler, message_id, fields, deliveries=1)

    async def _claim_stale(self, handler: Handler, stop: asyncio.Event) -> None:
        """Take over messages idle longer than ``claim_idle_ms`` (a crashed consumer's, or failed ones) and retry."""
        cursor = "0-0"
        while not stop.is_set():
            reply = await self.redis.xautoclaim(
                self.stream, self.group, self.consumer, self.claim_idle_ms, start_id=cursor, count=1
            )
            # Entries trimmed away while pending come back in reply[2] and are already dropped from the group.
            cursor = str(reply[0])
            for message_id, fields in _entries(reply[1]):
                if stop.is_set():
                    return
                self.claimed += 1
                await self._process(handler, message_id, fields, deliveries=await self._deliveries(message_id))
            if cursor == "0-0":
                return

    async def _deliveries(self, message_id: str) -> int:
        pending = await self.redis.xpending_range(self.stream, self.group, min=message_id, max=message_id, count=1)
        return int(pending[0]["times_delivered"]) if pending else 1

    async def _process(self, handler: Handler, message_id: str, fields: dict[str, str], deliveries: int) -> None:
        try:
            event = json.loads(fields[EVENT_FIELD])
            if not isinstance(event, dict):
                raise TypeError(f"event is a {type(event).__name__}, not an object")
        except (KeyError, TypeError, ValueError) as exc:
            # Malformed: no retry can fix it.
            await self._park(message_id, fields, f"malformed: {exc!r}", deliveries)
            return
        started = time.perf_counter()
        renew = asyncio.create_task(self._keep_lease(message_id))
        try:
            await handler(event)
        except Exception as exc:
            self.failed += 1
            if deliveries >= self.max_tries:
                log.exception("event %s failed %d times: parked", event.get("id"), deliveries)
                await self._park(message_id, fields, f"{type(exc).__name__}: {exc}", deliveries)
            else:
                log.exception("event %s failed (delivery %d/%d)", event.get("id"), deliveries, self.max_tries)
            return
        finally:
            renew.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renew
            self.latency.observe(time.perf_counter() - started)
        await self.redis.xack(self.stream, self.group, message_id)
        self.handled += 1

    async def _keep_lease(self, message_id: str) -> None:
        """Reset the message's idle time while its handler runs (XCLAIM JUSTID does not count a delivery)."""
        interval = max(self.claim_idle_ms / 3000, 0.01)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.redis.xclaim(self.stream, self.group, self.consumer, 0, [message_id], justid=True)
            except Exception:
                log.warning("could not renew the lease of %s", message_id, exc_info=True)

    async def _park(self, message_id: str, fields: dict[str, str], error: str, deliveries: int) -> None:
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
