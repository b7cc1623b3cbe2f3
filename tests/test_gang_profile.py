"""A gang under the local cloud's ``aws-p5`` profile, through chat: the spot authority replaces a lost node alone,
and on the profile's timeline that is sooner training again than the whole gang's start.

One two-node ``tiny`` run (two trainers at a time, then one replacement's): the profile's boots (two minutes ±
one, plus 140 GB fetched at 10 Gb/s) are held for 2 % of their time on the wall clock and the rest is the
profile's clock's jump (bot/cloud/local/profile_clock.py), so the run takes seconds, and its spans are read on the
profile's clock, not the wall's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.cloud.local.profile import AWS_P5
from bot.cloud.local.provider import LocalCloud
from fakes.bot_harness import CHANNEL, eventually, running_bot, settled, start_job, wait_job
from handlers.jobs import JobState
from tests.gang_reference import ADAPTER

pytestmark = pytest.mark.timeout(600)

PROFILE = {"finetune_local_profile": "aws-p5", "finetune_local_time_scale": 0.02}
DRILLED = "start tiny nodes=2 steps=16 save_steps=5 step_seconds=0.5"  # GANG_STEPS: two_node_reference


async def test_under_aws_p5_a_lost_node_is_replaced_alone_sooner_than_the_whole_gang_starts(
    tmp_path: Path, two_node_reference: bytes
) -> None:
    async with running_bot(tmp_path / "state", **PROFILE) as (service, chat):
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud) and cloud.profile.launch_seconds == AWS_P5.launch_seconds
        asked = cloud.clock.now()
        job_id = await start_job(service, "console:ana", DRILLED)
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 1, 300)
        whole_start = cloud.clock.now() - asked  # every node launched, booted, restored, one world: a whole gang
        running = await wait_job(service, job_id, lambda job: (job.step or 0) >= 7, 300)
        assert (running.attempts[0].launch_seconds or 0) >= AWS_P5.launch_seconds  # the profile's boot

        reply = await service.bot.command("console:ana", CHANNEL, f"interrupt-test {job_id} node=1")
        assert reply.startswith(f"OK: interrupt-test {job_id}"), reply
        lost = await wait_job(service, job_id, lambda j: j.state is JobState.RECOVERING and j.generation == 2, 300)
        committed = cloud.clock.now()
        assert lost.checkpoint is not None
        saved = lost.checkpoint.step
        await wait_job(service, job_id, lambda j: j.state is JobState.RUNNING and (j.step or 0) > saved, 300)
        replace_one = cloud.clock.now() - committed

        history = await service.bot.store.history(job_id)
        [lost_event] = [e for e in history if e.get("event") == "node-lost"]
        assert lost_event["recovery"] == "replace-one" and lost_event["measured"] is True
        assert lost_event["replace_s"] < lost_event["whole_s"]  # from the job's own launches: the profile's
        # On the profile's timeline: one boot (and the survivors' regroup) against a whole gang's slowest boot.
        assert replace_one >= AWS_P5.launch_seconds and replace_one < whole_start, (replace_one, whole_start)

        done = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED, timeout=500)
        assert len(done.instance_ids) == 3 and done.steps_lost == 0  # the survivor kept its instance
        assert done.output_uri is not None
        assert (Path(done.output_uri.removeprefix("file://")) / ADAPTER).read_bytes() == two_node_reference
        await eventually(lambda: settled(service))
        thread = "\n".join(text for _, said, text in chat.transcript if said == "thread")
        assert "replacing the lost node alone" in thread
