"""A gang that loses nodes on the real multi-node spot traces: replace only the lost nodes, or restart the whole gang.

Every scenario runs in the simulator of ``finetune-bot simulate`` (``handlers/spot/simulator.py``) twice: *whole-gang*
(any loss restarts every node, as SkyPilot, dstack and torchrun's elastic agent do) and *replace-one* (the survivors
hold, billing, for their zone to have the lost nodes again, then pay one node's restart; after each hold
``handlers/spot/gang.wait_or_move`` chooses between holding on and moving the gang). The traces are the 4-node
preemption and 16-node availability dates of ``bench/data/spot-traces`` (counts of live / obtainable p3.2xlarge per
zone); a gang of ``nodes`` is whole in a zone while its count is at least ``nodes``. Jobs: several (work, deadline)
pairs, each zone alone and all zones together, ``--starts`` start hours spread over each date.

    python bench/gang_recovery.py [--nodes 2,4] [--starts N] [--restart-minutes R] [--replace-minutes r]
                                  [--hold-minutes H] [--policy NAME]

Printed per gang size: mean cost of each way over on-demand's, the share of runs where replace-one was cheaper /
dearer, deadlines met, holds and how they ended (replaced, moved; the rest lost their survivors too), and the
survivors' idle node-hours per hold and their mean share of the job's cost.

Recorded (``--starts 4``, deadline-aware, hold 10 min, p3.2xlarge prices per node; 96 runs per gang size; every
deadline met both ways)::

    restart whole / one   nodes   whole/od   replace/od   cheaper  dearer   holds  replaced  moves  idle nh/hold  share
    12 min / 6 min          2      0.5506     0.5509        14%     33%      113      20       41      0.127      0.33%
    12 min / 6 min          4      0.5721     0.5727        14%     38%      190      45       97      0.361      0.72%
    30 min / 10 min         2      0.5889     0.5841        26%     21%      118      52        6      0.173      0.44%
    30 min / 10 min         4      0.6298     0.6118        35%     16%      177      90       18      0.553      0.92%

Replace-one pays where a whole gang's restart is long against one node's (a large model's restore on every node,
a placement group to fill again): 2.9% less at 4 nodes with 30 / 10 minutes. Where the two restarts are close (12 /
6) it is a wash (+0.1%): on these traces a zone that loses a node often loses the rest soon, and the hold's first
10 minutes are paid before ``wait_or_move`` is asked. The survivors' idle time stays under 1% of the job's cost.
Before the deadline bound in ``wait_or_move`` (move when the slack would not cover a hold and a move), replace-one
missed 3 of 96 deadlines at 4 nodes with 30 / 10 minutes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.policy_traces import ON_DEMAND_PRICE, SPOT_PRICE, Date, load_dates
from handlers.spot.rules import SIMULATED_POLICIES
from handlers.spot.simulator import Run, simulate, to_ticks

TRACES = Path(__file__).resolve().parent / "data" / "spot-traces"
PAIRS = [(8.0, 12.0), (16.0, 24.0), (24.0, 36.0)]


@dataclass(frozen=True, slots=True)
class Pair:
    """One job under both recoveries."""

    whole: float
    one: float
    whole_met: bool
    one_met: bool
    on_demand: float
    holds: int
    replaced: int
    moves: int
    idle_node_hours: float
    survivor_cost: float


def multi_node_dates() -> list[Date]:
    return [date for date in load_dates(TRACES) if date.nodes > 1]


def runs(date: Date, nodes: int, starts: int, restart: float, replace_minutes: float, hold: float) -> list[Run]:
    out = []
    ticks = min(len(zone.counts) for zone in date.zones)
    for work, deadline in PAIRS:
        span = ticks * date.gap_seconds / 3600 - deadline - 1
        for i in range(starts):
            start_hour = span * (i + 0.5) / starts
            for zones in [*((zone,) for zone in date.zones), date.zones]:
                start, work_t, deadline_t, overhead = to_ticks(
                    date.gap_seconds,
                    Fraction(str(round(start_hour, 3))),
                    Fraction(str(work)),
                    Fraction(str(deadline)),
                    Fraction(str(restart)),
                )
                gap = date.gap_seconds
                out.append(
                    Run(
                        zones,
                        gap,
                        start,
                        work_t,
                        deadline_t,
                        overhead,
                        SPOT_PRICE * nodes,
                        ON_DEMAND_PRICE * nodes,
                        nodes,
                        replace_overhead=int(-(-(Fraction(str(replace_minutes)) * 60) // gap)),
                        hold=max(1, int(-(-(Fraction(str(hold)) * 60) // gap))),
                    )
                )
    return out


def compare(run: Run, policy: str) -> Pair:
    whole_run = replace(run, replace_overhead=None)
    whole, one = simulate(whole_run, SIMULATED_POLICIES[policy]), simulate(run, SIMULATED_POLICIES[policy])
    return Pair(
        whole.cost(whole_run),
        one.cost(run),
        whole.met(whole_run),
        one.met(run),
        simulate(run, SIMULATED_POLICIES["on-demand"]).cost(run),
        one.holds,
        one.replaced,
        one.moves,
        float(one.survivor_node_ticks * run.hours_per_tick),
        one.survivor_cost(run),
    )


def report(nodes: int, pairs: list[Pair]) -> None:
    n = len(pairs)
    whole = statistics.mean(p.whole / p.on_demand for p in pairs)
    one = statistics.mean(p.one / p.on_demand for p in pairs)
    cheaper = sum(p.one < p.whole - 1e-9 for p in pairs) / n
    dearer = sum(p.one > p.whole + 1e-9 for p in pairs) / n
    holds = sum(p.holds for p in pairs)
    idle = sum(p.idle_node_hours for p in pairs)
    share = statistics.mean(p.survivor_cost / p.one for p in pairs if p.one > 0)
    print(
        f"{nodes:>5}  {n:>4}  {whole:>10.4f}  {one:>11.4f}  {cheaper:>7.0%}  {dearer:>6.0%}  "
        f"{sum(p.whole_met for p in pairs):>4}/{sum(p.one_met for p in pairs):<4}  {holds:>5}  "
        f"{sum(p.replaced for p in pairs):>8}  {sum(p.moves for p in pairs):>5}  "
        f"{(idle / holds if holds else 0.0):>14.3f}  {share:>11.2%}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2,4", help="gang sizes, comma-separated (at most 4 on the 4-node date)")
    parser.add_argument("--starts", type=int, default=4)
    parser.add_argument("--restart-minutes", type=float, default=12.0, help="the whole gang's restart overhead")
    parser.add_argument("--replace-minutes", type=float, default=6.0, help="one node's restart overhead")
    parser.add_argument("--hold-minutes", type=float, default=10.0)
    parser.add_argument("--policy", default="deadline-aware", choices=sorted(SIMULATED_POLICIES))
    args = parser.parse_args(argv)
    dates = multi_node_dates()
    print(
        f"policy {args.policy}; restart {args.restart_minutes:g} min whole gang, {args.replace_minutes:g} min one "
        f"node; hold {args.hold_minutes:g} min; dates: {', '.join(d.name for d in dates)}"
    )
    print(
        "nodes  runs  whole/od    replace/od  cheaper  dearer  met w/r    holds  replaced  moves  "
        "idle nh / hold  idle share"
    )
    for nodes in (int(part) for part in args.nodes.split(",")):
        pairs = [
            compare(run, args.policy)
            for date in dates
            if nodes <= date.nodes
            for run in runs(date, nodes, args.starts, args.restart_minutes, args.replace_minutes, args.hold_minutes)
        ]
        report(nodes, pairs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
