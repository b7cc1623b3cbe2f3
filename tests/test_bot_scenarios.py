"""The bot end to end: real embedded Valkey, real HTTP, local cloud with real runner subprocesses."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest

from fakes.bot_harness import (
    CHANNEL,
    FAILS_ON_RESUME,
    SECRET,
    SLEEPS,
    attempt_salt,
    drained,
    eventually,
    quick_recipe,
    report_headers,
    running_bot,
    start_job,
    wait_job,
    write_config,
)
from handlers.jobs import JobState
from handlers.messages import ReportReceived, dump_message
from handlers.reports import Progress
from handlers.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from tests.demo_checkout import Demo


@pytest.mark.scenario
def test_the_demo_story_end_to_end(make_demo: Demo) -> None:
    """``make demo`` (the run the quickstarts begin with: tests/demo_checkout.py) tells the whole story: the
    interruption alerted, the checkpoint committed, the relaunch resumed with no step lost, the job finished."""
    assert make_demo.status == 0, make_demo.failure()
    checklist = [line.strip() for line in make_demo.said().splitlines() if line.strip()[:1] in ("✔", "✘")]
    assert len(checklist) == 4 and all(line.startswith("✔") for line in checklist), checklist
    assert checklist[-1] == "✔ finished" and "0 steps lost" in checklist[2]


async def test_runner_reports_must_be_signed_and_duplicates_change_nothing(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    async with running_bot(tmp_path / "state", config) as (service, _chat):
        job_id = await start_job(service, "console:ana", "start sleepy")
        running = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
        url = f"http://127.0.0.1:{service.port}/runner/reports"
        body = Progress(job_id=job_id, attempt=1, step=99, total_steps=100).model_dump_json().encode()
        now = int(time.time())
        salt = await attempt_salt(service, job_id, 1)
        forged = [
            {},
            {TIMESTAMP_HEADER: str(now), SIGNATURE_HEADER: sign("wrong-secret", now, body)},
            {TIMESTAMP_HEADER: str(now), SIGNATURE_HEADER: sign(SECRET, now, body)},  # the master is no runner's key
            report_headers(body, now - 600, salt=salt),
            {**report_headers(body + b" ", now, salt=salt)},
            report_headers(body, now, salt="0" * 32),  # its job and number, but not its attempt's salt
        ]
        async with aiohttp.ClientSession() as http:
            for headers in forged:
                async with http.post(url, data=body, headers=headers) as response:
                    assert response.status == 401
            malformed = b'{"type": "progress", "job_id": "%s", "attempt": 1}' % job_id.encode()
            async with http.post(url, data=malformed, headers=report_headers(malformed, now, salt=salt)) as response:
                assert response.status == 400
            await eventually(lambda: drained(service.bus))  # whatever reached the bus was handled
            unchanged = await service.bot.store.get(job_id)
            assert unchanged is not None and unchanged.version == running.version and unchanged.step is None

            for _ in range(3):  # the runner retrying one report: accepted each time, applied once
                async with http.post(url, data=body, headers=report_headers(body, now, salt=salt)) as response:
                    assert response.status == 202
        moved = await wait_job(service, job_id, lambda job: job.step == 99)
        await eventually(lambda: drained(service.bus))  # all three handled: none is still to be applied
        final = await service.bot.store.get(job_id)
        assert final is not None and final.version == moved.version == running.version + 1
        progress = [entry for entry in await service.bot.store.history(job_id) if entry.get("event") == "progress"]
        assert len(progress) == 1


async def test_unauthorised_commands_are_refused_and_recorded(tmp_path: Path) -> None:
    policy = {"allow": {"start": ["console:alice"], "stop": ["console:alice"], "interrupt-test": ["console:alice"]}}
    config = write_config(tmp_path / "bot.yaml", policy=policy, recipes=[quick_recipe("sleepy", SLEEPS)])
    async with running_bot(tmp_path / "state", config) as (service, _chat):
        refused = await service.bot.command("console:bob", CHANNEL, "start sleepy")
        assert refused.startswith("⛔") and "not allowed to start" in refused
        assert await service.bot.store.list_jobs() == []
        refused = (await service.bot.store.refusal_log())[-1]
        assert {"event": "refused", "action": "start", "by": "console:bob"}.items() <= refused.items()
        assert await service.bot.store.audit_log() == []

        job_id = await start_job(service, "console:alice", "start sleepy")
        before = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
        for text in (f"stop {job_id}", f"interrupt-test {job_id}"):
            reply = await service.bot.command("console:bob", CHANNEL, text)
            assert reply.startswith("⛔")
        after = await service.bot.store.get(job_id)
        assert after is not None and after.state is JobState.RUNNING
        refusals = [e for e in await service.bot.store.refusal_log() if e.get("job") == job_id]
        assert [(e["action"], e["by"]) for e in refusals] == [
            ("stop", "console:bob"),
            ("interrupt-test", "console:bob"),
        ]
        status = await service.bot.command("console:bob", CHANNEL, f"status {job_id}")
        assert job_id in status and "RUNNING" in status and before.id == job_id
        unknown = await service.bot.command("console:alice", CHANNEL, "start llama-70b")
        assert "unknown recipe 'llama-70b'" in unknown and "tiny" in unknown
        out_of_range = await service.bot.command("console:alice", CHANNEL, "start tiny lr=9")
        assert "above the maximum" in out_of_range
        assert len(await service.bot.store.list_jobs()) == 1


async def test_a_failed_resume_pages_on_call_who_acks_and_resumes_on_demand(tmp_path: Path) -> None:
    # The one on call is on the rota (as console:oncall): the page makes ack and resume theirs, not the job.
    oncall = {"people": {"olga": {"console": "oncall"}}, "rota": [["olga"]]}
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("flaky", FAILS_ON_RESUME)], oncall=oncall)
    async with running_bot(tmp_path / "state", config) as (service, chat):
        job_id = await start_job(service, "console:ana", "start flaky")
        # Interrupt-tested once it trains (a step reported): its SIGTERM handler is set, so it saves checkpoint-<step>.
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 1)
        assert (await service.bot.command("console:ana", CHANNEL, f"interrupt-test {job_id}")).startswith("OK")
        failed = await wait_job(service, job_id, lambda job: job.state is JobState.RESUME_FAILED)
        assert failed.attempt == 2 and "gave up after 2 restart(s)" in str(failed.failure)
        await wait_for_text(chat, "page", "could not resume")

        acked = await service.bot.command("console:oncall", CHANNEL, f"ack {job_id}")
        assert acked.startswith("OK")
        job = await service.bot.store.get(job_id)
        assert job is not None and job.acked_by == "console:oncall"
        await wait_for_text(chat, "thread", "console:oncall acknowledged")

        resumed = await service.bot.command("console:oncall", CHANNEL, f"resume {job_id} on-demand")
        assert resumed.startswith("OK")
        again = await wait_job(service, job_id, lambda job: job.state is JobState.RESUME_FAILED and job.attempt == 3)
        assert again.attempts[2].market == "on-demand" and again.acked_by is None
        refused = await service.bot.command("console:oncall", CHANNEL, f"stop {job_id}")
        assert refused == f"⛔ {job_id} is not yours to stop: only its owner, its team and the admins may"
        assert await service.bot.command("console:mallory", CHANNEL, f"ack {job_id}") == (
            f"⛔ {job_id} is not yours to ack: only its owner, its team, the admins and the on-call it paged may"
        )
        stopped = await service.bot.command("console:ana", CHANNEL, f"stop {job_id}")
        assert stopped.startswith("OK")
        final = await service.bot.store.get(job_id)
        assert final is not None and final.state is JobState.STOPPED


async def test_jobs_survive_a_restart_of_the_bot_and_its_embedded_redis(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    async with running_bot(tmp_path / "state", config) as (service, _chat):
        job_id = await start_job(service, "console:ana", "start sleepy")
        before = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
        history = await service.bot.store.history(job_id)
    async with running_bot(tmp_path / "state", config) as (service, _chat):
        after = await service.bot.store.get(job_id)
        assert after is not None and after.version >= before.version and after.attempts[0].instance_id
        assert (await service.bot.store.history(job_id))[: len(history)] == history
        assert job_id in await service.bot.command("console:ana", CHANNEL, "list")


async def test_two_replicas_share_the_bus_and_handle_each_event_once(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    async with running_bot(tmp_path / "a", config) as (first, _):
        job_id = await start_job(first, "console:ana", "start sleepy")
        await wait_job(first, job_id, lambda job: job.state is JobState.RUNNING)
        async with running_bot(tmp_path / "b", config, redis_url=first.redis_url) as (second, _):
            reports = [ReportReceived(report=Progress(job_id=job_id, attempt=1, step=step)) for step in range(1, 41)]
            for message in [*reports, *reports[::4]]:  # ten redeliveries on top
                await first.bus.publish(dump_message(message))
            await wait_job(first, job_id, lambda job: job.step == 40)
            await eventually(lambda: drained(first.bus))  # one group: every copy handled by one replica or the other
            progress = [e for e in await first.bot.store.history(job_id) if e.get("event") == "progress"]
            assert len(progress) == 40
            # Both replicas took work (counted once the acknowledging task resumes after the server's reply).

            async def both_took_work() -> bool:
                return first.bus.handled > 0 and second.bus.handled > 0

            await eventually(both_took_work)

            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{second.port}/metrics") as response:
                    text = await response.text()
                async with http.get(f"http://127.0.0.1:{first.port}/healthz") as response:
                    assert response.status == 200 and json.loads(await response.text()) == {"status": "ok"}
            assert 'finetune_jobs{state="RUNNING"} 1' in text
            assert "finetune_handler_latency_seconds_count" in text and "finetune_events_handled_total" in text


async def wait_for_text(chat: object, channel: str, words: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    transcript = chat.transcript  # type: ignore[attr-defined]
    while time.monotonic() < deadline:
        if any(said == channel and words in text for _, said, text in transcript):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {channel} message with {words!r}: {transcript[-5:]}")


RAISE_PRICE = "an admin can raise policy.max_hourly_price"


async def test_guards_cap_concurrency_and_price(tmp_path: Path) -> None:
    cheap = write_config(tmp_path / "cheap.yaml", policy={"max_hourly_price": 0.10})
    async with running_bot(tmp_path / "a", cheap) as (service, _chat):
        refused = await service.bot.command("console:ana", CHANNEL, "start tiny")
        assert refused == f"⛔ $0.30/h for 1 node(s) is above the cap of $0.10/h; {RAISE_PRICE}"
        assert await service.bot.store.list_jobs() == []
    # The cap is on what the job pays an hour: a gang's every node (two of $0.30 are over $0.50).
    gang_cap = write_config(tmp_path / "gang.yaml", policy={"max_hourly_price": 0.50})
    async with running_bot(tmp_path / "g", gang_cap) as (service, _chat):
        refused = await service.bot.command("console:ana", CHANNEL, "start tiny nodes=2")
        assert refused == f"⛔ $0.60/h for 2 node(s) is above the cap of $0.50/h; {RAISE_PRICE}"
        assert await service.bot.store.list_jobs() == []
    one = write_config(
        tmp_path / "one.yaml", policy={"max_concurrent_nodes": 1}, recipes=[quick_recipe("sleepy", SLEEPS)]
    )
    async with running_bot(tmp_path / "b", one) as (service, _chat):
        await start_job(service, "console:ana", "start sleepy")
        second = await service.bot.command("console:ana", CHANNEL, "start sleepy")
        assert second.startswith("⛔ you run 1 of the 1 concurrent nodes of a person on no team, so 1 more do not fit")
        assert len(await service.bot.store.list_jobs()) == 1
