"""Gangs through chat on the local cloud: ``tiny nodes=2``, each node a local instance of its own (its own runner,
metadata endpoint and report key), gloo over loopback between the two trainers, the job's file:// store shared.

Each drill ends in the final adapter of an uninterrupted two-node run, bit for bit, with only the lost node
replaced (or, when its replacement cannot be had, the whole gang moved after the hold time).

Cost: one two-node run to completion per test (two tiny trainers of one rank each at a time; the world of four is
two trainers of two ranks, stopped after its first step), and one uninterrupted two-node run without the bot for
the module (the adapter every drilled run must equal).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from bot.chat.render import card_text
from bot.cloud.local.profile import AWS_P5
from bot.cloud.local.provider import LocalCloud
from fakes.bot_harness import CHANNEL, SteppedClock, eventually, running_bot, settled, start_job, wait_job
from handlers.jobs import JobState
from tests.gang_reference import ADAPTER
from tests.runner_harness import progress_steps, wait_until

pytestmark = pytest.mark.timeout(600)

TINY = "start tiny nodes=2 steps=6 save_steps=3 step_seconds=0"


async def test_tiny_nodes_2_runs_to_completion_on_two_instances_and_the_card_shows_the_gang(tmp_path: Path) -> None:
    async with running_bot(tmp_path / "state") as (service, _chat):
        # With a deadline: the gang is the spot policy's to place, as one node is (deadline-aware, the default).
        job_id = await start_job(service, "console:ana", f"{TINY} deadline=2h")
        running = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING, timeout=300)
        assert running.nodes == 2 and sorted(running.gang_attempts) == [0, 1]
        assert running.deadline is not None and running.plan is not None and running.plan.action == "spot"
        assert running.plan.zone == "local-a"  # the policy's zone, where node 0 went and node 1 followed
        # RUNNING only once both runners started: each node's attempt has its instance and its start.
        assert all(a.instance_id and a.started_generation == 1 for a in running.gang_attempts.values())
        status = await service.bot.command("console:ana", CHANNEL, f"status {job_id}")
        assert "2 instances in local-a" in status and "Node 0" in status and "Node 1" in status
        assert "Deadline:" in status and "Plan: " in status

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


DRILLED = "start tiny nodes=2 steps=16 save_steps=5 step_seconds=0.5"  # GANG_STEPS: two_node_reference
# The drills replace one node, as the spot authority does where a launch costs what it costs on a cloud: on the local
# cloud's instant launches it restarts the whole gang (tests/test_gang_recovery_choice.py), so they run under aws-p5,
# its boots held 0.5 % of their time (about a second; bot/cloud/local/profile_clock.py).
CLOUD = {"finetune_local_profile": "aws-p5", "finetune_local_time_scale": 0.005}


@pytest.mark.parametrize("drilled", [1, 0])
async def test_a_drilled_node_alone_is_replaced_and_the_gang_resumes_bitwise_equal_with_no_step_lost(
    tmp_path: Path, two_node_reference: bytes, drilled: int
) -> None:
    """Under ``aws-p5`` the spot authority replaces the lost node alone (from the job's own measured launches), and on
    the profile's timeline (bot/cloud/local/profile_clock.py: the boots held 0.5 % of their time on the wall, the
    rest the clock's jump) that is sooner training again than the whole gang's start: one boot against a whole
    gang's slowest."""
    async with running_bot(tmp_path / "state", **CLOUD) as (service, chat):
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud) and cloud.profile.launch_seconds == AWS_P5.launch_seconds
        asked = cloud.clock.now()
        job_id = await start_job(service, "console:ana", DRILLED)
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 1, 300)
        whole_start = cloud.clock.now() - asked  # every node launched, booted, restored, one world: a whole gang
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 7, 300)
        before = await service.bot.store.get(job_id)
        assert before is not None
        assert (before.attempts[0].launch_seconds or 0) >= AWS_P5.launch_seconds  # the profile's boot
        lost, kept = before.gang_attempts[drilled], before.gang_attempts[1 - drilled]
        reply = await service.bot.command("console:ana", CHANNEL, f"interrupt-test {job_id} node={drilled}")
        assert reply.startswith(f"OK: interrupt-test {job_id}"), reply
        recovering = await wait_job(
            service, job_id, lambda j: j.state is JobState.RECOVERING and j.generation == 2, 300
        )
        committed = cloud.clock.now()
        assert recovering.checkpoint is not None
        held = recovering.checkpoint.step
        await wait_job(service, job_id, lambda j: j.state is JobState.RUNNING and (j.step or 0) > held, 300)
        replace_one = cloud.clock.now() - committed
        # On the profile's timeline: one boot (and the survivors' regroup) against a whole gang's slowest boot.
        assert replace_one >= AWS_P5.launch_seconds and replace_one < whole_start, (replace_one, whole_start)

        done = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED, timeout=500)
        history = await service.bot.store.history(job_id)
        [lost_event] = [e for e in history if e.get("event") == "node-lost"]
        assert lost_event["recovery"] == "replace-one" and lost_event["measured"] is True
        assert lost_event["replace_s"] < lost_event["whole_s"]  # from the job's own launches: the profile's
        saved = lost_event["step"]
        assert lost_event["attempt"] == lost.number and lost_event["node_rank"] == drilled and saved >= 7
        standby = [e for e in history if e.get("event") == "standby"]
        assert [(e["node_rank"], e["step"], e["cause"]) for e in standby] == [(1 - drilled, saved, "stopped")]
        # Three instances in the job's life: the survivor kept its own to the end, one replacement.
        assert len(done.instance_ids) == 3 and done.generation == 2
        survivor = done.attempt_numbered(kept.number)
        assert survivor is not None and survivor.instance_id == kept.instance_id
        assert survivor.end_reason == "completed" and survivor.generation == 2 and survivor.node_rank == 0
        replacement = done.attempts[-1]
        assert (replacement.node_rank, replacement.generation, replacement.zone) == (1, 2, lost.zone)
        assert replacement.resumed_from_step == saved and survivor.resumed_from_step == saved
        assert done.steps_lost == 0 and done.step == 16
        assert done.output_uri is not None
        final = (Path(done.output_uri.removeprefix("file://")) / ADAPTER).read_bytes()
        assert final == two_node_reference
        await eventually(lambda: settled(service))
        thread = "\n".join(text for _, said, text in chat.transcript if said == "thread")
        assert "replacing the lost node alone" in thread


async def test_a_node_whose_instance_vanishes_costs_no_step_the_survivor_held(
    tmp_path: Path, two_node_reference: bytes
) -> None:
    """Node 1's whole instance is killed between periodic saves (its process and its runner's tree: no notice, no
    cloud event; the bot would hear of it at its next reconcile). Node 0's trainer, its collective broken, saves the
    step it holds; its runner says so at once, the bot finds node 1's instance gone and launches the replacement,
    which waits for node 0's commit of that step (node 1's part rebuilt by rule) and restores it: no step lost."""
    async with running_bot(tmp_path / "state", **CLOUD) as (service, chat):
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)
        job_id = await start_job(service, "console:ana", DRILLED)
        running = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 6)
        lost, kept = running.gang_attempts[1], running.gang_attempts[0]
        assert lost.instance_id is not None and kept.instance_id is not None
        # Between two saves (5 and 10), at node 0's own progress: the step it holds then has no node-1 part committed.
        progress = cloud.state_dir / "instances" / kept.instance_id / "work" / "progress.jsonl"

        def between_saves() -> bool:
            step = (progress_steps(progress) or [0])[-1]
            return step >= 6 and step % 5 in (1, 2)

        await wait_until(between_saves, timeout=300)
        reached = progress_steps(progress)[-1]
        record = await cloud.registry.get(lost.instance_id)
        assert record is not None
        os.kill(record.pid, signal.SIGKILL)  # the machine is gone: it tells nobody,
        os.killpg(record.runner_pid, signal.SIGKILL)  # and nothing of it runs after

        done = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED, timeout=500)
        history = await service.bot.store.history(job_id)
        [peer_lost] = [e for e in history if e.get("event") == "peer-lost"]
        assert peer_lost["node_rank"] == 0 and peer_lost["peers"] == [lost.instance_id]
        [lost_event] = [e for e in history if e.get("event") == "node-lost"]
        assert (lost_event["attempt"], lost_event["node_rank"]) == (lost.number, 1)
        [standby] = [e for e in history if e.get("event") == "standby"]
        held = standby["step"]
        assert standby["node_rank"] == 0 and standby["cause"] == "trainer-exited" and held >= reached >= 6
        assert standby["rebuilt"] == {"node-1": "seed-step-rank"}  # the step it held, not the last periodic save
        assert len(done.instance_ids) == 3  # only the lost node replaced
        survivor = done.attempt_numbered(kept.number)
        assert survivor is not None and survivor.instance_id == kept.instance_id
        replacement = done.attempts[-1]
        assert replacement.resumed_from_step == survivor.resumed_from_step == held
        assert done.steps_lost == 0 and done.step == 16
        vanished = done.attempt_numbered(lost.number)
        assert vanished is not None and vanished.ended_at is not None
        assert vanished.ended_at <= replacement.launched_at  # the loss dated from the survivor's word,
        assert "a survivor's collective failed" in (vanished.end_reason or "")  # on which the bot looked at once
        await eventually(lambda: settled(service))
        thread = "\n".join(text for _, said, text in chat.transcript if said == "thread")
        assert f"committed step {held}, the step the survivors held" in thread
        assert "node 1's RNG and data order rebuilt from (seed, step, rank)" in thread
        assert f"from step {held}: 0 steps lost" in thread
        assert done.output_uri is not None
        assert (Path(done.output_uri.removeprefix("file://")) / ADAPTER).read_bytes() == two_node_reference


async def test_a_replacement_refused_for_capacity_holds_then_the_whole_gang_moves_and_says_why(
    tmp_path: Path, two_node_reference: bytes
) -> None:
    clock = SteppedClock()
    zones = {"finetune_local_zones": "local-a,local-b", **CLOUD}
    async with running_bot(tmp_path / "state", clock=clock, **zones) as (service, chat):
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)
        job_id = await start_job(service, "console:ana", DRILLED)
        running = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 7)
        assert {a.zone for a in running.gang_attempts.values()} == {"local-a"}
        await cloud.take_spot_capacity("local-a", reclaim=False)  # no room for a replacement; the gang keeps its own
        await service.bot.command("console:ana", CHANNEL, f"interrupt-test {job_id} node=1")

        async def held() -> bool:
            job = await service.bot.store.get(job_id)
            return job is not None and job.held_since is not None

        await eventually(held, timeout=300)
        holding = await service.bot.store.get(job_id)
        assert holding is not None and holding.state is JobState.RECOVERING
        survivor = holding.gang_attempts[0]
        assert survivor.ended_at is None and survivor.instance_id is not None  # standing by, billing

        clock.advance(11)  # past the hold (10 minutes): the policy chooses, and moving beats waiting
        done = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED, timeout=500)
        history = await service.bot.store.history(job_id)
        [due] = [e for e in history if e.get("event") == "gang-hold-due"]
        assert due["choice"] == "move" and due["from_zone"] == "local-a"
        moved = [a for a in done.attempts if a.generation == done.generation]
        assert [(a.node_rank, a.zone) for a in moved] == [(0, "local-b"), (1, "local-b")]
        assert len(done.instance_ids) == 4  # the first gang, then the whole gang elsewhere; no replacement started
        waited = done.attempt_numbered(survivor.number)
        assert waited is not None and waited.ended_at is not None
        assert (waited.ended_at - waited.launched_at).total_seconds() >= 600  # the survivor's wait is billed
        await eventually(lambda: settled(service))
        thread = "\n".join(text for _, said, text in chat.transcript if said == "thread")
        assert "replacement has no capacity in local-a" in thread and "the whole gang moves" in thread
        assert done.output_uri is not None
        assert (Path(done.output_uri.removeprefix("file://")) / ADAPTER).read_bytes() == two_node_reference


async def test_two_nodes_of_two_ranks_each_make_one_world_of_four(tmp_path: Path) -> None:
    """``nodes=2 nproc=2``: torchrun on each node, ranks 0-1 on node 0 and 2-3 on node 1, one world. A stop saves
    every rank's state, each in its own node's part, under one marker. (A stop, not a run to completion: a
    finished run's last periodic commit is cancelled for its output, so whether one is reported raced the
    training.)"""
    async with running_bot(tmp_path / "state") as (service, _chat):
        command = "start tiny nodes=2 nproc=2 steps=10000 save_steps=10000 step_seconds=0.2"
        job_id = await start_job(service, "console:ana", command)
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 1, 300)
        reply = await service.bot.command("console:ana", CHANNEL, f"stop {job_id}")
        assert reply.startswith("OK"), reply
        done = await wait_job(service, job_id, lambda job: job.state in (JobState.STOPPED, JobState.FAILED), 300)
        assert done.state is JobState.STOPPED, done.failure
        assert done.checkpoint is not None and done.checkpoint.step >= 1  # the stop's save: no periodic one is due
        assert all(attempt.ended_at is not None for attempt in done.attempts)
        checkpoint = Path(done.checkpoint.uri.removeprefix("file://"))
        parts = [manifest.parent for manifest in checkpoint.glob("node-*/MANIFEST.json")]
        ranks = {part.name: sorted(state.name for state in part.glob("rng_state_*.pth")) for part in parts}
        assert ranks == {
            "node-0": ["rng_state_0.pth", "rng_state_1.pth"],
            "node-1": ["rng_state_2.pth", "rng_state_3.pth"],
        }
        assert (checkpoint / "GANG.json").exists()
