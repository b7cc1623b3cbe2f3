"""The local cloud's registry of instances, in the shared Redis: what EC2's DescribeInstances is to AWS.

Each local instance is its own process (:mod:`bot.cloud.local.instance`) and writes its record here when it is up
and again when it is gone; every replica reads it to act on any instance (interrupt test, stop, terminate through the
instance's control endpoint), and a restarted bot finds its instances again (:meth:`LocalRegistry.instances`).
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Literal

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict

from bot.keys import Keys
from handlers.jobs import Market

InstanceState = Literal["running", "gone"]


def local_instance_id(job_id: str, attempt: int) -> str:
    """One instance per (job, attempt): a launch retried after a crash finds the instance the first one started."""
    return "i-" + hashlib.sha256(f"{job_id}/{attempt}".encode()).hexdigest()[:17]


class LocalInstanceRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    instance_id: str
    job_id: str
    attempt: int
    state: InstanceState = "running"
    control: str  # the instance's control endpoint (interrupt-test, notice, stop, terminate)
    token: str  # what a caller of the control endpoint must present
    metadata: str  # its metadata service, as the runner sees it
    pid: int  # the instance process
    runner_pid: int = 0  # the runner's process group
    instance_type: str = "local.cpu"
    zone: str = "local-a"
    market: Market = "spot"
    price_per_hour: float | None = None
    on_demand_price_per_hour: float | None = None
    boot_seconds: float = 0.0  # its profile's boot (launch and fetch), in the profile's seconds
    launched_at: datetime
    ended_at: datetime | None = None
    exit_code: int | None = None
    # What the interrupt-test of this instance did (JSON of an InterruptTestResult; asked again, it answers the same).
    interrupt_test: str | None = None

    def fields(self) -> dict[str, str]:
        """The record as a Redis hash (``None`` fields left out)."""
        return {name: str(value) for name, value in self.model_dump(mode="json").items() if value is not None}


class LocalRegistry:
    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def get(self, instance_id: str) -> LocalInstanceRecord | None:
        fields = await self.redis.hgetall(self.keys.local_instance(instance_id))
        return LocalInstanceRecord.model_validate(fields) if fields else None

    async def instances(self) -> list[LocalInstanceRecord]:
        """Every instance the local cloud started (running or gone), oldest first."""
        ids = sorted(str(instance_id) for instance_id in await self.redis.smembers(self.keys.local_instances))
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for instance_id in ids:
                pipe.hgetall(self.keys.local_instance(instance_id))
            found = await pipe.execute()
        records = [LocalInstanceRecord.model_validate(fields) for fields in found if fields]
        return sorted(records, key=lambda record: (record.launched_at, record.instance_id))
