"""Spend over a window, by team, user, recipe and zone: what ``/finetune costs`` and ``GET /costs`` report.

A pure function of job records and a clock. A job counts in a window when it was active at some moment of it
(created before the window ends; not ended, or ended after it began), with its whole cost up to the window's end
(:func:`handlers.job_cost.job_cost`): a job that spans the boundary of two windows counts in both, so the report
lists each job's row too, and a finance sheet that adds windows up can take each job once by its id.

Savings compare like with like: ``paid`` is every job's spend, but the saving is 1 − (the spend of the jobs
whose on-demand counterfactual is known) / (that counterfactual), so a job with no known on-demand price (or no
measured step yet) neither inflates nor shrinks it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from handlers.job_cost import Cost, billed, job_cost
from handlers.jobs import TERMINAL_STATES, Job

WINDOWS: Mapping[str, timedelta] = {"7d": timedelta(days=7), "30d": timedelta(days=30)}
DEFAULT_WINDOW = "7d"
NO_TEAM = "-"  # the group of jobs started with no team


@dataclass(frozen=True, slots=True)
class Spend:
    """What a group of jobs cost (every sum over the group's jobs)."""

    jobs: int = 0
    paid: float = 0.0
    compared_paid: float = 0.0  # the spend of the jobs whose on-demand counterfactual is known
    on_demand: float = 0.0  # their counterfactual: the same useful work on one on-demand instance
    steps_lost: int = 0
    lost_hours: float = 0.0
    restarts: int = 0
    restart_hours: float = 0.0  # from each lost instance to its replacement's start (the jobs' downtime)
    egress: float = 0.0  # checkpoints moved between regions (part of ``paid``: handlers/egress.py)

    @property
    def saved(self) -> float:
        """Money not spent against on-demand (negative when spot cost more)."""
        return self.on_demand - self.compared_paid

    @property
    def savings(self) -> float | None:
        """1 − compared spend / counterfactual; None when no job of the group has a counterfactual."""
        return 1 - self.compared_paid / self.on_demand if self.on_demand > 0 else None

    def plus(self, job: Job, cost: Cost) -> Spend:
        compared = cost.savings is not None
        return Spend(
            jobs=self.jobs + 1,
            paid=self.paid + cost.paid,
            compared_paid=self.compared_paid + (cost.paid if compared else 0.0),
            on_demand=self.on_demand + (cost.on_demand if compared else 0.0),
            steps_lost=self.steps_lost + job.steps_lost,
            lost_hours=self.lost_hours + cost.lost_hours,
            restarts=self.restarts + cost.restarts,
            restart_hours=self.restart_hours + cost.downtime_hours,
            egress=self.egress + cost.egress,
        )


@dataclass(frozen=True, slots=True)
class ZoneSpend:
    """What was billed in one zone (its name says its region: ``us-west-2b``): the attempts that ran there. A job
    that moved counts in each zone it ran in, with only what it paid there."""

    jobs: int = 0
    paid: float = 0.0
    hours: float = 0.0  # billed instance-hours


@dataclass(frozen=True, slots=True)
class JobSpend:
    """One job's line of the report."""

    job: str
    team: str
    user: str
    recipe: str
    state: str
    spend: Spend
    zones: tuple[str, ...] = ()  # where its attempts ran, first first


@dataclass(frozen=True, slots=True)
class CostReport:
    window: str
    start: datetime
    end: datetime
    teams: tuple[str, ...] | None  # the teams it is limited to; None: every job
    total: Spend = Spend()
    by_team: dict[str, Spend] = field(default_factory=dict)
    by_user: dict[str, Spend] = field(default_factory=dict)
    by_recipe: dict[str, Spend] = field(default_factory=dict)
    jobs: tuple[JobSpend, ...] = ()
    by_zone: dict[str, ZoneSpend] = field(default_factory=dict)  # attempts with no zone known are left out


def window_start(window: str, end: datetime) -> datetime:
    """When ``window`` (``7d``, ``30d``) ending at ``end`` begins; a window not in :data:`WINDOWS` is a KeyError."""
    return end - WINDOWS[window]


def active_in(job: Job, start: datetime, end: datetime) -> bool:
    """Whether ``job`` was active at some moment of [start, end]: created by its end, not ended before its start
    (an ended job's ``updated_at`` is when it ended: nothing changes a job in a final state but a resume)."""
    if job.created_at > end:
        return False
    return job.state not in TERMINAL_STATES or job.updated_at >= start


def cost_report(jobs: Iterable[Job], window: str, end: datetime, teams: Iterable[str] | None = None) -> CostReport:
    """The report of ``window`` ending at ``end`` over ``jobs`` (any superset of those active in it: the rest are
    left out here), limited to ``teams`` when given (a job with no team is then left out)."""
    start = window_start(window, end)
    allowed = None if teams is None else tuple(sorted(set(teams)))
    total = Spend()
    by_team: dict[str, Spend] = {}
    by_user: dict[str, Spend] = {}
    by_recipe: dict[str, Spend] = {}
    by_zone: dict[str, ZoneSpend] = {}
    rows: list[JobSpend] = []
    for job in sorted(jobs, key=lambda job: (job.created_at, job.id)):
        if not active_in(job, start, end) or (allowed is not None and job.team not in allowed):
            continue
        cost = job_cost(job, end)
        team = job.team or NO_TEAM
        total = total.plus(job, cost)
        by_team[team] = by_team.get(team, Spend()).plus(job, cost)
        by_user[job.requested_by] = by_user.get(job.requested_by, Spend()).plus(job, cost)
        by_recipe[job.recipe] = by_recipe.get(job.recipe, Spend()).plus(job, cost)
        zones = _zone_spend(job, end)
        for zone, there in zones.items():
            before = by_zone.get(zone, ZoneSpend())
            by_zone[zone] = ZoneSpend(before.jobs + 1, before.paid + there.paid, before.hours + there.hours)
        spend = Spend().plus(job, cost)
        rows.append(JobSpend(job.id, team, job.requested_by, job.recipe, job.state.value, spend, tuple(zones)))
    groups = (_by_spend(by_team), _by_spend(by_user), _by_spend(by_recipe))
    zones_first = dict(sorted(by_zone.items(), key=lambda item: (-item[1].paid, item[0])))
    return CostReport(window, start, end, allowed, total, *groups, jobs=tuple(rows), by_zone=zones_first)


def _zone_spend(job: Job, end: datetime) -> dict[str, ZoneSpend]:
    """What ``job``'s attempts (and an instance launched ahead) billed in each zone, up to ``end``."""
    spent: dict[str, ZoneSpend] = {}
    ahead = [job.standby] if job.standby is not None else []
    for attempt in [*job.attempts, *ahead]:
        if attempt.instance_id is None or not attempt.zone:
            continue
        until = min(attempt.ended_at or end, end)
        hours = max((until - attempt.launched_at).total_seconds(), 0.0) / 3600
        before = spent.get(attempt.zone, ZoneSpend(jobs=1))
        spent[attempt.zone] = ZoneSpend(1, before.paid + billed(attempt, until), before.hours + hours)
    return spent


def _by_spend(groups: dict[str, Spend]) -> dict[str, Spend]:
    """The biggest spender first (then by name), the order a person reads the report in."""
    return dict(sorted(groups.items(), key=lambda item: (-item[1].paid, item[0])))


def report_json(report: CostReport) -> dict[str, Any]:
    """The report as JSON-ready data for a finance sheet: money in dollars rounded to cents, hours to 0.01."""
    return {
        "window": report.window,
        "start": report.start.isoformat(),
        "end": report.end.isoformat(),
        "teams": list(report.teams) if report.teams is not None else None,
        "total": spend_json(report.total),
        "by_team": {name: spend_json(spend) for name, spend in report.by_team.items()},
        "by_user": {name: spend_json(spend) for name, spend in report.by_user.items()},
        "by_recipe": {name: spend_json(spend) for name, spend in report.by_recipe.items()},
        "by_zone": {
            zone: {"jobs": spend.jobs, "paid": round(spend.paid, 2), "hours": round(spend.hours, 2)}
            for zone, spend in report.by_zone.items()
        },
        "jobs": [
            {"job": row.job, "team": row.team, "user": row.user, "recipe": row.recipe, "state": row.state}
            | {"zones": list(row.zones)}
            | spend_json(row.spend)
            for row in report.jobs
        ],
    }


def spend_json(spend: Spend) -> dict[str, Any]:
    savings = spend.savings
    return {
        "jobs": spend.jobs,
        "paid": round(spend.paid, 2),
        "on_demand": round(spend.on_demand, 2),
        "compared_paid": round(spend.compared_paid, 2),
        "saved": round(spend.saved, 2),
        "savings": round(savings, 4) if savings is not None else None,
        "steps_lost": spend.steps_lost,
        "lost_hours": round(spend.lost_hours, 2),
        "restarts": spend.restarts,
        "restart_hours": round(spend.restart_hours, 2),
        "egress": round(spend.egress, 2),
    }
