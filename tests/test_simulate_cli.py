"""``finetune-bot simulate`` as a user runs it: a subprocess, scenarios on stdin, one JSON line per result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.scenario  # every test here runs a subprocess (tests/markers.py)

SAMPLE = Path(__file__).resolve().parents[1] / "bench" / "data" / "spot-traces" / "availability" / "1-node"
KEYS = [
    "scenario",
    "policy",
    "cost",
    "on_demand_cost",
    "finish_hours",
    "met_deadline",
    "preemptions",
    "spot_hours",
    "on_demand_hours",
]


def simulate(stdin: str, *policies: str) -> subprocess.CompletedProcess[str]:
    flags = [part for name in policies for part in ("--policy", name)]
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "simulate", *flags],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def trace(path: Path, counts: list[int], gap: int = 3600) -> str:
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": counts}))
    return str(path)


def scenario(traces: list[Any], **changes: Any) -> str:
    values: dict[str, Any] = {
        "traces": traces,
        "nodes": 1,
        "work_hours": 3,
        "deadline_hours": 10,
        "restart_minutes": 60,
        "spot_price": 0.5,
        "on_demand_price": 2.0,
        "start_hour": 0,
    }
    values.update(changes)
    return json.dumps(values)


def test_each_scenario_and_policy_gives_one_line_with_the_hand_computed_figures(tmp_path: Path) -> None:
    a = trace(tmp_path / "a.json", [1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    b = trace(tmp_path / "b.json", [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    lines = "\n".join([scenario([a]), "", scenario([a, b])]) + "\n"
    done = simulate(lines, "spot-only", "on-demand")
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert all(list(result) == KEYS for result in results)
    assert [(r["scenario"], r["policy"]) for r in results] == [
        (1, "spot-only"),  # scenarios are numbered by their line, from 1, as an editor counts
        (1, "on-demand"),
        (3, "spot-only"),  # the blank line keeps its number
        (3, "on-demand"),
    ]
    # One zone: start-up, 1 h of work, preempted, start-up, 2 h of work: 5 spot hours at $0.50, done after 6 h.
    assert results[0] == {
        "scenario": 1,
        "policy": "spot-only",
        "cost": 2.5,
        "on_demand_cost": 8.0,  # (1 h start-up + 3 h of work) at $2
        "finish_hours": 6.0,
        "met_deadline": True,
        "preemptions": 1,
        "spot_hours": 5.0,
        "on_demand_hours": 0.0,
    }
    assert results[1] | {"policy": "spot-only"} == results[0] | {
        "cost": 8.0,
        "finish_hours": 4.0,
        "preemptions": 0,
        "spot_hours": 0.0,
        "on_demand_hours": 4.0,
    }
    # Two zones: zone b takes over at once (its own start-up), done after 5 h.
    assert (results[2]["cost"], results[2]["finish_hours"], results[2]["preemptions"]) == (2.5, 5.0, 1)


def test_live_the_policy_knows_only_what_the_bot_knows_and_each_line_counts_the_refused_launches(
    tmp_path: Path,
) -> None:
    # zone a has spot for two hours, zone b from the fourth: told everything, spot-only waits one hour and takes b;
    # knowing only what the bot knows, it tries b while b has none, then a again once a's cool-down is over.
    a = trace(tmp_path / "a.json", [1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1])
    b = trace(tmp_path / "b.json", [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    done = simulate(scenario([a, b]) + "\n" + scenario([a, b], live=True) + "\n", "spot-only")
    assert done.returncode == 0, done.stderr
    told, live = [json.loads(line) for line in done.stdout.splitlines()]
    assert list(told) == KEYS and list(live) == [*KEYS, "refusals"]
    assert live["refusals"] == 2 and live["met_deadline"] and told["met_deadline"]


def test_the_default_policy_is_deadline_aware_and_it_meets_deadlines_on_the_sample_traces() -> None:
    zones = sorted(str(path) for path in (SAMPLE / "aws-02-15-2023").glob("*.json"))
    lines = [
        scenario(zones[:1], work_hours=8, deadline_hours=12, restart_minutes=6, spot_price=0.918, on_demand_price=3.06),
        scenario(zones, work_hours=24, deadline_hours=36, restart_minutes=6, spot_price=0.918, start_hour=200),
    ]
    done = simulate("\n".join(lines))
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["policy"] for r in results] == ["deadline-aware", "deadline-aware"]
    assert all(r["met_deadline"] and r["finish_hours"] <= 36 for r in results)
    # 195 s ticks: 8 h is 148 ticks of work, 6 min of restart 2 ticks: (148 + 2) × 195 s at $3.06.
    assert results[0]["on_demand_cost"] == pytest.approx(150 * 195 / 3600 * 3.06)
    assert results[1]["cost"] < results[1]["on_demand_cost"]


def test_a_move_to_another_region_pays_the_checkpoint_s_transfer_and_its_slower_restore(tmp_path: Path) -> None:
    # Home us-east-1a has no spot; us-west-2's zone (its region said by the scenario) has. A 200 GB checkpoint at
    # $0.02 a GB, in and out: $8; restored at 0.1 GB/s against 1.25 in the region: 1840 s more than the hour's
    # restart, so two ticks of start-up there, then three of work: five spot hours at $0.50.
    home = trace(tmp_path / "us-east-1a_v100_1.json", [0] * 11)
    far = trace(tmp_path / "far.json", [1] * 11)
    zones: list[Any] = [home, {"trace": far, "region": "us-west-2"}]
    moving = scenario(zones, transfer_price_per_gb=0.02, checkpoint_gb=200, cross_region_gb_per_s=0.1)
    staying = scenario(zones, transfer_price_per_gb=0.02)  # no checkpoint size: nothing moves, the line is as ever
    done = simulate(moving + "\n" + staying + "\n", "spot-only")
    assert done.returncode == 0, done.stderr
    moved, plain = [json.loads(line) for line in done.stdout.splitlines()]
    assert list(moved) == [*KEYS, "region_moves", "transfer_cost"] and list(plain) == KEYS
    assert moved["region_moves"] == 1 and moved["transfer_cost"] == pytest.approx(8.0)
    assert moved["spot_hours"] == 5 and moved["cost"] == pytest.approx(5 * 0.5 + 8.0)
    assert plain["spot_hours"] == 4 and plain["cost"] == pytest.approx(4 * 0.5)


GANG = Path(__file__).resolve().parents[1] / "bench" / "data" / "spot-traces" / "preemption" / "4-node"


def test_a_four_node_gang_is_priced_whole_gang_and_replace_one(tmp_path: Path) -> None:
    # Four nodes, $2/h on spot for all of them ($0.50 a node); zone a has three from t3 to t4.
    a = trace(tmp_path / "a.json", [4, 4, 4, 3, 3, 4, 4, 4, 4, 4, 4, 4])
    gang = {"nodes": 4, "restart_minutes": 120, "replace_minutes": 60, "hold_minutes": 120, "spot_price": 2.0}
    real = sorted(str(path) for path in (GANG / "aws-08-03-2023").glob("*.json"))
    lines = [
        scenario([a], on_demand_price=8.0, **gang),
        scenario(real, work_hours=24, deadline_hours=36, restart_minutes=30, replace_minutes=10, nodes=4,
                 spot_price=3.672, on_demand_price=12.24, start_hour=24),
    ]
    done = simulate("\n".join(lines) + "\n", "spot-only")
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["scenario"], r["gang"]) for r in results] == [
        (1, "whole-gang"),
        (1, "replace-one"),
        (2, "whole-gang"),
        (2, "replace-one"),
    ]
    extra = ["gang", "holds", "replaced", "moves", "survivor_idle_hours", "survivor_cost"]
    assert all(list(r) == KEYS + extra for r in results)
    # Whole gang: start-up t0-t1, work t2, lost at t3, waits t3-t4, start-up again t5-t6, work t7-t8: 7 h at $2.
    assert results[0] | {"gang": ""} == {
        "scenario": 1,
        "policy": "spot-only",
        "cost": 14.0,
        "on_demand_cost": 40.0,  # (2 h start-up + 3 h of work) at $8
        "finish_hours": 9.0,
        "met_deadline": True,
        "preemptions": 1,
        "spot_hours": 7.0,
        "on_demand_hours": 0.0,
        "gang": "",
        "holds": 0,
        "replaced": 0,
        "moves": 0,
        "survivor_idle_hours": 0.0,
        "survivor_cost": 0.0,
    }
    # Replace-one: the three survivors hold t3-t4 (6 node-hours at $0.50), the fourth is back at t5 with one node's
    # hour of start-up, work t6-t7: 6 h at $2 + $3, done an hour sooner.
    assert {k: results[1][k] for k in ("cost", "finish_hours", "preemptions", "spot_hours")} == {
        "cost": 15.0,
        "finish_hours": 8.0,
        "preemptions": 0,
        "spot_hours": 6.0,
    }
    assert (results[1]["holds"], results[1]["replaced"], results[1]["moves"]) == (1, 1, 0)
    assert (results[1]["survivor_idle_hours"], results[1]["survivor_cost"]) == (6.0, 3.0)
    # The real 4-node traces: both ways finish; what the survivors paid is part of the replace-one cost.
    whole, one = results[2], results[3]
    assert whole["met_deadline"] and one["met_deadline"]
    assert one["holds"] >= 1 and one["survivor_cost"] > 0
    assert one["survivor_cost"] < one["cost"] < one["on_demand_cost"]


@pytest.mark.parametrize(
    ("line", "policies", "message"),
    [
        ("{not json", (), "line 1: not JSON"),
        ('{"traces": []}', (), "line 1: traces:"),
        ("[1, 2]", (), "line 1: a scenario is a JSON object"),
        ("SCENARIO colour=1", (), "line 1: colour: Extra inputs are not permitted"),
        ("SCENARIO work_hours=-1", (), "line 1: work_hours:"),
        ("SCENARIO spot_price=NaN", (), "line 1: not JSON (NaN is not a number)"),
        ("SCENARIO start_hour=99", (), "line 1: start_hour 99 is past the end of the traces (11 h)"),
        ("MISSING", (), "gone.json: cannot be read (No such file or directory)"),
        ("MIXED", (), "line 1: traces with different gap_seconds (60, 3600)"),
        ("SCENARIO", ("fastest",), "unknown policy 'fastest'"),
        ("SCENARIO", ("deadline-aware-plan",), "unknown policy 'deadline-aware-plan'"),  # the bench's alone
        ('SCENARIO live="yes"', (), "line 1: live:"),
        ("SCENARIO checkpoint_gb=-1", (), "line 1: checkpoint_gb:"),
        ("SCENARIO cross_region_gb_per_s=0", (), "line 1: cross_region_gb_per_s:"),
    ],
)
def test_bad_input_is_one_clear_line_exit_2_and_no_output(
    tmp_path: Path, line: str, policies: tuple[str, ...], message: str
) -> None:
    a = trace(tmp_path / "a.json", [1] * 11)
    minutes = trace(tmp_path / "m.json", [1] * 11, gap=60)
    if line.startswith("SCENARIO"):
        changes = dict(part.split("=") for part in line.split()[1:])
        values = {key: json.loads(value) if value != "NaN" else float("nan") for key, value in changes.items()}
        line = scenario([a], **values)
    elif line == "MISSING":
        line = scenario([str(tmp_path / "gone.json")])
    elif line == "MIXED":
        line = scenario([a, minutes])
    done = simulate(line + "\n", *policies)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("finetune-bot simulate: ") and message in done.stderr, done.stderr


def test_bad_input_after_good_lines_still_writes_nothing(tmp_path: Path) -> None:
    a = trace(tmp_path / "a.json", [1] * 11)
    done = simulate(f"{scenario([a])}\n{scenario([a], nodes=0)}\n")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("finetune-bot simulate: line 2: nodes:")
