"""The escalation ladder in the running bot, on a clock the test moves: each step once, none after the ack,
across a restart of the bot and across two replicas sharing one Redis."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bot.chat.catalog import plain
from bot.chat.console import ConsoleChat
from bot.service import BotService
from bot.timers import Timers
from fakes.bot_harness import (
    CHANNEL,
    FAILS_ON_RESUME,
    SteppedClock,
    eventually,
    quick_recipe,
    running_bot,
    settled,
    start_job,
    wait_job,
    write_config,
)
from handlers.jobs import JobState
from handlers.messages import PageStep

ONCALL = {
    "people": {"ana": {"slack": "U0ANA"}, "bo": {"slack": "U0BO", "console": "bo"}},  # bo acks in the console
    "rota": [["ana", "bo"]],
    "ladder": [
        {"after_minutes": 0, "notify": ["primary"]},
        {"after_minutes": 5, "notify": ["primary", "secondary"]},
        {"after_minutes": 15, "notify": ["channel"]},
    ],
    "repeat_every_minutes": 15,
    "max_repeats": 1,
}


def pages(*chats: ConsoleChat) -> list[str]:
    return [text for chat in chats for _, channel, text in chat.transcript if channel == "page"]


async def wait_for(what: str, check: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def page_entries(service: BotService, job_id: str) -> list[dict[str, Any]]:
    return [entry for entry in await service.bot.store.history(job_id) if entry.get("event") == "page"]


async def fail_a_resume(service: BotService) -> str:
    """Start a job whose trainer cannot resume, interrupt-test it: the resume fails and the page opens."""
    job_id = await start_job(service, "console:ana", "start flaky")
    # Interrupt-tested once it trains (a step reported): its SIGTERM handler is in place, so it saves checkpoint-<step>.
    await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 1)
    assert (await service.bot.command("console:ana", CHANNEL, f"interrupt-test {job_id}")).startswith("OK")
    await wait_job(service, job_id, lambda job: job.state is JobState.RESUME_FAILED)
    return job_id


async def test_the_ladder_sends_each_step_once_survives_a_restart_and_stops_at_the_ack(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("flaky", FAILS_ON_RESUME)], oncall=ONCALL)
    clock = SteppedClock()
    async with running_bot(tmp_path / "state", config, clock=clock) as (service, chat):
        job_id = await fail_a_resume(service)
        await wait_for("step 0", lambda: _shown(1, chat))
        assert pages(chat)[0].startswith("[PAGE] @ana 🚨 On-call:")

        clock.advance(5)
        await wait_for("step 1", lambda: _shown(2, chat))
        assert pages(chat)[1].startswith("[PAGE] @ana @bo 🚨 On-call (escalation 2 of 4")
        first_pages = pages(chat)
    assert len(first_pages) == 2

    clock.advance(10)  # step 2 falls due while the bot is down
    async with running_bot(tmp_path / "state", config, clock=clock) as (service, chat):
        await wait_for("step 2 after the restart", lambda: _shown(1, chat))
        assert await _count(service, job_id, 3) and len(pages(chat)) == 1
        assert pages(chat)[0].startswith("[PAGE] @channel 🚨 On-call (escalation 3")

        reply = await service.bot.command("console:bo", CHANNEL, f"ack {job_id}")
        assert reply.startswith("OK: ack")
        job = await service.bot.store.get(job_id)
        assert job is not None and job.page is not None and job.page.acked_by == "console:bo"
        assert (await service.bot.command("console:ana", CHANNEL, f"ack {job_id}")).startswith("⛔ ack")

        clock.advance(15)  # the repeat falls due, finds the ack and is dropped

        async def dropped() -> bool:
            history = await service.bot.store.history(job_id)
            return any(e.get("what") == "page-step" and "acknowledged" in str(e.get("why")) for e in history)

        await wait_for("the repeat to be dropped", dropped)
        assert len(pages(chat)) == 1 and len(await page_entries(service, job_id)) == 3
        acks = [entry for entry in await service.bot.store.history(job_id) if entry.get("event") == "ack"]
        assert [(entry["by"], entry["after_steps"]) for entry in acks] == [("console:bo", 3)]
        status = plain(await service.bot.command("console:ana", CHANNEL, f"status {job_id}"))
        assert "acknowledged by console:bo" in status


async def test_two_replicas_send_each_step_exactly_once(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("flaky", FAILS_ON_RESUME)], oncall=ONCALL)
    clock = SteppedClock()
    async with running_bot(tmp_path / "a", config, clock=clock) as (first, chat_a):
        job_id = await fail_a_resume(first)
        await wait_for("step 0", lambda: _shown(1, chat_a))
        async with running_bot(tmp_path / "b", config, redis_url=first.redis_url, clock=clock) as (second, chat_b):
            for minutes, sent in ((5, 2), (10, 3), (15, 4)):
                clock.advance(minutes)
                await wait_for(f"step {sent - 1}", lambda sent=sent: _shown(sent, chat_a, chat_b))
            clock.advance(60)  # the ladder is out of steps: nothing more is scheduled or sent
            rounds = first.timers.rounds, second.timers.rounds
            await eventually(lambda: timers_looked(first, second, rounds))  # both looked, with the clock moved
            await eventually(lambda: settled(first))  # and whatever they fired was handled and posted
            steps = [entry["step"] for entry in await page_entries(first, job_id)]
            assert steps == [0, 1, 2, 3]
            assert len(pages(chat_a, chat_b)) == 4
            assert sorted(text.split(" 🚨")[0] for text in pages(chat_a, chat_b)) == sorted(
                ["[PAGE] @ana", "[PAGE] @ana @bo", "[PAGE] @channel", "[PAGE] @channel"]
            )
            pending = await Timers(second.bot.store.redis).pending()
            assert not [timer for timer in pending if isinstance(timer, PageStep)]


async def timers_looked(first: BotService, second: BotService, before: tuple[int, int]) -> bool:
    """Both replicas' timer loops finished two full rounds since ``before``: one began after the clock moved."""
    return first.timers.rounds >= before[0] + 2 and second.timers.rounds >= before[1] + 2


async def _shown(count: int, *chats: ConsoleChat) -> bool:
    return len(pages(*chats)) >= count


async def _count(service: BotService, job_id: str, sent: int) -> bool:
    job = await service.bot.store.get(job_id)
    return job is not None and job.page is not None and job.page.sent >= sent
