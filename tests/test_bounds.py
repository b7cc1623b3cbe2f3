"""What keeps one user or one team from growing the bot without bound, against a real Valkey and the real Bot:
per-user rates shared by replicas, the job cap taken atomically, retention of ended jobs, a bounded ``list``, and
refusals kept apart from actions. Two replicas are two Bot instances with clients of their own on one server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from bot.charts.series import Point
from bot.cloud.local.provider import LocalCloud
from bot.core import Bot
from bot.keys import Keys
from bot.retention import Retention
from bot.store import JobCapReached, JobStore
from handlers.caps import Caps
from handlers.change import Change
from handlers.jobs import Attempt, ChatRef, Job, JobState
from handlers.policy_config import PolicyConfig
from handlers.recipes import BUILT_IN
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    RedisClientFactory,
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
A = ChatRef(platform="slack", channel="C0AAA")
B = ChatRef(platform="slack", channel="C0BBB")


class Clock:
    """The bots' time, moved by the test (never the wall clock)."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


async def replicas(
    factory: RedisClientFactory, prefix: str, tmp_path: Path, policy: PolicyConfig, clock: Callable[[], datetime]
) -> list[Bot]:
    """Two bots on one Redis, each with its own client (and pool), as two replicas are."""
    bots = []
    for name in ("a", "b"):
        client = await factory()
        store = JobStore(client, Keys(prefix))
        bots.append(Bot(store, LocalCloud(tmp_path / name), policy, BUILT_IN, clock=clock))
    return bots


async def test_a_burst_from_one_user_across_two_replicas_is_cut_at_the_limit_and_refills_with_time(
    redis_client_factory: RedisClientFactory, key_prefix: str, tmp_path: Path
) -> None:
    clock = Clock()
    policy = PolicyConfig(rate={"commands_per_minute": 6, "starts_per_minute": 2})
    first, second = await replicas(redis_client_factory, key_prefix, tmp_path, policy, clock)
    burst = [(first if n % 2 else second).command("slack:U0MAL", A, "list") for n in range(15)]
    replies = await asyncio.gather(*burst)
    slowed = [reply for reply in replies if reply.startswith("⛔ slow down")]
    assert len(replies) - len(slowed) == 6 and len(slowed) == 9
    assert slowed[0] == "⛔ slow down: at most 6 commands a minute; try again in 10 s"
    assert (await first.command("slack:U0ANA", A, "list")).startswith("no jobs")  # another user's bucket is full

    clock.now += timedelta(seconds=10)  # 6 a minute: one more token every ten seconds, on either replica
    assert (await second.command("slack:U0MAL", A, "list")).startswith("no jobs")
    assert (await first.command("slack:U0MAL", A, "list")).startswith("⛔ slow down")

    # Starts have a bucket of their own, smaller: past it nothing is created.
    clock.now += timedelta(minutes=5)
    started = await asyncio.gather(*(bot.command("slack:U0ANA", A, "start tiny") for bot in (first, second) * 2))
    assert sorted(reply.split()[0] for reply in started) == ["Starting", "Starting", "⛔", "⛔"]
    assert "at most 2 starts a minute" in next(reply for reply in started if reply.startswith("⛔"))
    assert len(await first.store.list_jobs()) == 2


async def test_twenty_concurrent_starts_with_a_cap_of_three_nodes_in_all_leave_exactly_three_jobs(
    redis_client_factory: RedisClientFactory, key_prefix: str, tmp_path: Path
) -> None:
    policy = PolicyConfig(max_total_nodes=3)  # twenty people on no team: each a team of one, all under the total
    first, second = await replicas(redis_client_factory, key_prefix, tmp_path, policy, Clock())
    starts = [(first, second)[n % 2].command(f"slack:U{n:04d}", A, "start tiny") for n in range(20)]
    replies = await asyncio.gather(*starts)
    assert sum(reply.startswith("Starting ft-") for reply in replies) == 3
    refused = [reply for reply in replies if not reply.startswith("Starting")]
    assert len(refused) == 17 and all("run 3 of the 3 nodes allowed at once" in reply for reply in refused)
    assert all("policy.max_total_nodes" in reply for reply in refused)  # which limit, and who changes it
    jobs = await first.store.list_jobs()
    assert len(jobs) == 3 and all(job.state is JobState.PENDING for job in jobs)
    counts = await first.store.counts_by_state()
    assert counts[JobState.PENDING] == 3


async def test_a_teams_concurrent_starts_of_gangs_are_cut_at_its_five_nodes_counted_as_nodes(
    redis_client_factory: RedisClientFactory, key_prefix: str, tmp_path: Path
) -> None:
    """No cap configured: a team runs at most 5 nodes at once, counted as nodes (two-node gangs: two fit, a third
    would make six), whoever of its members starts them and on whichever replica."""
    members = [f"slack:U{n:04d}" for n in range(10)]
    policy = PolicyConfig(teams={"ml": {"members": members, "channels": ["slack:C0AAA"]}})
    first, second = await replicas(redis_client_factory, key_prefix, tmp_path, policy, Clock())
    starts = [(first, second)[n % 2].command(user, A, "start tiny nodes=2") for n, user in enumerate(members)]
    replies = await asyncio.gather(*starts)
    assert sum(reply.startswith("Starting ft-") for reply in replies) == 2
    refused = [reply for reply in replies if not reply.startswith("Starting")]
    assert len(refused) == 8 and all("team ml runs 4 of its 5 concurrent nodes" in reply for reply in refused)
    assert all("policy.teams.ml.max_concurrent_nodes" in reply for reply in refused)
    jobs = await first.store.list_jobs()
    assert sorted(job.nodes for job in jobs) == [2, 2] and {job.team for job in jobs} == {"ml"}
    # Another team's room is its own: a person on no team still starts in ml's channel, billed to nobody's team.
    outsider = await first.command("slack:U0OUT", A, "start tiny nodes=4")
    assert outsider.startswith("Starting ft-"), outsider
    job = await first.store.get(outsider.split()[1].rstrip(":"))
    assert job is not None and job.team is None


async def end(store: JobStore, job_id: str, at: datetime, state: JobState = JobState.STOPPED) -> Job:
    def moved(job: Job) -> Change:
        return Change(job.model_copy(update={"state": state, "updated_at": at}), {"event": "test", "to": state})

    applied = await store.apply(job_id, moved)
    assert applied.job is not None
    return applied.job


async def test_ended_jobs_leave_the_store_after_the_retention_with_every_index_entry_and_resumed_ones_stay(
    redis_client: aioredis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    clock = Clock()
    store = JobStore(redis_client, Keys(key_prefix))
    bot = Bot(store, LocalCloud(tmp_path), PolicyConfig(rate={"starts_per_minute": 100}), BUILT_IN, clock=clock)
    ids = [(await bot.command("slack:U0ANA", A, "start tiny")).split()[1].rstrip(":") for _ in range(3)]
    old, recent, resumed = ids
    await end(store, old, T0)
    await end(store, recent, T0 + timedelta(days=20))
    await end(store, resumed, T0)
    await end(store, resumed, T0 + timedelta(days=1), JobState.RECOVERING)  # a resume: no longer ended
    await store.redis.hset(store.keys.instances, "i-old", old)
    for job_id in (old, recent):
        await bot.series.add(job_id, Point(1, 2.0, T0, 1))

    clock.now = T0 + timedelta(days=31)
    assert await Retention(store, days=30, clock=clock).sweep() == 1
    assert await store.get(old) is None and await store.history(old) == []
    assert await bot.series.points(old) == [] and not await store.redis.exists(store.keys.chart_stride(old))
    assert await bot.series.points(recent) == [Point(1, 2.0, T0, 1)]
    assert {job.id for job in await store.list_jobs()} == {recent, resumed}
    assert not await store.redis.sismember(store.keys.state(JobState.STOPPED), old)
    assert {job.id for job in await store.recent(A)} == {recent, resumed}
    assert await store.redis.zscore(store.keys.created, old) is None
    assert await Retention(store, days=30, clock=clock).sweep() == 0  # once only

    clock.now = T0 + timedelta(days=51)
    assert await Retention(store, days=30, clock=clock).sweep() == 1
    assert [job.id for job in await store.list_jobs()] == [resumed]
    assert await store.redis.zcard(store.keys.ended) == 0


async def test_list_reads_the_channels_latest_jobs_from_an_index_and_admins_see_every_channel(
    redis_client: aioredis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    clock = Clock()
    store = JobStore(redis_client, Keys(key_prefix))
    rate = {"starts_per_minute": 100, "commands_per_minute": 100}
    # Twenty-five jobs running at once for one person: the subject is the list, so the node cap is lifted.
    policy = PolicyConfig(admins=["slack:U0ADMIN"], rate=rate, max_concurrent_nodes=100)
    bot = Bot(store, LocalCloud(tmp_path), policy, BUILT_IN, clock=clock)
    in_a = []
    for _ in range(25):
        clock.now += timedelta(seconds=1)
        in_a.append((await bot.command("slack:U0ANA", A, "start tiny")).split()[1].rstrip(":"))
    clock.now += timedelta(seconds=1)
    in_b = (await bot.command("slack:U0BOB", B, "start tiny")).split()[1].rstrip(":")

    listed_a = [line.split()[0] for line in (await bot.command("slack:U0ANA", A, "list")).splitlines()]
    assert listed_a == in_a[::-1][:20]  # newest first, twenty of them
    listed_b = [line.split()[0] for line in (await bot.command("slack:U0ANA", B, "list")).splitlines()]
    assert listed_b == [in_b]
    everything = [line.split()[0] for line in (await bot.command("slack:U0ADMIN", B, "list")).splitlines()]
    assert everything == [in_b, *in_a[::-1][:19]]


async def test_a_flood_of_refusals_cannot_roll_what_was_done_out_of_the_audit_log(
    redis_client: aioredis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    store = JobStore(redis_client, Keys(key_prefix), audit_maxlen=100)
    bot = Bot(store, LocalCloud(tmp_path), PolicyConfig(rate={"commands_per_minute": 1000}), BUILT_IN, clock=Clock())
    job_id = (await bot.command("slack:U0ANA", A, "start tiny")).split()[1].rstrip(":")
    for n in range(400):
        reply = await bot.command(f"slack:U{n:04d}", B, f"stop {job_id}")
        assert reply == f"⛔ {job_id} is not yours to stop: only its owner, its team and the admins may"
    assert await store.audit_log() == [
        {"event": "start", "by": "slack:U0ANA", "job": job_id, "channel": "slack:C0AAA"}
    ]
    refusals = await store.refusal_log(count=1000)
    assert 100 <= len(refusals) < 400  # capped (approximately, as Redis trims)
    assert refusals[-1] == {
        "event": "refused",
        "action": "stop",
        "by": "slack:U0399",
        "job": job_id,
        "channel": "slack:C0BBB",
        "why": f"{job_id} is not yours to stop: only its owner, its team and the admins may",
    }
    job = await store.get(job_id)
    assert job is not None and job.state is JobState.PENDING and job.version == 0
    assert [entry["event"] for entry in await store.history(job_id)] == ["created"]


async def test_the_node_count_follows_the_jobs_state_and_a_jobs_own_relaunch_is_never_refused_for_its_own_nodes(
    redis_client: aioredis.Redis, key_prefix: str
) -> None:
    """The store's node count: a job's nodes count while it is active, its own write (a relaunch on the other
    market, a recovery) does not count them twice, and they stop counting when it leaves the active states."""
    store = JobStore(redis_client, Keys(key_prefix))
    caps = Caps("team:ml", "ml", 4, 2, None, None)
    gang = Job(id="ft-gg01", recipe="tiny", requested_by="slack:U1", team="ml", nodes=2, created_at=T0)
    assert await store.create(gang, {"event": "created"}, caps=caps)
    assert await store.active_nodes("team:ml") == (2, 2)

    def to(state: JobState) -> Callable[[Job], Change]:
        return lambda job: Change(job.model_copy(update={"state": state}), {"event": "test", "to": state})

    relaunched = await store.apply(gang.id, to(JobState.RECOVERING), caps=lambda job: caps)  # the team is full
    assert relaunched.job is not None and relaunched.job.state is JobState.RECOVERING
    one = Job(id="ft-gg02", recipe="tiny", requested_by="slack:U2", team="ml", created_at=T0)
    with pytest.raises(JobCapReached) as full:
        await store.create(one, {"event": "created"}, caps=caps)
    assert full.value.full == "group" and await store.get(one.id) is None
    assert await store.active_nodes("team:ml", except_job=gang.id) == (0, 0)

    await store.apply(gang.id, to(JobState.STOPPED))
    assert await store.active_nodes("team:ml") == (0, 0)
    assert await store.create(one, {"event": "created"}, caps=caps)
    with pytest.raises(JobCapReached):  # back from STOPPED, its two nodes do not fit beside the one running
        await store.apply(gang.id, to(JobState.RECOVERING), caps=lambda job: caps)
    stopped = await store.get(gang.id)
    assert stopped is not None and stopped.state is JobState.STOPPED


async def test_a_stop_of_a_running_job_goes_through_when_its_team_is_over_a_cap_lowered_since(
    redis_client: aioredis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    """Only a start and a resume are held to the caps: a stop keeps the job active (STOPPING) and must never be
    refused because an admin lowered the team's cap below what it runs."""
    store = JobStore(redis_client, Keys(key_prefix))
    before = Bot(store, LocalCloud(tmp_path), PolicyConfig(), BUILT_IN, clock=Clock())
    ids = [(await before.command("slack:U0ANA", A, "start tiny")).split()[1].rstrip(":") for _ in range(2)]

    def running(job: Job) -> Change:
        attempt = Attempt(number=1, instance_id=f"i-{job.id}", started_at=T0)
        return Change(job.model_copy(update={"state": JobState.RUNNING, "attempts": [attempt]}), {"event": "test"})

    for job_id in ids:
        await store.apply(job_id, running)
    lowered = Bot(store, LocalCloud(tmp_path), PolicyConfig(max_concurrent_nodes=1), BUILT_IN, clock=Clock())
    assert (await lowered.command("slack:U0ANA", A, f"stop {ids[0]}")).startswith(f"OK: stop {ids[0]}")
    stopping = await store.get(ids[0])
    assert stopping is not None and stopping.state is JobState.STOPPING
