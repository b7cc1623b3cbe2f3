"""Gangs through chat on the local cloud: ``tiny nodes=2``, each node a local instance of its own (its own runner,
metadata endpoint and report key), gloo over loopback between the two trainers, the job's file:// store shared.

Cost: one two-node run to completion per test (two tiny trainers of one rank each at a time).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.chat.render import card_text
from bot.cloud.local import LocalCloud
from fakes.bot_harness import CHANNEL, eventually, running_bot, settled, start_job, wait_job
from handlers.jobs import JobState

pytestmark = pytest.mark.timeout(600)

TINY = "start tiny nodes=2 steps=6 save_steps=3 step_seconds=0"


async def test_tiny_nodes_2_runs_to_completion_on_two_instances_and_the_card_shows_the_gang(tmp_path: Path) -> None:
    async with running_bot(tmp_path / "state") as (service, _chat):
        job_id = await start_job(service, "console:ana", TINY)
        running = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING, timeout=300)
        assert running.nodes == 2 and sorted(running.gang_attempts) == [0, 1]
        # RUNNING only once both runners started: each node's attempt has its instance and its start.
        assert all(a.instance_id and a.started_generation == 1 for a in running.gang_attempts.values())
        status = await service.bot.command("console:ana", CHANNEL, f"status {job_id}")
        assert "2 instances in local-a" in status and "Node 0" in status and "Node 1" in status

        done = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED, timeout=400)
        assert done.step == 6 and done.output_uri and done.output_uri.endswith("/output/")
        assert [(a.number, a.node_rank, a.generation) for a in done.attempts] == [(1, 0, 1), (2, 1, 1)]
        assert all(a.ended_at is not None for a in done.attempts)
        card = card_text(done, done.updated_at)
        assert "2 instances in local-a" in card
        output = Path(done.output_uri.removeprefix("file://")) / "adapter_model.safetensors"
        assert output.stat().st_size > 0

        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)

        async def both_gone() -> bool:
            records = [r for r in await cloud.instances() if r.job_id == job_id]
            return len(records) == 2 and all(r.state == "gone" for r in records)

        await eventually(both_gone, timeout=120)
        await eventually(lambda: settled(service))
        history = await service.bot.store.history(job_id)
        assert [e["node_rank"] for e in history if e.get("event") == "launched"] == [0, 1]
