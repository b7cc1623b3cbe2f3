"""Attempts planned, launched, ended and released, for one node and for a gang alike: the relaunch step every
decision shares (one node's inputs, a gang's, the spot policy's steering, recovery after a failure), kept below them
all so that none of them needs another to relaunch.

A gang relaunches as a whole here (one attempt per node in a new generation, node 0 first); replacing one lost node
is the gang's own decision (:mod:`handlers.decide.gangs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from handlers.change import Change
from handlers.decide.builders import ignore, make, notify
from handlers.gang import new_gang
from handlers.jobs import Attempt, Job, Market
from handlers.lifecycle import best_step
from handlers.messages import (
    Launch,
    Launched,
    Message,
    RelaunchDue,
    StartDeadline,
    StopRunner,
    Terminate,
)
from handlers.notes import (
    CardRefresh,
)

START_TIMEOUT = timedelta(minutes=15)


def launch_details(message: Launched) -> dict[str, object]:
    """What an attempt records of its instance once the launch says where it runs (a gang node's too)."""
    return {
        "instance_id": message.instance_id,
        "instance_type": message.instance_type,
        "zone": message.zone,
        "market": message.market,
        "price_per_hour": message.price_per_hour,
        "on_demand_price_per_hour": message.on_demand_price_per_hour,
        "egress_price_per_gb": message.egress_price_per_gb,
        "private_ip": message.private_ip,
        "launched_at": message.at,
        "launch_seconds": message.launch_seconds,
        "notice_seconds": message.notice_seconds,
    }


def unwanted(job: Job, message: Launched, why: str) -> Change:
    """A launch result for an attempt the job no longer runs: its instance is released, not left billing."""
    ignored = ignore(job, "launched", why, instance=message.instance_id)
    release = Terminate(job_id=job.id, instance_id=message.instance_id)
    return Change(job, {**ignored.history, "released": True}, [release])


def relaunch(
    before: Job,
    job: Job,
    market: Market,
    now: datetime,
    history: dict[str, Any],
    outbox: Sequence[Message] | None = None,
    delay: timedelta = timedelta(),
    zone: str | None = None,
    launch_now: bool = True,
) -> Change:
    """Plan the next attempt now (so reports of the old one are fenced off at once) and ask for its launch,
    at once or, after attempts without progress, once ``delay`` is over (a timer on the bus). ``launch_now``
    False: the attempt waits for the spot policy's next tick to launch it."""
    if job.nodes > 1:
        return _relaunch_gang(before, job, market, now, history, outbox or [], delay, zone, launch_now)
    number = job.next_number
    attempt = Attempt(number=number, market=market, launched_at=now, from_step=best_step(job))
    planned = job.model_copy(update={"attempts": [*job.attempts, attempt], "updated_at": now})
    if not launch_now:
        launch: Sequence[Message] = []
    elif delay > timedelta():
        launch = [RelaunchDue(job_id=job.id, attempt=number, market=market, zone=zone, due=now + delay)]
    else:
        launch = launch_order(planned, number, market, now, zone)
    effects = [*(outbox or []), *launch, notify(planned, "card", CardRefresh(cause="launch"))]
    return make(planned, {**history, "state": planned.state.value, "next_attempt": number}, effects)


def launch_order(job: Job, number: int, market: Market, now: datetime, zone: str | None = None) -> Sequence[Message]:
    """The launch the decision chose: this market, in this zone (None: the cloud orders the zones within the
    launch). The deadline is set with the launch request, so even a launch lost on the way ends in a page."""
    return [
        Launch(job_id=job.id, attempt=number, market=market, zone=zone or None),
        StartDeadline(job_id=job.id, attempt=number, due=now + START_TIMEOUT),
    ]


def releases(job: Job) -> list[Terminate]:
    """Terminate the job's live instance (a gang's: every live node's)."""
    if job.nodes > 1:
        return _gang_releases(job)
    instance = job.current.instance_id if job.current else None
    return [Terminate(job_id=job.id, instance_id=instance)] if instance else []


def end_attempt(job: Job, at: datetime, reason: str) -> Job:
    if job.nodes > 1:
        return _end_all(job, at, reason)
    current = job.current
    if current is None or current.ended_at is not None:
        return job
    ended = current.model_copy(update={"ended_at": at, "end_reason": reason})
    return job.model_copy(update={"attempts": [*job.attempts[:-1], ended]})


def with_attempt(job: Job, attempt: Attempt) -> Job:
    """``job`` with ``attempt`` (by number) as given."""
    return job.model_copy(update={"attempts": [attempt if a.number == attempt.number else a for a in job.attempts]})


def live(job: Job) -> list[Attempt]:
    return list(job.gang_attempts.values())


def _gang_releases(job: Job) -> list[Terminate]:
    """Terminate every live node's instance (a gang ends, or fails, as one)."""
    return [Terminate(job_id=job.id, instance_id=a.instance_id) for a in live(job) if a.instance_id]


def _end_all(job: Job, at: datetime, reason: str) -> Job:
    """Every live node's attempt ended at ``at``."""
    for attempt in live(job):
        job = with_attempt(job, attempt.model_copy(update={"ended_at": at, "end_reason": reason}))
    return job


def _relaunch_gang(
    before: Job,
    job: Job,
    market: Market,
    now: datetime,
    history: dict[str, Any],
    outbox: Sequence[Message],
    delay: timedelta,
    zone: str | None,
    launch_now: bool,
) -> Change:
    """Plan a whole gang (the first launch, or a move elsewhere): one attempt per node in a new generation; node 0
    launches first, the others into its zone once its launch result comes (:func:`launched`)."""
    generation = job.generation + 1 if any(a.node_rank is not None for a in job.attempts) else job.generation
    moved = job.model_copy(update={"generation": generation})
    attempts = new_gang(moved, before.attempt + 1, market, best_step(job))
    planned = moved.model_copy(update={"attempts": [*job.attempts, *attempts], "updated_at": now})
    launch: list[Message] = []
    if launch_now and delay > timedelta():
        launch = [RelaunchDue(job_id=job.id, attempt=planned.attempt, market=market, zone=zone, due=now + delay)]
    elif launch_now:
        launch = list(launch_first(planned, market, now, zone))
    effects = [*outbox, *launch, notify(planned, "card", CardRefresh(cause="launch"))]
    fields = {"state": planned.state.value, "next_attempt": attempts[0].number, "nodes": job.nodes}
    return make(planned, {**history, **fields, "generation": generation}, effects)


def on_market(job: Job, market: Market, now: datetime) -> Job:
    """``job`` with every node planned for its current generation (not launched yet) on ``market``, launched now:
    a gang that waited for the policy's tick."""
    for attempt in live(job):
        if attempt.instance_id is None and attempt.generation == job.generation:
            job = with_attempt(job, attempt.model_copy(update={"market": market, "launched_at": now}))
    return job


def launch_first(job: Job, market: Market, now: datetime, zone: str | None) -> list[Message]:
    """Launch the gang's node 0 (the others follow it into its zone); the start deadline is the last node's."""
    leader = job.gang_attempts[0]
    return [
        Launch(job_id=job.id, attempt=leader.number, market=market, zone=zone or None),
        StartDeadline(job_id=job.id, attempt=job.attempt, due=now + START_TIMEOUT),
    ]


def end_unlaunched(job: Job, at: datetime, reason: str) -> Job:
    """A gang being stopped: every live node without an instance yet ends ``at``, so the stop waits only for the
    nodes that run, and the launches still in flight start nothing that stays (a queued one is skipped by the cloud
    executor, one already at the cloud is terminated by its result, as any launch of an ended attempt)."""
    for attempt in live(job):
        if attempt.instance_id is None:
            job = with_attempt(job, attempt.model_copy(update={"ended_at": at, "end_reason": reason}))
    return job


def stop_runners(job: Job) -> list[Message]:
    """Ask every live node's runner to save and stop (they stop at one step, as on a notice)."""
    return [StopRunner(job_id=job.id, instance_id=a.instance_id) for a in live(job) if a.instance_id]
