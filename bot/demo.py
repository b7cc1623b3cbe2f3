"""``finetune-bot demo``: the whole story on this machine, through the real bot.

The bot runs with its embedded Redis, the local cloud (each instance a process of its own that serves an IMDSv2
endpoint and supervises a runner) and the console chat. The demo types ``/finetune start tiny``, waits for
training, types ``/finetune interrupt-test <job>`` (a spot interruption notice on the instance's metadata
service, then a reclaim after the grace period), and watches the bot alert, the runner commit its checkpoint,
the relaunch, the resume and the finish. It exits 0 only if all of that happened with no step lost.

Under a profile of a real cloud (``FINETUNE_LOCAL_PROFILE=aws-p5``, with ``FINETUNE_LOCAL_TIME_SCALE=0.05`` to see a
four-minute boot in twelve seconds), the demo runs a two-node gang instead and interrupts node 1: the thread says
whether the spot authority replaces that node alone or restarts the whole gang and why, and the summary gives the
recovery's span on the profile's clock (bot/cloud/local/profile_clock.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any

from bot.chat.catalog import plain
from bot.chat.console import ConsoleChat
from bot.chat.render import card_text
from bot.cloud.local.provider import LocalCloud
from bot.service import BotService
from bot.settings import Settings
from handlers.clock import utcnow
from handlers.job_cost import job_cost
from handlers.jobs import TERMINAL_STATES, ChatRef, Job, JobState

USER = "console:demo"
CHANNEL = ChatRef(platform="console", channel="demo")
INTERRUPT_AT_STEP = 10
STEPS = 30


def say(text: str) -> None:
    print(text, flush=True)


async def wait_for(service: BotService, job_id: str, done: Callable[[Job], bool], timeout: float) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        job = await service.bot.store.get(job_id)
        if job is not None and done(job):
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job_id} is {job.state if job else 'missing'} after {timeout:.0f}s")
        await asyncio.sleep(0.1)


async def wait_said(chat: ConsoleChat, job_id: str, what: str, timeout: float) -> None:
    """Let the bot's last messages for the job go out before the summary (they follow the state change)."""
    deadline = time.monotonic() + timeout
    channel = "thread" if what == "finished" else "page"
    while time.monotonic() < deadline:
        if any(job == job_id and said == channel and what in text for job, said, text in chat.transcript):
            return
        await asyncio.sleep(0.1)


async def run_demo(state_dir: Path) -> int:
    settings = Settings(finetune_state_dir=state_dir, finetune_http_port=0, finetune_local_grace_seconds=30)
    chat = ConsoleChat(write=lambda text: say("  " + text.replace("\n", "\n  ")))
    async with BotService(settings, chat) as service:
        cloud = service.bot.cloud
        if isinstance(cloud, LocalCloud) and cloud.trainer_note:
            say(f"({cloud.trainer_note})")  # run as root from a folder other users cannot reach
        profiled = isinstance(cloud, LocalCloud) and not cloud.profile.instant
        gang = " nodes=2" if profiled else ""  # a real cloud's trade-off: replace one node, or restart the gang
        patience = _boot_wall_seconds(cloud)
        say(f"> /finetune start tiny steps={STEPS}{gang}")
        say(await service.bot.command(USER, CHANNEL, f"start tiny steps={STEPS}{gang}"))
        [job] = await service.bot.store.list_jobs()
        await wait_for(
            service,
            job.id,
            lambda j: j.state is JobState.RUNNING and (j.step or 0) >= INTERRUPT_AT_STEP,
            timeout=120 + patience,
        )
        node = " node=1" if profiled else ""
        say(f"> /finetune interrupt-test {job.id}{node}")
        asked = cloud.clock.now() if isinstance(cloud, LocalCloud) else 0.0
        say(await service.bot.command(USER, CHANNEL, f"interrupt-test {job.id}{node}"))
        if profiled and isinstance(cloud, LocalCloud):
            saved = (await wait_for(service, job.id, lambda j: j.generation > 1, timeout=180)).step or 0
            await wait_for(
                service, job.id, lambda j: j.state is JobState.RUNNING and (j.step or 0) > saved, 180 + patience
            )
            span = cloud.clock.now() - asked
            say(f"(training again {span:.0f} s after the notice, on the {cloud.profile.name} profile's clock)")
        final = await wait_for(
            service, job.id, lambda j: j.state in TERMINAL_STATES | {JobState.RESUME_FAILED}, timeout=180 + patience
        )
        await wait_said(chat, job.id, "finished" if final.state is JobState.SUCCEEDED else "resume", timeout=30)
        say(f"> /finetune status {job.id}")
        say(plain(card_text(final, utcnow())))
        return summarize(final, chat, utcnow())


def _boot_wall_seconds(cloud: object) -> float:
    """How long the profile holds a gang's boots on the wall clock (the demo's waits add it)."""
    if not isinstance(cloud, LocalCloud):
        return 0.0
    profile = cloud.profile
    return 4 * (profile.launch_seconds + profile.launch_spread_seconds + profile.fetch_seconds()) * profile.time_scale


def summarize(job: Job, chat: ConsoleChat, now: datetime) -> int:
    alerts = [text for _, channel, text in chat.transcript if channel == "alert"]
    resumed = job.attempts[-1].resumed_from_step if len(job.attempts) > 1 else None
    cost = job_cost(job, now)
    checks = {
        "interruption alert posted": len(alerts) == 1,
        "checkpoint committed before the deadline": job.checkpoint is not None and job.interruptions == 1,
        f"relaunched and resumed at step {resumed}, {job.steps_lost} steps lost": len(job.attempts) > job.nodes
        and resumed is not None
        and job.steps_lost == 0,
        "finished": job.state is JobState.SUCCEEDED and job.step == STEPS,
    }
    saving = f"{cost.savings:.0%}" if cost.savings is not None else "n/a"
    say("")
    say(
        f"summary: {len(job.attempts)} attempts, {job.interruptions} interruption, downtime "
        f"{job.downtime_seconds:.1f}s, {job.steps_lost} steps lost, cost ${cost.paid:.4f} "
        f"(on-demand ${cost.on_demand:.4f}, saving {saving})"
    )
    for what, ok in checks.items():
        say(f"  {'✔' if ok else '✘'} {what}")
    return 0 if all(checks.values()) else 1


def main() -> int:
    logging.basicConfig(
        level=os.environ.get("FINETUNE_LOG_LEVEL", "ERROR"), format="%(levelname)s %(name)s: %(message)s"
    )
    root = Path(os.environ.get("FINETUNE_STATE_DIR") or ".finetune-state").resolve()
    state_dir = root / "demo" / datetime.now().strftime("%Y%m%d-%H%M%S")
    say(f"finetune-bot demo (state in {state_dir})")
    return asyncio.run(until_signalled(run_demo(state_dir)))


async def until_signalled(demo: Coroutine[Any, Any, int]) -> int:
    """The demo's status, or 128 + the signal's number when SIGTERM or SIGINT ended it first: the bot then stops
    as at the end of the demo (its loops, then its Valkey, which a signal to the whole process group no longer
    reaches: bot.redis_server), instead of dying with the server left running on a state dir nobody uses again."""
    task = asyncio.create_task(demo)
    received: list[int] = []

    def stop(signum: int) -> None:
        received.append(signum)
        task.cancel()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)
    try:
        return await task
    except asyncio.CancelledError:
        if not received:
            raise
        say(f"demo stopped by {signal.Signals(received[0]).name}")
        return 128 + received[0]
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
