"""A trainer without torch, for tests of the notice path where what is trained does not matter but checkpoint
size and timing do. Steps are sleeps; every ``--save-every`` steps (or at the steps of ``--save-at``), and at the
next step's end after SIGTERM, it writes ``checkpoint-<step>/``: ``model.bin`` of ``--checkpoint-mib`` (at
``--write-mib-per-second`` if given), ``trainer_state.json``, then the ``.finetune-complete`` marker. It resumes
from ``FINETUNE_RESUME_FROM`` (the step in its ``trainer_state.json``) and writes a small final output at the end.

    python -m tests.trainers.synthetic --checkpoint-mib 20 --save-every 25 --step-seconds 0.2 --max-steps 100

:func:`recipe` makes it a recipe with the ``tiny`` recipe's knobs, for the bot's scenario tests where the trainer only
has to follow the contract (the spot policy, the store on a cluster): it starts in a twentieth of a second where
the HF trainer spends three seconds of CPU importing torch, transformers and peft.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

MiB = 1024 * 1024


def recipe(name: str = "synthetic") -> dict[str, Any]:
    """A recipe (the config file's form) that runs this trainer with ``steps``, ``step_seconds`` and ``save_steps``."""
    return {
        "name": name,
        "description": "steps that are sleeps, checkpoints of a few KiB (the trainer contract, without torch)",
        "model": "none",
        "command": [
            "{python}",
            "-m",
            "tests.trainers.synthetic",
            "--max-steps",
            "{steps}",
            "--step-seconds",
            "{step_seconds}",
            "--save-every",
            "{save_steps}",
            "--checkpoint-mib",
            "0.01",
        ],
        "parameters": {
            "steps": {"type": "int", "default": 30, "min": 1, "max": 10_000},
            "step_seconds": {"type": "float", "default": 0.2, "min": 0.0, "max": 10.0},
            "save_steps": {"type": "int", "default": 5, "min": 1, "max": 10_000},
        },
        "total_steps_param": "steps",
    }


def save(output: Path, step: int, mib: float, rate_mib: float) -> None:
    directory = output / f"checkpoint-{step}"
    directory.mkdir(parents=True, exist_ok=True)
    block = os.urandom(MiB)  # fresh bytes per save: a checkpoint of step 10 is not one of step 20
    remaining = int(mib * MiB)
    started = time.monotonic()
    written = 0
    with (directory / "model.bin").open("wb") as handle:
        while remaining > 0:
            piece = block[: min(len(block), remaining)]
            handle.write(piece)
            handle.flush()
            remaining -= len(piece)
            written += len(piece)
            if rate_mib > 0:  # a slow disk, or weights copied off the GPU piece by piece
                ahead = written / (rate_mib * MiB) - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (directory / ".finetune-complete").touch()
    print(f"synthetic: saved checkpoint-{step}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-mib", type=float, default=1.0)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--save-at", default="", help="comma-separated steps to save at (instead of --save-every)")
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--write-mib-per-second", type=float, default=0.0)
    args = parser.parse_args()
    output = Path(os.environ["FINETUNE_OUTPUT_DIR"])
    progress = Path(os.environ["FINETUNE_PROGRESS_FILE"])
    resume = os.environ.get("FINETUNE_RESUME_FROM") or ""
    step = json.loads((Path(resume) / "trainer_state.json").read_text())["global_step"] if resume else 0
    save_at = {int(step) for step in args.save_at.split(",") if step}
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while step < args.max_steps:
        step += 1
        time.sleep(args.step_seconds)
        with progress.open("a") as handle:
            handle.write(json.dumps({"step": step, "total_steps": args.max_steps}) + "\n")
        if stop:
            save(output, step, args.checkpoint_mib, args.write_mib_per_second)
            return 0
        if (step in save_at) if save_at else step % args.save_every == 0:
            save(output, step, args.checkpoint_mib, args.write_mib_per_second)
    (output / "adapter_model.safetensors").write_bytes(b"final weights at step %d" % step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
