"""A bot upgraded in place on a single server reads the store an older bot wrote, with nothing to move: a store of
one partition keeps the key names it always had (bot/keys.py). The older names are spelled out here, as the older
bot wrote them, so a change to today's names that would orphan a stored job, effect or timer fails this test."""

from __future__ import annotations

import json
from datetime import timedelta

import redis.asyncio as aioredis

from bot.keys import Keys
from bot.layout import PARTITIONS_FIELD, open_keys
from bot.store import JobStore
from bot.timers import Timers
from handlers.jobs import Job, JobState
from handlers.messages import StartDeadline
from handlers.reports import utcnow
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)


async def test_a_store_written_in_the_layout_before_partitions_is_read_as_it_is(
    redis_client: aioredis.Redis, key_prefix: str
) -> None:
    p = key_prefix
    job = Job.model_validate({"id": "ft-old1", "recipe": "tiny", "requested_by": "U1", "state": "RUNNING"})
    timer = StartDeadline(job_id=job.id, attempt=1, due=utcnow() - timedelta(seconds=1))
    # What a bot before partitions wrote, key by key.
    await redis_client.set(f"{p}job:{job.id}", job.model_dump_json())
    await redis_client.sadd(f"{p}state:RUNNING", job.id)
    await redis_client.hset(f"{p}instances", "i-old", job.id)
    await redis_client.xadd(f"{p}history:{job.id}", {"entry": json.dumps({"type": "created"})})
    await redis_client.zadd(f"{p}jobs:created", {job.id: job.created_at.timestamp()})
    await redis_client.set(f"{p}dedup:in:1-0", job.id)
    await redis_client.set(f"{p}effect:launch-1", "instance:i-old")
    await redis_client.zadd(f"{p}timers", {timer.model_dump_json(): timer.due.timestamp()})

    keys = await open_keys(redis_client, key_prefix)  # the first bot of this version: one partition, recorded
    assert keys == Keys(key_prefix, 1)
    assert await redis_client.hget(keys.layout, PARTITIONS_FIELD) == "1"
    store = JobStore(redis_client, keys)
    assert [found.id for found in await store.list_jobs([JobState.RUNNING])] == [job.id]
    assert await store.job_for_instance("i-old") == job.id
    assert [entry["type"] for entry in await store.history(job.id)] == ["created"]
    assert await store.effect_record("launch-1", job.id) == "instance:i-old"
    assert (await store.apply(job.id, lambda current: None, dedup_key="in:1-0")).duplicate  # seen before the upgrade
    assert [found.id for found in await store.recent()] == [job.id]
    timers = Timers(redis_client, keys)
    assert await timers.pending() == [timer]
    assert await timers.fire_due() == 1
    assert await redis_client.xlen(f"{p}events") == 1
