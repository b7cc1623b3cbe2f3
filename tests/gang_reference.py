"""An uninterrupted two-node run of ``runner.hf.tiny`` without runner or bot: the adapter a gang's run must equal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fakes.ports import free_port

ADAPTER = "adapter_model.safetensors"
# The training of every gang test that is compared with the reference (conftest's ``two_node_reference``).
GANG_STEPS = ["--max-steps", "16", "--save-steps", "5"]


def two_node_adapter(root: Path, arguments: list[str], final: str = ADAPTER) -> bytes:
    """Two trainers (one rank each) as one world over loopback; the final adapter (or the ``final`` file) global
    rank 0 writes."""
    port = str(free_port())
    runs = []
    for rank in (0, 1):
        env = dict(
            os.environ,
            FINETUNE_OUTPUT_DIR=str(root / f"node-{rank}"),
            FINETUNE_RESUME_FROM="",
            HF_HUB_OFFLINE="1",
            NNODES="2",
            NODE_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            FINETUNE_COLLECTIVE_TIMEOUT_SECONDS="120",
        )
        env.pop("FINETUNE_STOP_FILE", None)
        command = [sys.executable, "-m", "runner.hf.tiny", *arguments]
        runs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for run in runs:
        output = run.communicate(timeout=400)[0]
        assert run.returncode == 0, output[-3000:]
    return (root / "node-0" / final).read_bytes()
