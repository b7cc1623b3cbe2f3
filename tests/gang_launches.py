"""A two-node gang's launches as the bot orders them (handlers' own decisions), for provider-level tests: node 0's
launch first, node 1's once node 0's result (its zone and private address) is in the job."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from bot.cloud.base import Instance
from handlers.decide import decide, new_job
from handlers.gang import place_in, rank_of
from handlers.jobs import ChatRef, Job
from handlers.messages import Launch, Launched
from handlers.spec import JobSpec

NOW = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)

# (the attempt's spec without its place, the Launch) -> the instance the provider started
LaunchNode = Callable[[JobSpec, Launch], Awaitable[Instance]]


def placed(spec: JobSpec, job: Job) -> JobSpec:
    """The attempt's spec with its place in the job's world (what bot/cloud_effects.py gives a gang node's launch)."""
    attempt = job.attempt_numbered(spec.attempt)
    assert attempt is not None
    rank = rank_of(attempt)
    assert rank is not None
    return spec.model_copy(update={"gang": place_in(job, rank)})


async def launch_two_nodes(
    job_id: str, spec_of: Callable[[int], JobSpec], launch: LaunchNode
) -> tuple[Job, list[Instance]]:
    """Launch a new two-node job's nodes through ``launch`` in the order the bot's decisions give; the job after
    both results and the instances, node 0's first."""
    created = new_job(job_id, "tiny", {}, "console:ana", ChatRef(platform="console", channel="c"), NOW, nodes=2)
    job, outbox, started = created.job, created.outbox, []
    for _ in range(2):
        [order] = [message for message in outbox if isinstance(message, Launch)]
        instance = await launch(placed(spec_of(order.attempt), job), order)
        started.append(instance)
        result = Launched(
            job_id=job_id,
            attempt=order.attempt,
            instance_id=instance.instance_id,
            instance_type=instance.instance_type,
            zone=instance.zone,
            market=instance.market,
            private_ip=instance.private_ip,
        )
        change = decide(job, result, NOW)
        assert change is not None
        job, outbox = change.job, change.outbox
    return job, started
