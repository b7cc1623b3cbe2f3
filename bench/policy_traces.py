"""Spot policies on real spot traces: deadlines met, and cost against the offline optimum and always-on-demand.

Every policy runs in the simulator of ``finetune-bot simulate`` (``handlers/spot/simulator.py``), which calls the
bot's own policy code each tick. The offline optimum is a dynamic program over the same tick model with
perfect knowledge of the traces: the least a job can pay and still finish by its deadline.

Scenarios: each date of the traces, each zone alone and all its zones together, several (work, deadline)
pairs and start hours. Splits: *tuning* is the first 40% of each tuning date (the two sample dates the
deadline-aware policy's parameters were chosen on); *held-out* is their last 50% (the 10% between keeps a job
of one split from running into the other); *other dates* is every other date, whole (never looked at while
tuning). A date's folder says how many nodes its jobs need (``16-node`` → 16).

    python bench/policy_traces.py [--traces DIR] [--split tuning|held-out|other-dates|all] [--starts N]
                                  [--restart-minutes R] [--policy NAME ...] [--cache FILE] [--live]
    python bench/policy_traces.py --overheads 3,6,12,30 [--starts N] [--min-gap-seconds S] [--cache FILE]
                                  [--policy NAME] [--live]

``--live``: the policies are told only what the bot knows of the zones (``Run.live``, ``handlers/spot/simulator.py``):
see docs/spot-policy.md, "What the bot knows" for the figures.

``--overheads`` prints one table, "Policy cost / optimum per restart overhead", every split next to greedy
(the deadline-aware policy's thresholds are in restarts, so they must hold at every overhead, not the one
they were chosen at). ``--min-gap-seconds 100`` leaves out the 32 s preemption date, whose optimum at 30
minutes (57 ticks of start-up, thousands of ticks of work) takes the DP tens of minutes.

Recorded (``--overheads 3,6,12,30 --starts 3 --min-gap-seconds 100``; mean cost / optimum, every deadline met
by both policies in every row), deadline-aware / greedy, then deadline-aware less greedy run by run, with the
standard error of that mean (the table's ``- greedy`` column)::

    restart   tuning          held-out        other dates
     3 min    1.025 / 1.082   1.014 / 1.079   1.047 / 1.077
     6 min    1.035 / 1.086   1.023 / 1.073   1.073 / 1.094
    12 min    1.063 / 1.094   1.042 / 1.080   1.103 / 1.113
    30 min    1.119 / 1.119   1.112 / 1.112   1.156 / 1.156
    12 min    -0.031 ± 0.015  -0.038 ± 0.011  -0.010 ± 0.009

At 30 minutes deadline-aware keeps greedy's rules (its switch sits at 19.9 min of restart at these prices:
``DeadlineAware.restart_too_long``), so it costs what greedy costs, to the cent; below the switch it costs less
on every split. Its own rules cost more than greedy's at 30 minutes on the tuning split and the other dates
(+0.011 ± 0.009 and +0.014 ± 0.007), their returns from on-demand to spot paying more restarts than the
on-demand time they save. With ``--live`` (what the bot knows)::

    restart   tuning          held-out        other dates
     3 min    1.029 / 1.082   1.014 / 1.079   1.073 / 1.077
     6 min    1.035 / 1.086   1.019 / 1.073   1.090 / 1.094
    12 min    1.047 / 1.094   1.038 / 1.079   1.112 / 1.112
    30 min    1.113 / 1.113   1.104 / 1.104   1.153 / 1.153

(live, the other dates at 12 min are greedy's rules throughout: the gangs of two dates stop first, and the third
date's 600 s ticks make the restart 20 min, past the switch). Between the recorded restarts, at 9, 15, 18, 21 and 24
min (cost over always-on-demand on the same scenarios, no optimum needed), deadline-aware is under greedy or level
with it on the held-out split and on the other dates, told or live.

The table's last columns: the *safe optimum* (``offline_optimum(run, safe=True)``: the least a policy that keeps
every deadline whatever spot does next can pay, knowing the traces or not) over the optimum, and deadline-aware
over the safe optimum; same command::

    restart   tuning          held-out        other dates
     3 min    1.001 / 1.024   1.001 / 1.013   1.002 / 1.044
     6 min    1.002 / 1.032   1.001 / 1.022   1.006 / 1.065
    12 min    1.004 / 1.058   1.004 / 1.037   1.009 / 1.090
    30 min    1.014 / 1.099   1.023 / 1.085   1.029 / 1.110

Keeping the deadline costs a few thousandths to 3 %; the rest of the gap is what the policy does not know.

``deadline-aware-plan`` (``--policy deadline-aware-plan``) reads each tick's action from the offline optimum's
program solved in expectation over an availability model fitted on the tuning split alone
(``bench/spot_plan.py``, ``bench/spot_learned.py``, ``bench/spot_model.py``: a bench policy, which this script and
``policy_bound.py`` offer beside the bot's); same command::

    restart   tuning          held-out        other dates
     3 min    1.010 / 1.082   1.007 / 1.079   1.033 / 1.077
     6 min    1.019 / 1.086   1.013 / 1.073   1.047 / 1.094
    12 min    1.037 / 1.094   1.031 / 1.080   1.096 / 1.113
    30 min    1.095 / 1.119   1.095 / 1.112   1.154 / 1.156

Under deadline-aware everywhere (at 30 min, where deadline-aware is greedy, by 0.002 to 0.024), under greedy on
every split at every restart, within 1.05 of the optimum at 3 and 6 min on every split and at 12 min on two of
three. It needs each zone's age, which the live bot does not have; told the ages the bot could know it lost to
deadline-aware at 30 min, so the bot does not offer it.

``--cache FILE`` keeps the optima (which do not depend on the policies) in a JSON file between runs, so trying a
change to a policy costs only the policies' own replay; delete the file when the traces change.

``--traces`` defaults to ``bench/data/spot-traces`` (a copy of the public skypilot-org/spot-traces sample).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.spot_plan import BENCH_POLICIES
from handlers.spot.rules import SpotPolicy
from handlers.spot.simulator import Run, Zone, simulate, to_ticks

DEFAULT_TRACES = Path(__file__).resolve().parent / "data" / "spot-traces"
# (work hours, deadline hours): tight to loose slack, as in the paper's sweeps.
PAIRS = [(4.0, 6.0), (8.0, 12.0), (12.0, 16.0), (16.0, 24.0), (24.0, 36.0)]
SPOT_PRICE = 0.918  # p3.2xlarge (1 V100) in us-east-1, per node: the spot price the traces carry, on-demand
ON_DEMAND_PRICE = 3.06
TUNING_DATES = ("aws-02-15-2023", "aws-04-22-2023")
SPLITS = {"tuning": (0.0, 0.4), "held-out": (0.5, 1.0), "other dates": (0.0, 1.0)}
SPLIT_NAMES = {"tuning": "tuning", "held-out": "held-out", "other-dates": "other dates"}  # --split's words


@dataclass(frozen=True, slots=True)
class Date:
    name: str
    gap_seconds: int
    zones: tuple[Zone, ...]
    nodes: int

    @property
    def tuned_on(self) -> bool:
        return self.name.endswith(TUNING_DATES)

    @property
    def hours(self) -> float:
        return min(len(zone.counts) for zone in self.zones) * self.gap_seconds / 3600


def load_dates(root: Path) -> list[Date]:
    dates = []
    for folder in sorted({path.parent for path in root.rglob("*.json")}):
        zones, gaps = [], set()
        for path in sorted(folder.glob("*.json")):
            trace = json.loads(path.read_text())
            gaps.add(int(trace["metadata"]["gap_seconds"]))
            zones.append(Zone(path.stem.split("_")[0], [int(value) for value in trace["data"]]))
        if len(gaps) != 1:
            raise SystemExit(f"{folder}: traces with different gap_seconds {sorted(gaps)}")
        nodes = int(folder.parent.name.split("-")[0]) if folder.parent.name.endswith("-node") else 1
        name = f"{folder.parent.parent.name}/{folder.parent.name}/{folder.name}"
        dates.append(Date(name, gaps.pop(), tuple(zones), nodes))
    return dates


def offline_optimum(run: Run, safe: bool = False) -> float:
    """The least cost of finishing by the deadline with perfect knowledge of the traces (inf if impossible).

    State after each tick: what is held (nothing, on-demand, spot in a zone), the overhead ticks its instance
    still has to spend, and the progress made; the value is the least cost to get there. Arrays over progress
    make each tick a handful of numpy operations.

    ``safe``: only through states from which on-demand alone still finishes in time (the held on-demand
    instance, or a fresh one with its whole overhead). A policy that meets the deadline whatever the traces do
    next must stay in those states (were spot gone for good from any other, it would be late), so this *safe
    optimum* is the least any such online policy can pay: what is left between it and a policy is what the
    policy did not know, not what the deadline cost.

    Regions (``Run.home_region``): a new instance in a zone outside the home region pays ``Run.move_cost`` once and
    starts for ``Run.far_overhead`` ticks, as the simulator has it.
    """
    inf = np.inf
    work, overhead, k = run.work, run.overhead, len(run.zones)
    overheads = [overhead] + [run.overhead_in(zone) for zone in run.zones]
    fees = [0.0] + [run.move_cost if run.far(zone) else 0.0 for zone in run.zones]
    phases = max(*overheads, 1)
    h = float(run.hours_per_tick)
    prices = [run.on_demand_price * h] + [run.spot_price * h] * k  # holding 0 is on-demand, 1.. the zones
    held = np.full((k + 1, phases, work + 1), inf)
    idle = np.full(work + 1, inf)
    idle[0] = 0.0
    to_make = work - np.arange(work + 1)  # progress ticks still to make, per progress
    end = run.start + run.deadline
    for t in range(run.start, end):
        available = [True] + [t < len(zone.counts) and zone.counts[t] >= run.nodes for zone in run.zones]
        best_of = held.min(axis=1)  # (k + 1, work + 1): best over phases, per holding
        every = np.vstack([best_of, idle[None, :]])
        # The best state that is *not* holding x, for each x: prefix and suffix minima over the holdings.
        prefix = np.minimum.accumulate(every, axis=0)
        suffix = np.minimum.accumulate(every[::-1], axis=0)[::-1]
        new_idle = prefix[-1]
        new_held = np.full_like(held, inf)
        for x in range(k + 1):
            if not available[x]:
                continue
            left = prefix[x - 1] if x > 0 else np.full(work + 1, inf)
            others = np.minimum(left, suffix[x + 1])
            price, starts = prices[x], overheads[x]
            state = new_held[x]
            if starts >= 1:
                state[: phases - 1] = held[x, 1:] + price  # starting: one overhead tick fewer
                # A new instance spends its first overhead tick (and pays its move across regions).
                state[starts - 1] = np.minimum(state[starts - 1], others + price + fees[x])
                state[0, 1:] = np.minimum(state[0, 1:], held[x, 0, :-1] + price)  # running: one tick of progress
            else:
                state[0, 1:] = np.minimum(held[x, 0, :-1], others[:-1] + fees[x]) + price
        if safe:
            _keep_safe(new_held, new_idle, to_make, end - t - 1, overhead)
        held, idle = new_held, new_idle
    return float(min(idle[work], held[:, :, work].min()))


def _keep_safe(held: np.ndarray, idle: np.ndarray, to_make: np.ndarray, remaining: int, overhead: int) -> None:
    """Rule out (in place) the states after a tick from which on-demand alone could not finish in the
    ``remaining`` ticks: holding nothing or spot, a fresh instance's overhead and the work left; holding
    on-demand, what is left of its overhead (its phase) and the work left. A finished job is always safe."""
    done = to_make == 0
    fresh = done | (overhead + to_make <= remaining)
    idle[~fresh] = np.inf
    held[1:, :, ~fresh] = np.inf
    for phase in range(held.shape[1]):
        held[0, phase, ~(done | (phase + to_make <= remaining))] = np.inf


@dataclass(frozen=True, slots=True)
class Result:
    split: str
    date: str
    zones: str  # "one zone" or "all zones"
    policy: str
    cost: float
    optimum: float
    on_demand: float
    met: bool
    safe_optimum: float | None = None  # the least a policy that keeps the deadline whatever comes can pay


def scenarios(date: Date, split: str, starts: int) -> list[tuple[tuple[Zone, ...], float, float, float]]:
    """(zones, start hour, work hours, deadline hours) of one split of one date."""
    if date.tuned_on == (split == "other dates"):
        return []
    low, high = SPLITS[split]
    out: list[tuple[tuple[Zone, ...], float, float, float]] = []
    zone_sets = [(zone,) for zone in date.zones] + [date.zones]
    for work, deadline in PAIRS:
        first, last = low * date.hours, high * date.hours - deadline
        if split == "tuning":
            last = min(last, SPLITS["held-out"][0] * date.hours - deadline)
        if last <= first:
            continue
        hours = [first + (last - first) * i / max(starts - 1, 1) for i in range(starts)]
        out.extend((zones, round(start, 2), work, deadline) for zones in zone_sets for start in hours)
    return out


def optimum_key(date: Date, run: Run) -> str:
    """What the offline optimum of a run depends on, in ticks and prices (the traces themselves: by date name)."""
    zones = "+".join(zone.name for zone in run.zones)
    prices = f"{run.spot_price:g}/{run.on_demand_price:g}"
    return f"{date.name}|{zones}|{run.start}|{run.work}|{run.deadline}|{run.overhead}|{run.nodes}|{prices}"


def evaluate(
    dates: Sequence[Date],
    split: str,
    starts: int,
    restart_minutes: float,
    policies: dict[str, SpotPolicy],
    optima: dict[str, float] | None = None,
    safe: bool = False,
    live: bool = False,
) -> list[Result]:
    """Every policy on every scenario of the split; ``optima`` (see :func:`optimum_key`) saves the DP's answers
    between runs, since they do not depend on the policies; ``safe``: each result carries the safe optimum too
    (:func:`offline_optimum`); ``live``: the policies know only what the bot knows of the zones (``Run.live``)."""
    results = []
    for date in dates:
        for zones, start_hour, work, deadline in scenarios(date, split, starts):
            start, work_ticks, deadline_ticks, overhead = to_ticks(
                date.gap_seconds,
                Fraction(str(start_hour)),
                Fraction(str(work)),
                Fraction(str(deadline)),
                Fraction(str(restart_minutes)),
            )
            spot, on_demand = SPOT_PRICE * date.nodes, ON_DEMAND_PRICE * date.nodes
            ticks = (start, work_ticks, deadline_ticks, overhead)
            run = Run(zones, date.gap_seconds, *ticks, spot, on_demand, date.nodes, live=live)
            optimum = solved(run, optimum_key(date, run), optima, safe=False)
            if not math.isfinite(optimum):
                continue
            safe_optimum = solved(run, optimum_key(date, run) + "|safe", optima, safe=True) if safe else None
            always = simulate(run, BENCH_POLICIES["on-demand"]).cost(run)
            for name, policy in policies.items():
                outcome = simulate(run, policy)
                kind = "one zone" if len(zones) == 1 else "all zones"
                cost, met = outcome.cost(run), outcome.met(run)
                result = Result(split, date.name, kind, name, cost, optimum, always, met, safe_optimum)
                results.append(result)
    return results


def solved(run: Run, key: str, optima: dict[str, float] | None, safe: bool) -> float:
    """The (safe) offline optimum of the run, from ``optima`` where it is there, else solved (and kept there)."""
    value = optima.get(key) if optima is not None else None
    if value is None:
        value = offline_optimum(run, safe=safe)
        if optima is not None:
            optima[key] = value
    return value


def report(results: Sequence[Result], policies: Sequence[str], title: str) -> None:
    print(f"\n{title}")
    print(f"  {'policy':<16} {'deadlines met':>14} {'cost / optimum':>15} {'worst':>7} {'cost / on-demand':>17}")
    for name in policies:
        mine = [r for r in results if r.policy == name]
        if not mine:
            continue
        met = sum(r.met for r in mine)
        ratios = [r.cost / r.optimum for r in mine]
        print(
            f"  {name:<16} {met:>6}/{len(mine):<7} {statistics.fmean(ratios):>15.3f} {max(ratios):>7.2f} "
            f"{statistics.fmean(r.cost / r.on_demand for r in mine):>17.3f}"
        )


def overheads_table(
    dates: Sequence[Date],
    splits: Sequence[str],
    starts: int,
    overheads: Sequence[float],
    optima: dict[str, float] | None = None,
    policy: str = "deadline-aware",
    live: bool = False,
) -> None:
    """Policy cost / optimum per restart overhead, each split, ``policy`` (deadline-aware) next to greedy; then
    the safe optimum / optimum (what keeping every deadline whatever comes costs at best) and the policy / the safe
    optimum (what it pays for not knowing the traces' future)."""
    names = [policy, "greedy"]
    print("\nPolicy cost / optimum per restart overhead (mean, worst; deadlines met), next to greedy")
    print(
        f"  {'restart':>7}  {'split':<12} {'scenarios':>9}  {policy:>22}  {'greedy':>22}"
        f"  {'- greedy (± s.e.)':>17}  {'safe / optimum':>14}  {'policy / safe':>13}"
    )
    for minutes in overheads:
        for split in splits:
            results = evaluate(
                dates, split, starts, minutes, {name: BENCH_POLICIES[name] for name in names}, optima, True, live
            )
            cells = []
            for name in names:
                mine = [r for r in results if r.policy == name]
                ratios = [r.cost / r.optimum for r in mine] or [math.nan]
                met = sum(r.met for r in mine)
                cells.append(f"{statistics.fmean(ratios):.3f} {max(ratios):5.2f} {met:>4}/{len(mine):<4}")
            count = len(results) // len(names)
            gap, error = paired_gap(results, policy, "greedy")
            first = [r for r in results if r.policy == policy and r.safe_optimum is not None]
            bound = statistics.fmean(r.safe_optimum / r.optimum for r in first) if first else math.nan
            apart = statistics.fmean(r.cost / r.safe_optimum for r in first) if first else math.nan
            print(
                f"  {minutes:>5g} m  {split:<12} {count:>9}  {cells[0]:>22}  {cells[1]:>22}"
                f"  {gap:>+8.4f} ±{error:<7.4f}  {bound:>14.3f}  {apart:>13.3f}",
                flush=True,
            )


def paired_gap(results: Sequence[Result], policy: str, baseline: str) -> tuple[float, float]:
    """The mean of ``policy``'s cost / optimum less ``baseline``'s, scenario by scenario, and its standard error.

    Both ran the same scenarios in the same order, so the pairs share each scenario's luck; a gap within about two
    standard errors is the draw of scenarios speaking, not the policies (NaN where there are too few to tell).
    """
    mine = [r.cost / r.optimum for r in results if r.policy == policy]
    theirs = [r.cost / r.optimum for r in results if r.policy == baseline]
    gaps = [a - b for a, b in zip(mine, theirs, strict=True)]
    if len(gaps) < 2:
        return (gaps[0] if gaps else math.nan), math.nan
    return statistics.fmean(gaps), statistics.stdev(gaps) / math.sqrt(len(gaps))


def load_optima(path: Path) -> dict[str, float]:
    """The cache of ``--cache``: empty when the file is not there yet; a file that is not one is an error."""
    if not path.exists():
        return {}
    try:
        optima = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{path}: not a cache of optima ({exc})") from exc
    if not isinstance(optima, dict) or not all(isinstance(value, int | float) for value in optima.values()):
        raise SystemExit(f"{path}: not a cache of optima (an object of numbers)")
    return {str(key): float(value) for key, value in optima.items()}


def save_optima(path: Path | None, optima: dict[str, float] | None) -> None:
    if path is not None and optima is not None:
        path.write_text(json.dumps(optima, sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="a folder of spot-traces JSON files")
    parser.add_argument("--split", choices=[*SPLIT_NAMES, "all"], default="all")
    parser.add_argument("--starts", type=int, default=6, help="start hours per (zones, work, deadline)")
    parser.add_argument("--restart-minutes", type=float, default=6.0)
    parser.add_argument("--policy", action="append", choices=sorted(BENCH_POLICIES), help="default: all")
    parser.add_argument("--overheads", help="restart minutes, comma-separated: one table across them")
    parser.add_argument("--min-gap-seconds", type=int, default=0, help="leave out dates with finer ticks")
    parser.add_argument("--cache", type=Path, help="a JSON file that keeps the offline optima between runs")
    parser.add_argument("--live", action="store_true", help="policies know only what the bot knows of the zones")
    args = parser.parse_args(argv)
    optima = load_optima(args.cache) if args.cache else None
    dates = [date for date in load_dates(args.traces) if date.gap_seconds >= args.min_gap_seconds]
    if not dates:
        print(f"policy_traces: no traces under {args.traces}", file=sys.stderr)
        return 2
    names = args.policy or ["deadline-aware", "greedy", "spot-only", "on-demand"]
    policies = {name: BENCH_POLICIES[name] for name in names}
    for d in dates:
        print(f"traces: {d.name}: {len(d.zones)} zones, {d.nodes} node(s), {d.gap_seconds} s ticks, {d.hours:.0f} h")
    print(
        f"pairs (work h, deadline h): {PAIRS}; restart {args.restart_minutes:g} min; "
        f"spot ${SPOT_PRICE}/h, on-demand ${ON_DEMAND_PRICE}/h"
    )
    splits = list(SPLITS) if args.split == "all" else [SPLIT_NAMES[args.split]]
    if args.overheads:
        try:
            minutes = [float(m) for m in args.overheads.split(",")]
            policy = (args.policy or ["deadline-aware"])[0]
            overheads_table(dates, splits, args.starts, minutes, optima, policy, args.live)
        finally:
            save_optima(args.cache, optima)
        return 0
    for split in splits:
        began = time.perf_counter()
        results = evaluate(dates, split, args.starts, args.restart_minutes, policies, optima, live=args.live)
        save_optima(args.cache, optima)
        took = time.perf_counter() - began
        count = len(results) // len(policies)
        report(results, names, f"{split} split: {count} scenarios ({took:.0f} s)")
        for date in dates:
            for kind in ("one zone", "all zones"):
                shown = [r for r in results if r.date == date.name and r.zones == kind]
                if shown:
                    report(shown, names, f"  {date.name}, {kind}: {len(shown) // len(policies)} scenarios")
    return 0


if __name__ == "__main__":
    sys.exit(main())
