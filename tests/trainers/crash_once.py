"""A trainer that is killed mid-run the first time (like the kernel's OOM killer would), then trains normally.

Runs the real tiny trainer as a child; on the first run (no marker file yet) SIGKILLs it once the progress
file shows ``CRASH_AT_STEP`` and exits 137, the way a killed process looks to its supervisor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def last_step(progress: Path) -> int:
    try:
        lines = progress.read_text().splitlines()
    except FileNotFoundError:
        return 0
    steps = [json.loads(line).get("step", 0) for line in lines if line.endswith("}")]
    return max(steps, default=0)


def main() -> int:
    marker = Path(os.environ["CRASH_MARKER"])
    crash_at = int(os.environ.get("CRASH_AT_STEP", "7"))
    command = [sys.executable, "-m", "runner.hf.tiny", *sys.argv[1:]]
    if marker.exists():
        os.execv(sys.executable, command)
    marker.touch()
    child = subprocess.Popen(command)
    progress = Path(os.environ["FINETUNE_PROGRESS_FILE"])
    while child.poll() is None:
        if last_step(progress) >= crash_at:
            child.send_signal(signal.SIGKILL)
            child.wait()
            print(f"crash_once: killed the trainer at step {last_step(progress)}", flush=True)
            return 137
        time.sleep(0.02)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
