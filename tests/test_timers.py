"""The timer set (bot/timers.py) on a real Valkey: typed timers in, typed timers out, encoded once as the store
encodes them; a message that is no timer is refused and nothing is written; a due timer moves to the events
stream as it was stored."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from bot.keys import Keys
from bot.queues import EVENT_FIELD, route
from bot.timers import Timers
from handlers.messages import RelaunchDue, StartDeadline, Terminate
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


@pytest.fixture
def timers(redis_client: aioredis.Redis, key_prefix: str) -> Timers:
    return Timers(redis_client, Keys(key_prefix), clock=lambda: NOW)


async def test_a_scheduled_timer_reads_back_typed_and_stored_as_the_store_stores_it(timers: Timers) -> None:
    later = RelaunchDue(job_id="ft-t1", attempt=2, market="on-demand", due=NOW + timedelta(minutes=5))
    sooner = StartDeadline(job_id="ft-t1", attempt=1, due=NOW + timedelta(minutes=1))
    await timers.schedule(later)
    await timers.schedule(sooner)

    assert await timers.pending() == [sooner, later]  # earliest first, every field as it was
    stored = await timers.redis.zrange(timers.key, 0, -1, withscores=True)
    assert stored == [
        (route(sooner, platform="").payload, sooner.due.timestamp()),
        (route(later, platform="").payload, later.due.timestamp()),
    ]


async def test_a_message_that_is_no_timer_is_refused_and_nothing_is_written(timers: Timers) -> None:
    with pytest.raises(ValueError, match="a terminate message is not a timer"):
        await timers.schedule(Terminate(job_id="ft-t3", instance_id="i-1"))
    assert await timers.redis.zcard(timers.key) == 0


async def test_only_due_timers_fire_onto_the_events_stream_as_stored(timers: Timers) -> None:
    due = StartDeadline(job_id="ft-t4", attempt=1, due=NOW - timedelta(seconds=1))
    not_yet = StartDeadline(job_id="ft-t5", attempt=1, due=NOW + timedelta(hours=1))
    await timers.schedule(due)
    await timers.schedule(not_yet)

    assert await timers.fire_due() == 1
    entries = await timers.redis.xrange(timers.stream)
    assert [fields[EVENT_FIELD] for _, fields in entries] == [route(due, platform="").payload]
    assert await timers.pending() == [not_yet]
