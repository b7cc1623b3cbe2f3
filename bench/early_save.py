"""An early signal (a rebalance recommendation, a scheduled system event): how soon a fresh checkpoint is committed,
and how far it is from the step the signal came at, with the trainer training on.

The real runner (``python -m runner.cli run``) supervises the real ``tiny`` trainer, which saves only at its end
(``--save-steps`` past its last step), so before the signal there is nothing to commit. Once the trainer has reached
``--signal-at``, the bench writes the bot's save request into the attempt's control object (what the bot does for a
scheduled event only it heard; a rebalance the runner reads from IMDS takes the same path inside the runner). Per
trial: request written → ``checkpoint_saved`` report (the ranks' agreement at the next step boundary, the save, the
upload and the commit), the step committed against the step at the signal, and whether the run went on to its last
step in one trainer run. Before the save request, the runner committed the newest existing checkpoint: here none.

    python bench/early_save.py [--trials 3] [--step-seconds 0.5] [--signal-at 7]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from argparse import ArgumentParser, Namespace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from handlers.spec import SaveControl, control_key, dump_control

ROOT = Path(__file__).resolve().parents[1]
MAX_STEPS = 16


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def trial(scratch: Path, args: Namespace) -> dict[str, float]:
    """One run: the save request written once the trainer reached ``signal_at``; the times seen from outside."""
    work, store, reports = scratch / "work", scratch / "store", scratch / "reports.jsonl"
    command = [
        sys.executable, "-m", "runner.hf.tiny", "--max-steps", str(MAX_STEPS), "--save-steps", str(MAX_STEPS * 10),
        "--step-seconds", str(args.step_seconds),
    ]  # fmt: skip
    spec = {
        "version": 1,
        "job_id": "ft-bench",
        "attempt": 1,
        "command": command,
        "env": {"HF_HUB_OFFLINE": "1"},
        "checkpoint_uri": f"file://{store}/",
        "report": [f"file://{reports}"],
    }
    (scratch / "spec.json").write_text(json.dumps(spec))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FINETUNE_PROGRESS_SECONDS": "0",
        "FINETUNE_SYNC_SECONDS": "600",  # no periodic sync: only the request makes a commit before the end
        "FINETUNE_CONTROL_POLL_SECONDS": "0.2",
        "FINETUNE_TRAINER_ECHO": "0",
        "HF_HUB_OFFLINE": "1",
        # Run as root from a virtualenv other users cannot reach, the trainer runs as root (as the tests' does).
        "FINETUNE_TRAINER_USER": os.environ.get("FINETUNE_TRAINER_USER", "root"),
    }
    argv = [sys.executable, "-m", "runner.cli", "run", "--spec", str(scratch / "spec.json"), "--work-dir", str(work)]
    progress = work / "progress.jsonl"
    asked_at = committed_at = None
    signal_step = 0
    with (scratch / "runner.log").open("wb") as log:
        runner = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log)
        while runner.poll() is None:
            steps = lines(progress)
            if asked_at is None and steps and steps[-1]["step"] >= args.signal_at:
                signal_step = steps[-1]["step"]
                control = store / control_key(1)
                control.parent.mkdir(parents=True, exist_ok=True)
                control.write_bytes(dump_control(SaveControl(at=datetime.now(UTC))))
                asked_at = time.monotonic()
            if asked_at is not None and committed_at is None and any(
                report["type"] == "checkpoint_saved" for report in lines(reports)
            ):
                committed_at = time.monotonic()
            time.sleep(0.02)
    if runner.returncode != 0 or asked_at is None or committed_at is None:
        raise SystemExit(f"the run did not go as planned (exit {runner.returncode}): see {scratch / 'runner.log'}")
    early = next(report for report in lines(reports) if report["type"] == "checkpoint_saved")
    trained = [step["step"] for step in lines(progress)]
    return {
        "commit": committed_at - asked_at,
        "signal": float(signal_step),
        "committed": float(early["step"]),
        "one_run": float(trained == list(range(1, MAX_STEPS + 1))),
    }


def summary(values: list[float], unit: str = "s") -> str:
    return f"median {statistics.median(values):.2f} {unit} (" + ", ".join(f"{value:.2f}" for value in values) + ")"


def main() -> int:
    parser = ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--signal-at", type=int, default=7)
    args = parser.parse_args()
    trials = []
    for number in range(args.trials):
        with tempfile.TemporaryDirectory(prefix="early-save-bench-") as scratch:
            trials.append(trial(Path(scratch), args))
        print(f"  trial {number + 1}: {trials[-1]}", file=sys.stderr)
    print(f"an early signal (the bot's save request), real runner, tiny trainer, {args.step_seconds:g} s steps, "
          f"no checkpoint before it; {args.trials} trials:")  # fmt: skip
    print(f"  request -> fresh checkpoint committed: {summary([t['commit'] for t in trials])}")
    steps = ", ".join(f"{t['signal']:.0f} -> {t['committed']:.0f}" for t in trials)
    print(f"  step at the signal -> step committed:  {steps}")
    whole = sum(t["one_run"] for t in trials)
    print(f"  trained on to step {MAX_STEPS} in one trainer run: {whole:.0f} of {len(trials)}")
    print("  before (the newest existing checkpoint committed early): nothing to commit in these runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
