"""A hung trainer: how long until something is done about it, and how many steps it costs, today against the
runner's hang watchdog.

Today's path (no watchdog) is computed from the bot's settings: a hung trainer writes no progress, so its job goes
unheard of; the reconcile pass (every ``reconcile_seconds``) finds it silent once ``silent_after_seconds`` have passed
and says so in the channel, once. Nothing restarts it: the machine is billed until a person acts.

The watchdog's path is measured: the real runner (``python -m runner.cli run``) supervising the real ``tiny``
trainer, which hangs after step ``--hang-after`` (``--hang-after-step``: alive, asleep in ``_hang_forever``). Per
trial: from the hung step's progress line to the runner's ``hung`` report (detection: the limit, then the stacks),
to the first step of the restarted trainer (back to training: the commit, the trainer's start), and the steps
trained again (reached − the checkpoint restarted from). The limit there is the recipe's ``hang`` setting, small so
the bench is quick; with the defaults (k = 10, a floor of 120 s) a job's detection is that limit plus the same
seconds of stacks and restart, which the table for a few step times shows.

    python bench/hang_watch.py [--trials 3] [--floor 5] [--factor 10] [--step-seconds 0.2] [--hang-after 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from handlers.lifecycle import Lifecycle
from handlers.spec import HangRule

ROOT = Path(__file__).resolve().parents[1]
SAVE_STEPS = 5
MAX_STEPS = 12


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def trial(scratch: Path, args: argparse.Namespace) -> dict[str, float]:
    """One run: the runner, its trainer hanging once after ``hang_after``; the times seen from outside."""
    work, store, reports = scratch / "work", scratch / "store", scratch / "reports.jsonl"
    command = [
        sys.executable, "-m", "runner.hf.tiny", "--max-steps", str(MAX_STEPS), "--save-steps", str(SAVE_STEPS),
        "--step-seconds", str(args.step_seconds), "--hang-after-step", str(args.hang_after), "--hangs", "1",
    ]  # fmt: skip
    spec = {
        "version": 1,
        "job_id": "ft-bench",
        "attempt": 1,
        "command": command,
        "env": {"HF_HUB_OFFLINE": "1"},
        "checkpoint_uri": f"file://{store}/",
        "report": [f"file://{reports}"],
        "hang": {"floor_seconds": args.floor, "factor": args.factor},
    }
    (scratch / "spec.json").write_text(json.dumps(spec))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FINETUNE_PROGRESS_SECONDS": "0",
        "FINETUNE_SYNC_SECONDS": "0.2",
        "FINETUNE_TRAINER_ECHO": "0",
        "HF_HUB_OFFLINE": "1",
        # Run as root from a virtualenv other users cannot reach, the trainer runs as root (as the tests' does).
        "FINETUNE_TRAINER_USER": os.environ.get("FINETUNE_TRAINER_USER", "root"),
    }
    argv = [sys.executable, "-m", "runner.cli", "run", "--spec", str(scratch / "spec.json"), "--work-dir", str(work)]
    progress = work / "progress.jsonl"
    hung_step_at = hung_at = back_at = None
    seen = 0
    with (scratch / "runner.log").open("wb") as log:
        runner = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log)
        while runner.poll() is None:
            steps = lines(progress)
            now = time.monotonic()
            if hung_step_at is None and any(step["step"] == args.hang_after for step in steps):
                hung_step_at, seen = now, len(steps)
            if hung_at is None and any(report["type"] == "hung" for report in lines(reports)):
                hung_at, seen = now, len(steps)
            if hung_at is not None and back_at is None and len(steps) > seen:
                back_at = now
            time.sleep(0.02)
    if runner.returncode != 0 or hung_step_at is None or hung_at is None or back_at is None:
        raise SystemExit(f"the run did not go as planned (exit {runner.returncode}): see {scratch / 'runner.log'}")
    [hung] = [report for report in lines(reports) if report["type"] == "hung"]
    return {
        "detect": hung_at - hung_step_at,
        "back": back_at - hung_step_at,
        "limit": hung["limit_seconds"],
        "lost": float(hung["step"] - (hung["restart_from"] or 0)),
    }


def summary(values: list[float], unit: str = "s") -> str:
    return f"median {statistics.median(values):.1f} {unit} (" + ", ".join(f"{value:.1f}" for value in values) + ")"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--floor", type=float, default=5.0, help="the recipe's hang floor for the run (seconds)")
    parser.add_argument("--factor", type=float, default=10.0)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--hang-after", type=int, default=7)
    args = parser.parse_args()

    lifecycle = Lifecycle()
    first = lifecycle.silent_after_seconds
    last = first + lifecycle.reconcile_seconds
    lost_today = args.hang_after - (args.hang_after // SAVE_STEPS) * SAVE_STEPS
    print("today (no watchdog), from the bot's defaults:")
    print(f"  noticed: a 'no report' line after {first / 60:.0f}-{last / 60:.0f} min (silent_after_seconds, then the")
    print("           next reconcile pass); restarted: never by itself (the machine bills until a person acts)")
    print(f"  steps lost once a person resumes it: {lost_today} (since the last save), plus the whole wait")

    trials = []
    for number in range(args.trials):
        with tempfile.TemporaryDirectory(prefix="hang-bench-") as scratch:
            trials.append(trial(Path(scratch), args))
        print(f"  trial {number + 1}: {trials[-1]}", file=sys.stderr)
    print(f"\nwith the watchdog (real runner, tiny trainer, {args.step_seconds:g} s steps, floor {args.floor:g} s, "
          f"k = {args.factor:g}; {args.trials} trials):")  # fmt: skip
    print(f"  limit applied:             {summary([t['limit'] for t in trials])}")
    print(f"  hung step -> hung report:  {summary([t['detect'] for t in trials])}  (limit + stacks)")
    print(f"  hung step -> training:     {summary([t['back'] for t in trials])}  (+ commit, trainer start)")
    print(f"  steps trained again:       {summary([t['lost'] for t in trials], 'steps')}")
    overhead = statistics.median([t["back"] - t["limit"] for t in trials])
    print(f"\nwith the defaults (k = 10, floor 120 s), the limit and the time back to training (+{overhead:.1f} s):")
    rule = HangRule()
    for step_seconds in (1.0, 5.0, 15.0, 60.0):
        limit = rule.limit(step_seconds)
        print(f"  {step_seconds:>4g} s steps: hung after {limit / 60:.1f} min, training again after "
              f"{(limit + overhead) / 60:.1f} min (today: noticed after {first / 60:.0f}-{last / 60:.0f} min, never "
              "restarted)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
