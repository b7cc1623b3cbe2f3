"""One fact about one job, from the cloud and from the runner, on a real Valkey: both run in the job's lane, one
after the other, and whichever comes second (a duplicate) writes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from bot.bus import partition_key
from bot.cloud.local.provider import LocalCloud
from bot.core import Bot
from bot.keys import Keys
from bot.store import JobStore
from handlers.decide import decide, new_job
from handlers.jobs import ChatRef, Job, JobState
from handlers.messages import CloudEvent, Launched, ReportReceived, dump_message, report_received
from handlers.policy_config import PolicyConfig
from handlers.recipes import BUILT_IN
from handlers.reports import Notice, Started
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    RedisClientFactory,
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)
from tests.test_bus import Running, wait_for

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
DEADLINE = T0 + timedelta(minutes=2)


def running_job(job_id: str, instance_id: str) -> Job:
    """A job whose first attempt runs on ``instance_id``."""
    created = new_job(job_id, "tiny", {}, "slack:U0ANA", ChatRef(platform="slack", channel="C0AAA"), T0)
    launched = decide(created.job, Launched(job_id=job_id, attempt=1, instance_id=instance_id), T0)
    assert launched is not None
    started = decide(launched.job, ReportReceived(report=Started(job_id=job_id, attempt=1)), T0)
    assert started is not None and started.job.state is JobState.RUNNING
    return started.job


def cloud_warning(instance_id: str) -> CloudEvent:
    return CloudEvent(kind="spot-interruption", instance_id=instance_id, source="aws.ec2", deadline=DEADLINE)


def runner_warning(job_id: str) -> ReportReceived:
    notice = Notice(job_id=job_id, attempt=1, kind="spot-interruption", source="aws-imds", deadline=DEADLINE)
    return report_received(notice)


async def footprint(store: JobStore, job_id: str) -> dict[str, Any]:
    """Everything a decision may write: the job as stored, its history and every queue's length."""
    keys = store.keys
    return {
        "job": await store.redis.get(keys.job(job_id)),
        "history": await store.redis.xlen(keys.history(job_id)),
        "events": await store.redis.xlen(keys.events),
        "chat": await store.redis.xlen(keys.chat),
        "cloud": await store.redis.xlen(keys.cloud),
        "timers": await store.redis.zcard(keys.timers),
    }


@pytest.fixture
async def bot(redis_client: aioredis.Redis, key_prefix: str, tmp_path: Path) -> AsyncIterator[Bot]:
    store = JobStore(redis_client, Keys(key_prefix))
    yield Bot(store, LocalCloud(tmp_path), PolicyConfig(), BUILT_IN, clock=lambda: T0)


@pytest.mark.parametrize("first", ["cloud", "runner"])
async def test_the_second_warning_of_one_interruption_writes_nothing(bot: Bot, first: str) -> None:
    job = running_job("ft-dup01", "i-dup1")
    assert await bot.store.create(job, {"event": "test"})
    cloud, runner = dump_message(cloud_warning("i-dup1")), dump_message(runner_warning(job.id))
    earlier, later = (cloud, runner) if first == "cloud" else (runner, cloud)

    await bot.handle(earlier)
    warned = await bot.store.get(job.id)
    assert warned is not None and warned.state is JobState.INTERRUPTED and warned.interruptions == 1
    assert warned.version == job.version + 1
    before = await footprint(bot.store, job.id)
    assert before["chat"] == 2  # the alert and the thread message, once

    await bot.handle(later)  # the same fact from the other path: nothing to write
    assert await footprint(bot.store, job.id) == before
    await bot.handle(earlier)  # a redelivery of the first: its dedup key, nothing more
    assert await footprint(bot.store, job.id) == before
    assert await bot.store.get(job.id) == warned


async def test_a_cloud_warning_and_the_runners_report_of_it_share_the_jobs_lane(
    bot: Bot, redis_client_factory: RedisClientFactory, key_prefix: str
) -> None:
    store = bot.store
    job = running_job("ft-lane01", "i-lane1")
    assert await store.create(job, {"event": "test"})
    lanes: list[str | None] = []

    def recorded(event: dict[str, Any]) -> str | None:
        lanes.append(partition_key(event))
        return lanes[-1]

    running = Running(redis_client_factory, store.keys.events)
    try:
        bus = await running.bus("c1", key=recorded, jobs_of_instances=store.jobs_for_instances)
        unknown = cloud_warning("i-nobody")  # an instance no job has: it keeps its own lane, and is ignored
        for message in (cloud_warning("i-lane1"), runner_warning(job.id), unknown):
            await bus.publish(dump_message(message))
        running.start(bus, bot.handle)
        await wait_for(lambda: bus.handled == 3)
    finally:
        await running.close()

    assert lanes == ["job:ft-lane01", "job:ft-lane01", "instance:i-nobody"]
    assert (bus.failed, bus.parked) == (0, 0)
    warned = await store.get(job.id)
    assert warned is not None and warned.state is JobState.INTERRUPTED and warned.interruptions == 1
    assert warned.version == job.version + 1  # one write: the second warning found the job warned already
    assert [entry["event"] for entry in await store.history(job.id)] == ["test", "spot-interruption"]
