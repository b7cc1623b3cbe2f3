"""The chart's points: kept from accepted progress reports, bounded, deduplicated, and in Redis across a restart."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from bot.charts.series import ChartSeries, Point
from bot.cloud.local.provider import LocalCloud
from bot.core import Bot
from bot.keys import Keys
from bot.redis_server import connect
from bot.store import JobStore
from fakes.restartable_valkey import RestartableValkey
from handlers.jobs import ChatRef
from handlers.messages import ReportReceived, dump_message
from handlers.policy_config import PolicyConfig
from handlers.recipes import BUILT_IN
from handlers.reports import Progress, Started
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)

T0 = datetime(2026, 5, 1, 12, tzinfo=UTC)
CHAT = ChatRef(platform="slack", channel="C0JOBS")


def point(step: int, attempt: int = 1, loss: float | None = None) -> Point:
    return Point(step, 1.0 / step if loss is None and step else loss, T0 + timedelta(seconds=step), attempt)


async def test_points_come_back_by_step_with_their_values_and_a_redelivered_one_changes_nothing(
    redis_client: aioredis.Redis, key_prefix: str
) -> None:
    series = ChartSeries(redis_client, Keys(key_prefix))
    for step in (30, 10, 20):
        assert await series.add("ft-a1", point(step))
    assert not await series.add("ft-a1", point(20))  # the same report again
    assert not await series.add("ft-a1", point(20, attempt=2, loss=9.0))  # step 20 again after a resume
    assert await series.points("ft-a1") == [point(10), point(20), point(30)]
    assert await series.points("ft-other") == []
    with pytest.raises(ValueError, match="negative"):
        await series.add("ft-a1", point(-1))
    assert len(await series.points("ft-a1")) == 3


async def test_a_long_job_keeps_at_most_cap_points_spread_evenly_over_its_steps(
    redis_client: aioredis.Redis, key_prefix: str
) -> None:
    series = ChartSeries(redis_client, Keys(key_prefix), cap=50)
    for step in range(1, 2001):
        await series.add("ft-long", point(step))
    kept = [p.step for p in await series.points("ft-long")]
    stride = await series.stride("ft-long")
    assert 25 <= len(kept) <= 50, len(kept)  # thinned to half the cap at worst
    assert stride & (stride - 1) == 0 and stride > 1  # a power of two
    assert kept[0] == 1 and kept[-1] >= 2000 - stride
    assert max(b - a for a, b in itertools.pairwise(kept)) <= 2 * stride  # no stretch left bare
    assert len({s // stride for s in kept}) == len(kept)  # one point per stride


async def test_a_run_of_points_in_one_call_keeps_what_the_same_points_one_by_one_keep(
    redis_client: aioredis.Redis, key_prefix: str
) -> None:
    """The bus writes a run of one job's progress in one call; thinning and redelivery inside it behave as alone."""
    steps = [*range(1, 400), 150, 7]  # past the cap (the stride doubles mid-call), and two steps again
    alone, together = ChartSeries(redis_client, Keys(key_prefix + "a:"), cap=30), ChartSeries(
        redis_client, Keys(key_prefix + "b:"), cap=30
    )
    kept_alone = [await alone.add("ft-run", point(step)) for step in steps]
    kept_together = 0
    for start in range(0, len(steps), 32):  # the bus's lane batch
        kept_together += await together.add_many("ft-run", [point(step) for step in steps[start : start + 32]])
    assert kept_together == sum(kept_alone) > 30
    assert await together.points("ft-run") == await alone.points("ft-run")
    assert await together.stride("ft-run") == await alone.stride("ft-run") > 1
    assert await together.add_many("ft-run", []) == 0
    with pytest.raises(ValueError, match="negative"):
        await together.add_many("ft-run", [point(500), point(-2)])
    assert [p.step for p in await together.points("ft-run")] == [p.step for p in await alone.points("ft-run")]


async def test_sparse_reports_past_the_cap_still_thin_down_to_it(redis_client: aioredis.Redis, key_prefix: str) -> None:
    series = ChartSeries(redis_client, Keys(key_prefix), cap=10)
    for step in range(0, 100_000, 997):  # a report every 997 steps: no two share a small stride
        await series.add("ft-sparse", point(step))
    assert len(await series.points("ft-sparse")) <= 10


async def test_the_points_survive_a_redis_restart(tmp_path: Path, key_prefix: str) -> None:
    valkey = RestartableValkey(tmp_path / "redis")
    await valkey.start()
    client = connect(valkey.url)
    try:
        series = ChartSeries(client, Keys(key_prefix))
        await series.add("ft-kept", point(5))
        await valkey.stop()
        await valkey.start()
        assert await series.points("ft-kept") == [point(5)]
        assert await series.add("ft-kept", point(6))  # the script is loaded again where needed
    finally:
        await client.aclose()
        await valkey.stop()


async def test_the_bot_keeps_the_progress_it_accepts_and_not_a_fenced_attempts(
    redis_client: aioredis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    store = JobStore(redis_client, Keys(key_prefix))
    bot = Bot(store, LocalCloud(tmp_path), PolicyConfig(), BUILT_IN, clock=lambda: T0)
    reply = await bot.command("slack:U0ANA", CHAT, "start tiny")
    job_id = reply.split()[1].rstrip(":")

    async def report(body: Started | Progress) -> None:
        await bot.handle(dump_message(ReportReceived(report=body)))

    await report(Started(job_id=job_id, attempt=1, time=T0))
    await report(Progress(job_id=job_id, attempt=1, step=10, total_steps=100, loss=2.5, time=T0))
    await report(Progress(job_id=job_id, attempt=7, step=20, loss=1.0, time=T0))  # not the current attempt
    job = await store.get(job_id)
    assert job is not None and job.step == 10
    assert await bot.series.points(job_id) == [Point(10, 2.5, T0, 1)]
