"""The bench's ``deadline-aware-plan``: its availability model and the plan it reads its actions from (pure)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from typing import Any

from bench import spot_learned as learned
from bench.spot_outlook import EDGES_S, Model, Outlook, fit, history_of
from bench.spot_plan import BENCH_POLICIES, PLAN, Key, table_for, too_large
from handlers.spot import POLICIES as BOT_POLICIES
from handlers.spot.rules import SIMULATED_POLICIES, Choice, Holding, Situation, ZoneView, deadline_aware
from handlers.spot.simulator import Run, Zone, simulate
from tests.spot_cases import HOUR, situation

PLANNED = BENCH_POLICIES[PLAN]
ROOT = Path(__file__).resolve().parents[1]


def plan_case(age_s: float | None = 600.0, **changes: Any) -> Situation:
    """On on-demand, 6 h of work, 12 h to the deadline, a 30 min restart, 10 min periods; zone-a has had spot
    for ``age_s`` (None: unknown, as in a live run); then ``changes``."""
    values: dict[str, Any] = {
        "holding": Holding("on-demand"),
        "work_left_s": 6 * HOUR,
        "time_left_s": 12 * HOUR,
        "restart_s": 1800.0,
        "period_s": 600.0,
        "zones": (ZoneView("zone-a", True, 0.5, age_s),),
        "spot_price": 1.0,
        "on_demand_price": 3.0,
    }
    return situation(**{**values, **changes})


def test_the_plan_is_a_bench_policy_beside_the_simulators_and_the_bot_does_not_offer_it() -> None:
    # The bench measures the plan beside the very policies the simulator replays (the same objects), and the bot's
    # registry (config, ``finetune-bot simulate``) has no such name.
    assert set(BENCH_POLICIES) == {*SIMULATED_POLICIES, PLAN}
    assert all(BENCH_POLICIES[name] is SIMULATED_POLICIES[name] for name in SIMULATED_POLICIES)
    assert PLAN not in BOT_POLICIES


def test_the_history_is_the_stretches_of_a_job_that_stays_in_its_zone_and_moves_to_the_oldest() -> None:
    # a: up 3 ticks, then down; b takes over at t3 (a move), both down at t4, a back for the last 2 (still going).
    outlook = history_of([[1, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 0, 0, 0]], 0, 7, 60.0)
    assert outlook == Outlook(up=((180.0, True), (60.0, True), (120.0, False)), down=((60.0, True),), moves=1)
    # Losing its zone, the job takes the zone whose spot has lasted longest (b, up since t0), not the first one.
    outlook = history_of([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], 0, 5, 1.0)
    assert outlook.up == ((3.0, True), (1.0, True), (1.0, False)) and outlook.moves == 2
    # A window: only the ticks asked for (none before the trace begins).
    assert history_of([[1, 0, 1]], -5, 2, 1.0) == Outlook(up=((1.0, True),), down=((1.0, False),))


def test_a_heavy_tail_shows_as_a_rate_that_falls_with_age() -> None:
    # Many stretches of seven minutes, a few of ten hours: a young stretch ends soon, an old one rarely.
    stretches = tuple((420.0, True) for _ in range(30)) + tuple((36000.0, True) for _ in range(5))
    model = fit(Outlook(up=stretches, moves=7))
    assert model.up_end_per_h[model.bucket(400.0)] > 10 * model.up_end_per_h[model.bucket(20000.0)]
    assert model.move_share == round(8 / 37, 6)  # (moves + 1) / (ended + 2)
    # With nothing seen, the prior alone: up stretches of ten hours, outages of one.
    empty = fit(Outlook())
    assert empty.edges_s == EDGES_S and set(empty.up_end_per_h) == {0.1} and set(empty.down_end_per_h) == {1.0}


def test_the_shipped_models_are_the_fit_on_the_tuning_split_and_nothing_else() -> None:
    path = ROOT / "bench" / "spot_model.py"
    spec = importlib.util.spec_from_file_location("spot_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("spot_model", module)
    spec.loader.exec_module(module)
    traces = ROOT / "bench" / "data" / "spot-traces"
    assert module.fitted(traces) == (learned.ONE_ZONE, learned.ANY_ZONE)
    # Spot stretches in one zone are heavy-tailed: once past its first minutes, the older, the less likely to end.
    rates = learned.ONE_ZONE.up_end_per_h
    assert rates[1] > rates[3] > rates[5] > rates[-1]


def _key(model: Model = learned.ONE_ZONE, restart: int = 3) -> Key:
    """A key no other test asks for (a 7-minute tick), so the tables kept between tests are this test's own."""
    return Key(model, 420.0, restart, 1.0 / 6, 3.0 / 6)


def test_a_table_is_solved_once_per_key_and_grown_only_when_asked_beyond_it() -> None:
    table = table_for(_key(), 40, 20)
    assert table is not None
    assert table.phases == 3 and table_for(_key(), 30, 10) is table
    bigger = table_for(_key(), 60, 20)
    assert bigger is not None and bigger is not table and (bigger.ticks, bigger.work) == (60, 20)
    running = table_for(_key(restart=0), 30, 10)
    assert running is not None and running.phases == 1  # no restart: one phase, running
    # The bench's largest (36 h in 195 s ticks, 24 h of work, a 30 min restart) is solved; ten times finer is not.
    assert not too_large(Key(learned.ANY_ZONE, 195.0, 10, 0.05, 0.17), 664, 443)
    assert too_large(Key(learned.ANY_ZONE, 19.5, 93, 0.005, 0.017), 6646, 4431)


def test_the_plan_reads_the_restart_and_the_age_of_the_stretch() -> None:
    # On on-demand with 6 h of work in 8 h and a 30 min restart: spot that came 10 minutes ago (likely to go
    # again soon) does not repay a restart; spot that has lasted a day does; with 3 h of slack, one of 40 min does.
    young = PLANNED(plan_case(age_s=600.0, time_left_s=8 * HOUR))
    assert (young.action, young.reason.key) == ("on-demand", "bench.plan.on-demand")
    assert PLANNED(plan_case(age_s=2400.0, time_left_s=9 * HOUR)).action == "spot"
    old = PLANNED(plan_case(age_s=86400.0, time_left_s=8 * HOUR))
    assert (old.action, old.zone, old.reason.key) == ("spot", "zone-a", "spot-policy.spot")
    # With no slack for a restart, on-demand whatever the age; with a budget, no deadline, a zone of unknown age
    # (a live run), or ticks so fine that the table would not fit (30 s: 2.5 billion entries):
    # deadline-aware's rules.
    assert PLANNED(plan_case(age_s=86400.0, time_left_s=6 * HOUR + 900.0)).action == "on-demand"
    for changes in ({"budget": 100.0}, {"time_left_s": None}, {"age_s": None}, {"period_s": 30.0}):
        case = plan_case(**changes)
        assert PLANNED(case) == deadline_aware(case)


def test_without_spot_the_plan_waits_while_the_slack_allows_then_takes_on_demand() -> None:
    down = (ZoneView("zone-a", False, 0.5, 600.0),)
    roomy = situation(zones=down, work_left_s=4 * HOUR, time_left_s=12 * HOUR, restart_s=1800.0, period_s=600.0)
    assert PLANNED(roomy).action == "wait"
    tight = situation(zones=down, work_left_s=4 * HOUR, time_left_s=4.6 * HOUR, restart_s=1800.0, period_s=600.0)
    assert PLANNED(tight).action == "on-demand"


def test_the_plan_keeps_every_deadline_on_demand_could_keep() -> None:
    """Whatever spot does (random hourly traces, one or two zones, restarts of 0 to 2 ticks), the plan never takes
    a risk the deadline cannot absorb: where on-demand from the start finishes in time, so does the plan."""
    rng = random.Random(19)
    kept = 0
    for _ in range(80):
        deadline = rng.randint(3, 12)
        traces = [[rng.choice([0, 1, 1]) for _ in range(deadline + 2)] for _ in range(rng.randint(1, 2))]
        zones = tuple(Zone(f"z{i}", trace) for i, trace in enumerate(traces))
        run = Run(zones, 3600, 0, rng.randint(1, deadline), deadline, rng.randint(0, 2), 1.0, 3.0)
        if not simulate(run, BENCH_POLICIES["on-demand"]).met(run):
            continue
        outcome = simulate(run, PLANNED)
        assert outcome.met(run), run
        kept += 1
    assert kept > 40


def test_every_choice_the_plan_makes_is_one_the_simulator_accepts() -> None:
    seen: list[Choice] = []

    def recording(s: Situation) -> Choice:
        choice = PLANNED(s)
        seen.append(choice)
        return choice

    trace = [1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    run = Run((Zone("a", trace), Zone("b", trace[::-1])), 1800, 0, 6, 14, 1, 1.0, 3.0)
    outcome = simulate(run, recording)
    assert outcome.met(run) and {choice.action for choice in seen} <= {"spot", "on-demand", "wait"}
    assert outcome.spot_ticks > 0


def test_the_simulator_gives_the_policy_each_zones_age() -> None:
    seen: list[Situation] = []

    def recording(s: Situation) -> Choice:
        seen.append(s)
        return deadline_aware(s)

    trace = [1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]
    run = Run((Zone("a", trace),), 3600, 5, 2, 6, 0, 1.0, 3.0)
    simulate(run, recording)
    assert seen[0].zones[0].age_s == 0.0 and seen[1].zones[0].age_s == 3600.0  # up since t5
