"""A queue's consumers across every partition (see :mod:`bot.keys`): one :class:`~bot.bus.EventBus` per partition
stream, run side by side under one name.

A job's messages all live in its partition's stream, so its lane keeps their order; the partitions' buses share
nothing else. Each keeps its own consumer group, pending list and leases on its own stream (one slot), so a
cluster's failover of one primary holds up only its partitions. :func:`bus_for` gives a plain
:class:`~bot.bus.EventBus` for a store of one partition, a :class:`BusSet` otherwise.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel

from bot.bus import BatchHandler, EventBus, Handler, JobsOfInstances, LatencySummary, partition_key
from bot.keys import Keys


class BusSet:
    """The buses of every partition of one queue; counters are their sums."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        queue: str,
        *,
        group: str = "bot",
        consumer: str | None = None,
        jobs_of_instances: JobsOfInstances | None = None,
        **options: Any,
    ) -> None:
        self.keys = keys
        self.redis = redis
        self.jobs_of_instances = jobs_of_instances
        self.buses = [
            EventBus(redis, stream, group, consumer, jobs_of_instances=jobs_of_instances, **options)
            for stream in keys.streams(queue)
        ]
        self.group = group
        self.consumer = self.buses[0].consumer
        for bus in self.buses[1:]:
            bus.consumer = self.consumer

    @property
    def stream(self) -> str:
        """Partition 0's stream (each bus in :attr:`buses` has its own)."""
        return self.buses[0].stream

    def _sum(self, counter: str) -> int:
        return sum(int(getattr(bus, counter)) for bus in self.buses)

    handled = property(lambda self: self._sum("handled"))
    failed = property(lambda self: self._sum("failed"))
    parked = property(lambda self: self._sum("parked"))
    claimed = property(lambda self: self._sum("claimed"))
    released = property(lambda self: self._sum("released"))
    outages = property(lambda self: self._sum("outages"))
    unreachable = property(lambda self: self._sum("unreachable"))

    @property
    def latency(self) -> LatencySummary:
        total = LatencySummary()
        for bus in self.buses:
            total.count += bus.latency.count
            total.sum += bus.latency.sum
            total.bucket_counts = [a + b for a, b in zip(total.bucket_counts, bus.latency.bucket_counts, strict=True)]
        return total

    async def ensure_group(self) -> None:
        await asyncio.gather(*(bus.ensure_group() for bus in self.buses))

    async def publish(self, event: Mapping[str, Any] | BaseModel) -> str:
        """Append ``event`` to the stream of its job's partition (its own ``job_id`` or its report's, else the job
        of its instance when known), else to the partition its id hashes to."""
        return await self.buses[await self.partition(event)].publish(event)

    async def partition(self, event: Mapping[str, Any] | BaseModel) -> int:
        fields = event.model_dump(mode="json") if isinstance(event, BaseModel) else dict(event)
        key = partition_key(fields)
        if key is not None and key.startswith("job:"):
            return self.keys.partition_of(key.removeprefix("job:"))
        if key is not None and self.jobs_of_instances is not None:
            instance = key.removeprefix("instance:")
            job_id = (await self.jobs_of_instances([instance])).get(instance)
            if job_id is not None:
                return self.keys.partition_of(job_id)
        return zlib.crc32(str(fields.get("id", "")).encode()) % self.keys.partitions

    async def run(self, handler: Handler, stop: asyncio.Event, batch: BatchHandler | None = None) -> None:
        """Consume every partition until ``stop`` is set (see :meth:`bot.bus.EventBus.run`)."""
        await asyncio.gather(*(bus.run(handler, stop, batch) for bus in self.buses))

    async def parked_events(self, count: int = 100) -> Sequence[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for bus in self.buses:
            found.extend(await bus.parked_events(count))
        return found[:count]


Bus = EventBus | BusSet


def bus_for(
    redis: aioredis.Redis,
    keys: Keys,
    queue: str,
    *,
    group: str = "bot",
    consumer: str | None = None,
    jobs_of_instances: JobsOfInstances | None = None,
    **options: Any,
) -> Bus:
    """The consumer of ``queue`` (``events``, ``chat`` or ``cloud``) over every partition of ``keys``."""
    if keys.partitions == 1:
        stream = keys.streams(queue)[0]
        return EventBus(redis, stream, group, consumer, jobs_of_instances=jobs_of_instances, **options)
    return BusSet(redis, keys, queue, group=group, consumer=consumer, jobs_of_instances=jobs_of_instances, **options)
