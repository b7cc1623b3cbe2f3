"""Which ``checkpoint-<step>/`` directories the trainer has finished writing.

A directory is complete when it holds the ``.finetune-complete`` marker (our callback writes it after each
save), once a newer checkpoint directory appears (trainers write one at a time), or once the trainer has
exited on its own. A trainer we had to kill may have left its newest directory half-written, so then only
the first two rules apply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from runner.manifest import COMPLETE_MARKER

_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True, slots=True, order=True)
class LocalCheckpoint:
    step: int
    path: Path


def checkpoint_step(name: str) -> int | None:
    match = _CHECKPOINT_DIR.fullmatch(name)
    return int(match.group(1)) if match else None


def list_checkpoint_dirs(output_dir: Path) -> list[LocalCheckpoint]:
    if not output_dir.is_dir():
        return []
    found = []
    for entry in output_dir.iterdir():
        step = checkpoint_step(entry.name)
        if step is not None and entry.is_dir():
            found.append(LocalCheckpoint(step, entry))
    return sorted(found)


def complete_checkpoints(output_dir: Path, trainer_exited_cleanly: bool = False) -> list[LocalCheckpoint]:
    """The complete checkpoints, oldest first."""
    found = list_checkpoint_dirs(output_dir)
    complete = []
    for index, checkpoint in enumerate(found):
        superseded = index < len(found) - 1
        if superseded or trainer_exited_cleanly or (checkpoint.path / COMPLETE_MARKER).exists():
            complete.append(checkpoint)
    return complete


def newest_complete(output_dir: Path, trainer_exited_cleanly: bool = False) -> LocalCheckpoint | None:
    complete = complete_checkpoints(output_dir, trainer_exited_cleanly)
    return complete[-1] if complete else None
