"""The tick model of ``finetune-bot simulate`` against hand computation, and the bench's offline optimum
against brute force (every choice sequence of small runs)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import random
import sys
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from types import ModuleType

import pytest

from bench.spot_plan import BENCH_POLICIES  # the bot's policies and the bench's plan
from handlers.reasons import Reason
from handlers.spot.rules import Choice, Situation, on_demand, spot_only
from handlers.spot.simulator import Run, Zone, simulate, to_ticks
from tests.spot_cases import hourly_run

SCRIPTED = Reason("test.scripted", "as the test's plan says")


def test_ticks_come_from_the_typed_decimals_exactly() -> None:
    # 195 s ticks: start round(100 h / h) = 1846, work ceil(24 h / h) = 444, deadline floor(36 h / h) = 664,
    # restart ceil(6 min · 60 / 195) = 2.
    assert to_ticks(195, Fraction(100), Fraction(24), Fraction(36), Fraction(6)) == (1846, 444, 664, 2)
    # 0.3 h in 0.1 h ticks is 3 ticks (floating point would make it 2.999… and floor it to 2).
    assert to_ticks(360, Fraction("0"), Fraction("0.3"), Fraction("0.3"), Fraction("0")) == (0, 3, 3, 0)


def test_on_demand_pays_one_start_up_and_the_work() -> None:
    # 3 h of work, 30 min restart in 1 h ticks: 1 tick of overhead + 3 of progress = 4 ticks at $3.
    start, work, deadline, overhead = to_ticks(3600, Fraction(0), Fraction(3), Fraction(5), Fraction(30))
    run = Run((Zone("a", [0] * 8),), 3600, start, work, deadline, overhead, 1.0, 3.0)
    outcome = simulate(run, on_demand)
    assert (outcome.on_demand_ticks, outcome.spot_ticks, outcome.finish) == (4, 0, 4)
    assert outcome.cost(run) == 12.0 and outcome.met(run)


def test_spot_only_costs_each_held_tick_and_pays_the_overhead_again_after_a_preemption() -> None:
    # t0 start-up, t1 work, t2 preempted (nothing held), t3 start-up again, t4 and t5 work: done at t5.
    run = hourly_run([[1, 1, 0, 1, 1, 1, 1]], work=3, deadline=10)
    outcome = simulate(run, spot_only)
    assert [choice.action for choice in outcome.choices] == ["spot", "spot", "wait", "spot", "spot", "spot"]
    assert (outcome.spot_ticks, outcome.preemptions, outcome.finish) == (5, 1, 6)
    assert outcome.cost(run) == 5.0 and outcome.met(run)
    # The same with a second zone: it moves to zone-b at t2 (a new instance: its start-up) and stays.
    run = hourly_run([[1, 1, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1]], work=3, deadline=10)
    outcome = simulate(run, spot_only)
    assert [choice.zone for choice in outcome.choices] == ["zone-a", "zone-a", "zone-b", "zone-b", "zone-b"]
    assert (outcome.spot_ticks, outcome.preemptions, outcome.finish) == (5, 1, 5)


def test_nodes_count_a_zone_as_available_only_with_enough_instances() -> None:
    counts = [4, 4, 3, 4, 4, 4]
    four = Run((Zone("a", counts),), 3600, 0, 3, 10, 1, 1.0, 3.0, nodes=4)
    three = Run((Zone("a", counts),), 3600, 0, 3, 10, 1, 1.0, 3.0, nodes=3)
    assert simulate(four, spot_only).preemptions == 1
    assert simulate(three, spot_only).preemptions == 0 and simulate(three, spot_only).finish == 4


def test_past_the_end_of_the_traces_there_is_no_spot() -> None:
    run = hourly_run([[1, 1]], work=5, deadline=10, overhead=0)
    outcome = simulate(run, spot_only)
    assert outcome.finish is None and not outcome.met(run) and outcome.spot_ticks == 2
    assert simulate(run, BENCH_POLICIES["deadline-aware"]).met(run)  # on-demand finishes it


def test_a_policy_that_picks_a_zone_without_spot_is_a_bug_the_simulator_reports() -> None:
    run = hourly_run([[0, 1]], work=1, deadline=2)
    with pytest.raises(ValueError, match="no spot at this tick"):
        simulate(run, lambda s: Choice("spot", "zone-a", SCRIPTED))


# -- the offline optimum of bench/policy_traces.py ------------------------------------------------------------


def bench_module() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "bench" / "policy_traces.py"
    spec = importlib.util.spec_from_file_location("policy_traces", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("policy_traces", module)
    spec.loader.exec_module(module)
    return module


def scripted(run: Run, plan: tuple[object, ...]) -> Callable[[Situation], Choice]:
    """A policy that plays ``plan`` (None: nothing, "od", or a zone index), tick by tick."""
    moves = iter(plan)

    def policy(s: Situation) -> Choice:
        move = next(moves, None)
        if move is None:
            return Choice("wait", None, SCRIPTED)
        if move == "od":
            return Choice("on-demand", None, SCRIPTED)
        assert isinstance(move, int)
        return Choice("spot", run.zones[move].name, SCRIPTED)

    return policy


def brute_force(run: Run, allowed: Callable[[Run, tuple[object, ...]], bool] = lambda run, plan: True) -> float:
    """The least cost over every sequence of choices that meets the deadline (and that ``allowed`` lets through)."""
    best = float("inf")
    options: list[object] = [None, "od", *range(len(run.zones))]
    for plan in itertools.product(options, repeat=run.deadline):
        if any(
            isinstance(move, int) and run.zones[move].counts[run.start + t] < run.nodes for t, move in enumerate(plan)
        ):
            continue
        outcome = simulate(run, scripted(run, plan))
        if outcome.met(run) and outcome.cost(run) < best and allowed(run, plan):
            best = outcome.cost(run)
    return best


def random_run(rng: random.Random, longest: int) -> Run:
    """A small run of one or two hourly zones, spot two hours in three, a deadline of 3 to ``longest`` hours."""
    zones = rng.randint(1, 2)
    deadline = rng.randint(3, longest)
    traces = [[rng.choice([0, 1, 1]) for _ in range(deadline + 2)] for _ in range(zones)]
    named = tuple(Zone(f"z{i}", trace) for i, trace in enumerate(traces))
    return Run(named, 3600, rng.randint(0, 2), rng.randint(1, deadline), deadline, rng.randint(0, 2), 1.0, 3.0)


def test_the_offline_optimum_is_the_least_cost_of_every_plan() -> None:
    optimum = bench_module().offline_optimum
    rng = random.Random(15)
    for _ in range(60):
        run = random_run(rng, 6)
        expected = brute_force(run)
        assert optimum(run) == pytest.approx(expected), run
        for name, policy in BENCH_POLICIES.items():  # no policy beats perfect knowledge
            outcome = simulate(run, policy)
            if outcome.met(run):
                assert outcome.cost(run) >= expected - 1e-9, name


def test_with_regions_the_optimum_pays_each_move_out_of_the_home_region_and_its_longer_start_up() -> None:
    optimum = bench_module().offline_optimum
    rng = random.Random(51)
    moved = 0
    for _ in range(40):
        plain = random_run(rng, 5)
        counts = [rng.choice([0, 1, 1]) for _ in plain.zones[0].counts]
        far = Zone("far-b", counts, region="far")  # another region's zone; the first zone's region is home
        extra = rng.randint(0, 1)
        run = replace(
            plain,
            zones=(plain.zones[0], far),
            home_region=plain.zones[0].in_region,
            move_cost=rng.choice([0.25, 1.5]),
            far_overhead=plain.overhead + extra,
        )
        expected = brute_force(run)
        assert optimum(run) == pytest.approx(expected), run
        moved += optimum(run) > optimum(replace(run, move_cost=0.0, far_overhead=None)) + 1e-9
    assert moved >= 5  # the move's cost is what made the difference in a good share of the runs


def test_a_stretch_outside_the_home_region_pays_the_move_and_the_longer_start_up() -> None:
    home = Zone("us-east-1a", [0, 0, 0, 0, 0, 0, 0, 0])
    far = Zone("us-west-2a", [1, 1, 1, 1, 1, 1, 1, 1])
    run = Run((home, far), 3600, 0, 3, 7, 1, 1.0, 3.0, home_region="us-east-1", move_cost=0.8, far_overhead=2)
    outcome = simulate(run, spot_only)
    assert outcome.region_moves == 1
    assert outcome.spot_ticks == 5  # two ticks of start-up (the slower restore), three of work
    assert outcome.transfer_cost(run) == pytest.approx(0.8)
    assert outcome.cost(run) == pytest.approx(5 * 1.0 + 0.8)
    seen: list[Situation] = []

    def watching(s: Situation) -> Choice:
        seen.append(s)
        return spot_only(s)

    simulate(run, watching)
    assert [(z.move_cost, z.restart_extra_s) for z in seen[0].zones] == [(0.0, 0.0), (0.8, 3600.0)]


def keeps_the_deadline_whatever_comes(run: Run, plan: tuple[object, ...]) -> bool:
    """Whether on-demand alone could still finish after every tick of ``plan``: the plan's first ticks, then
    on-demand to the end, meet the deadline on the traces with no spot after those ticks."""
    for t in range(len(plan)):
        cut = tuple(Zone(z.name, [*z.counts[: run.start + t + 1], *[0] * len(z.counts)]) for z in run.zones)
        rest = Run(cut, run.gap_seconds, run.start, run.work, run.deadline, run.overhead, 1.0, 3.0)
        if not simulate(rest, scripted(rest, (*plan[: t + 1], *["od"] * (len(plan) - t - 1)))).met(rest):
            return False
    return True


def test_the_safe_optimum_is_the_least_cost_of_every_plan_that_keeps_the_deadline_whatever_comes() -> None:
    optimum = bench_module().offline_optimum
    rng = random.Random(23)
    tighter = 0
    for _ in range(30):
        run = random_run(rng, 5)
        best = brute_force(run, keeps_the_deadline_whatever_comes)
        safe = optimum(run, safe=True)
        assert safe == pytest.approx(best), run
        assert safe >= optimum(run) - 1e-9
        tighter += safe > optimum(run) + 1e-9
        for name in ("deadline-aware", "deadline-aware-plan", "greedy"):  # each keeps the deadline whatever comes
            outcome = simulate(run, BENCH_POLICIES[name])
            if outcome.met(run):
                assert outcome.cost(run) >= safe - 1e-9, name
    assert tighter  # some runs' optimum gambles on spot that a safe plan may not


# -- the deadline-aware policies on traces they were not tuned on ----------------------------------------------

# Restart minutes -> how far above greedy's mean cost / optimum each policy may be on the held-out dates.
# deadline-aware: below greedy at 3 to 12 minutes, greedy itself at 30 (past its switch to greedy's rules);
# deadline-aware-plan: below greedy at 3 to 12 minutes, within 1% at 30 (0.008 above it in this sample of two
# starts, 0.002 below in the bench's three).
OVER_GREEDY = {
    "deadline-aware": {3.0: 0.0, 6.0: 0.0, 12.0: 0.0, 30.0: 0.0},
    "deadline-aware-plan": {3.0: 0.0, 6.0: 0.0, 12.0: 0.0, 30.0: 0.01},
}
# Restart minutes -> the most its mean cost / optimum may be there: what it achieves in this sample, rounded up, so a
# regression of a few thousandths fails (deadline-aware 1.050, 1.083, 1.124, 1.175; the plan 1.035, 1.053, 1.110,
# 1.183).
AT_MOST = {
    "deadline-aware": {3.0: 1.05, 6.0: 1.085, 12.0: 1.125, 30.0: 1.18},
    "deadline-aware-plan": {3.0: 1.04, 6.0: 1.055, 12.0: 1.115, 30.0: 1.185},
}


@pytest.mark.parametrize("restart_minutes", [3.0, 6.0, 12.0, 30.0])
def test_on_dates_they_were_not_tuned_on_the_policies_meet_every_deadline_and_beat_greedy(
    restart_minutes: float,
) -> None:
    bench = bench_module()
    dates = [date for date in bench.load_dates(bench.DEFAULT_TRACES) if not date.tuned_on]
    assert {date.gap_seconds for date in dates} == {300, 600}  # coarse ticks: the DP takes seconds
    names = ("deadline-aware", "deadline-aware-plan", "greedy")
    results = bench.evaluate(dates, "other dates", 2, restart_minutes, {name: BENCH_POLICIES[name] for name in names})
    mean = {}
    for name in names:
        mine = [r for r in results if r.policy == name]
        assert len(mine) == 110 and all(r.met for r in mine), name
        mean[name] = sum(r.cost / r.optimum for r in mine) / len(mine)
    for name in OVER_GREEDY:
        assert mean[name] <= mean["greedy"] + OVER_GREEDY[name][restart_minutes], mean
        assert mean[name] <= AT_MOST[name][restart_minutes], mean


def test_the_bench_keeps_the_optima_it_computed_and_uses_them_on_the_next_run(tmp_path: Path) -> None:
    bench = bench_module()
    rng = random.Random(19)
    zones = tuple(Zone(f"z{i}", [rng.choice([0, 1, 1, 1]) for _ in range(60)]) for i in range(2))
    date = bench.Date("synthetic/1-node/hourly", 3600, zones, 1)
    policies = {"greedy": BENCH_POLICIES["greedy"]}
    optima: dict[str, float] = {}
    first = bench.evaluate([date], "other dates", 1, 1.0, policies, optima)
    assert first and len(optima) >= len(first)  # one optimum per scenario (an infeasible one is kept too)
    # The next run reads the optima from the cache instead of solving again: a doctored value shows through.
    doctored = {key: value * 2 for key, value in optima.items()}
    second = bench.evaluate([date], "other dates", 1, 1.0, policies, doctored)
    assert [r.optimum for r in second] == [r.optimum * 2 for r in first]
    assert [r.cost for r in second] == [r.cost for r in first]
    # The file round-trips; a file that is not a cache is refused with its name, not taken as empty.
    path = tmp_path / "optima.json"
    assert bench.load_optima(path) == {}
    bench.save_optima(path, optima)
    assert bench.load_optima(path) == optima
    path.write_text('{"a": "b"}')
    with pytest.raises(SystemExit, match="not a cache of optima"):
        bench.load_optima(path)


def test_the_bench_runs_each_split_it_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One tuning date and one other date, hourly, spot every other hour: each --split runs its own scenarios.
    bench = bench_module()
    for date in ("aws-02-15-2023", "aws-10-26-2022"):
        folder = tmp_path / "availability" / "1-node" / date
        folder.mkdir(parents=True)
        trace = {"metadata": {"gap_seconds": 3600}, "data": [hour % 2 for hour in range(100)]}
        (folder / "us-east-1a_v100_1.json").write_text(json.dumps(trace))
    cases = (("tuning", "tuning", "2023"), ("held-out", "held-out", "2023"), ("other-dates", "other dates", "2022"))
    for split, title, year in cases:
        assert bench.main(["--traces", str(tmp_path), "--split", split, "--starts", "1", "--policy", "greedy"]) == 0
        shown = capsys.readouterr().out
        assert f"\n{title} split: 10 scenarios" in shown, shown
        assert f"-{year}, one zone: 10 scenarios" in shown and shown.count("one zone") == 1, shown


def test_the_regions_bench_puts_a_job_where_spot_is_and_pays_its_move(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # us-east-1 never has spot, us-west-2 always: homed in us-east-1, a job confined there pays on-demand, one free to
    # move pays spot and one move; homed in us-west-2 nothing moves. Hourly ticks, 60 minutes of restart.
    from bench import policy_regions

    folder = tmp_path / "availability" / "1-node" / "aws-01-01-2024"
    folder.mkdir(parents=True)
    for zone, count in (("us-east-1a", 0), ("us-west-2a", 1)):
        trace = {"metadata": {"gap_seconds": 3600}, "data": [count] * 60}
        (folder / f"{zone}_v100_1.json").write_text(json.dumps(trace))
    dates = policy_traces_dates(tmp_path)
    results = policy_regions.evaluate(dates, 1, 60.0, 200.0, None)
    assert len(results) == 2 * 5  # two home regions (us-east-1 first), five (work, deadline) pairs
    east, west = results[:5], results[5:]
    assert all(r.moves == 0 and r.ratios["deadline-aware"] == pytest.approx(1.0) for r in west)  # nothing to move
    # 4 h of work by 6 h: the move's two hours of start-up (the restart, and 160 s more restore) leave no room for a
    # fallback, so every policy pays on-demand at home, which the all-knowing optimum beats by moving just in time.
    tight = east[0]
    assert tight.moves == 0 and all(ratio == pytest.approx(tight.confined) for ratio in tight.ratios.values())
    for r in east[1:]:
        assert r.moves == 1  # deadline-aware moved once, to us-west-2
        assert r.ratios["deadline-aware"] == pytest.approx(1.0)  # spot there is the optimum, the move and all
        assert r.ratios["deadline-aware, one region"] > 1.5 and r.confined > 1.5  # on-demand at $3.06 against spot
    assert all(all(r.met.values()) for r in results)
    flags = ["--starts", "1", "--overheads", "60", "--checkpoints", "200"]
    assert policy_regions.main(["--traces", str(tmp_path), *flags]) == 0
    shown = capsys.readouterr().out
    assert "2 zones in us-east-1, us-west-2" in shown and "  60 m      200 GB    10" in shown, shown


def policy_traces_dates(root: Path) -> list[object]:
    return list(bench_module().load_dates(root))


def test_the_overheads_table_puts_the_safe_optimum_between_the_optimum_and_the_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One other date, hourly, spot in runs of 1 to 3 hours: short enough that a 1 h restart gambles.
    bench = bench_module()
    folder = tmp_path / "availability" / "1-node" / "aws-10-26-2022"
    folder.mkdir(parents=True)
    rng = random.Random(5)
    trace = {"metadata": {"gap_seconds": 3600}, "data": [rng.choice([0, 1, 1]) for _ in range(100)]}
    (folder / "us-east-1a_v100_1.json").write_text(json.dumps(trace))
    def row_of(*policy: str) -> list[str]:
        argv = ["--traces", str(tmp_path), "--split", "other-dates", "--starts", "2", "--overheads", "60", *policy]
        assert bench.main(argv) == 0
        [row] = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("60 m")]
        assert row[2:5] == ["other", "dates", "20"] and len(row) == 15, row
        return row

    row = row_of()
    policy, safe_over_optimum, policy_over_safe = float(row[5]), float(row[-2]), float(row[-1])
    assert 1.0 < safe_over_optimum <= policy and policy_over_safe >= 1.0, row  # this trace's optimum gambles
    assert safe_over_optimum * policy_over_safe == pytest.approx(policy, abs=0.2), row  # means of ratios, roughly
    # The gap to greedy is taken run by run: its mean is the means' difference, its error the spread of the gaps.
    for shown in (row, row_of("--policy", "on-demand")):
        policy, greedy, gap, error = (float(shown[i].lstrip("±")) for i in (5, 8, 11, 12))
        assert gap == pytest.approx(policy - greedy, abs=1e-3), shown
    assert gap > 2 * error > 0.0, shown  # on-demand all the way: over greedy by far more than the draw's noise


def gang_run(traces: list[list[int]], hold: int, replace: int | None = 1) -> Run:
    """Two nodes in one-hour ticks, $2/h for both on spot (a survivor pays $1/h), a 2 h whole-gang restart."""
    zones = tuple(Zone(f"zone-{'ab'[i]}", counts) for i, counts in enumerate(traces))
    return Run(zones, 3600, 0, 3, 20, 2, 2.0, 6.0, nodes=2, replace_overhead=replace, hold=hold)


def test_a_gang_holds_for_its_lost_node_and_pays_one_nodes_restart() -> None:
    # t0-t1 start-up; t2-t3 zone-a has one of the two: the survivor holds ($1 a tick); t4 the node is back: one
    # tick of replacement overhead, then t5-t7 work. 6 spot ticks at $2 + 2 survivor ticks at $1.
    run = gang_run([[2, 2, 1, 1, 2, 2, 2, 2, 2, 2]], hold=5)
    outcome = simulate(run, spot_only)
    assert (outcome.holds, outcome.replaced, outcome.moves, outcome.preemptions) == (1, 1, 0, 0)
    assert (outcome.spot_ticks, outcome.survivor_node_ticks, outcome.finish) == (6, 2, 8)
    assert outcome.cost(run) == 14.0 and outcome.survivor_cost(run) == 2.0
    assert [choice.action for choice in outcome.choices] == ["spot"] * 6  # the hold's ticks are the gang's own
    # The whole gang restarting instead: preempted at t2, waits, starts again at t4 (2 ticks), works t6-t8.
    whole = simulate(gang_run([[2, 2, 1, 1, 2, 2, 2, 2, 2, 2]], hold=5, replace=None), spot_only)
    assert (whole.holds, whole.preemptions, whole.spot_ticks, whole.finish) == (0, 1, 7, 9)


def test_a_gang_moves_when_wait_or_move_says_so_and_loses_its_survivors_at_zero() -> None:
    # Zone-a keeps one node from t2; after the 2-tick hold (t4) wait_or_move weighs 1·2 + 0.4·2·1 + 0.6·2·(2 + 2)
    # = 7.6 node-hours of waiting (availability 2 of the last 5 ticks) against 2·2 = 4 of moving: the gang moves to
    # zone-b (a whole-gang start-up t4-t5, work t6-t8). Survivors billed t2-t3.
    run = gang_run([[2, 2, 1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 2, 2, 2, 2, 2, 2]], hold=2)
    outcome = simulate(run, spot_only)
    assert (outcome.holds, outcome.replaced, outcome.moves, outcome.preemptions) == (1, 0, 1, 0)
    assert (outcome.spot_ticks, outcome.survivor_node_ticks, outcome.finish) == (7, 2, 9)
    assert outcome.cost(run) == 16.0
    assert [choice.zone for choice in outcome.choices] == ["zone-a", "zone-a", *["zone-b"] * 5]
    # The survivor lost too (zone-a at 0 at t3): an ordinary preemption after one held tick.
    run = gang_run([[2, 2, 1, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 2, 2, 2, 2, 2, 2, 2]], hold=5)
    outcome = simulate(run, spot_only)
    assert (outcome.holds, outcome.moves, outcome.preemptions, outcome.survivor_node_ticks) == (1, 0, 1, 1)
    assert outcome.finish == 8  # zone-b from t3: start-up t3-t4, work t5-t7


def test_a_hold_never_spends_the_slack_a_move_needs() -> None:
    # Deadline 7 ticks for 3 of work: at t2 the slack is 7 - 2 - 3 = 2 ticks, short of a hold (5) and a move (2):
    # the gang moves at once (no survivor tick billed), where spot-only takes zone-b.
    zones = (Zone("zone-a", [2, 2, 1, 1, 2, 2, 2, 2]), Zone("zone-b", [2] * 8))
    run = Run(zones, 3600, 0, 3, 7, 2, 2.0, 6.0, nodes=2, replace_overhead=1, hold=5)
    outcome = simulate(run, spot_only)
    assert (outcome.holds, outcome.moves, outcome.survivor_node_ticks) == (1, 1, 0)
    assert outcome.choices[2].zone == "zone-b"


# -- live: only what the bot knows of the zones --------------------------------------------------------------


def test_live_the_policy_knows_its_own_zone_and_what_was_refused_or_reclaimed_and_nothing_else() -> None:
    # One-hour ticks, so the 30 min cool-down is one tick. zone-a has spot for two ticks, zone-b from t3.
    run = replace(hourly_run([[1, 1, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]], work=3, deadline=10), live=True)
    seen: list[tuple[str, tuple[bool | None, ...]]] = []

    def recording(s: Situation) -> Choice:
        seen.append((s.event, tuple(zone.available for zone in s.zones)))
        assert all(zone.age_s is None and zone.availability is not None for zone in s.zones)
        return spot_only(s)

    outcome = simulate(run, recording)
    assert seen == [
        ("launch", (None, None)),  # nothing known: zone-a first
        ("tick", (True, None)),  # its own instance's zone
        ("interrupted", (False, None)),  # reclaimed: zone-a without spot for the cool-down; zone-b tried...
        ("capacity", (False, False)),  # ...and refused: wait
        ("tick", (None, None)),  # the cool-down over: zone-a tried (refused), then zone-b
        ("capacity", (False, None)),
        ("tick", (None, True)),
        ("tick", (None, True)),
    ]
    assert (outcome.refusals, outcome.preemptions, outcome.spot_ticks, outcome.finish) == (2, 1, 5, 6)
    # Told everything, it goes to zone-b only when zone-b has spot, and never hears a refusal.
    full = simulate(replace(run, live=False), spot_only)
    assert full.refusals == 0 and [c.zone for c in full.choices] == ["zone-a", "zone-a", None] + ["zone-b"] * 3


def test_live_a_refused_return_to_spot_costs_one_node_nothing_and_a_gang_a_new_on_demand_start() -> None:
    # On on-demand from t0; at t2 the policy goes back to spot in zone-a, which has none. The bot launches one node's
    # spot instance ahead: refused, the on-demand instance trains on (at the on-demand cost of never leaving).
    run = replace(hourly_run([[0] * 10], work=3, deadline=9), live=True)

    def back_at_two(s: Situation) -> Choice:
        if s.elapsed_s == 2 * 3600 and s.zones[0].available is not False:
            return Choice("spot", "zone-a", SCRIPTED)
        return Choice("on-demand", None, SCRIPTED)

    outcome = simulate(run, back_at_two)
    assert outcome.refusals == 1 and [c.action for c in outcome.choices][:3] == ["on-demand"] * 3
    assert (outcome.on_demand_ticks, outcome.finish) == (4, 4)  # t0 start-up, t1-t3 work, no second start-up
    assert outcome.cost(run) == simulate(run, on_demand).cost(run) == 12.0
    # A gang stops its nodes first: the refusal leaves nothing held, and on-demand again is a new start-up.
    gang = replace(run, zones=(Zone("zone-a", [0] * 10),), nodes=2, replace_overhead=1, hold=5)
    stopped = simulate(gang, back_at_two)
    assert stopped.refusals == 1 and (stopped.on_demand_ticks, stopped.finish) == (5, 5)


def test_live_a_one_node_switch_trains_on_the_old_instance_through_the_new_ones_start_up_but_its_last_tick() -> None:
    # On-demand from t0 (a 3-tick start-up), back to spot at t4: the bot launches spot ahead and on-demand trains on
    # through the spot start-up's first two ticks (both bill); the third pays the checkpoint and the restore.
    run = replace(hourly_run([[2] * 20], work=5, deadline=20, overhead=3), live=True)  # room for a gang of two

    def back_at_four(s: Situation) -> Choice:
        return Choice("spot", "zone-a", SCRIPTED) if s.elapsed_s >= 4 * 3600 else Choice("on-demand", None, SCRIPTED)

    ahead = simulate(run, back_at_four)
    assert (ahead.on_demand_ticks, ahead.spot_ticks, ahead.finish) == (6, 5, 9)
    assert ahead.cost(run) == 6 * 3.0 + 5 * 1.0
    # Told everything, or a gang (which stops its nodes first): the restart as the offline optimum counts it.
    for stop_first in (replace(run, live=False), replace(run, nodes=2)):
        outcome = simulate(stop_first, back_at_four)
        assert (outcome.on_demand_ticks, outcome.spot_ticks, outcome.finish) == (4, 7, 11)

    # Spot to on-demand at t4, spot taken at t5: spot trains on at t4 only, then the on-demand start-up goes on alone.
    taken = replace(hourly_run([[1] * 5 + [0] * 15], work=5, deadline=20, overhead=3), live=True)

    def away_at_four(s: Situation) -> Choice:
        return Choice("on-demand", None, SCRIPTED) if s.elapsed_s >= 4 * 3600 else Choice("spot", "zone-a", SCRIPTED)

    moved = simulate(taken, away_at_four)
    assert (moved.spot_ticks, moved.on_demand_ticks, moved.finish, moved.preemptions) == (5, 6, 10, 0)


def test_live_a_spot_instance_launched_ahead_and_reclaimed_while_it_starts_leaves_the_old_one_training() -> None:
    # On-demand from t0, back to spot at t4; zone-a loses spot at t5, during the spot start-up. The bot gives up its
    # launch ahead and the on-demand instance trains on: no new on-demand start-up, zone-a out for the cool-down.
    run = replace(hourly_run([[1] * 5 + [0] * 15], work=5, deadline=20, overhead=3), live=True)

    def back_at_four(s: Situation) -> Choice:
        if s.elapsed_s >= 4 * 3600 and s.zones[0].available is not False:
            return Choice("spot", "zone-a", SCRIPTED)
        return Choice("on-demand", None, SCRIPTED)

    outcome = simulate(run, back_at_four)
    assert (outcome.on_demand_ticks, outcome.spot_ticks, outcome.finish) == (8, 1, 8)
    assert outcome.preemptions == 1 and outcome.refusals == 2  # then refused at t6 and t7, free
    assert [c.action for c in outcome.choices][4:6] == ["spot", "on-demand"]  # t5: out for the cool-down
