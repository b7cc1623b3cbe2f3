"""Per-attempt report keys through the real bot and the real local cloud: a runner holds its own attempt's key and
nothing of the bot's, and no runner can speak for another job."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import aiohttp
import pytest

from bot.cloud.local import LocalCloud
from fakes.bot_harness import SECRET, SLEEPS, quick_recipe, running_bot, start_job, wait_job, write_config
from handlers.jobs import JobState
from handlers.report_keys import derive_report_key
from handlers.reports import Completed, Started, dump_report
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

        own_key = derive_report_key(SECRET, job_id, 1)
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
        a_key = derive_report_key(SECRET, job_a, 1)  # what job A's machine holds
        b_key = derive_report_key(SECRET, job_b, 1)

        async def post(body: bytes, key: str) -> int:
            now = int(time.time())
            headers = {TIMESTAMP_HEADER: str(now), SIGNATURE_HEADER: sign(key, now, body)}
            url = f"http://127.0.0.1:{service.port}/runner/reports"
            async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as response:
                return response.status

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
