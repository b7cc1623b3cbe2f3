"""``finetune-bot simulate``: the bot's own spot policies replayed on spot traces, scenario by scenario.

Scenarios come as JSON Lines on stdin, one object per line (blank lines are skipped but keep their number)::

    {"traces": ["us-east-1a_v100_1.json", ...], "nodes": 1, "work_hours": 24, "deadline_hours": 36,
     "restart_minutes": 6, "spot_price": 0.918, "on_demand_price": 3.06, "start_hour": 100}

``traces`` are files in the skypilot-org/spot-traces format (``{"metadata": {"gap_seconds": N}, "data": [...]}``),
one zone each, in the zones' order of preference (a file as ``{"trace": "a.json", "region": "us-east-2"}`` says its
zone's region; otherwise the file's zone name says it, ``us-east-2a_v100_1.json`` in ``us-east-2``); ``nodes``
(default 1) is how many instances the job needs from a zone; prices are per hour of everything the job holds;
``start_hour`` defaults to 0 and ``restart_minutes`` to 0; an optional ``budget`` stops a job whose spend would exceed
it. For each scenario and each policy, one JSON line goes to stdout (see :func:`result`), its ``scenario`` the line
it came from (counted from 1, as in an error). The tick model is in :mod:`handlers.spot.simulator`.

A gang (``nodes`` ≥ 2) with ``replace_minutes`` (one node's restart overhead: its launch, restore and the regroup)
is priced both ways, two lines per policy: ``"gang": "whole-gang"`` (any loss restarts every node, paying
``restart_minutes``) and ``"gang": "replace-one"`` (the survivors hold, billing, for the lost nodes' replacements;
after each ``hold_minutes``, default 10 as the bot's, :func:`handlers.spot.gang.wait_or_move` chooses between
waiting on and moving the gang), each with the survivors' idle hours and their cost.

Regions: ``checkpoint_gb`` and ``transfer_price_per_gb`` (both default 0: nothing moves) price a stretch in a zone
outside ``home_region`` (default: the first zone's region; the bucket's) at the checkpoint restored in and committed
out, and ``cross_region_gb_per_s`` (default 0.625, the bot's ``policy.spot.cross_region_gb_per_s``) slows its
restore against the in-region 1.25 GB/s; each line then says ``region_moves`` and their ``transfer_cost`` (in
``cost``).

All input is read and checked before anything runs: a bad line or trace is one line on stderr, exit 2, and
no output at all.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from bot.errors import InputRefused
from handlers.regions import region_of
from handlers.spot.rules import DEFAULT_POLICY, SIMULATED_POLICIES
from handlers.spot.simulator import Outcome, Run, Zone, simulate, to_ticks
from handlers.spot.zones import IN_REGION_BYTES_PER_S


class TraceRef(BaseModel):
    """A trace file and the region of its zone."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    trace: str
    region: str = Field(min_length=1, max_length=64)


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    traces: list[str | TraceRef] = Field(min_length=1, max_length=64)
    nodes: StrictInt = Field(default=1, ge=1)
    work_hours: Decimal = Field(gt=0, le=10_000)
    deadline_hours: Decimal = Field(gt=0, le=10_000)
    restart_minutes: Decimal = Field(default=Decimal(0), ge=0, le=100_000)
    spot_price: Decimal = Field(ge=0, le=1_000_000)
    on_demand_price: Decimal = Field(ge=0, le=1_000_000)
    start_hour: Decimal = Field(default=Decimal(0), ge=0, le=1_000_000)
    budget: Decimal | None = Field(default=None, gt=0, le=1_000_000_000)
    replace_minutes: Decimal | None = Field(default=None, ge=0, le=100_000)
    hold_minutes: Decimal = Field(default=Decimal(10), gt=0, le=100_000)
    live: StrictBool = False  # the policy knows only what the bot knows of the zones (handlers/spot/simulator.py)
    home_region: str | None = Field(default=None, min_length=1, max_length=64)
    checkpoint_gb: Decimal = Field(default=Decimal(0), ge=0, le=1_000_000)
    transfer_price_per_gb: Decimal = Field(default=Decimal(0), ge=0, le=1000)
    cross_region_gb_per_s: Decimal = Field(default=Decimal("0.625"), gt=0, le=1000)

    @property
    def paths(self) -> list[str]:
        return [ref.trace if isinstance(ref, TraceRef) else ref for ref in self.traces]


class Trace(BaseModel):
    model_config = ConfigDict(frozen=True)
    gap_seconds: StrictInt = Field(ge=1, le=86_400)
    data: list[StrictInt] = Field(min_length=1)


def read_scenarios(lines: Iterable[str]) -> list[tuple[int, Scenario]]:
    """(line number from 1, as an editor counts, scenario) for each non-blank line; InputRefused for the first bad
    one."""
    scenarios = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line, parse_float=Decimal, parse_constant=_no_constant)
        except ValueError as exc:
            raise InputRefused(f"line {number}: not JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise InputRefused(f"line {number}: a scenario is a JSON object")
        try:
            scenarios.append((number, Scenario.model_validate(raw)))
        except ValidationError as exc:
            raise InputRefused(f"line {number}: {_first_error(exc)}") from None
    return scenarios


def load_trace(path: str) -> Trace:
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputRefused(f"trace {path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise InputRefused(f"trace {path}: not JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("metadata"), dict):
        raise InputRefused(f"trace {path}: not a spot trace (needs metadata.gap_seconds and data)")
    try:
        trace = Trace.model_validate({"gap_seconds": raw["metadata"].get("gap_seconds"), "data": raw.get("data")})
    except ValidationError as exc:
        raise InputRefused(f"trace {path}: {_first_error(exc)}") from None
    if any(count < 0 for count in trace.data):
        raise InputRefused(f"trace {path}: data: counts cannot be negative")
    return trace


def build_run(scenario: Scenario, traces: dict[str, Trace], number: int) -> Run:
    """The scenario in ticks of its traces (which must share one gap_seconds)."""
    used = [traces[path] for path in scenario.paths]
    gaps = {trace.gap_seconds for trace in used}
    if len(gaps) != 1:
        raise InputRefused(f"line {number}: traces with different gap_seconds ({', '.join(map(str, sorted(gaps)))})")
    gap = gaps.pop()
    start, work, deadline, overhead = to_ticks(
        gap,
        Fraction(scenario.start_hour),
        Fraction(scenario.work_hours),
        Fraction(scenario.deadline_hours),
        Fraction(scenario.restart_minutes),
    )
    replace = _ceil_ticks(Fraction(scenario.replace_minutes), gap) if scenario.replace_minutes is not None else None
    hold = max(1, _ceil_ticks(Fraction(scenario.hold_minutes), gap))
    zones = tuple(
        Zone(_zone_name(path, i), traces[path].data, _region_of(ref, path))
        for i, (ref, path) in enumerate(zip(scenario.traces, scenario.paths, strict=True))
    )
    length = min(len(zone.counts) for zone in zones)
    if start >= length:
        hours = length * gap / 3600
        past = f"start_hour {scenario.start_hour} is past the end of the traces ({hours:g} h)"
        raise InputRefused(f"line {number}: {past}")
    return Run(
        zones=zones,
        gap_seconds=gap,
        start=start,
        work=work,
        deadline=deadline,
        overhead=overhead,
        spot_price=float(scenario.spot_price),
        on_demand_price=float(scenario.on_demand_price),
        nodes=scenario.nodes,
        budget=float(scenario.budget) if scenario.budget is not None else None,
        replace_overhead=replace,
        hold=hold,
        live=scenario.live,
        home_region=scenario.home_region or zones[0].in_region,
        move_cost=float(2 * scenario.checkpoint_gb * scenario.transfer_price_per_gb),  # restored in, committed out
        far_overhead=_far_overhead(scenario, gap),
    )


def _far_overhead(scenario: Scenario, gap: int) -> int:
    """A start-up outside the home region in ticks: the restart and the restore's extra time there (the checkpoint
    at the cross-region rate, less at the in-region one), rounded up as the restart is."""
    size = scenario.checkpoint_gb * 10**9
    cross = Fraction(scenario.cross_region_gb_per_s) * 10**9
    extra = max(Fraction(size) / cross - Fraction(size) / Fraction(IN_REGION_BYTES_PER_S), Fraction(0))
    return _ceil_ticks(Fraction(scenario.restart_minutes) + extra / 60, gap)


def _region_of(ref: str | TraceRef, path: str) -> str:
    """A zone's region: the scenario's word, else what the trace file's zone name says."""
    return ref.region if isinstance(ref, TraceRef) else region_of(Path(path).stem.split("_")[0])


def _ceil_ticks(minutes: Fraction, gap: int) -> int:
    return int(-(-(minutes * 60) // gap))


def results(number: int, policy: str, run: Run) -> list[dict[str, Any]]:
    """The scenario's line for ``policy``; a gang that can replace one node gets two, whole-gang and replace-one."""
    if not run.replaces_one:
        return [result(number, policy, run, simulate(run, SIMULATED_POLICIES[policy]))]
    whole = replace(run, replace_overhead=None)
    return [
        result(number, policy, whole, simulate(whole, SIMULATED_POLICIES[policy]), gang="whole-gang"),
        result(number, policy, run, simulate(run, SIMULATED_POLICIES[policy]), gang="replace-one"),
    ]


def result(number: int, policy: str, run: Run, outcome: Outcome, gang: str | None = None) -> dict[str, Any]:
    """One output line: the policy's cost and timing, and what always-on-demand would have cost; for a gang, which
    way it recovers (``gang``) and what its survivors paid waiting."""
    h = run.hours_per_tick
    always = (run.overhead + run.work) * h * Fraction(str(run.on_demand_price))
    line = {
        "scenario": number,
        "policy": policy,
        "cost": outcome.cost(run),
        "on_demand_cost": float(always),
        "finish_hours": float(outcome.finish * h) if outcome.finish is not None else None,
        "met_deadline": outcome.met(run),
        "preemptions": outcome.preemptions,
        "spot_hours": float(outcome.spot_ticks * h),
        "on_demand_hours": float(outcome.on_demand_ticks * h),
    }
    if run.live:
        line["refusals"] = outcome.refusals
    if run.move_cost > 0 or run.far_overhead != run.overhead:
        line["region_moves"] = outcome.region_moves
        line["transfer_cost"] = outcome.transfer_cost(run)
    if gang is None:
        return line
    return {
        **line,
        "gang": gang,
        "holds": outcome.holds,
        "replaced": outcome.replaced,
        "moves": outcome.moves,
        "survivor_idle_hours": float(outcome.survivor_node_ticks * h),  # node-hours
        "survivor_cost": outcome.survivor_cost(run),
    }


def run_scenarios(lines: Iterable[str], policies: Sequence[str], out: TextIO) -> None:
    """Check all input, then write one line per (scenario, policy). InputRefused before any output."""
    unknown = [name for name in policies if name not in SIMULATED_POLICIES]
    if unknown:
        raise InputRefused(f"unknown policy {unknown[0]!r}; the policies are {', '.join(SIMULATED_POLICIES)}")
    scenarios = read_scenarios(lines)
    traces: dict[str, Trace] = {}
    for _, scenario in scenarios:
        for path in scenario.paths:
            if path not in traces:
                traces[path] = load_trace(path)
    runs = [(number, build_run(scenario, traces, number)) for number, scenario in scenarios]
    for number, run in runs:
        for name in policies:
            for line in results(number, name, run):
                out.write(json.dumps(line) + "\n")
    out.flush()


def main(policies: Sequence[str] | None, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    names = list(dict.fromkeys(policies or [DEFAULT_POLICY]))
    try:
        run_scenarios(stdin, names, stdout)
    except InputRefused as exc:  # a bad scenario line or trace file: its one line, exit 2
        print(f"finetune-bot simulate: {exc}", file=sys.stderr)
        return 2
    return 0


def _zone_name(path: str, index: int) -> str:
    """A zone's name from its trace file (``us-east-1a_v100_1.json`` → ``us-east-1a``), unique in the run."""
    return f"{index}:{Path(path).stem.split('_')[0]}"


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "value"
    return f"{where}: {error['msg']}"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")
