"""The availability model and the plan the deadline-aware policy weighs a return to spot with (pure)."""

from __future__ import annotations

import math

from handlers.spot.outlook import PRIOR, Outlook, fit, history_of
from handlers.spot.plan import NONE, ON_DEMAND, SPOT, Plan, plan_for
from handlers.spot.rules import POLICIES, Choice, Situation, deadline_aware
from handlers.spot.simulator import Run, Zone, simulate
from tests.spot_cases import SHORT_STRETCHES, plan_case

PLANNED = POLICIES["deadline-aware-plan"]

TICK = 600.0


def test_the_history_is_the_stretches_of_a_job_that_stays_in_its_zone_and_moves_to_the_oldest() -> None:
    # a: up 3 ticks, then down; b takes over at t3 (a move), both down at t4, a back for the last 2 (still going).
    outlook = history_of([[1, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 0, 0, 0]], 0, 7, 60.0)
    assert outlook == Outlook(up=((180.0, True), (60.0, True), (120.0, False)), down=((60.0, True),), moves=1)
    # Losing its zone, the job takes the zone whose spot has lasted longest (b, up since t0), not the first one.
    outlook = history_of([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], 0, 5, 1.0)
    assert outlook.up == ((3.0, True), (1.0, True), (1.0, False)) and outlook.moves == 2
    # A window: only the ticks asked for (none before the trace begins).
    assert history_of([[1, 0, 1]], -5, 2, 1.0) == Outlook(up=((1.0, True),), down=((1.0, False),))


def test_a_heavy_tail_shows_as_a_hazard_that_falls_with_age() -> None:
    # Many stretches of one step, a few of sixty: a young stretch likely ends within a step, an old one does not.
    stretches = tuple((TICK, True) for _ in range(30)) + tuple((60 * TICK, True) for _ in range(5))
    hazards = fit(Outlook(up=stretches), TICK)
    assert hazards.up_end[0] > 0.4 > 0.1 > hazards.up_end[hazards.bucket(40)]
    # With nothing seen, the prior alone: decreasing too, outages shorter than spot stretches.
    prior = fit(None, TICK)
    assert list(prior.up_end) == sorted(prior.up_end, reverse=True)
    assert all(down > up for down, up in zip(prior.down_end, prior.up_end, strict=True))
    assert prior.move_share == PRIOR.move_share


def _plan(outlook: Outlook | None, slack_ticks: float = 36) -> Plan:
    return plan_for(
        outlook,
        tick_s=TICK,
        deadline_ticks=72,
        restart_ticks=3,
        spot_price=1.0,
        on_demand_price=3.0,
        time_left_ticks=72,
        slack_ticks=slack_ticks,
    )


def test_the_plan_keeps_the_deadline_structural_and_is_solved_once_per_model() -> None:
    plan = _plan(Outlook(up=((3600.0, True),)))
    assert plan.key.step_ticks == 3 and plan.key.restart_steps == 1.0  # the step resolves the restart
    # On-demand running finishes with no slack at all; anything else needs a restart's worth of it.
    assert math.isfinite(plan.value(10, 0, ON_DEMAND, 0))
    assert plan.value(10, 0.5, NONE, 0) == math.inf and plan.value(10, 0.5, SPOT, 0) == math.inf
    # Done is free; 6 steps of work cost between all of it on spot (0.5 a step) and all on on-demand (1.5 a step).
    assert plan.value(10, 10, NONE, 0) == 0.0
    assert 6 * 0.5 < plan.value(10, 4, ON_DEMAND, 0) <= 6 * 1.5 + 1e-9
    # The same model again, for a state inside the table: the same plan; a larger state: solved again.
    assert _plan(Outlook(up=((3600.0, True),)), slack_ticks=20) is plan
    assert _plan(Outlook(up=((3600.0, True),)), slack_ticks=60) is not plan


def test_a_return_to_spot_must_pay_in_the_plan_over_the_stretches_seen() -> None:
    # Stretches of ten minutes (shorter than the restart) with short outages: the restart never pays back.
    short = SHORT_STRETCHES
    choice = PLANNED(plan_case(short))
    assert choice.action == "on-demand" and choice.reason.key == "spot-policy.on-demand.plan"
    # Stretches of a day: back to spot.
    long = Outlook(up=tuple((86400.0, True) for _ in range(4)), down=tuple((TICK, True) for _ in range(4)))
    choice = PLANNED(plan_case(long))
    assert (choice.action, choice.zone, choice.reason.key) == ("spot", "zone-a", "spot-policy.spot.back")
    # No outlook (the live bot), or the default policy: the rule alone, as before.
    assert PLANNED(plan_case(None)).action == "spot"
    assert deadline_aware(plan_case(short)).action == "spot"


def test_the_simulator_gives_the_policy_each_zones_age_and_the_stretches_before_the_start() -> None:
    seen: list[Situation] = []

    def recording(s: Situation) -> Choice:
        seen.append(s)
        return deadline_aware(s)

    trace = [1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]
    run = Run((Zone("a", trace),), 3600, 5, 2, 6, 0, 1.0, 3.0)
    simulate(run, recording)
    first = seen[0]
    assert first.zones[0].age_s == 0.0 and seen[1].zones[0].age_s == 3600.0  # up since t5
    # The trace before t5: two hours of spot, then an outage still going at t5 (its end is not seen yet).
    assert first.outlook == Outlook(up=((7200.0, True),), down=((10800.0, False),))
