"""The job store against a real Valkey: atomic transitions, dedup, indexes, concurrency, durability."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from bot.keys import Keys
from bot.owner_lock import AlreadyOwned
from bot.redis_server import RedisConfig, RedisHandle, connect, open_redis
from bot.store import Applied, Decider, JobStore
from fakes.notes import notify
from fakes.restartable_valkey import RestartableValkey
from handlers.change import Change
from handlers.clock import utcnow
from handlers.failures import Failure
from handlers.jobs import Attempt, ChatRef, Job, JobState
from handlers.messages import (
    Launch,
    Launched,
    Message,
    RelaunchDue,
    StartDeadline,
    StopDeadline,
    StopFailed,
    dump_message,
)
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    RedisClientFactory,
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)


def new_job(job_id: str = "ft-abc1", **fields: Any) -> Job:
    return Job.model_validate({"id": job_id, "recipe": "tiny", "requested_by": "U1", **fields})


def move(state: JobState, outbox: list[Message] | None = None, **fields: Any) -> Decider:
    def decide(job: Job) -> Change:
        updated = job.model_copy(update={"state": state, "updated_at": utcnow(), **fields})
        return Change(job=updated, history={"type": "state", "from": job.state, "to": state}, outbox=outbox or [])

    return decide


def launch(instance_id: str) -> Decider:
    def decide(job: Job) -> Change:
        attempt = Attempt(number=job.attempt + 1, instance_id=instance_id, zone="us-east-1a")
        updated = job.model_copy(update={"state": JobState.PROVISIONING, "attempts": [*job.attempts, attempt]})
        return Change(job=updated, history={"type": "launched", "instance_id": instance_id})

    return decide


def step_up(job: Job) -> Change:
    return Change(job=job.model_copy(update={"step": (job.step or 0) + 1}), history={"type": "step"})


@pytest.fixture
def store(redis_client: aioredis.Redis, key_prefix: str) -> JobStore:
    return JobStore(redis_client, Keys(key_prefix))


async def stream(store: JobStore, name: str) -> list[dict[str, Any]]:
    entries: Any = await store.redis.xrange(name)  # decode_responses=True: str throughout
    return [json.loads(fields["event"]) for _id, fields in entries]


async def outbox(store: JobStore) -> list[dict[str, Any]]:
    """What the store put on the events stream."""
    return await stream(store, store.keys.events)


async def test_create_refuses_a_taken_id(store: JobStore) -> None:
    job = new_job()
    assert await store.create(job, {"type": "created"}) is True
    assert await store.create(new_job(recipe="other"), {"type": "created again"}) is False

    stored = await store.get(job.id)
    assert stored == job
    assert await store.history(job.id) == [{"type": "created"}]
    assert [j.id for j in await store.list_jobs([JobState.PENDING])] == [job.id]
    assert await store.get("ft-none") is None


async def test_apply_writes_job_history_and_outbox_together(store: JobStore) -> None:
    job = new_job()
    await store.create(job, {"type": "created"})
    events: list[Message] = [
        Launched(id="ev-given-0001", job_id=job.id, attempt=1, instance_id="i-1"),
        StopFailed(job_id=job.id, instance_id="i-1", reason="gone"),
    ]

    applied = await store.apply(job.id, move(JobState.PROVISIONING, outbox=events), dedup_key="cmd-1")

    assert applied.changed and not applied.duplicate and not applied.missing
    assert applied.job is not None and applied.change is not None
    assert applied.job.version == 1 and applied.job.state is JobState.PROVISIONING
    assert await store.get(job.id) == applied.job
    assert [h["type"] for h in await store.history(job.id)] == ["created", "state"]
    assert (await store.history(job.id))[-1] == {"type": "state", "from": "PENDING", "to": "PROVISIONING"}
    published = await outbox(store)
    assert [e["type"] for e in published] == ["launched", "stop-failed"]
    assert published[0]["id"] == "ev-given-0001"
    assert published[1]["id"]  # every message has its id from the start
    assert published == [dump_message(message) for message in applied.change.outbox]  # as decided, encoded once
    assert await store.redis.ttl(store.keys.dedup("cmd-1")) > 6 * 86400


async def test_each_effect_goes_straight_to_its_executors_queue_with_the_change(store: JobStore) -> None:
    job = new_job(chat=ChatRef(platform="slack", channel="C1"))
    await store.create(job, {"type": "created"})
    due = utcnow()
    note = notify(job.id, "thread", "stop-requested", **{"by": "U1"})
    launch_effect = Launch(job_id=job.id, attempt=1)
    deadline = StartDeadline(job_id=job.id, attempt=1, due=due)
    launched = Launched(job_id=job.id, attempt=1, instance_id="i-0abc")
    outbox_messages: list[Message] = [note, launch_effect, deadline, launched]

    applied = await store.apply(job.id, move(JobState.PROVISIONING, outbox=outbox_messages), "cmd-1")

    assert applied.changed
    [chat] = await stream(store, store.keys.chat)
    assert chat == {"id": note.id, "job_id": job.id, "platform": "slack", "note": dump_message(note)}
    assert await stream(store, store.keys.cloud) == [dump_message(launch_effect)]
    assert await outbox(store) == [dump_message(launched)]  # an input goes where inputs go
    [(member, score)] = await store.redis.zrange(store.keys.timers, 0, -1, withscores=True)
    assert json.loads(member) == dump_message(deadline) and score == pytest.approx(due.timestamp())

    # Nothing is routed for a duplicate, and the routing needs no change either.
    assert (await store.apply(job.id, move(JobState.RUNNING, outbox=outbox_messages), "cmd-1")).duplicate
    assert len(await stream(store, store.keys.cloud)) == 1
    await store.send([Launch(job_id=job.id, attempt=2)])
    assert [e["attempt"] for e in await stream(store, store.keys.cloud)] == [1, 2]


async def test_the_lifecycle_timers_wait_in_the_timer_set_and_a_failed_stop_is_an_input(store: JobStore) -> None:
    """Issue 13's timers (a held-back relaunch, a stop's deadline) wait in the timer set like the start deadline;
    StopFailed, the cloud executor's follow-up of a stop it could not ask for, goes where inputs go."""
    due = utcnow()
    timers = [
        RelaunchDue(job_id="ft-tm1", attempt=2, due=due),
        StopDeadline(job_id="ft-tm1", attempt=1, due=due + timedelta(seconds=1)),
    ]
    failed = StopFailed(job_id="ft-tm1", instance_id="i-0abc", reason="instance i-0abc is not running")
    await store.send([*timers, failed])

    members = await store.redis.zrange(store.keys.timers, 0, -1, withscores=True)
    assert [json.loads(member) for member, _score in members] == [dump_message(timer) for timer in timers]
    assert [score for _member, score in members] == [pytest.approx(timer.due.timestamp()) for timer in timers]
    assert await outbox(store) == [dump_message(failed)]
    assert await stream(store, store.keys.cloud) == []


async def test_duplicate_dedup_key_changes_nothing_and_publishes_nothing(store: JobStore) -> None:
    job = new_job()
    await store.create(job, {"type": "created"})
    provision = Launch(job_id=job.id, attempt=1)
    first = await store.apply(job.id, move(JobState.PROVISIONING, outbox=[provision]), "ev-1")
    assert first.changed

    calls: list[Job] = []

    def decide(job: Job) -> Change | None:
        calls.append(job)
        return move(JobState.RUNNING, outbox=[Launch(job_id=job.id, attempt=2)])(job)

    again = await store.apply(job.id, decide, "ev-1")

    assert again == Applied(duplicate=True)
    assert calls == []
    assert await store.get(job.id) == first.job
    assert len(await store.history(job.id)) == 2
    assert await stream(store, store.keys.cloud) == [dump_message(provision)]


async def test_no_change_records_the_dedup_key_and_appends_nothing(store: JobStore) -> None:
    job = new_job()
    await store.create(job, {"type": "created"})

    applied = await store.apply(job.id, lambda job: None, "ev-stale")

    assert applied == Applied(job=job)
    assert await store.get(job.id) == job  # version not bumped
    assert len(await store.history(job.id)) == 1
    assert await outbox(store) == []
    assert (await store.apply(job.id, move(JobState.RUNNING), "ev-stale")).duplicate


async def test_a_failing_or_foreign_decision_writes_nothing(store: JobStore) -> None:
    job = new_job()
    await store.create(job, {"type": "created"})

    def boom(job: Job) -> Change:
        raise RuntimeError("decider failed")

    with pytest.raises(RuntimeError):
        await store.apply(job.id, boom, "ev-1")
    with pytest.raises(ValueError, match="ft-other"):
        await store.apply(job.id, lambda job: Change(job=new_job("ft-other"), history={}), "ev-2")

    assert await store.get(job.id) == job
    assert len(await store.history(job.id)) == 1
    assert await store.redis.exists(store.keys.dedup("ev-1"), store.keys.dedup("ev-2")) == 0
    assert await store.get("ft-other") is None


async def test_missing_job(store: JobStore) -> None:
    assert await store.apply("ft-nope", step_up, "ev-1") == Applied(missing=True)
    assert await store.redis.exists(store.keys.dedup("ev-1")) == 0


async def test_a_write_between_read_and_commit_makes_apply_decide_again(store: JobStore, valkey_url: str) -> None:
    job = new_job()
    await store.create(job, {"type": "created"})
    seen: list[int] = []

    def decide(current: Job) -> Change:
        seen.append(current.version)
        if len(seen) == 1:  # another replica commits while this one is deciding (a blocking client: no await here)
            with redis.Redis.from_url(valkey_url, decode_responses=True) as other:
                other.set(
                    store.keys.job(job.id), current.model_copy(update={"step": 100, "version": 1}).model_dump_json()
                )
        return step_up(current)

    applied = await store.apply(job.id, decide, "ev-1")

    assert seen == [0, 1]  # decided again, on what the other replica wrote
    assert applied.job is not None and applied.job.version == 2 and applied.job.step == 101
    assert [h["type"] for h in await store.history(job.id)] == ["created", "step"]  # the lost try wrote nothing


async def test_concurrent_applies_on_two_connections_all_land(
    store: JobStore, redis_client_factory: RedisClientFactory
) -> None:
    job = new_job()
    await store.create(job, {"type": "created"})
    stores = [JobStore(await redis_client_factory(), store.keys) for _ in range(2)]
    decisions = 0

    def decide(current: Job) -> Change:
        nonlocal decisions
        decisions += 1
        return step_up(current)

    async def writer(replica: JobStore, n: int) -> None:
        for i in range(n):
            await replica.apply(job.id, decide, dedup_key=f"{id(replica)}-{i}")

    await asyncio.gather(writer(stores[0], 15), writer(stores[1], 15))

    final = await store.get(job.id)
    assert final is not None
    assert final.version == 30 and final.step == 30  # no lost update
    assert len(await store.history(job.id)) == 31
    assert decisions >= 30


async def test_many_jobs_applied_at_once_share_round_trips_and_all_land(store: JobStore) -> None:
    """Concurrent transitions of different jobs go out together; each still lands whole, once."""
    jobs = [new_job(f"ft-many{n:02d}") for n in range(40)]
    await asyncio.gather(*(store.create(job, {"type": "created"}) for job in jobs))

    async def steps(job: Job) -> list[Applied]:
        return [await store.apply(job.id, step_up, dedup_key=f"{job.id}-{i}") for i in range(5)]

    results = await asyncio.gather(*(steps(job) for job in jobs))
    again = await asyncio.gather(*(store.apply(job.id, step_up, dedup_key=f"{job.id}-4") for job in jobs))

    assert all(applied.changed for per_job in results for applied in per_job)
    assert all(applied.duplicate for applied in again)
    for job in jobs:
        stored = await store.get(job.id)
        assert stored is not None and stored.step == 5 and stored.version == 5
        assert len(await store.history(job.id)) == 6


async def test_concurrent_creates_of_one_id_have_one_winner(store: JobStore) -> None:
    results = await asyncio.gather(*(store.create(new_job(recipe=f"r{n}"), {"type": "created"}) for n in range(10)))

    assert results.count(True) == 1
    stored = await store.get("ft-abc1")
    assert stored is not None and stored.recipe == f"r{results.index(True)}"
    assert len(await store.history("ft-abc1")) == 1


async def test_the_write_script_is_loaded_again_after_a_script_flush(store: JobStore) -> None:
    job = new_job()
    await store.create(job, {"type": "created"})
    await store.redis.script_flush()  # as after a server restart without the script cache

    applied = await store.apply(job.id, step_up, "ev-1")

    assert applied.job is not None and applied.job.step == 1
    assert (await store.apply(job.id, step_up, "ev-1")).duplicate


async def test_an_error_reply_fails_only_its_own_command(store: JobStore) -> None:
    job = new_job()
    await store.create(job, {"type": "created"})
    batch = [store.get(job.id), store._batch.execute("INCR", store.keys.job(job.id)), store.get(job.id)]

    got, error, again = await asyncio.gather(*batch, return_exceptions=True)  # one pipeline: issued in one turn

    assert got == job and again == job
    assert isinstance(error, redis.ResponseError) and "not an integer" in str(error)


async def test_once_only_markers(store: JobStore) -> None:
    assert await store.claim_once("dingtalk:1") is True
    assert await store.claim_once("dingtalk:1") is False
    assert await store.was_done("dingtalk:1") and not await store.was_done("dingtalk:2")


async def test_an_effect_and_its_follow_up_are_recorded_once_together(store: JobStore) -> None:
    job = new_job(chat=ChatRef(platform="slack", channel="C1"))
    launched = Launched(job_id=job.id, attempt=1, instance_id="i-0abc")
    note = notify(job.id, "thread", "interrupt-test-failed", error="ok")
    assert await store.effect_record("eff-1") is None

    first = await store.finish_effect("eff-1", "instance:i-0abc", [launched, note], "slack")
    again = await store.finish_effect("eff-1", "instance:i-0other", [launched, note], "slack")

    assert first is None and again == "instance:i-0abc"  # the second learns what the first recorded
    assert await store.effect_record("eff-1") == "instance:i-0abc"
    assert await outbox(store) == [dump_message(launched)]  # once
    assert [entry["note"] for entry in await stream(store, store.keys.chat)] == [dump_message(note)]


async def test_a_lost_connection_fails_the_commands_then_the_store_works_again(
    redis_client: aioredis.Redis, valkey_url: str, key_prefix: str
) -> None:
    name = key_prefix.rstrip(":")
    client = aioredis.Redis.from_url(valkey_url, decode_responses=True, client_name=name)
    store = JobStore(client, Keys(key_prefix))
    job = new_job()
    await store.create(job, {"type": "created"})
    for line in (await redis_client.execute_command("CLIENT", "LIST")).splitlines():
        fields = dict(item.split("=", 1) for item in line.split())
        if fields["name"] == name:
            await redis_client.execute_command("CLIENT", "KILL", "ID", fields["id"])

    outcomes = await asyncio.gather(*(store.get(job.id) for _ in range(3)), return_exceptions=True)
    assert all(outcome == job or isinstance(outcome, redis.ConnectionError) for outcome in outcomes)
    assert await store.get(job.id) == job
    assert (await store.apply(job.id, step_up, "ev-1")).changed
    await client.aclose()


async def test_after_a_redis_restart_no_idle_connection_fails_a_command(tmp_path: Path, key_prefix: str) -> None:
    """The bot's client checks a pooled connection before using it: after Redis restarts, connections that sat idle
    meanwhile are replaced, not handed out dead (each would fail its first command, a DingTalk frame or a Slack
    command answered "Redis is unavailable" although it is back)."""
    valkey = RestartableValkey(tmp_path / "redis")
    await valkey.start()
    client = connect(valkey.url)
    try:
        store = JobStore(client, Keys(key_prefix))
        job = new_job()
        await store.create(job, {"type": "created"})

        async def pipelined_get() -> Any:
            async with client.pipeline(transaction=False) as pipe:
                pipe.get(store.keys.job(job.id))
                return (await pipe.execute())[0]

        await asyncio.gather(*(pipelined_get() for _ in range(4)))  # four connections, each used, now idle
        await valkey.stop()
        await valkey.start()

        assert all(raw is not None for raw in await asyncio.gather(*(pipelined_get() for _ in range(4))))
        assert await asyncio.gather(*(store.get(job.id) for _ in range(8))) == [job] * 8
        assert (await store.apply(job.id, step_up, "ev-1")).changed
    finally:
        await client.aclose()
        await valkey.stop()


async def test_state_index_follows_every_transition(store: JobStore) -> None:
    a, b, c = new_job("ft-aaa"), new_job("ft-bbb"), new_job("ft-ccc")
    for job in (a, b, c):
        await store.create(job, {"type": "created"})
    await store.apply(a.id, move(JobState.PROVISIONING))
    await store.apply(a.id, move(JobState.RUNNING))
    await store.apply(b.id, move(JobState.PROVISIONING))
    await store.apply(b.id, move(JobState.RUNNING))
    await store.apply(b.id, move(JobState.INTERRUPTED))
    await store.apply(b.id, move(JobState.INTERRUPTED))  # same state: still indexed once
    await store.apply(c.id, move(JobState.FAILED, failure=Failure.of("launch-failed", error="no capacity")))

    assert [j.id for j in await store.list_jobs([JobState.RUNNING])] == ["ft-aaa"]
    assert [j.id for j in await store.list_jobs({JobState.INTERRUPTED, JobState.FAILED})] == ["ft-bbb", "ft-ccc"]
    assert [j.id for j in await store.list_jobs()] == ["ft-aaa", "ft-bbb", "ft-ccc"]
    assert await store.list_jobs([JobState.PENDING, JobState.PROVISIONING]) == []
    assert await store.list_jobs([]) == []
    counts = await store.counts_by_state()
    assert set(counts) == set(JobState)
    assert {s: n for s, n in counts.items() if n} == {JobState.RUNNING: 1, JobState.INTERRUPTED: 1, JobState.FAILED: 1}
    for state in JobState:  # every job in exactly one set
        members = await store.redis.smembers(store.keys.state(state))
        assert members == {j.id for j in await store.list_jobs([state])}


async def test_instance_index_maps_every_attempt_to_its_job(store: JobStore) -> None:
    job = new_job()
    await store.create(job, {"type": "created"})
    await store.apply(job.id, launch("i-0first"))
    await store.apply(job.id, launch("i-0second"))

    assert await store.job_for_instance("i-0first") == job.id
    assert await store.job_for_instance("i-0second") == job.id
    assert await store.job_for_instance("i-0unknown") is None


async def test_history_keeps_the_latest_entries_oldest_first(store: JobStore) -> None:
    job = new_job()
    await store.create(job, {"type": "created", "n": 0})

    def note(n: int) -> Decider:
        return lambda job: Change(job=job, history={"type": "note", "n": n})

    for n in range(1, 6):
        await store.apply(job.id, note(n))

    assert [h["n"] for h in await store.history(job.id)] == [0, 1, 2, 3, 4, 5]
    assert [h["n"] for h in await store.history(job.id, count=2)] == [4, 5]


@pytest.mark.scenario
async def test_jobs_and_history_survive_a_restart_of_the_embedded_server(tmp_path: Path) -> None:
    settings = RedisConfig(redis_url=None, state_dir=tmp_path / "state")
    handle = await open_redis(settings)
    assert handle.embedded
    try:
        store = JobStore(handle.client)
        job = new_job()
        await store.create(job, {"type": "created"})
        await store.apply(job.id, launch("i-0abc"), "ev-1")
        before = await store.get(job.id)
    finally:
        await handle.close()
    assert (tmp_path / "state" / "redis" / "appendonlydir").is_dir()

    handle = await open_redis(settings)
    try:
        store = JobStore(handle.client)
        assert await store.get(job.id) == before
        assert [h["type"] for h in await store.history(job.id)] == ["created", "launched"]
        assert [j.id for j in await store.list_jobs([JobState.PROVISIONING])] == [job.id]
        assert await store.job_for_instance("i-0abc") == job.id
        assert (await store.apply(job.id, step_up, "ev-1")).duplicate
    finally:
        await handle.close()


@pytest.mark.scenario
async def test_a_live_owners_server_is_never_touched(tmp_path: Path) -> None:
    """A second process on the same data dir is refused; the first one's server goes on serving."""
    first = RedisHandle(data_dir=tmp_path / "redis")
    await first.start()
    try:
        await first.client.set("k", "v")
        with pytest.raises(AlreadyOwned):
            await RedisHandle(data_dir=tmp_path / "redis").start()
        assert await first.client.get("k") == "v"
    finally:
        await first.close()


# Starts the embedded server on argv[1], writes a key, says its server's pid, then waits to be killed.
_OWNER = """
import asyncio, sys
from pathlib import Path
from bot.redis_server import RedisHandle
async def main():
    handle = RedisHandle(data_dir=Path(sys.argv[1]))
    await handle.start()
    await handle.client.set("k", "v")
    info = await handle.client.info("server")
    print(info["process_id"], flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


def test_a_server_left_running_by_a_killed_owner_is_stopped_first(tmp_path: Path) -> None:
    """A killed bot leaves its server running: the next one must take over the data, never share the AOF."""
    command = [sys.executable, "-c", _OWNER, str(tmp_path / "redis")]
    owner = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        old_pid = int(owner.stdout.readline())
    finally:
        owner.kill()  # no clean-up runs; the kernel drops its lock, its server lives on
        owner.wait()

    async def take_over() -> None:
        second = RedisHandle(data_dir=tmp_path / "redis")
        try:
            await second.start()
            assert await second.client.get("k") == "v"
            assert int((await second.client.info("server"))["process_id"]) != old_pid
        finally:
            await second.close()

    asyncio.run(take_over())
    old_cmdline = Path(f"/proc/{old_pid}/cmdline")
    assert not old_cmdline.exists() or old_cmdline.read_bytes() == b""  # gone (a zombie has no command line)


async def test_a_run_of_inputs_is_decided_in_turn_and_written_together(store: JobStore) -> None:
    job = new_job(chat=ChatRef(platform="slack", channel="C1"))
    await store.create(job, {"type": "created"})
    await store.apply(job.id, step_up, "ev-0")  # seen before the run: skipped in it
    seen: list[tuple[int, int | None]] = []
    notes = {n: notify(job.id, "card", "progress") for n in range(4)}

    def step_with_note(n: int) -> Decider:
        def decide(current: Job) -> Change:
            seen.append((current.version, current.step))
            return Change(step_up(current).job, {"type": "step", "n": n}, [notes[n]])

        return decide

    steps: list[tuple[Decider, str | None]] = [
        (step_with_note(1), "ev-1"),
        (step_with_note(0), "ev-0"),  # a redelivery of an input already applied
        (lambda current: None, "ev-quiet"),  # nothing to change: only its dedup key is written
        (step_with_note(2), "ev-2"),
        (step_with_note(1), "ev-1"),  # the same input twice in one run: the second is a duplicate
        (step_with_note(3), None),
    ]
    applied = await store.apply_many(job.id, steps)

    assert seen == [(1, 1), (2, 2), (3, 3)]  # each decided on the job as the one before left it
    assert [a.duplicate for a in applied] == [False, True, False, False, True, False]
    assert [a.job.version if a.job else None for a in applied] == [2, None, 2, 3, None, 4]
    assert applied[2].job is not None and not applied[2].changed
    stored = await store.get(job.id)
    assert stored is not None and (stored.version, stored.step) == (4, 4)
    assert [h.get("n") for h in await store.history(job.id)] == [None, None, 1, 2, 3]
    assert [entry["id"] for entry in await stream(store, store.keys.chat)] == [notes[n].id for n in (1, 2, 3)]
    assert await store.redis.exists(*(store.keys.dedup(key) for key in ("ev-1", "ev-2", "ev-quiet"))) == 3
    again = await store.apply_many(job.id, [(step_up, "ev-1"), (step_up, "ev-quiet"), (step_up, "ev-2")])
    assert all(a.duplicate for a in again)
    assert (await store.get(job.id)) == stored  # a redelivered run writes nothing


async def test_a_run_whose_input_was_seen_meanwhile_is_decided_again_without_it(
    store: JobStore, valkey_url: str
) -> None:
    job = new_job()
    await store.create(job, {"type": "created"})
    tries = 0

    def first(current: Job) -> Change:
        nonlocal tries
        tries += 1
        if tries == 1:  # another replica applies the second input while this one decides (blocking client)
            with redis.Redis.from_url(valkey_url, decode_responses=True) as other:
                other.set(store.keys.dedup("ev-b"), job.id)
        return step_up(current)

    applied = await store.apply_many(job.id, [(first, "ev-a"), (step_up, "ev-b")])

    assert tries == 2  # the first try wrote nothing
    assert [a.duplicate for a in applied] == [False, True]
    stored = await store.get(job.id)
    assert stored is not None and (stored.version, stored.step) == (1, 1)
    assert [h["type"] for h in await store.history(job.id)] == ["created", "step"]


async def test_a_run_for_a_missing_job_writes_nothing(store: JobStore) -> None:
    await store.claim_once("ev-seen")  # what a redelivery of an input already applied finds

    applied = await store.apply_many("ft-nope", [(step_up, "ev-1"), (step_up, None)])

    assert applied == [Applied(missing=True), Applied(missing=True)]
    assert await store.redis.exists(store.keys.dedup("ev-1")) == 0


async def test_a_gangs_restart_is_kept_apart_from_one_nodes_of_the_same_recipe_and_type(store: JobStore) -> None:
    # Before: a gang node's restart (node 0 first, then the world's rendezvous) went into the one-node estimate of
    # its recipe and type, so one-node jobs planned with a gang's start-up, and a new gang with one node's.
    def measured(job_id: str, nodes: int, seconds: float) -> Job:
        launched = utcnow()
        first = launched + timedelta(seconds=seconds)
        attempt = Attempt(number=1, instance_type="g5.xlarge", launched_at=launched, first_step_at=first)
        return new_job(job_id=job_id).model_copy(update={"attempts": [attempt], "nodes": nodes})

    await store.record_restart(measured("ft-gang1", 4, 600.0))
    assert await store.restart_estimate("tiny", ["g5.xlarge"], nodes=4) == 600.0
    assert await store.restart_estimate("tiny", ["g5.xlarge"]) is None
    await store.record_restart(measured("ft-one1", 1, 90.0))
    assert await store.restart_estimate("tiny", ["g5.xlarge"]) == 90.0
    assert await store.restart_estimate("tiny", ["g5.xlarge"], nodes=4) == 600.0
    assert await store.restart_estimate("tiny", ["g5.xlarge"], nodes=2) is None  # a gang of another size: its own


@pytest.mark.scenario
async def test_an_attempts_key_salt_is_read_back_after_a_restart_of_the_server(tmp_path: Path) -> None:
    """The report gate derives an attempt's key from the salt stored with it: a restarted bot (or another replica)
    finds the same salt, so a runner's key keeps working; an attempt the store does not hold has none."""
    settings = RedisConfig(redis_url=None, state_dir=tmp_path / "state")
    handle = await open_redis(settings)
    try:
        store = JobStore(handle.client)
        job = new_job()
        await store.create(job, {"type": "created"})
        await store.apply(job.id, launch("i-0abc"), "ev-1")
        stored = await store.get(job.id)
        assert stored is not None and stored.current is not None
        salt = stored.current.key_salt
        ahead = Attempt(number=2, market="on-demand")
        await store.apply(job.id, lambda j: Change(j.model_copy(update={"standby": ahead}), {"type": "ahead"}), "ev-2")
    finally:
        await handle.close()

    handle = await open_redis(settings)
    try:
        store = JobStore(handle.client)
        assert await store.key_salt(job.id, 1) == salt and len(salt) == 32
        assert await store.key_salt(job.id, 2) == ahead.key_salt != salt  # the attempt launched ahead has its own
        assert await store.key_salt(job.id, 3) is None
        assert await store.key_salt("ft-none", 1) is None
    finally:
        await handle.close()
