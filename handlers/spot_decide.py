"""The spot policy as the bot's live behaviour: which job it steers, what it chooses now, and how that is kept.

A job is steered by the policy (:func:`managed`) when it was started with a deadline or a budget, or when the
configured policy is not the default: a job with neither under the default behaves exactly as the bot always
did (spot first, the launch plan's own fallback to on-demand). :func:`choose` builds the job's
:class:`~handlers.spot_policy.Situation` (:mod:`handlers.spot_live`) and calls the very policy ``finetune-bot
simulate`` measures; :mod:`handlers.decide` turns the choice into effects (a launch pinned to a zone, on-demand,
nothing until the next tick, a switch of market through a checkpoint, a stop). The choice is stored on the job
as data (:class:`~handlers.jobs.PlanChoice`), so the card words it in the channel's language.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from handlers.jobs import Job, PlanChoice
from handlers.reasons import Wording
from handlers.spot_live import live_situation, lost_zones, projection
from handlers.spot_policy import DEFAULT_POLICY, POLICIES, Choice, Event
from handlers.spot_policy import WORDING as POLICY_WORDING

WORDING = Wording(
    {
        "spot-policy.unmeasured": "spot in {zone}: no step is measured yet to plan by",
        "spot-policy.unmeasured.on-demand": "on-demand: no zone has spot, and no step is measured yet to plan by",
        "spot-policy.unmeasured.wait": "waiting for spot: no zone has capacity, and no step is measured yet",
    }
)


@dataclass(frozen=True, slots=True)
class SpotView:
    """What the bot read from the cloud for the policy: the zones (in preference order; ``""`` alone: the cloud
    picks), the prices per hour now, and how often the policy is asked again."""

    zones: tuple[str, ...] = ("",)
    spot_price: float | None = None
    on_demand_price: float | None = None
    period: timedelta = timedelta(minutes=5)
    checkpoint_steps: int | None = None
    scores: dict[str, float] = field(default_factory=dict)
    restart_s: float | None = None  # measured by earlier jobs of the recipe on its instance type


def managed(job: Job) -> bool:
    """Does the spot policy steer this job? (Else the bot launches it as it always did.)"""
    return steers(job.spot_policy, job.deadline, job.budget)


def steers(policy: str | None, deadline: datetime | None, budget: float | None) -> bool:
    """Would the policy ``policy`` steer a job with this deadline and budget?"""
    if policy is None:
        return False
    return deadline is not None or budget is not None or policy != DEFAULT_POLICY


def choose(job: Job, view: SpotView, now: datetime, event: Event) -> tuple[Choice, PlanChoice]:
    """The policy's choice for ``job`` now, and the record of it the card shows."""
    # Prices the cloud did not say now: the job's own attempts', else a typical spot discount of a nominal price.
    known_spot = [a.price_per_hour for a in job.attempts if a.market == "spot" and a.price_per_hour]
    known_on_demand = [a.on_demand_price_per_hour for a in job.attempts if a.on_demand_price_per_hour]
    on_demand_price = view.on_demand_price or (known_on_demand[-1] if known_on_demand else 1.0)
    spot_price = view.spot_price or (known_spot[-1] if known_spot else on_demand_price * 0.35)
    policy = POLICIES.get(job.spot_policy or DEFAULT_POLICY, POLICIES[DEFAULT_POLICY])
    s = live_situation(
        job,
        now,
        event,
        deadline=job.deadline,
        budget=job.budget,
        zones=view.zones,
        scores=view.scores,
        refused=job.refused_zones,
        spot_price=spot_price,
        on_demand_price=on_demand_price,
        period=view.period,
        checkpoint_steps=view.checkpoint_steps,
        known_restart=view.restart_s,
    )
    if s is None:
        choice = _unmeasured(job, view, now)
        return choice, _record(choice, event, now, None, None)
    choice = policy(s)
    shown = projection(s, choice, now)
    return choice, _record(choice, event, now, shown.finish, shown.cost)


def _unmeasured(job: Job, view: SpotView, now: datetime) -> Choice:
    """Before the first steps are measured there is no work to plan by: spot where it may be had (on-demand when
    the job's policy is on-demand, or none has it and a deadline is set); else wait for the next tick."""
    if job.spot_policy == "on-demand":
        return Choice("on-demand", None, POLICY_WORDING("spot-policy.on-demand.only"))
    lost = lost_zones(job, now, job.refused_zones)  # refused for capacity, or reclaimed, within the cool-down
    zones = [zone for zone in view.zones if zone not in lost]
    if zones:
        return Choice("spot", zones[0], WORDING("spot-policy.unmeasured", zone=zones[0] or "-"))
    if job.deadline is not None and job.spot_policy != "spot-only":
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
