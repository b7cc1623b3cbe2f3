"""Spot policies across regions: cost over the offline optimum when a job may move out of its home region, paying
its checkpoint's transfer both ways and its slower restore there.

The sample traces (``bench/data/spot-traces``, skypilot-org/spot-traces) are AWS zones of three regions: us-east-1,
us-east-2 and us-west-2, read from each file's zone name (``handlers.regions.region_of``). The dates with more than
one region are the ones used: ``availability/1-node/aws-02-15-2023`` (9 zones, all three regions),
``availability/16-node/aws-08-27-2023`` (us-east-2, us-west-2) and ``preemption/4-node/aws-08-03-2023`` (all
three); ``aws-10-26-2022`` holds us-west-2 alone, and the 32 s ``aws-04-22-2023`` is left out with
``--min-gap-seconds 100`` as in ``policy_traces.py`` (its optimum at 30 minutes takes the DP tens of minutes).

Each region of a date is the home region in turn (the bucket's: a stretch in another region's zone pays
``2 × checkpoint × $0.02/GB``, restored in and committed out, and its restore runs at the 5 Gb/s AWS allows an
instance to another region against 10 Gb/s at home, ``handlers/spot/zones.py``); zones are in preference order, the
home region's first. Scenarios: ``policy_traces.PAIRS`` (work, deadline) at ``--starts`` start hours over each whole
date; the policies are told every zone's state each tick (the simulator's default view). Compared, every one over the
same optimum (all regions, moves paid, ``policy_traces.offline_optimum``):

- ``greedy``: every region's zones, the first with spot in preference order (home first), moves paid;
- ``deadline-aware, one region``: the home region's zones alone (the bot before issue 51);
- ``deadline-aware``: every region's zones, each weighed against its move (``rules.cheapest_zone``).

``optimum one region``: the least a job confined to its home region could pay, over the all-regions optimum.

    python bench/policy_regions.py [--starts N] [--overheads 6,12,30] [--checkpoints 20,200] [--cache FILE]

Recorded (``--starts 6 --cache /tmp/regions.json``, 2026-12-07, 87 s with the optima cached; mean cost /
optimum, deadlines met / runs, then deadline-aware less greedy run by run ± its standard error)::

    restart  checkpoint  runs  greedy        deadline-aware,      deadline-aware  - greedy (± s.e.)  one-region  moves
                                               one region                                            optimum     / run
     6 m       20 GB   240  1.089 240/240  1.658 240/240      1.077 240/240  -0.0117 ± 0.0071   1.584       2.25
     6 m      200 GB   240  1.379 240/240  1.447 240/240      1.349 240/240  -0.0302 ± 0.0163   1.384       2.25
    12 m       20 GB   240  1.136 240/240  1.698 240/240      1.109 240/240  -0.0268 ± 0.0091   1.590       2.21
    12 m      200 GB   240  1.399 240/240  1.482 240/240      1.352 240/240  -0.0468 ± 0.0152   1.389       2.22
    30 m       20 GB   240  1.240 240/240  1.754 240/240      1.240 240/240  +0.0000 ± 0.0000   1.570       1.81
    30 m      200 GB   240  1.404 240/240  1.550 240/240      1.404 240/240  +0.0000 ± 0.0000   1.384       1.77

Every deadline met. Confined to its home region a job pays 1.38-1.59 × what it could with every region (the
one-region optimum), and deadline-aware on one region 1.45-1.75 ×: the traces' regions are rarely all without spot
at once, where each region alone often is. Across regions deadline-aware costs less than greedy at 6 and 12 minutes
(by 1.6 to 3.1 standard errors) and is greedy at 30 (past the switch of ``rules.DeadlineAware``: greedy's rules, its
zone order included); on the smaller sample of ``--starts 2`` (80 runs a cell, the dates' first and last start hours)
it was 0.007-0.008 over greedy at 6 minutes (both sizes, about two standard errors each) and under it at 12 (measured
before the switch). The difference is the deadline rules
(``rules.DeadlineAware``), not the zone: choosing zones in the configured order (home first, as greedy does) moves
deadline-aware's figures by 0.002 at most, either way (measured before the start-up check below).

How a zone of another region is weighed (``rules.cheapest_zone``): the move (the checkpoint's transfer and its longer
start-up at the spot price) against what the zone's availability saves until the policy looks again (one period off
spot, paid at on-demand's premium), so a zone of the home region with spot wins unless another region's availability
is worth more in a period than the move costs; a zone whose longer start-up the deadline's slack cannot cover is no
candidate (for greedy too: without it greedy moved into far zones it then had to leave for on-demand, 1.343 against
1.324 at 30 minutes, 200 GB, ``--starts 2``). Weighed over the whole work left instead of a period, it moved jobs out
of their home region for availability that the next hours did not keep: +0.017 / +0.031 over greedy at 6 minutes
(20 / 200 GB, ``--starts 2``, before that check), +0.015 / +0.009 at 30. The dates include the 2023-02-15 one the
deadline rules were tuned on, and the zone weighing was chosen on these same dates: these figures are not held out.

``--cache FILE`` keeps the optima between runs (a JSON file; delete it when the traces change).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.policy_traces import (
    DEFAULT_TRACES,
    ON_DEMAND_PRICE,
    PAIRS,
    SPOT_PRICE,
    Date,
    load_dates,
    load_optima,
    optimum_key,
    save_optima,
    solved,
)
from handlers.regions import AWS_TRANSFER_PRICE_PER_GB, region_of
from handlers.spot.rules import deadline_aware, greedy
from handlers.spot.simulator import Run, Zone, simulate, to_ticks
from handlers.spot.zones import CROSS_REGION_BYTES_PER_S, IN_REGION_BYTES_PER_S

POLICIES = ("greedy", "deadline-aware, one region", "deadline-aware")


@dataclass(frozen=True, slots=True)
class Result:
    ratios: dict[str, float]  # each policy's cost / the all-regions optimum
    met: dict[str, bool]
    confined: float  # the home region's optimum / the all-regions optimum
    moves: int  # deadline-aware's stretches outside the home region


def regions(date: Date) -> list[str]:
    return sorted({region_of(zone.name) for zone in date.zones})


def homed(date: Date, home: str) -> tuple[Zone, ...]:
    """The date's zones in preference order: the home region's first, then the others (each in name order)."""
    return tuple(sorted(date.zones, key=lambda zone: (region_of(zone.name) != home, zone.name)))


def far_overhead(restart_minutes: float, checkpoint_gb: float, gap: int) -> int:
    """Start-up ticks outside the home region, as ``finetune-bot simulate`` counts them (bot/simulate.py)."""
    size = Fraction(str(checkpoint_gb)) * 10**9
    extra = max(size / Fraction(CROSS_REGION_BYTES_PER_S) - size / Fraction(IN_REGION_BYTES_PER_S), Fraction(0))
    return int(-(-(Fraction(str(restart_minutes)) * 60 + extra) // gap))


def evaluate(
    dates: Sequence[Date], starts: int, restart_minutes: float, checkpoint_gb: float, optima: dict[str, float] | None
) -> list[Result]:
    results = []
    for date in dates:
        for home in regions(date):
            zones = homed(date, home)
            near = tuple(zone for zone in zones if region_of(zone.name) == home)
            for work, deadline in PAIRS:
                last = date.hours - deadline
                if last <= 0:
                    continue
                for i in range(starts):
                    start_hour = round(last * i / max(starts - 1, 1), 2)
                    ticks = to_ticks(
                        date.gap_seconds,
                        Fraction(str(start_hour)),
                        Fraction(str(work)),
                        Fraction(str(deadline)),
                        Fraction(str(restart_minutes)),
                    )
                    spot, on_demand = SPOT_PRICE * date.nodes, ON_DEMAND_PRICE * date.nodes
                    run = Run(
                        zones,
                        date.gap_seconds,
                        *ticks,
                        spot,
                        on_demand,
                        date.nodes,
                        home_region=home,
                        move_cost=2 * checkpoint_gb * AWS_TRANSFER_PRICE_PER_GB,
                        far_overhead=far_overhead(restart_minutes, checkpoint_gb, date.gap_seconds),
                    )
                    moved = f"|home={home}|move={run.move_cost:g}|far={run.far_overhead}"
                    optimum = solved(run, optimum_key(date, run) + moved, optima, safe=False)
                    if not math.isfinite(optimum):
                        continue
                    alone = replace(run, zones=near)
                    confined = solved(alone, optimum_key(date, alone) + moved, optima, safe=False)
                    outcomes = {
                        "greedy": (run, simulate(run, greedy)),
                        "deadline-aware, one region": (alone, simulate(alone, deadline_aware)),
                        "deadline-aware": (run, simulate(run, deadline_aware)),
                    }
                    results.append(
                        Result(
                            ratios={name: out.cost(r) / optimum for name, (r, out) in outcomes.items()},
                            met={name: out.met(r) for name, (r, out) in outcomes.items()},
                            confined=confined / optimum,
                            moves=outcomes["deadline-aware"][1].region_moves,
                        )
                    )
    return results


def paired(results: Sequence[Result], policy: str, baseline: str) -> tuple[float, float]:
    gaps = [r.ratios[policy] - r.ratios[baseline] for r in results]
    if len(gaps) < 2:
        return (gaps[0] if gaps else math.nan), math.nan
    return statistics.fmean(gaps), statistics.stdev(gaps) / math.sqrt(len(gaps))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--starts", type=int, default=3, help="start hours per (home region, work, deadline)")
    parser.add_argument("--overheads", default="6,12,30", help="restart minutes, comma-separated")
    parser.add_argument("--checkpoints", default="20,200", help="checkpoint sizes in GB, comma-separated")
    parser.add_argument("--min-gap-seconds", type=int, default=100, help="leave out dates with finer ticks")
    parser.add_argument("--cache", type=Path, help="a JSON file that keeps the offline optima between runs")
    args = parser.parse_args(argv)
    dates = [
        date
        for date in load_dates(args.traces)
        if date.gap_seconds >= args.min_gap_seconds and len(regions(date)) > 1
    ]
    if not dates:
        print(f"policy_regions: no traces of more than one region under {args.traces}", file=sys.stderr)
        return 2
    for d in dates:
        print(f"traces: {d.name}: {len(d.zones)} zones in {', '.join(regions(d))}, {d.nodes} node(s)")
    optima = load_optima(args.cache) if args.cache else None
    head = "".join(f"  {name:>27}" for name in POLICIES)
    print(f"\n  restart  checkpoint  runs{head}  {'- greedy (± s.e.)':>18}  {'one-region opt.':>15}  moves/run")
    began = time.perf_counter()
    try:
        for minutes in [float(m) for m in args.overheads.split(",")]:
            for size in [float(gb) for gb in args.checkpoints.split(",")]:
                results = evaluate(dates, args.starts, minutes, size, optima)
                cells = "".join(
                    f"  {statistics.fmean(r.ratios[name] for r in results):>18.3f}"
                    f" {sum(r.met[name] for r in results):>3}/{len(results):<4}"
                    for name in POLICIES
                )
                gap, error = paired(results, "deadline-aware", "greedy")
                confined = statistics.fmean(r.confined for r in results)
                moves = statistics.fmean(r.moves for r in results)
                print(
                    f"  {minutes:>4g} m  {size:>7g} GB  {len(results):>4}{cells}  {gap:>+8.4f} ±{error:<7.4f}"
                    f"  {confined:>15.3f}  {moves:>9.2f}",
                    flush=True,
                )
                save_optima(args.cache, optima)
    finally:
        save_optima(args.cache, optima)
    print(f"\n({time.perf_counter() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
