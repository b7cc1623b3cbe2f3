"""A gang node lost without notice, on the local cloud, through chat: steps lost and time to train again.

Each run starts ``tiny nodes=2`` through the bot (each node a local instance with its own runner, gloo over loopback,
the job's file:// store shared), waits for node 0 to report step ``--kill-at`` or later, and kills node 1's whole
instance: its instance process (so no cloud event is sent, as when a host dies) and its runner's process tree. Then:

- *steps lost*: the step node 0 had reported before the kill, against the step the gang resumed from (and the job's
  own count of steps lost);
- *noticed*: the kill → the bot's ``node-lost`` decision;
- *training again*: the kill → node 0's first step of the next generation;
- *downtime said*: what the thread's "Resumed" note says.

``--tree PATH`` imports the bot, runner and trainer from another checkout (e.g. one of the code before the change:
then the survivor stands by at the last periodic checkpoint and the bot hears of the loss at its reconcile, every
``--reconcile-seconds``), so both are measured by the same script on the same machine.

    python bench/gang_node_loss.py [--tree PATH] [--repeat 2] [--steps 30] [--kill-at 7] [--step-seconds 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


def _tree() -> Path:
    """``--tree`` before anything of the project is imported (the checkout the run measures)."""
    for index, argument in enumerate(sys.argv):
        if argument == "--tree" and index + 1 < len(sys.argv):
            return Path(sys.argv[index + 1]).resolve()
        if argument.startswith("--tree="):
            return Path(argument.split("=", 1)[1]).resolve()
    return Path(__file__).resolve().parents[1]


TREE = _tree()
sys.path.insert(0, str(TREE))
os.chdir(TREE)  # the instances' runners and trainers (``python -m``) import from their working directory first
os.environ["PYTHONPATH"] = os.pathsep.join([str(TREE), *filter(None, [os.environ.get("PYTHONPATH")])])

from bot.cloud.local.provider import LocalCloud  # noqa: E402
from fakes.bot_harness import running_bot, start_job, wait_job  # noqa: E402
from handlers.jobs import Job, JobState  # noqa: E402

USER = "console:ana"


@dataclass(frozen=True, slots=True)
class Loss:
    reached: int  # node 0's step as the bot knew it at the kill
    resumed_from: int
    steps_lost: int  # the job's own count
    noticed: float  # the kill → the bot's node-lost decision (s)
    training_again: float  # the kill → node 0's first step of the next generation (s)
    downtime_said: float  # the Resumed note's


async def one_loss(root: Path, steps: int, kill_at: int, step_seconds: float, reconcile_seconds: float) -> Loss:
    config = root / "config.yaml"
    config.write_text(f"policy:\n  lifecycle:\n    reconcile_seconds: {reconcile_seconds}\n")
    async with running_bot(root / "state", config=config) as (service, _chat):
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)
        command = f"start tiny nodes=2 steps={steps} save_steps=5 step_seconds={step_seconds}"
        job_id = await start_job(service, USER, command)
        running = await wait_job(
            service, job_id, lambda j: j.state is JobState.RUNNING and (j.step or 0) >= kill_at, 600
        )
        lost = running.gang_attempts[1]
        assert lost.instance_id is not None
        record = await cloud.registry.get(lost.instance_id)
        assert record is not None
        killed = time.time()
        os.kill(record.pid, signal.SIGKILL)
        os.killpg(record.runner_pid, signal.SIGKILL)
        again = await wait_job(
            service, job_id, lambda j: j.generation > running.generation and (j.step or 0) > 0 and _trains(j), 900
        )
        trained = time.time()
        done = await wait_job(service, job_id, lambda j: j.state in (JobState.SUCCEEDED, JobState.FAILED), 900)
        assert done.state is JobState.SUCCEEDED, done.failure
        history = await service.bot.store.history(job_id, with_times=True)
        [node_lost] = [e for e in history if e.get("event") == "node-lost"]
        [started] = [e for e in history if e.get("event") == "started" and e.get("lost") is not None]
        resumed_from = int(again.attempts[-1].resumed_from_step or 0)
        return Loss(
            reached=running.step or 0,
            resumed_from=resumed_from,
            steps_lost=done.steps_lost,
            noticed=node_lost["written"].timestamp() - killed,
            training_again=trained - killed,
            downtime_said=float(started["downtime"]),
        )


def _trains(job: Job) -> bool:
    """The gang trains past the step it resumed from."""
    fresh = job.attempts[-1].resumed_from_step
    return job.state is JobState.RUNNING and fresh is not None and (job.step or 0) > fresh


def figures(values: list[float]) -> str:
    return " / ".join(f"{value:.1f}" for value in values) + f"  (median {statistics.median(values):.1f})"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", default=str(TREE), help="the checkout to import (default: this one)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kill-at", type=int, default=7, help="kill once node 0 reported this step (default 7)")
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--reconcile-seconds", type=float, default=300.0, help="the bot's reconcile period")
    options = parser.parse_args()
    print(f"tree {TREE}; {len(os.sched_getaffinity(0))} cores; load average {os.getloadavg()[0]:.2f} at the start")
    losses: list[Loss] = []
    for _ in range(options.repeat):
        with tempfile.TemporaryDirectory(prefix="gang-loss-") as tmp:
            losses.append(
                await one_loss(
                    Path(tmp), options.steps, options.kill_at, options.step_seconds, options.reconcile_seconds
                )
            )
    print(f"a node of 2 lost without notice at step >= {options.kill_at}, save every 5, {options.repeat} runs:")
    print(f"  step reached → resumed from:  {[(loss.reached, loss.resumed_from) for loss in losses]}")
    print(f"  steps lost (the job's count): {[loss.steps_lost for loss in losses]}")
    print(f"  kill → noticed:               {figures([loss.noticed for loss in losses])} s")
    print(f"  kill → training again:        {figures([loss.training_again for loss in losses])} s")
    print(f"  downtime the note says:       {figures([loss.downtime_said for loss in losses])} s")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    asyncio.run(main())
