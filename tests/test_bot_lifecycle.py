"""Lifecycle safety through the real bot (embedded Valkey, local cloud, real runner subprocesses): no relaunch
loop for a trainer that cannot start, stops that end, and a stopped job that resumes from its kept checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

from bot.cloud.local.provider import LocalCloud
from bot.timers import Timers
from fakes.bot_harness import CHANNEL, SLEEPS, quick_recipe, running_bot, start_job, wait_job, write_config
from handlers.jobs import TERMINAL_STATES, JobState
from handlers.messages import RelaunchDue
from tests.test_bot_scenarios import wait_for_text

# Trains one step every 50 ms until SIGTERM, then saves checkpoint-<step> and exits; resumed, it trains three
# more steps from the checkpoint's step and finishes.
STOPS_AND_RESUMES = """
import json, os, pathlib, signal, sys, time
out = pathlib.Path(os.environ['FINETUNE_OUTPUT_DIR'])
progress = pathlib.Path(os.environ['FINETUNE_PROGRESS_FILE'])
resume = os.environ.get('FINETUNE_RESUME_FROM')
step = int(pathlib.Path(resume).name.split('-')[1]) if resume else 0
last = step + 3 if resume else None
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
while not stop and (last is None or step < last):
    step += 1
    with progress.open('a') as f:
        f.write(json.dumps({'step': step}) + '\\n')
    time.sleep(0.05)
ckpt = out / ('checkpoint-%d' % step)
ckpt.mkdir(parents=True, exist_ok=True)
(ckpt / 'state.json').write_text(json.dumps({'step': step}))
(ckpt / '.finetune-complete').touch()
"""

QUICK = {"max_relaunches_without_progress": 2, "relaunch_pause_seconds": 0.2, "relaunch_pause_max_seconds": 0.3}


async def test_a_trainer_that_cannot_start_ends_the_job_after_the_configured_launches(tmp_path: Path) -> None:
    missing = {"name": "missing", "description": "no such program", "model": "none", "command": ["ft-no-such-trainer"]}
    config = write_config(tmp_path / "bot.yaml", policy={"lifecycle": QUICK}, recipes=[missing])
    async with running_bot(tmp_path / "state", config) as (service, chat):
        job_id = await start_job(service, "console:ana", "start missing")
        ended = await wait_job(service, job_id, lambda job: job.state in TERMINAL_STATES | {JobState.RESUME_FAILED})
        assert ended.state in (JobState.FAILED, JobState.RESUME_FAILED), ended.state
        launched = [entry for entry in await service.bot.store.history(job_id) if entry.get("event") == "launched"]
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)
        assert 1 <= len(launched) <= 1 + QUICK["max_relaunches_without_progress"]
        instances = [record for record in await cloud.instances() if record.job_id == job_id]
        assert len(instances) == len(launched) == ended.attempt  # every launch the cloud saw, and no more
        # Nothing is left that could launch again: no held-back launch, no launch on the way.
        pending = await Timers(service.bot.store.redis).pending()
        assert not [timer for timer in pending if isinstance(timer, RelaunchDue) and timer.job_id == job_id]
        assert ended.failure
        if ended.state is JobState.RESUME_FAILED:
            assert "without progress" in str(ended.failure) or "went away" in str(ended.failure)
            await wait_for_text(chat, "page", "could not resume")


async def test_stop_of_a_job_whose_instance_is_gone_ends_stopped_at_once(tmp_path: Path) -> None:
    # Reconciliation off: it would find the instance gone at start (tests/test_bot_reconcile.py); here the stop
    # itself must find out.
    lifecycle = {"reconcile_seconds": 0}
    config = write_config(
        tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)], policy={"lifecycle": lifecycle}
    )
    async with running_bot(tmp_path / "state", config, keep_instances=True) as (service, _chat):
        job_id = await start_job(service, "console:ana", "start sleepy")
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)
        [record] = [record for record in await cloud.instances() if record.job_id == job_id]
    # The bot went away and its local instance with it, without a word (killed, no instance-gone event on the
    # bus, its record still "running"): the job is still RUNNING on record.
    os.kill(record.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.runner_pid, signal.SIGKILL)
    async with running_bot(tmp_path / "state", config) as (service, chat):
        stale = await service.bot.store.get(job_id)
        assert stale is not None and stale.state is JobState.RUNNING
        reply = await service.bot.command("console:ana", CHANNEL, f"stop {job_id}")
        assert reply.startswith("OK"), reply
        stopped = await wait_job(service, job_id, lambda job: job.state is JobState.STOPPED)
        assert stopped.current is not None and stopped.current.ended_at is not None
        # The cloud executor could not ask the gone instance's runner: its StopFailed ended the stop at once.
        assert "stop-failed" in [entry.get("event") for entry in await service.bot.store.history(job_id)]
        await wait_for_text(chat, "thread", f"{job_id} stopped")
        again = await service.bot.command("console:ana", CHANNEL, f"status {job_id}")
        assert "STOPPED" in again


async def test_stop_then_resume_finishes_from_the_kept_checkpoint(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("counter", STOPS_AND_RESUMES)])
    async with running_bot(tmp_path / "state", config) as (service, chat):
        job_id = await start_job(service, "console:ana", "start counter")
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 2)
        assert (await service.bot.command("console:ana", CHANNEL, f"stop {job_id}")).startswith("OK")
        stopped = await wait_job(service, job_id, lambda job: job.state is JobState.STOPPED)
        assert stopped.checkpoint is not None and stopped.checkpoint.step >= 2
        kept = stopped.checkpoint.step
        await wait_for_text(chat, "thread", f"checkpoint at step {kept} kept")

        reply = await service.bot.command("console:ana", CHANNEL, f"resume {job_id}")
        assert reply.startswith("OK"), reply
        done = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED)
        assert done.attempt == 2 and done.attempts[1].resumed_from_step == kept
        assert done.step == kept + 3 and done.steps_lost == 0


# Trains one step every 100 ms and saves a complete checkpoint-<step> after each; resumed, it stands at its
# checkpoint (no step after it) until SIGTERM, so what the card shows is what the restore said.
SAVES_EACH_STEP = """
import json, os, pathlib, signal, sys, time
out = pathlib.Path(os.environ['FINETUNE_OUTPUT_DIR'])
progress = pathlib.Path(os.environ['FINETUNE_PROGRESS_FILE'])
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
if os.environ.get('FINETUNE_RESUME_FROM'):
    while not stop:
        time.sleep(0.1)
    sys.exit(0)
step = 0
while not stop:
    step += 1
    ckpt = out / ('checkpoint-%d' % step)
    ckpt.mkdir(parents=True)
    (ckpt / 'state.json').write_text(json.dumps({'step': step}))
    (ckpt / '.finetune-complete').touch()
    with progress.open('a') as f:
        f.write(json.dumps({'step': step, 'total_steps': 400}) + '\\n')
    time.sleep(0.1)
"""


async def test_after_a_restart_the_card_shows_the_checkpoint_the_relaunch_restored(tmp_path: Path) -> None:
    """The console trial's Ctrl-C: the bot (and its embedded Redis) goes, the instance trains on and commits
    checkpoints nobody hears, then dies. The restarted bot relaunches; the runner restores the newest commit, and
    the card printed when the job runs again shows that checkpoint and step, as the "resumed" line beside it does."""
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("saver", SAVES_EACH_STEP)])
    state = tmp_path / "state"
    async with running_bot(state, config, keep_instances=True) as (service, _chat):
        job_id = await start_job(service, "console:ana", "start saver")
        await wait_job(service, job_id, lambda job: job.checkpoint is not None)
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)
        [record] = [record for record in await cloud.instances() if record.job_id == job_id]
    # The bot is gone. Whatever it heard was before now: the trainer's own progress file says how far that was.
    progress = state / "instances" / record.instance_id / "work" / "progress.jsonl"
    known = json.loads(progress.read_text().splitlines()[-1])["step"]
    unheard = await committed_past(state / "bucket" / "jobs" / job_id, known)
    os.kill(record.pid, signal.SIGKILL)  # then the instance goes, its runner and trainer with it
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.runner_pid, signal.SIGKILL)

    async with running_bot(state, config) as (service, chat):
        again = await wait_job(
            service, job_id, lambda job: job.state is JobState.RUNNING and job.attempt == 2, timeout=180
        )
        restored = again.attempts[-1].resumed_from_step
        assert restored is not None and restored >= unheard > known
        assert again.checkpoint is not None and again.checkpoint.step == restored and again.step == restored
        await wait_for_text(chat, "thread", f"from step {restored}")
        await wait_for_text(chat, "card", "(spot, attempt 2)")
        [card] = [
            text
            for job, channel, text in chat.transcript
            if job == job_id and channel == "card" and "RUNNING" in text and "attempt 2" in text
        ]
        assert f"Checkpoint: step {restored} · " in card and f"{restored}/400" in card, card


async def committed_past(checkpoints: Path, step: int, timeout: float = 120) -> int:
    """The step of a checkpoint committed (its manifest written) past ``step``, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [int(path.parent.name.split("-")[1]) for path in checkpoints.glob("checkpoint-*/MANIFEST.json")]
        if steps and max(steps) > step:
            return max(steps)
        await asyncio.sleep(0.1)
    raise AssertionError(f"no checkpoint past step {step} was committed in {timeout:.0f}s")
