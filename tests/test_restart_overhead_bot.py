"""Restart overhead measured on the real bot (embedded Valkey, the local cloud, the tiny trainer): a finished
job's attempts' overhead is in its record and in the store, and the next job of the recipe starts with it."""

from __future__ import annotations

from pathlib import Path

from fakes.bot_harness import running_bot, start_job, wait_job, write_config
from handlers.jobs import JobState
from handlers.restart_overhead import job_restart_s

TICK = {"spot": {"tick_seconds": 600}}


async def test_a_finished_jobs_restart_is_in_its_record_and_the_next_job_of_the_recipe_starts_with_it(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path / "bot.yaml", policy=TICK)
    async with running_bot(tmp_path / "state", config) as (service, _chat):
        store = service.bot.store
        first_id = await start_job(service, "console:ana", "start tiny steps=5 step_seconds=0")
        done = await wait_job(service, first_id, lambda job: job.state is JobState.SUCCEEDED)
        attempt = done.attempts[-1]
        assert attempt.started_at is not None and attempt.restore_seconds is not None
        assert attempt.first_step_at is not None and attempt.launched_at <= attempt.first_step_at
        measured = job_restart_s(done.attempts)
        assert measured is not None and done.restart_seconds == measured
        assert attempt.instance_type is not None
        assert await store.restart_estimate("tiny", [attempt.instance_type]) == measured

        # A steered job of the same recipe: its policy plans with the first job's restart, not the constant.
        second_id = await start_job(service, "console:ana", "start tiny steps=5 step_seconds=0 deadline=2h")
        second = await store.get(second_id)
        assert second is not None and second.restart_seconds == measured
        finished = await wait_job(service, second_id, lambda job: job.state is JobState.SUCCEEDED)
        assert finished.restart_seconds == job_restart_s(finished.attempts)  # then its own measurement
        # The estimate now blends both jobs' measurements.
        both = await store.restart_estimate("tiny", [attempt.instance_type])
        assert both is not None and min(measured, finished.restart_seconds or 0) <= both
