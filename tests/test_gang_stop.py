"""A stop ends a gang's launches still in flight, on the local cloud through the real bot.

Node 0's launch result orders the other nodes' launches; they are carried out one after the other (one job's
effects share a lane). The cloud here holds node 1's launch at the cloud until the test lets it go, so the stop is
written while node 1's launch is at the cloud and nodes 2 and 3 are still queued: node 1 (already asked for) starts
and is terminated by its own result, nodes 2 and 3 never start, and every instance of the job ends gone."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path

from bot.cloud.base import GangPlacement, Instance
from bot.cloud.local.provider import LocalCloud
from bot.cloud_effects import launching
from bot.service import CloudWiring
from fakes.bot_harness import CHANNEL, SLEEPS, eventually, quick_recipe, running_bot, wait_job, write_config
from handlers.decide import decide, new_job, stop_command
from handlers.jobs import JobState, Market
from handlers.messages import Launch, Launched, StopRunner, Terminate
from handlers.spec import JobSpec

NOW = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)


class HeldGangLaunches(LocalCloud):
    """The local cloud, where a gang's node 1 launch waits at the cloud until :attr:`release` is set."""

    reached: asyncio.Event
    release: asyncio.Event

    async def launch(
        self,
        spec: JobSpec,
        instance_types: list[str],
        market: Market,
        *,
        avoid_zones: Collection[str] = (),
        zone: str | None = None,
        gang: GangPlacement | None = None,
    ) -> Instance:
        if spec.gang is not None and spec.gang.node_rank == 1:
            self.reached.set()
            await self.release.wait()
        return await super().launch(spec, instance_types, market, avoid_zones=avoid_zones, zone=zone, gang=gang)


async def test_a_stop_while_a_gangs_nodes_are_launching_ends_the_launches_not_yet_made(tmp_path: Path) -> None:
    reached, release = asyncio.Event(), asyncio.Event()

    def cloud(wiring: CloudWiring) -> HeldGangLaunches:
        settings = wiring.settings
        held = HeldGangLaunches(
            settings.finetune_state_dir,
            wiring.redis.client,
            wiring.redis.url,
            keys=wiring.keys,
            grace_seconds=settings.finetune_local_grace_seconds,
            report_keys=wiring.report_keys,
        )
        held.reached, held.release = reached, release
        return held

    sleepy = {**quick_recipe("sleepy", SLEEPS), "max_nodes": 4}  # its nodes train nothing together: a stop ends each
    config = write_config(tmp_path / "bot.yaml", policy={"admins": ["console:boss"]}, recipes=[sleepy])
    async with running_bot(tmp_path / "state", config, cloud=cloud) as (service, _chat):
        reply = await service.bot.command("console:ana", CHANNEL, "start sleepy nodes=4")
        assert reply.startswith("Starting ft-"), reply
        job_id = reply.split()[1].rstrip(":")
        await asyncio.wait_for(reached.wait(), 60)  # node 1's launch is at the cloud; nodes 2 and 3 are queued

        stop = await service.bot.command("console:boss", CHANNEL, f"stop {job_id}")
        assert stop.startswith(f"OK: stop {job_id}"), stop
        release.set()
        await wait_job(service, job_id, lambda job: job.state is JobState.STOPPED, timeout=120)
        cloud_now = service.bot.cloud
        assert isinstance(cloud_now, LocalCloud)

        async def all_gone() -> bool:
            records = [record for record in await cloud_now.instances() if record.job_id == job_id]
            return len(records) == 2 and all(record.state == "gone" for record in records)

        await eventually(all_gone, timeout=120)  # nodes 0 and 1, both terminated
        history = await service.bot.store.history(job_id)
        assert [entry["node_rank"] for entry in history if entry.get("event") == "launched"] == [0]
        job = await service.bot.store.get(job_id)
        assert job is not None
        assert sorted((a.node_rank, a.end_reason) for a in job.attempts if a.instance_id is None) == [
            (rank, "stopped by console:boss before its launch") for rank in (1, 2, 3)
        ]
        # Node 1's instance, asked for before the stop, was released by its own result; 2 and 3 never started.
        released = [entry["instance"] for entry in history if entry.get("released")]
        instances = {record.instance_id for record in await cloud_now.instances() if record.job_id == job_id}
        assert instances == {*job.instance_ids, *released} and len(released) == 1


def test_a_gangs_stop_ends_its_unlaunched_nodes_and_a_late_launch_result_is_released() -> None:
    """The decisions alone: node 0 is up and nodes 1-3 are ordered; the stop asks node 0's runner to save, ends
    nodes 1-3 at once, and node 1's launch result after it terminates its instance; node 0's end stops the job."""
    created = new_job("ft-ab12", "sleepy", {}, "console:ana", CHANNEL, NOW, nodes=4)
    [first] = [message for message in created.outbox if isinstance(message, Launch)]
    up = decide(created.job, Launched(job_id="ft-ab12", attempt=first.attempt, instance_id="i-0", zone="z"), NOW)
    assert up is not None and len([m for m in up.outbox if isinstance(m, Launch)]) == 3  # nodes 1-3 ordered

    stopping = stop_command(up.job, "console:boss", NOW)
    assert stopping.job.state is JobState.STOPPING
    assert [m.instance_id for m in stopping.outbox if isinstance(m, StopRunner)] == ["i-0"]
    assert sorted(stopping.job.gang_attempts) == [0]  # only the node that runs is waited for
    assert not launching(stopping.job)  # the cloud executor starts nothing more for it

    late = decide(stopping.job, Launched(job_id="ft-ab12", attempt=2, instance_id="i-1", zone="z"), NOW)
    assert late is not None and [m.instance_id for m in late.outbox if isinstance(m, Terminate)] == ["i-1"]
    assert late.job.instance_ids == ["i-0"]
