"""The notice budget on the real bot: the local cloud with a short notice (its grace, 2 s), a real runner whose trainer
writes a checkpoint that takes longer than that to save. The runner's first periodic save measures it; the thread is
warned once, and the card (``status``) shows the commit against the notice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.bot_harness import CHANNEL, eventually, running_bot, settled, start_job, wait_job, write_config
from handlers.notice_budget import notice_budget
from tests.trainers import synthetic

WARNING = "A commit on a spot notice would take"


def slow_saver() -> dict[str, Any]:
    """The synthetic recipe, its checkpoints 8 MiB written at 2 MiB/s: a save of about 4 s."""
    recipe = synthetic.recipe("slow-saver")
    command = list(recipe["command"])
    assert command[-2:] == ["--checkpoint-mib", "0.01"]
    recipe["command"] = [*command[:-2], "--checkpoint-mib", "8", "--write-mib-per-second", "2"]
    return recipe


async def test_a_job_whose_commit_cannot_fit_a_short_notice_is_warned_in_its_thread(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[slow_saver()], policy={"admins": ["console:ana"]})
    async with running_bot(tmp_path / "state", config, grace=2.0) as (service, chat):
        job_id = await start_job(service, "console:ana", "start slow-saver steps=400 step_seconds=0.1 save_steps=5")
        job = await wait_job(service, job_id, lambda job: job.notice_budget_warned)
        assert job.current is not None and job.current.notice_seconds == 2.0  # the local cloud's grace
        budget = notice_budget(job)
        assert budget is not None and not budget.fits and budget.commit_seconds >= 3.0  # the 4 s save, measured
        assert job.checkpoint_save_seconds is not None and job.checkpoint_interval_steps == 5

        await eventually(lambda: settled(service))
        warned = [said for job_of, channel, said in chat.transcript if channel == "thread" and WARNING in said]
        assert len(warned) == 1 and "longer than the cloud's 2.0s notice" in warned[0], warned
        # The next periodic save measures again and says nothing more.
        warned_at = job.checkpoint.step if job.checkpoint else 0
        await wait_job(service, job_id, lambda later: (later.checkpoint.step if later.checkpoint else 0) > warned_at)
        await eventually(lambda: settled(service))
        assert sum(WARNING in said for _, _, said in chat.transcript) == 1

        status = await service.bot.command("console:ana", CHANNEL, f"status {job_id}")
        line = next(line for line in status.splitlines() if "Notice budget" in line)
        assert "s of 2.0s: does not fit" in line, status
