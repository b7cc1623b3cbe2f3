"""A stand-in trainer with a checkpoint of a chosen size: it "trains" (sleeps) until SIGTERM, then writes
``checkpoint-<step>/`` with one large file and the completion marker, like a real save of big weights.

    FINETUNE_OUTPUT_DIR=/tmp/out python bench/synthetic_trainer.py --checkpoint-mib 1024
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

BLOCK = os.urandom(64 * 1024 * 1024)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-mib", type=int, default=1024)
    args = parser.parse_args()
    output = Path(os.environ["FINETUNE_OUTPUT_DIR"])
    progress = Path(os.environ["FINETUNE_PROGRESS_FILE"])
    stop = False

    def on_sigterm(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_sigterm)
    step = 0
    while not stop:
        step += 1
        with progress.open("a") as handle:
            handle.write(json.dumps({"step": step, "total_steps": 1_000_000}) + "\n")
        time.sleep(0.1)
    directory = output / f"checkpoint-{step}"
    directory.mkdir(parents=True)
    remaining = args.checkpoint_mib * 1024 * 1024
    with (directory / "model.safetensors").open("wb") as handle:
        while remaining > 0:
            chunk = BLOCK[: min(len(BLOCK), remaining)]
            handle.write(chunk)
            remaining -= len(chunk)
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (directory / ".finetune-complete").touch()


if __name__ == "__main__":
    main()
