"""What a tiny trainer's start costs in CPU, with Python's garbage collector left on and paused as the trainer does.

Each trial is a fresh interpreter (the children's user + system CPU from ``resource``), alternating the two ways so
a busy moment hurts both alike:

* importing the training (torch, transformers, peft: ``runner.hf.tiny_training``) plainly, and under
  ``runner.hf.tiny.collector_paused`` (collector off, then what the imports made frozen);
* the whole ``python -m runner.hf.tiny`` run of a few steps, as the runner starts it.

    python bench/trainer_start.py [--trials 3] [--steps 16]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAIN_IMPORT = "import runner.hf.tiny_training"
PAUSED_IMPORT = (
    "from runner.hf.tiny import collector_paused\n"
    "with collector_paused():\n"
    "    import runner.hf.tiny_training"
)
# The same run with the pause taken out: the trainer's own main, its context manager replaced by a do-nothing one.
UNPAUSED_RUN = (
    "import contextlib, sys, runner.hf.tiny as tiny\n"
    "tiny.collector_paused = contextlib.nullcontext\n"
    "sys.exit(tiny.main())"
)


def cpu_of(argv: list[str], env: dict[str, str] | None = None) -> float:
    """CPU seconds (user + system) the child ``argv`` took."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def summary(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} s (" + ", ".join(f"{value:.2f}" for value in values) + ")"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}  # compiled modules cached, as `make test` has them
    python = sys.executable
    imports: dict[str, list[float]] = {"collector on": [], "paused": []}
    runs: dict[str, list[float]] = {"collector on": [], "paused": []}
    with tempfile.TemporaryDirectory() as scratch:
        flags = ["--max-steps", str(args.steps), "--save-steps", "5"]
        for trial in range(args.trials):
            imports["collector on"].append(cpu_of([python, "-c", PLAIN_IMPORT], env))
            imports["paused"].append(cpu_of([python, "-c", PAUSED_IMPORT], env))
            on, paused = ({**env, "FINETUNE_OUTPUT_DIR": f"{scratch}/{way}-{trial}"} for way in ("on", "paused"))
            runs["collector on"].append(cpu_of([python, "-c", UNPAUSED_RUN, *flags], on))
            runs["paused"].append(cpu_of([python, "-m", "runner.hf.tiny", *flags], paused))
    for what, table in (("import the training", imports), (f"a {args.steps}-step tiny run", runs)):
        for way, values in table.items():
            print(f"{what}, {way}: {summary(values)}")
    saved = statistics.median(runs["collector on"]) - statistics.median(runs["paused"])
    print(f"a trainer start with the collector paused: {saved:.2f} CPU-s less")
    return 0


if __name__ == "__main__":
    sys.exit(main())
