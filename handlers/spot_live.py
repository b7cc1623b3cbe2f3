"""The live bot's side of the spot policy: a job's record, as the :class:`~handlers.spot_policy.Situation` the
simulator also builds, and what the card shows of the policy's choice (projected finish and cost, the reason).

Pure, like the policy: the bot passes in what it knows (the job, now, its deadline and budget, the zones with
what the cloud said of them, the prices) and calls the very policy ``finetune-bot simulate`` measures; the bot
asks through :mod:`handlers.spot_decide` (launch, interruption, capacity error, resume and the policy's tick).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from handlers.cost import job_cost
from handlers.jobs import Job
from handlers.spot_policy import NOTHING, Choice, Event, Holding, Situation, ZoneView

# Until the job has measured its own start-up: boot, runner install, checkpoint restore.
DEFAULT_RESTART = timedelta(minutes=6)
# A zone the job was just reclaimed in (or refused for capacity) counts as without spot for this long.
LOST_ZONE_COOLDOWN = timedelta(minutes=30)


@dataclass(frozen=True, slots=True)
class Projection:
    """What the card shows beside the choice: when the job would finish and what it would cost in all."""

    finish: datetime | None  # None: not known (waiting for spot)
    cost: float  # at most this, holding the choice (waiting: if on-demand had to finish it)


def live_situation(
    job: Job,
    now: datetime,
    event: Event,
    *,
    deadline: datetime | None,
    budget: float | None,
    zones: Sequence[str],
    scores: Mapping[str, float] | None = None,
    refused: Mapping[str, datetime] | None = None,
    spot_price: float,
    on_demand_price: float,
    period: timedelta,
    checkpoint_steps: int | None = None,
    known_restart: float | None = None,
) -> Situation | None:
    """The job's situation now, or None while nothing is measured (no total steps or no step time yet).

    ``scores``: the zones' recent spot availability (0..1: a placement score / 10, a share of successful
    launches); ``refused``: when a launch in a zone last failed for capacity; ``checkpoint_steps``: the
    recipe's checkpoint interval in steps (the work a notice-less loss takes); ``known_restart``: the restart
    overhead measured by earlier jobs of the recipe on its instance type (the job's own comes first).
    """
    cost = job_cost(job, now)
    if not job.total_steps or cost.seconds_per_step is None:
        return None
    per_step = cost.seconds_per_step
    done = job.step or 0
    restart = _measured_restart(job) or known_restart or DEFAULT_RESTART.total_seconds()
    lost = lost_zones(job, now, refused or {})
    views = tuple(ZoneView(zone, False if zone in lost else None, (scores or {}).get(zone)) for zone in zones)
    return Situation(
        event=event,
        work_left_s=max(job.total_steps - done, 0) * per_step,
        work_done_s=done * per_step,
        time_left_s=(deadline - now).total_seconds() if deadline is not None else None,
        elapsed_s=max((now - job.created_at).total_seconds(), 0.0),
        restart_s=restart,
        period_s=period.total_seconds(),
        checkpoint_interval_s=(checkpoint_steps or 0) * per_step,
        holding=_holding(job, now, restart),
        zones=views,
        spot_price=spot_price,
        on_demand_price=on_demand_price,
        spent=cost.paid,
        budget=budget,
    )


def projection(s: Situation, choice: Choice, now: datetime) -> Projection:
    """Finish and cost if the choice held to the end (spot: with no further loss)."""
    if choice.action == "stop":
        return Projection(None, s.spent)
    fallback = s.restart_s + s.work_left_s
    if choice.action == "wait":
        return Projection(None, s.spent + fallback / 3600 * s.on_demand_price)
    same = s.holding.market == choice.action and (choice.action == "on-demand" or s.holding.zone == choice.zone)
    need = (s.holding.starting_s if same else s.restart_s) + s.work_left_s
    price = s.spot_price if choice.action == "spot" else s.on_demand_price
    return Projection(now + timedelta(seconds=need), s.spent + need / 3600 * price)


def _holding(job: Job, now: datetime, restart: float) -> Holding:
    current = job.current
    if current is None or current.instance_id is None or current.ended_at is not None:
        return NOTHING
    if current.started_at is not None:
        return Holding(current.market, current.zone, 0.0)
    return Holding(current.market, current.zone, max(restart - (now - current.launched_at).total_seconds(), 0.0))


def _measured_restart(job: Job) -> float | None:
    """The job's measured start-up: its attempts' launch to first step, else the latest launch to runner start."""
    if job.restart_seconds is not None:
        return job.restart_seconds
    for attempt in reversed(job.attempts):
        if attempt.instance_id is not None and attempt.started_at is not None:
            return max((attempt.started_at - attempt.launched_at).total_seconds(), 0.0)
    return None


def lost_zones(job: Job, now: datetime, refused: Mapping[str, datetime]) -> set[str]:
    """Zones where the job's spot instance was reclaimed, or a launch refused for capacity, within the cool-down."""
    lost = {zone for zone, at in refused.items() if now - at < LOST_ZONE_COOLDOWN}
    for attempt in job.attempts:
        reason = attempt.end_reason or ""
        # A spot instance the cloud took (a notice, or gone without one); not one the bot stopped (a person's stop,
        # the policy's switch of market: the runner's notice kind is "stop"), nor an on-demand one.
        taken = reason.startswith(("interrupted", "instance gone")) and reason != "interrupted: stop"
        reclaimed = taken and attempt.market == "spot"
        if attempt.zone and attempt.ended_at and reclaimed and now - attempt.ended_at < LOST_ZONE_COOLDOWN:
            lost.add(attempt.zone)
    return lost
