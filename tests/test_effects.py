"""Effects that survive replica crashes and Redis restarts: issue 12's findings 1-3 as scenarios.

Real parts throughout: a Valkey server of the test's own (restarted mid-test where the scenario says so), the
bot service (two replicas with separate state directories where it says so), the local cloud's instances as
processes of their own, real runner subprocesses.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from bot.chat.slack.deliverer import NOTE_EVENT
from bot.cloud.local.provider import LocalCloud
from bot.keys import DEFAULT_KEYS
from bot.redis_server import connect
from bot.service import BotService
from bot.store import JobStore
from fakes.bot_harness import (
    CHANNEL,
    INTERRUPTIBLE,
    NO_RELAUNCH_PAUSE,
    SECRET,
    SLEEPS,
    attempt_salt,
    chat_drained,
    quick_recipe,
    report_headers,
    running_bot,
    slack_settings,
    start_job,
    wait_job,
    write_config,
)
from fakes.fake_slack import FakeSlack, Message
from fakes.notes import notify
from fakes.restartable_valkey import RestartableValkey
from handlers.clock import utcnow
from handlers.decide import new_job
from handlers.jobs import TERMINAL_STATES, ChatRef, JobState
from handlers.messages import Notify
from handlers.recipes import Recipe
from handlers.report_keys import ReportKeys
from handlers.reports import Notice
from handlers.spec_build import build_spec


@pytest.fixture
async def valkey(tmp_path: Path) -> AsyncIterator[RestartableValkey]:
    server = RestartableValkey(tmp_path / "redis")
    await server.start()
    yield server
    await server.stop()


async def until(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def test_any_replica_carries_out_any_effect_and_reports_outlive_the_launching_replica(
    tmp_path: Path, valkey: RestartableValkey
) -> None:
    """Finding 3: with the launching replica gone, the other one hears the runner, interrupt-tests the instance, and the
    job recovers and finishes; the cloud's instances belong to the cloud."""
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("interruptible", INTERRUPTIBLE)])
    shared = {
        "redis_url": valkey.url,
        # The notice's window must hold the runner's report reserve (2 s at least) and a save: IMDS gives the
        # deadline in whole seconds, so 3 s could leave no time to ask for a checkpoint (runner/commit_plan.py).
        "grace": 8.0,
        "keep_instances": True,
        "finetune_local_checkpoints": (tmp_path / "bucket").resolve().as_uri() + "/",
    }
    stacks = {"a": contextlib.AsyncExitStack(), "b": contextlib.AsyncExitStack()}
    try:
        replicas = {
            name: (await stack.enter_async_context(running_bot(tmp_path / name, config, **shared)))[0]
            for name, stack in stacks.items()
        }
        job_id = await start_job(replicas["a"], "console:ana", "start interruptible")
        running = await wait_job(replicas["a"], job_id, lambda job: job.state is JobState.RUNNING)
        assert running.current is not None and running.current.instance_id
        instance_id = running.current.instance_id
        launcher = "a" if (tmp_path / "a" / "instances" / instance_id).is_dir() else "b"
        other = replicas["b" if launcher == "a" else "a"]

        # The other replica sees the instance as the cloud's.
        [record] = await other.bot.cloud.instances()  # type: ignore[attr-defined]
        assert (record.instance_id, record.job_id, record.attempt, record.state) == (instance_id, job_id, 1, "running")

        await stacks[launcher].aclose()  # the launching replica is gone
        step = (await other.bot.store.get(job_id) or running).step or 0
        await wait_job(other, job_id, lambda job: (job.step or 0) > step + 3)  # its runner's reports still arrive

        assert (await other.bot.command("console:ana", CHANNEL, f"interrupt-test {job_id}")).startswith("OK")
        done = await wait_job(other, job_id, lambda job: job.state is JobState.SUCCEEDED, timeout=180)
        assert done.interruptions == 1 and len(done.attempts) == 2 and done.steps_lost == 0
        said = [text for job, channel, text in other.chat.transcript if job == job_id]  # type: ignore[attr-defined]
        assert any("Interrupt test" in text for text in said)
        assert not any("failed" in text for text in said), said
        gone = {r.instance_id: r.state for r in await other.bot.cloud.instances()}  # type: ignore[attr-defined]
        assert gone[instance_id] == "gone"
        # The interrupt test asked again (an effect retried after a crash), with the instance gone: it says what it did.
        again = await other.bot.cloud.interrupt_test(instance_id)
        assert (again.instance_id, again.way) == (instance_id, "notice") and again.reclaim_at is not None
        told = f"spot interruption notice posted on {instance_id}; it is reclaimed at {again.reclaim_at:%H:%M:%S} UTC"
        assert any(told in text for text in said), said
    finally:
        for stack in stacks.values():
            await stack.aclose()
        client = connect(valkey.url)
        cleanup = LocalCloud(tmp_path, client, valkey.url)
        await cleanup.terminate_all()
        await cleanup.close()
        await client.aclose()


async def test_a_launch_repeated_after_a_crash_starts_no_second_instance(
    tmp_path: Path, valkey: RestartableValkey
) -> None:
    """Finding 1: a replica launched the instance and died before recording it; the launch is carried out again
    by the next replica, finds the same instance, and the job runs (one instance, one launch in its history)."""
    recipe = Recipe.model_validate(quick_recipe("sleepy", SLEEPS))
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    redis = connect(valkey.url)
    store = JobStore(redis, DEFAULT_KEYS)
    change = new_job("ft-crash1", "sleepy", {}, "console:ana", CHANNEL, utcnow())
    assert await store.create(change.job, change.history, change.outbox)
    dying = LocalCloud(tmp_path / "dead-replica", redis, valkey.url, report_keys=ReportKeys(SECRET))
    spec = build_spec(change.job, 1, recipe, dying.checkpoint_uri(change.job.id), [], dying.notice, "python")
    first = await dying.launch(spec, [], "spot")  # ... and the replica dies here: nothing recorded, nothing acked

    async with running_bot(tmp_path / "state", config, redis_url=valkey.url) as (service, _chat):
        running = await wait_job(service, change.job.id, lambda job: job.state is JobState.RUNNING)
        await until(lambda: has_launched(service.bot.store, change.job.id), "the launch result")
        job = await service.bot.store.get(change.job.id)
        assert job is not None and job.instance_ids == [first.instance_id] == running.instance_ids
        instances = [r for r in await service.bot.cloud.instances() if r.job_id == change.job.id]  # type: ignore[attr-defined]
        assert [(r.instance_id, r.state) for r in instances] == [(first.instance_id, "running")]
        assert service.effects.launched == 1  # carried out again, by this replica, with the same result
    await redis.aclose()


async def has_launched(store: JobStore, job_id: str) -> bool:
    return any(entry.get("event") == "launched" for entry in await store.history(job_id))


async def test_a_redis_restart_while_starts_are_in_flight_leaves_no_job_stuck(
    tmp_path: Path, valkey: RestartableValkey
) -> None:
    """Finding 1, as found: a burst of starts, Redis restarted under them; every job runs (or ends saying why),
    on one instance each."""
    config = write_config(
        tmp_path / "bot.yaml",
        recipes=[quick_recipe("sleepy", SLEEPS)],
        # One person's burst of six: the restart is the subject here (so the rate and the node cap are lifted).
        policy={"rate": {"starts_per_minute": 60}, "max_concurrent_nodes": 6},
    )
    async with running_bot(tmp_path / "state", config, redis_url=valkey.url) as (service, _chat):
        jobs = [await start_job(service, "console:ana", "start sleepy") for _ in range(6)]
        outages = (service.bus.unreachable, service.effects.bus.unreachable)
        await valkey.stop()  # launches are on their way: some started, some not, none recorded
        # Held down until both consumers found it gone and tried again: the outage reached the running service.
        await until(
            lambda: unreachable_since(service, outages, 2), "both consumers to find Redis down, twice", timeout=60
        )
        await valkey.start()

        def settled(job: object) -> bool:
            state = getattr(job, "state", None)
            return state is JobState.RUNNING or state in TERMINAL_STATES

        finals = [await wait_job(service, job_id, settled, timeout=180) for job_id in jobs]
        for job in finals:
            assert job.state is JobState.RUNNING or job.failure, job
        running = [job for job in finals if job.state is JobState.RUNNING]
        assert running, "a restart must not fail every start"
        instances = await service.bot.cloud.instances()  # type: ignore[attr-defined]
        for job in running:
            assert len(job.instance_ids) == 1
            live = [r for r in instances if r.job_id == job.id and r.state == "running"]
            assert [r.instance_id for r in live] == job.instance_ids  # one instance per job: no double launch
        assert service.bus.parked == service.effects.bus.parked == 0


async def test_an_old_attempts_late_warning_is_still_posted_once(tmp_path: Path, valkey: RestartableValkey) -> None:
    """Finding 2: the runner's spot notice comes in only after the job relaunched (the replica holding it died);
    it moves nothing, but the alert is posted; told again (redelivered, or by the cloud), it is not posted twice."""
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)], policy=NO_RELAUNCH_PAUSE)
    async with running_bot(tmp_path / "state", config, redis_url=valkey.url) as (service, chat):
        job_id = await start_job(service, "console:ana", "start sleepy")
        first = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
        assert first.current is not None and first.current.instance_id
        old_instance = first.current.instance_id
        await service.bot.cloud.terminate(old_instance, job_id)  # reclaimed without notice, as far as the bot knows
        relaunched = await wait_job(service, job_id, lambda job: job.attempt == 2 and job.state is JobState.RUNNING)

        notice = Notice(job_id=job_id, attempt=1, kind="spot-interruption", source="aws-imds")
        salt = await attempt_salt(service, job_id, 1)
        for _ in range(2):  # the reclaimed message, then a redelivery of it
            assert await post_report(service.port, notice.model_dump_json().encode(), salt) == 202

        def alerts() -> list[str]:
            return [text for job, channel, text in chat.transcript if job == job_id and channel == "alert"]

        async def told(what: str, count: int) -> bool:
            history = await service.bot.store.history(job_id)
            return sum(1 for entry in history if entry.get("what") == what) == count

        await until(lambda: told("report:notice", 1), "the late notice, fenced")  # the redelivery is a duplicate
        await service.bus.publish(
            {"type": "cloud", "kind": "spot-interruption", "instance_id": old_instance, "source": "aws.ec2"}
        )
        await until(lambda: told("cloud:spot-interruption", 1), "the cloud's late warning, fenced")
        await until(lambda: chat_drained(service), "every note handled")
        assert len(alerts()) == 1 and old_instance in alerts()[0]
        now = await service.bot.store.get(job_id)
        assert now is not None and now.state is JobState.RUNNING and now.version >= relaunched.version
        assert now.interruptions == relaunched.interruptions  # fencing: the job did not move


async def unreachable_since(service: BotService, before: tuple[int, int], times: int) -> bool:
    return service.bus.unreachable >= before[0] + times and service.effects.bus.unreachable >= before[1] + times


async def post_report(port: int, body: bytes, salt: str) -> int:
    now = int(time.time())
    headers = report_headers(body, now, salt=salt)
    url = f"http://127.0.0.1:{port}/runner/reports"
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as response:
        await response.read()
        return response.status


async def test_a_note_in_doubt_is_looked_for_in_slack_before_it_is_posted_again(
    tmp_path: Path, valkey: RestartableValkey
) -> None:
    """A replica died between Slack's answer and recording the note as sent: the next delivery finds the note in
    the thread (by the id in its metadata) and does not post it again; one never posted is posted, once."""
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    async with (
        FakeSlack() as slack,
        running_bot(tmp_path / "state", config, redis_url=valkey.url, **slack_settings(slack.api_url)) as (
            service,
            _chat,
        ),
    ):
        where = ChatRef(platform="slack", channel="C0JOBS")
        reply = await service.bot.command("slack:U0ANA", where, "start sleepy")
        job_id = reply.split()[1].rstrip(":")
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
        card = await slack.wait_for(lambda: [m for m in slack.channel_messages("C0JOBS") if m.blocks])
        store = service.bot.store

        def said(n: str) -> str:
            return f"⚠️ interrupt-test failed for {job_id}: note {n}"

        posted, lost = (
            notify(job_id, "thread", "interrupt-test-failed", error=f"note {n}") for n in ("posted", "lost")
        )
        # The dead replica's first note made it to Slack (with its id), its second did not; neither was recorded.
        slack.messages[("C0JOBS", "1800000000.000001")] = Message(
            "C0JOBS", "1800000000.000001", said("posted"), [], card[0].ts, 0, _note_metadata(posted)
        )
        for note in (posted, lost):
            await store.redis.set(store.keys.sending(note.id), "dead-replica")
        await store.send([posted, lost], "slack")

        await until(lambda: chat_drained(service), "both notes handled")
        thread = [m.text for m in slack.replies("C0JOBS", card[0].ts)]
        assert thread.count(said("posted")) == 1 and thread.count(said("lost")) == 1
        assert await store.redis.exists(store.keys.sent(posted.id), store.keys.sent(lost.id)) == 2
        assert slack.called("conversations.replies")  # it looked before posting


def _note_metadata(note: Notify) -> dict[str, object]:
    return {"event_type": NOTE_EVENT, "event_payload": {"note": note.id, "job": note.job_id}}
