"""The local cloud speaking Alibaba's metadata dialect: the real bot, real runner subprocesses that watch
``instance/spot/termination-time``, an interrupt test, the checkpoint, the relaunch, the resume and the completion."""

from __future__ import annotations

from pathlib import Path

from fakes.bot_harness import CHANNEL, INTERRUPTIBLE, quick_recipe, running_bot, start_job, wait_job, write_config
from handlers.jobs import JobState


async def test_an_interrupt_test_by_alibaba_metadata_checkpoints_relaunches_and_completes(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("resumes", INTERRUPTIBLE)])
    async with running_bot(tmp_path / "state", config, grace=8.0, finetune_local_dialect="aliyun") as (service, _chat):
        assert service.bot.cloud.notice == "aliyun"
        job_id = await start_job(service, "console:ana", "start resumes")
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 2)
        reply = await service.bot.command("console:ana", CHANNEL, f"interrupt-test {job_id}")
        assert job_id in reply
        done = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED, timeout=180)

        assert done.interruptions == 1
        assert len(done.attempts) == 2
        assert done.checkpoint is not None
        history = await service.bot.store.history(job_id)
        warnings = [entry for entry in history if entry.get("event") == "spot-interruption"]
        assert warnings and warnings[0]["source"] == "aliyun-metadata"  # the runner heard ECS's termination time
        specs = sorted((tmp_path / "state" / "instances").glob("*/spec.json"))
        assert len(specs) == 2
        assert all('"notice":"aliyun"' in path.read_text() for path in specs)
