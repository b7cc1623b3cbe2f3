"""Per-attempt report keys through the real bot and the real local cloud: a runner holds its own attempt's key and
nothing of the bot's, no runner can speak for another job, an ended attempt's key stops speaking after its grace,
and a report naming storage outside its job's prefix is refused."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from bot.cloud.local.provider import LocalCloud
from bot.service import BotService
from fakes.bot_harness import (
    CHANNEL,
    NO_RELAUNCH_PAUSE,
    SECRET,
    SLEEPS,
    SteppedClock,
    attempt_salt,
    eventually,
    quick_recipe,
    running_bot,
    start_job,
    wait_job,
    write_config,
)
from handlers.jobs import Job, JobState
from handlers.report_fence import ENDED_ATTEMPT_GRACE
from handlers.report_keys import derive_report_key
from handlers.reports import CheckpointSaved, Completed, Started, dump_report
from handlers.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

SLACK_TOKEN = "xoxb-the-bots-own-slack-token"
SIGNING_SECRET = "the-bots-slack-signing-secret"
WEBHOOK_TOKEN = "the-bots-alibaba-webhook-token-0123456789"

# Reports progress for a few seconds, then finishes (the runner reports ``completed``).
FINISHES = """
import json, os, pathlib, time
progress = pathlib.Path(os.environ['FINETUNE_PROGRESS_FILE'])
for step in range(1, 31):
    with progress.open('a') as file:
        file.write(json.dumps({'step': step, 'total_steps': 30}) + '\\n')
    time.sleep(0.25)
"""


async def post_report(service: BotService, body: bytes, key: str) -> int:
    """POST a runner report signed with ``key`` now; the HTTP status."""
    now = int(time.time())
    headers = {TIMESTAMP_HEADER: str(now), SIGNATURE_HEADER: sign(key, now, body)}
    url = f"http://127.0.0.1:{service.port}/runner/reports"
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as response:
        return response.status


async def refused_reports(service: BotService) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{service.port}/metrics") as response:
        text = await response.text()
    return next(line for line in text.splitlines() if line.startswith("finetune_reports_refused_total "))


def environment_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {name.decode(): value.decode(errors="replace") for name, value in pairs}


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (the runner's: its trainer, and whatever that started)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


async def trainer_started(runner_pid: int) -> list[int]:
    for _ in range(600):
        if below := descendants(runner_pid):
            return below
        await asyncio.sleep(0.1)
    raise AssertionError("the runner started no trainer")


@pytest.fixture
def bot_secrets_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a bot's environment holds in production; the tests pass the settings explicitly (these stay unused by
    the bot itself, so nothing here turns an adapter on), and only check that no instance inherits them."""
    for name, value in {
        "FINETUNE_REPORT_SECRET": SECRET,
        "SLACK_BOT_TOKEN": SLACK_TOKEN,
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "FINETUNE_ALIYUN_WEBHOOK_TOKEN": WEBHOOK_TOKEN,
        "DINGTALK_CLIENT_SECRET": "the-bots-dingtalk-secret",
    }.items():
        monkeypatch.setenv(name, value)


NO_ADAPTERS = {"slack_bot_token": None, "slack_signing_secret": None, "finetune_aliyun_webhook_token": None}


@pytest.mark.usefixtures("bot_secrets_in_the_environment")
async def test_a_local_instance_holds_its_attempts_key_and_nothing_of_the_bots(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    async with running_bot(tmp_path / "state", config, **NO_ADAPTERS) as (service, _chat):
        job_id = await start_job(service, "console:ana", "start sleepy")
        job = await wait_job(
            service, job_id, lambda j: j.state is JobState.RUNNING and j.current is not None and bool(j.instance_ids)
        )
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)
        [record] = await cloud.instances()
        processes = [record.pid, record.runner_pid, *await trainer_started(record.runner_pid)]

        own_key = derive_report_key(SECRET, job_id, 1, await attempt_salt(service, job_id, 1))
        for pid in processes:
            environment = environment_of(pid)
            values = set(environment.values())
            assert not {SECRET, SLACK_TOKEN, SIGNING_SECRET, WEBHOOK_TOKEN} & values, pid
            assert not [name for name in environment if name.startswith(("SLACK_", "DINGTALK_"))]
            assert "REDIS_URL" not in environment
            assert environment.get("FINETUNE_REPORT_SECRET") in (None, own_key)  # its attempt's key at most
        assert environment_of(record.runner_pid)["FINETUNE_REPORT_SECRET"] == own_key
        assert job.current is not None and job.current.instance_id == record.instance_id
        # What a real instance would have: the basics a runner needs.
        runner = environment_of(record.runner_pid)
        assert runner["PATH"] == os.environ["PATH"] and runner["AWS_EC2_METADATA_SERVICE_ENDPOINT"] == record.metadata


async def test_a_report_signed_with_another_jobs_key_changes_nothing_and_the_job_finishes(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS), quick_recipe("finishes", FINISHES)]
    )
    async with running_bot(tmp_path / "state", config) as (service, _chat):
        job_a = await start_job(service, "console:ana", "start sleepy")
        job_b = await start_job(service, "console:bea", "start finishes")
        a = await wait_job(service, job_a, lambda j: j.state is JobState.RUNNING and bool(j.instance_ids))
        b = await wait_job(service, job_b, lambda j: j.state is JobState.RUNNING and bool(j.instance_ids))
        assert a.current is not None and b.current is not None
        a_key = derive_report_key(SECRET, job_a, 1, await attempt_salt(service, job_a, 1))  # what A's machine holds
        b_key = derive_report_key(SECRET, job_b, 1, await attempt_salt(service, job_b, 1))

        async def post(body: bytes, key: str) -> int:
            return await post_report(service, body, key)

        # From job A's machine: "job B completed" (the bot would release B's instance) with A's key: refused.
        forged = dump_report(Completed(job_id=job_b, attempt=1, step=1, output_uri="s3://elsewhere/out/")).encode()
        assert await post(forged, a_key) == 401
        # From job B's own machine, a started naming A's instance: not believed, nothing points B at it.
        claim = dump_report(Started(job_id=job_b, attempt=1, instance_id=a.current.instance_id)).encode()
        assert await post(claim, b_key) == 202

        done = await wait_job(service, job_b, lambda j: j.state is JobState.SUCCEEDED, timeout=180)
        assert done.output_uri != "s3://elsewhere/out/" and done.step == 30
        assert done.instance_ids == [b.current.instance_id]
        history = await service.bot.store.history(job_b)
        assert [entry.get("output_uri") for entry in history if entry.get("event") == "completed"] == [
            done.output_uri
        ]
        # B's instance is released; A's, named in the false claim, runs on.
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)

        async def instance_state(instance_id: str) -> str | None:
            record = await cloud.registry.get(instance_id)
            return record.state if record is not None else None

        for _ in range(600):
            if await instance_state(b.current.instance_id) == "gone":
                break
            await asyncio.sleep(0.1)
        assert await instance_state(b.current.instance_id) == "gone"
        assert await instance_state(a.current.instance_id) == "running"
        still = await service.bot.store.get(job_a)
        assert still is not None and still.state is JobState.RUNNING and still.instance_ids == a.instance_ids
        metrics_url = f"http://127.0.0.1:{service.port}/metrics"
        async with aiohttp.ClientSession() as http, http.get(metrics_url) as response:
            assert "finetune_reports_refused_total 1.0" in await response.text()


async def ignored_entries(service: BotService, job_id: str, why: str) -> list[dict[str, object]]:
    return [e for e in await service.bot.store.history(job_id) if e.get("event") == "ignored" and why in str(e["why"])]


def ignored(service: BotService, job_id: str, why: str) -> Callable[[], Awaitable[bool]]:
    """For :func:`eventually`: the job's history says a report was ignored for ``why``."""

    async def check() -> bool:
        return bool(await ignored_entries(service, job_id, why))

    return check


def unchanged(before: Job, after: Job | None) -> bool:
    """The job as it was: its state, its attempts and instances, its output (its history may say more, and the
    record's version counts the write of that history)."""
    same = {"updated_at", "version"}
    return after is not None and after.model_dump(exclude=same) == before.model_dump(exclude=same)


async def instances_running(service: BotService, job: Job) -> list[str]:
    cloud = service.bot.cloud
    assert isinstance(cloud, LocalCloud)
    records = [await cloud.registry.get(instance_id) for instance_id in job.instance_ids]
    return [record.instance_id for record in records if record is not None and record.state == "running"]


async def test_a_completion_signed_with_an_ended_attempts_key_after_its_grace_changes_nothing(tmp_path: Path) -> None:
    """The attack of the issue: a key read off an ended attempt (its user data) marks the live job done later."""
    clock = SteppedClock()
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)], policy=NO_RELAUNCH_PAUSE)
    async with running_bot(tmp_path / "state", config, clock=clock) as (service, chat):
        job_id = await start_job(service, "console:ana", "start sleepy")
        await wait_job(service, job_id, lambda j: j.state is JobState.RUNNING and bool(j.instance_ids))
        old_key = derive_report_key(SECRET, job_id, 1, await attempt_salt(service, job_id, 1))  # attempt 1's runner
        assert (await service.bot.command("console:ana", CHANNEL, f"interrupt-test {job_id}")).startswith("OK")
        live = await wait_job(
            service, job_id, lambda j: j.state is JobState.RUNNING and j.attempt == 2 and len(j.instance_ids) == 2
        )
        ended = live.attempt_numbered(1)
        assert ended is not None and ended.ended_at is not None
        assert await instances_running(service, live) == [live.instance_ids[1]]
        new_key = derive_report_key(SECRET, job_id, 2, await attempt_salt(service, job_id, 2))
        assert new_key != old_key
        prefix = service.bot.cloud.checkpoint_uri(job_id)
        said_before = len(chat.transcript)

        clock.advance(ENDED_ATTEMPT_GRACE.total_seconds() / 60 + 1)  # the grace is over
        forged = Completed(job_id=job_id, attempt=1, step=1, output_uri=prefix + "output/")
        assert await post_report(service, dump_report(forged).encode(), old_key) == 202  # its key: the gate admits it
        await eventually(ignored(service, job_id, "past the grace"))
        after = await service.bot.store.get(job_id)
        assert unchanged(live, after)  # not SUCCEEDED, no output, attempt 2 not ended
        assert await instances_running(service, live) == [live.instance_ids[1]]  # attempt 2's instance is not released
        # A later report of the live attempt is applied after it (one lane per job): the forged one posted nothing.
        checkpoint = CheckpointSaved(job_id=job_id, attempt=2, step=7, uri=prefix + "checkpoint-7/", bytes=1, seconds=1)
        assert await post_report(service, dump_report(checkpoint).encode(), new_key) == 202
        await wait_job(service, job_id, lambda j: j.checkpoint is not None and j.checkpoint.step == 7)
        said = "\n".join(text for _, _, text in chat.transcript[said_before:])
        assert "output" not in said.lower() and "succeeded" not in said.lower()
        [entry] = await ignored_entries(service, job_id, "past the grace")
        assert entry["what"] == "report:completed" and entry["attempt"] == 1


async def test_a_report_naming_storage_outside_its_jobs_prefix_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    async with running_bot(tmp_path / "state", config) as (service, _chat):
        job_a = await start_job(service, "console:ana", "start sleepy")
        job_b = await start_job(service, "console:bea", "start sleepy")
        a = await wait_job(service, job_a, lambda j: j.state is JobState.RUNNING and bool(j.instance_ids))
        await wait_job(service, job_b, lambda j: j.state is JobState.RUNNING and bool(j.instance_ids))
        key = derive_report_key(SECRET, job_a, 1, await attempt_salt(service, job_a, 1))  # A's own, live attempt
        cloud = service.bot.cloud
        prefix_a, prefix_b = cloud.checkpoint_uri(job_a), cloud.checkpoint_uri(job_b)
        assert prefix_a.startswith("file:///") and prefix_a.endswith(f"/{job_a}/")
        refused = [
            Completed(job_id=job_a, attempt=1, step=1, output_uri="https://attacker.example/leak"),
            Completed(job_id=job_a, attempt=1, step=1, output_uri=prefix_b + "output/"),  # another job's output
            Completed(job_id=job_a, attempt=1, step=1, output_uri=prefix_a + "../" + job_b + "/output/"),
            CheckpointSaved(job_id=job_a, attempt=1, step=9, uri="file:///etc/", bytes=1, seconds=1.0),
        ]
        for report in refused:
            assert await post_report(service, dump_report(report).encode(), key) == 400, report
        assert await refused_reports(service) == f"finetune_reports_refused_total {len(refused)}.0"
        # Refused at the gate: nothing reached the job's lane, so nothing can follow.
        assert not [e for e in await service.bot.store.history(job_a) if e.get("event") in ("completed", "checkpoint")]
        assert unchanged(a, await service.bot.store.get(job_a))
        assert await instances_running(service, a) == a.instance_ids
        # The same key with its own prefix is believed (the refusal above was the prefix's, not the key's).
        own = CheckpointSaved(job_id=job_a, attempt=1, step=9, uri=prefix_a + "checkpoint-9/", bytes=1, seconds=1.0)
        assert await post_report(service, dump_report(own).encode(), key) == 202
        await wait_job(service, job_a, lambda j: j.checkpoint is not None and j.checkpoint.uri == own.uri)


async def test_a_gang_nodes_key_cannot_claim_rank_0_and_complete_the_gang(tmp_path: Path) -> None:
    gang_recipe = {**quick_recipe("sleepy", SLEEPS), "max_nodes": 2}  # a member may ask for two nodes of it
    config = write_config(tmp_path / "bot.yaml", recipes=[gang_recipe])
    async with running_bot(tmp_path / "state", config) as (service, chat):
        job_id = await start_job(service, "console:ana", "start sleepy nodes=2")
        gang = await wait_job(service, job_id, lambda j: j.state is JobState.RUNNING and len(j.instance_ids) == 2, 300)
        node1 = gang.gang_attempts[1]
        key = derive_report_key(SECRET, job_id, node1.number, await attempt_salt(service, job_id, node1.number))
        prefix = service.bot.cloud.checkpoint_uri(job_id)
        said_before = len(chat.transcript)
        forged = Completed(job_id=job_id, attempt=node1.number, node_rank=0, step=1, output_uri=prefix + "output/")
        assert await post_report(service, dump_report(forged).encode(), key) == 202  # node 1's own key
        await eventually(ignored(service, job_id, "is node 1, not node 0"))
        assert unchanged(gang, await service.bot.store.get(job_id))  # RUNNING, no output, no node ended
        assert sorted(await instances_running(service, gang)) == sorted(gang.instance_ids)
        # Node 0's own word still counts after it, in the job's lane: the forged one told the thread nothing.
        node0 = gang.gang_attempts[0]
        key0 = derive_report_key(SECRET, job_id, node0.number, await attempt_salt(service, job_id, node0.number))
        checkpoint = CheckpointSaved(
            job_id=job_id, attempt=node0.number, node_rank=0, step=4, uri=prefix + "checkpoint-4/", bytes=1, seconds=1
        )
        assert await post_report(service, dump_report(checkpoint).encode(), key0) == 202
        await wait_job(service, job_id, lambda j: j.checkpoint is not None and j.checkpoint.step == 4)
        said = "\n".join(text for _, _, text in chat.transcript[said_before:])
        assert "output" not in said.lower() and "succeeded" not in said.lower()
