"""The floor of ``bench/policy_bound.py``: on the plan's own availability chain, the plan told the chain's state is
the least expected cost of any policy that sees only the past and meets every deadline (pure)."""

from __future__ import annotations

import functools
import importlib.util
import math
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from bench.spot_learned import ANY_ZONE, ONE_ZONE
from bench.spot_outlook import Model, fit
from bench.spot_plan import BENCH_POLICIES, LATE, transitions
from handlers.spot.rules import SpotPolicy
from handlers.spot.simulator import simulate

ROOT = Path(__file__).resolve().parents[1]
TICK = 1200  # a tick no other test plans with, so the tables kept between tests are this test's own
SPOT, ON_DEMAND = 0.918, 3.06  # the bench's prices per hour


def _bench() -> ModuleType:
    for name in ("policy_traces", "policy_bound"):
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    return sys.modules["policy_bound"]


@functools.cache
def _steps(model: Model, state: int) -> tuple[tuple[float, int, bool], ...]:
    """(chance, next state, moved) of one tick of the chain from ``state``, the zero chances left out."""
    going, move, down = transitions(model, TICK)
    steps = [(float(chance), following, False) for following, chance in enumerate(going[state]) if chance > 0]
    if move[state] > 0:
        steps.append((float(move[state]), 0, True))
    if down[state] > 0:
        steps.append((float(down[state]), len(model.edges_s), False))
    return tuple(steps)


def _successors(model: Model, state: int, zone: int) -> Iterator[tuple[float, int, int]]:
    """(chance, next state, next zone) of one tick of the chain: a move hands spot to the other zone."""
    for chance, following, moved in _steps(model, state):
        yield chance, following, 1 - zone if moved else zone


def _paths(model: Model, start: int, ticks: int) -> Iterator[tuple[float, list[tuple[int, int]]]]:
    """Every path of ``ticks`` ticks from ``start`` with its chance."""

    def grow(chance: float, path: list[tuple[int, int]]) -> Iterator[tuple[float, list[tuple[int, int]]]]:
        if len(path) == ticks:
            yield chance, path
            return
        state, zone = path[-1]
        for step, following, moved in _successors(model, state, zone):
            yield from grow(chance * step, [*path, (following, moved)])

    yield from grow(1.0, [(start, 0)])


def _least(model: Model, restart: int) -> Callable[[int, int, int, int, int], float]:
    """The least expected cost by brute force, written from the simulator's rules rather than the program's arrays:
    (ticks left, work left, held: 0 nothing / 1 on-demand / 2 spot, restart ticks it still has to spend, state)."""
    buckets = len(model.edges_s)
    hour = TICK / 3600
    prices = {1: ON_DEMAND * hour, 2: SPOT * hour}

    @functools.cache
    def least(left: int, work: int, held: int, phase: int, state: int) -> float:
        if work == 0:
            return 0.0
        if left == 0:
            return LATE
        nothing = sum(
            chance * least(left - 1, work, 0, 0, following) for chance, following, _ in _successors(model, state, 0)
        )
        options = [nothing]
        for market in (1, 2):
            if market == 2 and state >= buckets:
                continue  # no spot in an outage
            starting = phase if held == market else restart  # a new instance spends the whole restart
            after, done = (starting - 1, 0) if starting > 0 else (0, 1)
            value = prices[market]
            for chance, following, moved in _successors(model, state, 0):
                kept = market == 1 or (moved == 0 and following < buckets)  # spot: the stretch went on
                if kept:
                    value += chance * least(left - 1, work - done, market, after, following)
                else:
                    value += chance * least(left - 1, work - done, 0, 0, following)
            options.append(value)
        return min(options)

    return least


def _expected(policy: SpotPolicy | None, model: Model, restart: int, work: int, deadline: int, start: int) -> float:
    """The exact expected cost of ``policy`` (None: the informed plan) over every path of the chain, each run in the
    simulator, which must meet the deadline on every path (the floor is of policies that do)."""
    bench = _bench()
    zones = 2 if model.move_share > 0 else 1
    total = 0.0
    for chance, path in _paths(model, start, deadline + 1):
        run = bench.run_of(path, model, zones, TICK, work, deadline, restart)
        run = replace(run, spot_price=SPOT, on_demand_price=ON_DEMAND)
        outcome = simulate(run, policy or bench.Informed(path, model))
        assert outcome.met(run), (policy, path)
        total += chance * outcome.cost(run)
    return total


ONE = replace(ONE_ZONE, move_share=0.0)  # one zone has nowhere to move
# (model, restart ticks, the chain's state at the start, work ticks, deadline ticks). A state 5 minutes into its
# stretch (1: spot, 11: an outage) is where the chain's state and the zone's age tell the plan different things.
CASES = [
    pytest.param(ONE, 1, 0, 3, 6, id="one-zone-restart1-spot-just-begun"),
    pytest.param(ONE, 1, 11, 2, 5, id="one-zone-restart1-outage-5-min-old"),
    pytest.param(ONE, 2, 1, 3, 8, id="one-zone-restart2-spot-5-min-old"),
    pytest.param(ONE, 2, 4, 3, 8, id="one-zone-restart2-spot-old"),
    pytest.param(ONE, 2, 10, 3, 8, id="one-zone-restart2-outage-just-begun"),
    pytest.param(ANY_ZONE, 1, 0, 3, 6, id="any-zone-restart1-spot-just-begun"),
    pytest.param(ANY_ZONE, 2, 0, 3, 8, id="any-zone-restart2-spot-just-begun"),
    pytest.param(ANY_ZONE, 2, 14, 3, 8, id="any-zone-restart2-outage-old"),
]


@pytest.mark.unit
@pytest.mark.parametrize(("model", "restart", "start", "work", "deadline"), CASES)
def test_the_informed_plan_pays_the_least_any_policy_can_expect_on_its_chain(
    model: Model, restart: int, start: int, work: int, deadline: int
) -> None:
    least = _least(model, restart)(deadline, work, 0, 0, start)
    assert least < work * ON_DEMAND * TICK / 3600 + restart * ON_DEMAND * TICK / 3600  # spot is worth something
    # The simulator's replay of the plan, over every path, comes to exactly the brute force's least expectation.
    assert _expected(None, model, restart, work, deadline, start) == pytest.approx(least, rel=1e-9)
    # Nothing that sees only the past does better: the bench's plan and the bot's policies, in the same simulator.
    for name in ("deadline-aware-plan", "deadline-aware", "greedy", "on-demand"):
        assert _expected(BENCH_POLICIES[name], model, restart, work, deadline, start) >= least * (1 - 1e-9), name


@pytest.mark.unit
def test_the_draws_spend_the_chains_long_run_share_of_time_with_spot() -> None:
    bench = _bench()
    model = ANY_ZONE
    going, move, down = transitions(model, 195)
    buckets = len(model.edges_s)
    chain = going.copy()
    chain[:, 0] += move
    chain[:, buckets] += down
    values, vectors = np.linalg.eig(chain.T)
    stationary = np.real(vectors[:, np.argmin(abs(values - 1))])
    stationary /= stationary.sum()
    path = bench.draw(model, 195, 40_000, random.Random(11))
    share = sum(state < buckets for state, _ in path) / len(path)
    assert share == pytest.approx(float(stationary[:buckets].sum()), abs=0.02)
    # A move hands spot to the other zone: both zones have spot at some time; outages come too.
    assert {zone for state, zone in path if state < buckets} == {0, 1}
    assert any(state >= buckets for state, _ in path)


@pytest.mark.unit
def test_with_the_traces_each_date_not_tuned_on_and_the_held_out_split_get_a_one_zone_chain_at_their_tick() -> None:
    bench = _bench()
    traces = ROOT / "bench" / "data" / "spot-traces"
    chains = bench.chains(195, traces)
    assert [(chain.name, chain.tick_s, chain.moves) for chain in chains] == [
        ("one zone", 195, False),
        ("any zone", 195, True),
        ("held-out", 195, False),  # the tuning date's last half (its 32 s date is left out, as in the bench)
        ("aws-10-26-2022", 600, False),
        ("aws-08-27-2023", 300, False),
        ("aws-08-03-2023", 300, False),
    ]
    assert chains[0].model == replace(ONE_ZONE, move_share=0.0) and chains[1].model == ANY_ZONE
    # Fitted on the date itself (the held-out part of the tuning date): not the tuning split's rates, and with no
    # moves (one zone).
    assert all(chain.model.move_share == 0.0 and chain.model != chains[0].model for chain in chains[2:])
    tuning_date = next(date for date in bench.load_dates(traces) if date.tuned_on and date.gap_seconds == 195)
    whole = replace(fit(bench.one_zone_stretches(tuning_date)), move_share=0.0)
    assert chains[2].model != whole  # the held-out part alone
    assert bench.chains(195) == chains[:2]


@pytest.mark.unit
def test_the_floor_is_printed_with_the_standard_error_of_its_mean_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    # Ratios 1.0, 1.2, 1.0, 1.2: mean 1.1, sample deviation 0.1155, over √4 → 0.0577.
    bench = _bench()
    measured = {"optimum": [10.0, 10.0, 5.0, 5.0], "floor": [10.0, 12.0, 5.0, 6.0]}
    assert bench.standard_error(measured, "floor") == pytest.approx(0.2 / math.sqrt(3) / 2)
    # The table: 2 draws of each of the 5 pairs; the ± column is that of those 10 runs' floor.
    assert bench.main(["--runs", "2", "--overheads", "3", "--chain", "one zone", "--seed", "7"]) == 0
    [row] = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("one zone")]
    floor, error = float(row[7]), float(row[8].lstrip("±"))
    assert row[4] == "10" and floor >= 1.0 and 0.0 < error < 1.0, row
