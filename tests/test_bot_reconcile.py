"""Reconciliation through the real bot (embedded or external Valkey, the local cloud, real instance and runner
processes): a job whose bot and instance were killed together finishes under the next bot; instances that
survive their bot are found again; an orphan is released and said so; a silent job is probed once per silence;
two replicas or two rounds relaunch a job whose instance is gone once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from bot.cloud.local.provider import LocalCloud
from bot.cloud.local.registry import LocalInstanceRecord, LocalRegistry
from bot.keys import DEFAULT_KEYS
from bot.reconciler import Reconciler
from bot.redis_server import connect
from bot.store import JobStore
from fakes.bot_harness import NO_RELAUNCH_PAUSE, SLEEPS, quick_recipe, running_bot, start_job, wait_job, write_config
from fakes.restartable_valkey import RestartableValkey
from handlers.clock import utcnow
from handlers.jobs import Job, JobState
from handlers.recipes import find_recipe
from handlers.spec_build import build_spec
from tests.test_bot_scenarios import wait_for_text

# Its first run trains until killed; any later run trains three steps and finishes.
FIRST_RUN_TRAINS_ON = """
import json, os, pathlib, time
marker = pathlib.Path({marker!r})
first = not marker.exists()
marker.touch()
progress = pathlib.Path(os.environ['FINETUNE_PROGRESS_FILE'])
step = 0
while first or step < 3:
    step += 1
    with progress.open('a') as f:
        f.write(json.dumps({{'step': step}}) + '\\n')
    time.sleep(0.1)
"""

# Trains until the test lets it finish (a file appears).
TRAINS_UNTIL_RELEASED = """
import json, os, pathlib, time
release = pathlib.Path({release!r})
progress = pathlib.Path(os.environ['FINETUNE_PROGRESS_FILE'])
step = 0
while not release.exists():
    step += 1
    with progress.open('a') as f:
        f.write(json.dumps({{'step': step}}) + '\\n')
    time.sleep(0.1)
"""


async def poll(what: str, check: object, timeout: float = 120.0) -> None:
    """Wait until ``check()`` (sync or async) is true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()  # type: ignore[operator]
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def kill_instance(record: LocalInstanceRecord) -> None:
    """The instance's machine goes, without a word: its process and its runner, no instance-gone on the bus.

    Returns once the process is dead (gone, or a zombie with no command line): a SIGKILL is delivered when the
    process is next scheduled, which on a busy machine is after the reconciliation the test runs next."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.runner_pid, signal.SIGKILL)
    guard = time.monotonic() + 60  # a hang guard only: SIGKILL cannot be caught
    while _command_line(record.pid) and time.monotonic() < guard:
        time.sleep(0.01)


def _command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def history_events(store: JobStore, job_id: str, event: str) -> list[dict[str, object]]:
    return [entry for entry in await store.history(job_id) if entry.get("event") == event]


async def test_bot_and_instance_killed_together_the_restarted_bot_finds_the_job_and_it_finishes(
    tmp_path: Path,
) -> None:
    code = FIRST_RUN_TRAINS_ON.format(marker=str(tmp_path / "first-run"))
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("resumable", code)])
    state = tmp_path / "state"
    log = (tmp_path / "first-bot.log").open("ab")
    first = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.bot_process",
        str(state),
        str(config),
        "resumable",
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        assert first.stdout is not None
        line = await asyncio.wait_for(first.stdout.readline(), 120)
        assert line, f"the first bot did not start (see {log.name})"
        started = json.loads(line)
        job_id = str(started["job"])
        redis = connect(str(started["redis"]))  # the first bot's embedded Valkey
        try:
            store = JobStore(redis, DEFAULT_KEYS)

            async def training() -> bool:
                job = await store.get(job_id)
                return job is not None and job.state is JobState.RUNNING and (job.step or 0) >= 2

            await poll("the first attempt to train", training)
            job = await store.get(job_id)
            assert job is not None and job.current is not None and job.current.instance_id is not None
            record = await LocalRegistry(redis, DEFAULT_KEYS).get(job.current.instance_id)
            assert record is not None and record.state == "running"
            # Everything written so far is on disk (the append-only file is fsynced every second): a write of
            # ours, then WAITAOF until the file has it and all before it.
            await redis.set("test:fsynced", "1")
            assert (await redis.execute_command("WAITAOF", 1, 0, 0))[0] == 1
        finally:
            await redis.aclose()
        # Bot and instance go together: kill -9, nothing said to anyone.
        first.kill()
        kill_instance(record)
        await first.wait()
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
        log.close()

    async with running_bot(state, config) as (service, chat):
        stale = await service.bot.store.get(job_id)
        assert stale is not None and stale.attempt == 1  # the new bot's Valkey has the job from the file
        done = await wait_job(service, job_id, lambda job: job.state in (JobState.SUCCEEDED, JobState.FAILED))
        assert done.state is JobState.SUCCEEDED, done.failure
        assert done.attempt == 2 and done.attempts[0].instance_id == record.instance_id
        [gone] = await history_events(service.bot.store, job_id, "instance-gone")
        assert gone["source"] == "reconcile" and gone["instance"] == record.instance_id
        assert len(await history_events(service.bot.store, job_id, "launched")) == 2  # nothing launched twice
        await wait_for_text(chat, "thread", f"Instance {record.instance_id} went away")
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)
        listed = {i.instance_id: i for i in await cloud.list_instances()}
        assert not listed[record.instance_id].live  # the registry knows it is gone now


async def test_instances_outlive_a_bot_on_an_external_redis_and_the_next_bot_finds_them(tmp_path: Path) -> None:
    release = tmp_path / "release"
    code = TRAINS_UNTIL_RELEASED.format(release=str(release))
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("held", code)])
    valkey = RestartableValkey(tmp_path / "redis")
    await valkey.start()
    try:
        async with running_bot(tmp_path / "state", config, redis_url=valkey.url, keep_instances=True) as (service, _):
            job_id = await start_job(service, "console:ana", "start held")
            running = await wait_job(service, job_id, lambda job: (job.step or 0) >= 2)
            instance_id = running.attempts[0].instance_id
        async with running_bot(tmp_path / "state", config, redis_url=valkey.url) as (service, _):
            await poll("the start round", lambda: service.reconciler.rounds >= 1)
            cloud = service.bot.cloud
            assert isinstance(cloud, LocalCloud)
            [listed] = [i for i in await cloud.list_instances() if i.job_id == job_id]
            assert (listed.instance_id, listed.live) == (instance_id, True)  # found again, still running
            assert await history_events(service.bot.store, job_id, "instance-gone") == []
            before = (await service.bot.store.get(job_id)).step  # type: ignore[union-attr]
            await wait_job(service, job_id, lambda job: (job.step or 0) > (before or 0))  # reports reach this bot
            release.touch()
            done = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED)
            assert done.attempt == 1  # the instance that outlived its bot finished the job: no relaunch
    finally:
        await valkey.stop()


async def test_an_orphan_of_an_ended_or_unknown_job_is_released_and_said_so(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "bot.yaml", recipes=[quick_recipe("quick", "print('done')"), quick_recipe("sleepy", SLEEPS)]
    )
    async with running_bot(tmp_path / "state", config) as (service, chat):
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)
        job_id = await start_job(service, "console:ana", "start quick")
        ended = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED)
        sleepy = find_recipe("sleepy", service.bot.recipes)
        stranger = Job(id="ft-zz99", recipe="sleepy", requested_by="console:bob")

        async def stray(job: Job, attempt: int, checkpoints: str) -> str:
            spec = build_spec(job, attempt, sleepy, checkpoints, [], cloud.notice, sys.executable)
            return (await cloud.launch(spec, [], "spot")).instance_id

        # Instances the bot never asked for (a launch retried by hand, a bot that lost its record): they bill.
        # The ended job's stray reads another prefix: a runner that sees its job's completion record exits by
        # itself (nothing to release, and on a busy machine it may be gone before the round), one that does not
        # (hung, an old image, a prefix typed by hand) bills until it is released.
        of_ended = await stray(ended, 5, cloud.checkpoint_uri(f"{job_id}-by-hand"))
        of_unknown = await stray(stranger, 1, cloud.checkpoint_uri(stranger.id))
        done = await service.reconciler.round()
        assert done is not None
        released = {(d.action.instance_id, d.action.code, d.acted) for d in done if d.action.action == "release"}
        assert released == {(of_ended, "job-over", True), (of_unknown, "job-unknown", True)}

        async def both_gone() -> bool:
            records = [await cloud.registry.get(instance) for instance in (of_ended, of_unknown)]
            return all(record is not None and record.state == "gone" for record in records)

        await poll("both strays to be terminated", both_gone)
        await wait_for_text(chat, "thread", f"Released instance {of_ended}: its job {job_id} is SUCCEEDED")
        [entry] = await history_events(service.bot.store, job_id, "orphan-released")
        assert entry["instance"] == of_ended and entry["reason"] == "job-over"
        job = await service.bot.store.get(job_id)
        assert job is not None and job.state is JobState.SUCCEEDED and job.updated_at == ended.updated_at
        again = await service.reconciler.round()  # they are gone now: nothing more to release
        assert again is not None and [d for d in again if d.action.action == "release"] == []


async def test_a_silent_job_is_probed_once_and_a_gone_instance_relaunches_once_whatever_the_replicas(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)], policy=NO_RELAUNCH_PAUSE)
    async with running_bot(tmp_path / "state", config) as (service, chat):
        store = service.bot.store
        job_id = await start_job(service, "console:ana", "start sleepy")
        running = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
        instance_id = running.attempts[0].instance_id
        assert instance_id is not None

        # Its trainer says nothing (no steps): half an hour later, the channel hears so; once for this silence.
        later = running.updated_at + (service.reconciler.limits.silent_after * 1.1)
        first = await service.reconciler.round(later)
        assert first is not None and [(d.action.action, d.acted) for d in first] == [("probe", True)]
        second = await service.reconciler.round(later + service.reconciler.limits.silent_after)
        assert second is not None and [(d.action.action, d.acted) for d in second] == [("probe", False)]
        assert len(await history_events(store, job_id, "probe")) == 1
        await wait_for_text(chat, "thread", f"No report from {job_id} for 33 min")

        # Its instance goes without a word. Two replicas reconcile at the same moment, then again.
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)
        record = await cloud.registry.get(instance_id)
        assert record is not None
        kill_instance(record)
        other = Reconciler(store.redis, store, cloud, service.bot.policy.lifecycle, owner="replica-b")
        rounds = await asyncio.gather(service.reconciler.round(), other.round())
        assert sorted(r is None for r in rounds) == [False, True]  # one replica at a time
        [ran] = [r for r in rounds if r is not None]
        assert [(d.action.action, d.action.instance_id) for d in ran] == [("instance-gone", instance_id)]
        await other.round(utcnow())  # once more, before or after the bot decided on the first: the same event
        relaunched = await wait_job(service, job_id, lambda job: job.attempt == 2 and job.state is JobState.RUNNING)
        assert relaunched.attempts[0].end_reason is not None
        await service.reconciler.round()  # and once the job is on its new instance: nothing to do for it
        gone = await history_events(store, job_id, "instance-gone")
        assert [entry["source"] for entry in gone] == ["reconcile"]
        assert len(await history_events(store, job_id, "launched")) == 2
        assert len([i for i in await cloud.instances() if i.job_id == job_id]) == 2
