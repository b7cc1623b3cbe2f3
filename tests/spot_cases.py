"""Hand-made spot traces and situations shared by the policy, simulator and catalogue tests."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from handlers.errors import ReasonError
from handlers.job_options import parse_budget, parse_deadline, parse_job_options, reserved_parameter
from handlers.jobs import Job
from handlers.policy_reasons import WORDING
from handlers.reasons import Reason
from handlers.spot import SpotView, choose, spot_first
from handlers.spot.rules import (
    NOTHING,
    DeadlineAware,
    Holding,
    Situation,
    ZoneView,
    greedy,
    on_demand,
    spot_only,
)
from handlers.spot.simulator import Run, Zone

HOUR = 3600.0
# Deadline-aware where spot's stretches last days: its own rules at the hour-long restarts of these cases, which the
# default (37 min stretches) would meet with greedy's (DeadlineAware.restart_too_long).
OWN_RULES = DeadlineAware(spot_stretch_s=100 * HOUR)
NOW = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)


def situation(**changes: Any) -> Situation:
    """One-hour periods, a one-hour restart, 4 h of work left of 4, 12 h to the deadline, no zone, told where spot
    is (as the simulator tells it): then changes."""
    values: dict[str, Any] = {
        "told": True,
        "event": "tick",
        "work_left_s": 4 * HOUR,
        "work_done_s": 0.0,
        "time_left_s": 12 * HOUR,
        "elapsed_s": 0.0,
        "restart_s": HOUR,
        "period_s": HOUR,
        "holding": NOTHING,
        "zones": (),
        "spot_price": 1.0,
        "on_demand_price": 3.0,
    }
    values.update(changes)
    return Situation(**values)


# Six-minute restarts and periods: slack of many restarts, where the deadline-aware policy may leave spot early.
SHORT_RESTART: dict[str, Any] = {"restart_s": 0.1 * HOUR, "period_s": 0.1 * HOUR}
# No spot, 1.1 h to spare (11 restarts), under the 0.1 h restart + 10% of the 10 h left kept for outages.
RESERVE: dict[str, Any] = {**SHORT_RESTART, "work_left_s": 8.8 * HOUR, "time_left_s": 10 * HOUR}


def zones(*available: bool, share: float | None = 1.0) -> tuple[ZoneView, ...]:
    names = "abcdefgh"
    return tuple(ZoneView(f"zone-{names[i]}", up, share) for i, up in enumerate(available))


def hourly_run(
    traces: Sequence[Sequence[int]],
    work: int,
    deadline: int,
    overhead: int = 1,
    budget: float | None = None,
    start: int = 0,
) -> Run:
    """A run in one-hour ticks (so a tick's cost is its price), spot $1/h, on-demand $3/h."""
    named = tuple(Zone(f"zone-{'abcdefgh'[i]}", list(counts)) for i, counts in enumerate(traces))
    return Run(named, 3600, start, work, deadline, overhead, 1.0, 3.0, budget=budget)


def policy_reasons() -> list[Reason]:
    """Every Reason the spot policies and the job options give, each from the real code path that gives it."""
    up, down = zones(True), zones(False, share=0.0)
    on_spot = Holding("spot", "zone-a")
    on_od = Holding("on-demand")
    reasons = [
        on_demand(situation()).reason,
        spot_only(situation(zones=up)).reason,
        spot_only(situation(zones=down)).reason,
        greedy(situation(zones=up)).reason,  # spot with slack
        greedy(situation(zones=zones(False))).reason,  # wait
        greedy(situation(zones=zones(False), time_left_s=5 * HOUR)).reason,  # on-demand for the deadline
        OWN_RULES(situation(zones=up, time_left_s=None)).reason,  # no deadline
        OWN_RULES(situation(zones=up, time_left_s=None, holding=on_od)).reason,  # no deadline, on-demand
        OWN_RULES(situation(zones=zones(False, share=1.0), restart_s=0.0)).reason,  # wait
        OWN_RULES(situation(zones=down, **RESERVE)).reason,  # on-demand: slack kept
        OWN_RULES(situation(zones=down, **SHORT_RESTART, time_left_s=8 * HOUR, elapsed_s=30 * HOUR)).reason,
        OWN_RULES(situation(zones=up, holding=on_od, time_left_s=10 * HOUR)).reason,  # back to spot
        OWN_RULES(situation(zones=down, holding=on_od)).reason,  # stays on on-demand
        OWN_RULES(situation(zones=up, holding=on_spot, time_left_s=3 * HOUR)).reason,  # late
        OWN_RULES(situation(zones=up, budget=8.0)).reason,  # spot: on-demand over budget
        OWN_RULES(situation(zones=down, budget=8.0)).reason,  # wait: on-demand over budget
        OWN_RULES(situation(zones=up, budget=8.0, spent=4.0)).reason,  # stop
        spot_first(situation(zones=up)).reason,  # spot first
        spot_first(situation(zones=down)).reason,  # on-demand: no zone has spot
        *unmeasured_reasons(),
        WORDING("gang.hold", node=1, zone="us-east-1a", minutes=10.0),  # a gang's lost node waits
        WORDING("gang.move", node=1, zone="us-east-1a", minutes=10.0),  # then the gang moves
        # a gang's recovery from a lost node: which, and why (handlers/decide/gang_recovery.py)
        WORDING("gang.replace-one", replace_s=237, whole_s=252, launch_s=232, restore_s=0.1, nodes=2),
        WORDING("gang.whole-gang", replace_s=6, whole_s=2, launch_s=1, restore_s=0.1, nodes=2),
        WORDING("gang.replace-one.default", replace_s=185, whole_s=200, launch_s=120, restore_s=60.0, nodes=2),
        WORDING("gang.whole-gang.default", replace_s=185, whole_s=160, launch_s=120, restore_s=60.0, nodes=2),
    ]
    errors: list[ReasonError] = []
    for call in (
        lambda: parse_deadline("soon", NOW),
        lambda: parse_deadline("91d", NOW),
        lambda: parse_budget("lots"),
        lambda: parse_budget("0"),
        lambda: parse_job_options({"nodes": "65"}, NOW),
        lambda: parse_job_options({"nodes": "2", "efa": "maybe"}, NOW),
        lambda: parse_job_options({"efa": "true"}, NOW),
    ):
        try:
            call()
        except ReasonError as exc:
            errors.append(exc)
    reserved = reserved_parameter("mine", {"deadline": 1})
    assert reserved is not None and len(errors) == 7
    assert all(error.reason.key.startswith("option.") for error in [*errors, reserved])
    return [*reasons, *(error.reason for error in errors), reserved.reason]


def unmeasured_reasons() -> list[Reason]:
    """The live policy's reasons before any step is measured: spot, on-demand (a deadline), wait (none)."""
    fresh = Job(id="ft-ab12", recipe="tiny", requested_by="console:ana", spot_policy="deadline-aware", created_at=NOW)
    due = fresh.model_copy(update={"deadline": datetime(2026, 3, 3, tzinfo=UTC)})
    refused = {"zone-a": NOW}
    view = SpotView(zones=("zone-a",))
    return [
        choose(due, view, NOW, "launch")[0].reason,
        choose(due.model_copy(update={"refused_zones": refused}), view, NOW, "capacity")[0].reason,
        choose(fresh.model_copy(update={"refused_zones": refused, "budget": 5.0}), view, NOW, "capacity")[0].reason,
    ]
