"""The live decision: where a job's next stretch runs, from its record and what the cloud says now.

Every launch, interruption, capacity refusal, resume and policy tick of every job asks :func:`choose`, which
builds the job's :class:`~handlers.spot.rules.Situation` (the very one ``finetune-bot simulate`` builds from a
trace) and calls the job's named policy (:mod:`handlers.spot.policies`). A job started with a deadline or a budget,
or under a configured policy other than the default, is *steered* (:func:`managed`): its policy is also asked on a
periodic tick, with the cloud's view of zones, prices and live availability (:class:`SpotView`), and its choice
is kept on the card. Any other job runs ``spot-first`` (spot, then on-demand once no zone has spot), as the bot
always did. :mod:`handlers.decide` turns the choice into effects (a launch pinned to a zone and a market, nothing
until the next tick, a switch of market through a checkpoint, a stop); no cloud changes zone or market by itself.

Pure, like the policy: the bot passes in what it knows (the job, now, its deadline and budget, the zones with what
the cloud said of them, the prices).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from handlers.job_cost import job_cost
from handlers.jobs import Job, PlanChoice
from handlers.notice_budget import steps_at_risk
from handlers.policy_reasons import WORDING
from handlers.regions import region_of
from handlers.spot.policies import POLICIES, SPOT_FIRST, best_zone, policy_for
from handlers.spot.rules import DEFAULT_POLICY, NOTHING, Choice, Event, Holding, Situation, ZoneView
from handlers.spot.zones import (
    CROSS_REGION_BYTES_PER_S,
    IN_REGION_BYTES_PER_S,
    STAY,
    Move,
    move_to,
    refused_regions,
    weigh_availability,
)

# Until the job has measured its own start-up: boot, runner install, checkpoint restore.
DEFAULT_RESTART = timedelta(minutes=6)
# A zone the job was just reclaimed in (or refused for capacity) counts as without spot until the policy's next look
# (one period): trying it again then costs nothing, since a refused launch holds nothing and a job on on-demand
# launches spot ahead of its switch (handlers/decide/), and each zone is tried at most once a period, never in a
# loop. A longer cool-down only kept jobs off spot that had come back: on the traces, 30 minutes cost deadline-aware
# 0.02-0.05 of the optimum at every restart (docs/spot-policy.md).


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
    launches_ahead: bool = True,
    regions: Regions | None = None,
) -> Situation | None:
    """The job's situation now, or None while nothing is measured (no total steps or no step time yet).

    ``spot_price`` and ``on_demand_price`` are one instance's (what the cloud lists): the situation's are the
    job's, every node of a gang billing (as :func:`~handlers.job_cost.job_cost` counts what it spent).
    ``scores``: the zones' recent spot availability (0..1: a placement score / 10, a share of successful
    launches); ``refused``: when a launch in a zone last failed for capacity; ``checkpoint_steps``: the
    recipe's checkpoint interval in steps (the work a notice-less loss takes; a job whose notice-driven commit does
    not fit its cloud's notice counts its own save interval, :mod:`handlers.notice_budget`); ``known_restart``: the
    restart overhead measured by earlier jobs of the recipe on its instance type (the job's own comes first);
    ``launches_ahead``: the cloud can launch a job's next instance while its current one runs (not a group mode).
    ``regions``: where the job's checkpoint is and what moving it costs (None: one region, nothing moves); a region
    whose every zone refused within one cool-down is avoided for the cool-down after its last refusal.
    """
    cost = job_cost(job, now)
    if not job.total_steps or cost.seconds_per_step is None:
        return None
    per_step = cost.seconds_per_step
    done = job.step or 0
    restart = _measured_restart(job) or known_restart or DEFAULT_RESTART.total_seconds()
    lost = lost_zones(job, now, refused or {}, period) | region_lost(job, now, refused or {}, period, zones)
    holding = _holding(job, now, restart)
    moves = {zone: _move(job, zone, regions) for zone in zones}
    views = tuple(zone_view(zone, holding, zone in lost, (scores or {}).get(zone), moves[zone]) for zone in zones)
    return Situation(
        event=event,
        work_left_s=max(job.total_steps - done, 0) * per_step,
        work_done_s=done * per_step,
        time_left_s=(deadline - now).total_seconds() if deadline is not None else None,
        elapsed_s=max((now - job.created_at).total_seconds(), 0.0),
        restart_s=restart,
        period_s=period.total_seconds(),
        # A job whose commit cannot fit the notice loses its save interval's work on a notice, as without one.
        checkpoint_interval_s=max(checkpoint_steps or 0, steps_at_risk(job)) * per_step,
        holding=holding,
        zones=views,
        spot_price=spot_price * job.nodes,
        on_demand_price=on_demand_price * job.nodes,
        spent=cost.paid,
        budget=budget,
        switch_ahead=job.nodes == 1 and launches_ahead,  # handlers/decide/steering: one node's next goes first
    )


def zone_view(zone: str, holding: Holding, lost: bool, score: float | None, move: Move = STAY) -> ZoneView:
    """A zone as the bot knows it: with spot where its spot instance runs (or starts: its launch found spot), without
    for the cool-down after a refusal or a reclaim, else unknown until a launch there tries it; with what a stretch
    there moves across regions. The simulator's ``live`` runs see the zones through this too."""
    if lost:
        available: bool | None = False
    else:
        available = True if holding.market == "spot" and holding.zone == zone else None
    return ZoneView(zone, available, score, move_cost=move.cost, restart_extra_s=move.extra_s)


@dataclass(frozen=True, slots=True)
class Regions:
    """Where a job's checkpoint lives and what moving it costs: the cloud's home region (its bucket's) and
    inter-region price per GB (``SpansRegions``), and the restore's rate from another region when the job has not
    measured one (``policy.spot.cross_region_gb_per_s``)."""

    home: str
    price_per_gb: float
    cross_bytes_per_s: float = CROSS_REGION_BYTES_PER_S


def _move(job: Job, zone: str, regions: Regions | None) -> Move:
    """What a stretch of ``job`` in ``zone`` moves across regions, at the restore rates the job measured (its
    attempts' restores in and outside the home region, of its checkpoint's size), else the defaults."""
    if regions is None:
        return STAY
    cross, local = regions.cross_bytes_per_s, IN_REGION_BYTES_PER_S
    size = job.checkpoint_bytes
    for attempt in job.attempts:
        if size and attempt.zone and attempt.restore_seconds:
            rate = size / attempt.restore_seconds
            if region_of(attempt.zone) == regions.home:
                local = rate
            else:
                cross = rate
    return move_to(zone, regions.home, size, regions.price_per_gb, cross, local)


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


def lost_zones(job: Job, now: datetime, refused: Mapping[str, datetime], cooldown: timedelta) -> set[str]:
    """Zones where the job's spot instance was reclaimed, or a launch refused for capacity, within the cool-down
    (the policy's period)."""
    return {zone for zone, at in lost_at(job, refused).items() if now - at < cooldown}


def lost_at(job: Job, refused: Mapping[str, datetime]) -> dict[str, datetime]:
    """When each zone last refused the job's spot launch for capacity, or took its spot instance."""
    lost = dict(refused)
    for attempt in job.attempts:
        reason = attempt.end_reason or ""
        # A spot instance the cloud took (a notice, or gone without one); not one the bot stopped (a person's stop,
        # the policy's switch of market: the runner's notice kind is "stop"), nor an on-demand one.
        taken = reason.startswith(("interrupted", "instance gone")) and reason != "interrupted: stop"
        reclaimed = taken and attempt.market == "spot"
        if attempt.zone and attempt.ended_at and reclaimed:
            lost[attempt.zone] = max(attempt.ended_at, lost.get(attempt.zone, attempt.ended_at))
    return lost


def region_lost(
    job: Job, now: datetime, refused: Mapping[str, datetime], cooldown: timedelta, zones: Sequence[str]
) -> set[str]:
    """The zones of the regions whose every zone refused or reclaimed within one cool-down
    (:func:`~handlers.spot.zones.refused_regions`)."""
    out = refused_regions(lost_at(job, refused), zones, now, cooldown)
    return {zone for zone in zones if zone and region_of(zone) in out}



@dataclass(frozen=True, slots=True)
class SpotView:
    """What the bot read from the cloud for the policy: the zones (in preference order; ``""`` alone: the cloud
    orders them within the launch), the prices per hour now, how often the policy is asked again, and the zones'
    live availability (0..1: an AWS placement score / 10, Alibaba's stock status; absent: no signal)."""

    zones: tuple[str, ...] = ("",)
    spot_price: float | None = None
    on_demand_price: float | None = None
    period: timedelta = timedelta(minutes=5)
    checkpoint_steps: int | None = None
    scores: dict[str, float] = field(default_factory=dict)
    restart_s: float | None = None  # measured by earlier jobs of the recipe on its instance type
    # The cloud can launch a job's next instance while its current one runs, so a one-node job switches market
    # make-before-break; not in a group mode (AWS Auto Scaling, Alibaba scaling groups), whose one group per job
    # holds one instance and would end the current one to start the next.
    launches_ahead: bool = True
    regions: Regions | None = None  # the cloud spans regions: what a move out of the home region costs


# How far back the job's own launches count for the estimate of a zone's availability.
ESTIMATE_WINDOW = timedelta(hours=6)


def managed(job: Job) -> bool:
    """Is this job steered (ticks, the cloud's view, its plan on the card)? Else it runs ``spot-first``."""
    return steers(job.spot_policy, job.deadline, job.budget)


def steers(policy: str | None, deadline: datetime | None, budget: float | None) -> bool:
    """Would the configured policy ``policy`` steer a job with this deadline and budget? (A configured
    ``spot-first`` does: it then plans with the cloud's zones and live availability, and its plan is on the card.)"""
    if policy is None or policy not in POLICIES:
        return False
    return deadline is not None or budget is not None or policy != DEFAULT_POLICY


def policy_of(job: Job) -> str:
    """The name of the policy that decides for ``job``."""
    return policy_for(job.spot_policy, job.deadline, job.budget)


def estimated_availability(job: Job, now: datetime, window: timedelta = ESTIMATE_WINDOW) -> dict[str, float]:
    """Where the cloud gives no live signal: the share of the job's recent spot launches in each zone that were
    not refused for capacity nor reclaimed (the trace-based estimate, from the job's own trace)."""
    tries: dict[str, list[bool]] = {}
    for attempt in job.attempts:
        if attempt.market != "spot" or not attempt.zone or now - attempt.launched_at > window:
            continue
        reason = attempt.end_reason or ""
        lost = reason.startswith(("interrupted", "instance gone", "capacity")) and reason != "interrupted: stop"
        tries.setdefault(attempt.zone, []).append(not lost)
    for zone, at in job.refused_zones.items():
        if zone and now - at <= window:
            tries.setdefault(zone, []).append(False)
    return {zone: round(sum(kept) / len(kept), 4) for zone, kept in tries.items()}


def choose(job: Job, view: SpotView, now: datetime, event: Event) -> tuple[Choice, PlanChoice]:
    """The choice of ``job``'s policy now, and the record of it the card shows."""
    # Prices the cloud did not say now: the job's own attempts', else a typical spot discount of a nominal price.
    known_spot = [a.price_per_hour for a in job.attempts if a.market == "spot" and a.price_per_hour]
    known_on_demand = [a.on_demand_price_per_hour for a in job.attempts if a.on_demand_price_per_hour]
    on_demand_price = view.on_demand_price or (known_on_demand[-1] if known_on_demand else 1.0)
    spot_price = view.spot_price or (known_spot[-1] if known_spot else on_demand_price * 0.35)
    name = policy_of(job)
    scores = weigh_availability(view.scores, estimated_availability(job, now))
    s = live_situation(
        job,
        now,
        event,
        deadline=job.deadline,
        budget=job.budget,
        zones=view.zones,
        scores=scores,
        refused=job.refused_zones,
        spot_price=spot_price,
        on_demand_price=on_demand_price,
        period=view.period,
        checkpoint_steps=view.checkpoint_steps,
        known_restart=view.restart_s,
        launches_ahead=view.launches_ahead,
        regions=view.regions,
    )
    current = job.current
    if name == SPOT_FIRST and event == "interrupted" and current is not None and current.market == "on-demand":
        # An on-demand instance lost (its runner failed, it went away): the job stays on on-demand, as ever.
        choice = Choice("on-demand", None, WORDING("spot-policy.on-demand.kept"))
        return choice, _record(choice, event, now, None, None)
    if s is None:
        choice = _unmeasured(job, name, view, scores, now)
        return choice, _record(choice, event, now, None, None)
    choice = POLICIES[name](s)
    shown = projection(s, choice, now)
    return choice, _record(choice, event, now, shown.finish, shown.cost)


def _unmeasured(job: Job, name: str, view: SpotView, scores: Mapping[str, float], now: datetime) -> Choice:
    """Before the first steps are measured there is no work to plan by: spot where it may be had (on-demand when
    the job's policy is on-demand; also when no zone has spot and the policy is ``spot-first``, or a deadline is
    set); else wait for the next tick."""
    if name == "on-demand":
        return Choice("on-demand", None, WORDING("spot-policy.on-demand.only"))
    lost = lost_zones(job, now, job.refused_zones, view.period)  # refused or reclaimed within the cool-down
    lost |= region_lost(job, now, job.refused_zones, view.period, view.zones)
    views = [
        zone_view(zone, NOTHING, zone in lost, scores.get(zone), _move(job, zone, view.regions)) for zone in view.zones
    ]
    zone = best_zone(views)
    if zone is not None:
        return Choice("spot", zone.name, WORDING("spot-policy.unmeasured", zone=zone.name or "-"))
    if name == SPOT_FIRST or (job.deadline is not None and name != "spot-only"):
        return Choice("on-demand", None, WORDING("spot-policy.unmeasured.on-demand"))
    return Choice("wait", None, WORDING("spot-policy.unmeasured.wait"))


def _record(choice: Choice, event: Event, now: datetime, finish: datetime | None, cost: float | None) -> PlanChoice:
    return PlanChoice(
        action=choice.action,
        zone=choice.zone or None,
        reason=choice.reason.key,
        values=dict(choice.reason.values),
        event=event,
        at=now,
        finish=finish,
        cost=round(cost, 4) if cost is not None else None,
    )
