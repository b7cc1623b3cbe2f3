"""A gang losing one node on the local cloud, through chat, timed: replace only the lost node, against restarting
the whole gang, on this machine.

Each run starts ``tiny nodes=N`` through the bot (every node a local instance with its own runner and metadata
endpoint, gloo over loopback, the job's file:// store shared) and, once it trains, drills it one of two ways:

- *replace-one*: ``interrupt-test <job> node=N-1``. Timed: the drill → every node's part committed (the gang's
  marker, ``GANG.json``, written by node 0's runner once it saw every part); committed → the gang training again
  (node 0's first step past the saved one, in the next generation: one replacement launched, restored, every
  node regrouped); the survivors' idle node-seconds (each from its ``standby`` to training again) and their share
  of the node-seconds the job paid for.
- *whole-gang*: ``stop <job>`` at the same step, then ``resume <job>`` as soon as the job is STOPPED: every node
  launched again. Timed: every part committed → the gang training again (every node's runner done and the job
  stopped, then N launches, N restores, one new world), and the resume → training again alone: what a tool
  that tears the whole gang down pays after its commit.

Both runs end bitwise in the same adapter (tests/test_gang_bot.py proves that); this only times them. On one
machine a local instance launches in well under a second and restores from a local disk, so the replace-one
advantage a cloud gives (one instance to get instead of N, one restore instead of N) does not show here: what
shows is the handshake's own cost. ``--profile aws-p5`` runs the local cloud under that profile
(bot/cloud/local/profile.py: p5 boots of 1-3 minutes, 140 GB fetched at 10 Gb/s, four boots at once per zone),
its boots held ``--time-scale`` of their time on the wall clock, and every span is read on the profile's clock
(bot/cloud/local/profile_clock.py): what this machine spent plus the profile's boots on the recovery's path.

    python bench/gang_recovery_live.py [--nodes 2,4] [--repeat 2] [--steps 40] [--step-seconds 0.25]
                                       [--profile aws-p5 --time-scale 0.02]

Run as root from a virtualenv other users cannot reach, the trainers run as root (``FINETUNE_TRAINER_USER``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.cloud.local.provider import LocalCloud
from bot.service import BotService
from fakes.bot_harness import CHANNEL, running_bot, start_job, wait_job, write_config
from handlers.job_cost import job_cost
from handlers.jobs import Job, JobState

USER = "console:ana"
PROFILE: dict[str, object] = {}  # the local cloud's profile settings (--profile, --time-scale)


def team_config(root: Path, nodes: int) -> Path | None:
    """Past the ``tiny`` recipe's four nodes: a team of the bench's user whose caps allow ``nodes`` (twice, for the
    whole gang's relaunch beside the old one's last reports)."""
    if nodes <= 4:
        return None
    team = {"members": [USER], "channels": [f"console:{CHANNEL.channel}"], "max_nodes": nodes}
    team["max_concurrent_nodes"] = 2 * nodes
    return write_config(root / "bot.yaml", policy={"teams": {"bench": team}})


def now(service: BotService) -> float:
    """Seconds on the local cloud's profile timeline (the wall clock under the instant profile)."""
    cloud = service.bot.cloud
    assert isinstance(cloud, LocalCloud)
    return cloud.clock.now()


def offset(service: BotService) -> float:
    """How far the profile's clock is ahead of the wall clock now: a wall-clock time (a file's mtime, a history
    entry's) from before the recovery's boots is on the profile's timeline at this offset taken before they end."""
    cloud = service.bot.cloud
    assert isinstance(cloud, LocalCloud)
    cloud.clock.now()  # takes in every boot over by now
    return cloud.clock.offset


@dataclass(frozen=True, slots=True)
class ReplaceOne:
    committed: float  # the drill → every part committed (s)
    training_again: float  # committed → node 0's first step of the next generation (s)
    idle_node_seconds: float  # the survivors' standby → training again, summed
    idle_share: float  # of every node-second the job paid for
    steps_lost: int


@dataclass(frozen=True, slots=True)
class WholeGang:
    training_again: float  # every part committed → node 0's first step of the next generation (s)
    from_resume: float  # the resume → the same step (s)
    steps_lost: int


def command(nodes: int, steps: int, step_seconds: float) -> str:
    return f"start tiny nodes={nodes} steps={steps} save_steps=5 step_seconds={step_seconds}"


async def training(service: BotService, job_id: str, past: int) -> Job:
    """The job once node 0 reports a step past ``past`` (the card's step is node 0's)."""
    return await wait_job(service, job_id, lambda j: j.state is JobState.RUNNING and (j.step or 0) > past, 600)


async def training_again(service: BotService, job_id: str, generation: int, saved: int) -> float:
    """When (on the profile's clock) node 0 first reports a step past ``saved`` in a generation after ``generation``."""
    await wait_job(service, job_id, lambda j: j.generation > generation and (j.step or 0) > saved, 600)
    return now(service)


async def marker_time(job: Job) -> float:
    """When node 0's runner wrote the gang marker of ``job``'s checkpoint (every part committed; the job may know the
    checkpoint from a node's report a moment before the marker is there)."""
    assert job.checkpoint is not None and job.checkpoint.uri.startswith("file://"), job.checkpoint
    marker = Path(job.checkpoint.uri.removeprefix("file://")) / "GANG.json"
    for _ in range(1200):
        if marker.exists():
            break
        await asyncio.sleep(0.05)
    return marker.stat().st_mtime


async def replace_one(root: Path, nodes: int, steps: int, step_seconds: float) -> ReplaceOne:
    async with running_bot(root / "state", team_config(root, nodes), **PROFILE) as (service, _chat):
        job_id = await start_job(service, USER, command(nodes, steps, step_seconds))
        before = await training(service, job_id, steps // 4)
        drilled = now(service)
        reply = await service.bot.command(USER, CHANNEL, f"interrupt-test {job_id} node={nodes - 1}")
        assert reply.startswith("OK"), reply
        lost = await wait_job(service, job_id, lambda j: j.state is JobState.RECOVERING and j.checkpoint is not None)
        assert lost.checkpoint is not None
        ahead = offset(service)  # before the replacement's boot is over
        committed = await marker_time(lost) + ahead  # written before any node could train on
        again = await training_again(service, job_id, before.generation, lost.checkpoint.step)
        history = await service.bot.store.history(job_id)
        [chosen] = [e.get("recovery") for e in history if e.get("event") == "node-lost"]
        assert chosen == "replace-one", f"the authority chose {chosen}: replace-one is timed by a drill"
        done = await wait_job(service, job_id, lambda j: j.state in (JobState.SUCCEEDED, JobState.FAILED), 900)
        assert done.state is JobState.SUCCEEDED, done.failure
        history = await service.bot.store.history(job_id, with_times=True)
        standby = [e["written"].timestamp() + ahead for e in history if e.get("event") == "standby"]
        assert len(standby) == nodes - 1, standby
        idle = sum(max(again - at, 0.0) for at in standby)
        paid = job_cost(done, done.updated_at).hours * 3600
        return ReplaceOne(committed - drilled, again - committed, idle, idle / paid, done.steps_lost)


async def whole_gang(root: Path, nodes: int, steps: int, step_seconds: float) -> WholeGang:
    async with running_bot(root / "state", team_config(root, nodes), **PROFILE) as (service, _chat):
        job_id = await start_job(service, USER, command(nodes, steps, step_seconds))
        before = await training(service, job_id, steps // 4)
        reply = await service.bot.command(USER, CHANNEL, f"stop {job_id}")
        assert reply.startswith("OK"), reply
        stopped = await wait_job(service, job_id, lambda j: j.state is JobState.STOPPED, 600)
        assert stopped.checkpoint is not None, "stopped without a checkpoint"
        committed = await marker_time(stopped) + offset(service)
        resumed = now(service)  # at once, as a tool that restarts the whole gang would once every node is down
        reply = await service.bot.command(USER, CHANNEL, f"resume {job_id}")
        assert reply.startswith("OK"), reply
        again = await training_again(service, job_id, before.generation, stopped.checkpoint.step)
        done = await wait_job(service, job_id, lambda j: j.state in (JobState.SUCCEEDED, JobState.FAILED), 900)
        assert done.state is JobState.SUCCEEDED, done.failure
        return WholeGang(again - committed, again - resumed, done.steps_lost)


def figures(values: list[float]) -> str:
    return " / ".join(f"{value:.1f}" for value in values) + f"  (median {statistics.median(values):.1f})"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="2,4", help="gang sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each way per gang size")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-seconds", type=float, default=0.25)
    parser.add_argument("--profile", default="instant", help="the local cloud's profile (instant, aws-p5, a file)")
    parser.add_argument("--time-scale", type=float, default=None, help="wall seconds per profile second")
    options = parser.parse_args()
    PROFILE.update(finetune_local_profile=options.profile)
    if options.time_scale is not None:
        PROFILE.update(finetune_local_time_scale=options.time_scale)
    print(f"profile {options.profile}, time scale {options.time_scale}; spans on the profile's clock")
    print(f"{len(os.sched_getaffinity(0))} cores; load average {os.getloadavg()[0]:.2f} at the start")
    for nodes in (int(n) for n in options.nodes.split(",")):
        ones: list[ReplaceOne] = []
        wholes: list[WholeGang] = []
        for _ in range(options.repeat):
            with tempfile.TemporaryDirectory(prefix="gang-live-") as tmp:
                ones.append(await replace_one(Path(tmp), nodes, options.steps, options.step_seconds))
            with tempfile.TemporaryDirectory(prefix="gang-live-") as tmp:
                wholes.append(await whole_gang(Path(tmp), nodes, options.steps, options.step_seconds))
        print(f"nodes={nodes}, {options.repeat} runs each:")
        print(f"  notice → every part committed:            {figures([r.committed for r in ones])} s")
        print(f"  committed → training again, replace-one:  {figures([r.training_again for r in ones])} s")
        print(f"  committed → training again, whole gang:   {figures([w.training_again for w in wholes])} s")
        print(f"    of which the resume → training again:   {figures([w.from_resume for w in wholes])} s")
        print(f"  survivors' idle node-seconds per recovery: {figures([r.idle_node_seconds for r in ones])}")
        if not PROFILE.get("finetune_local_profile") or PROFILE["finetune_local_profile"] == "instant":
            print(f"  their share of the node-seconds paid:      {figures([100 * r.idle_share for r in ones])} %")
        print(f"  steps lost: replace-one {[r.steps_lost for r in ones]}, whole gang {[w.steps_lost for w in wholes]}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    asyncio.run(main())
