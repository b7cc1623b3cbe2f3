"""Which ``checkpoint-<step>/`` directories the trainer has finished writing.

A directory is complete when it holds the ``.finetune-complete`` marker (our callback writes it after each
save), when the training stack's own sign of a finished save is there (:func:`finished_by_stack`), once a newer
checkpoint directory appears (trainers write one at a time), or once the trainer has exited on its own. A trainer
we had to kill may have left its newest directory half-written, so then only the first three rules apply.

Hugging Face's ``Trainer`` writes ``trainer_state.json`` last in every save, periodic or on SIGTERM
(``enable_jit_checkpoint``), and a SIGTERM save keeps ``checkpoint-is-incomplete.txt`` in the directory until it is
done: a directory whose ``trainer_state.json`` is whole and has no such sentinel is complete without our marker, so
a plain ``Trainer`` script's newest save is committed as soon as it is written, not once the next one appears. A
trainer that runs our callback (it says so: ``runner.stop_request``'s ``.watched`` file beside ``output/``) is judged
by our marker alone: with several ranks, rank 0 writes ``trainer_state.json`` while the others may still be writing
their files, and only the callback waits for all of them.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from runner.manifest import COMPLETE_MARKER
from runner.stop_request import STOP_FILE_NAME, watched_path

_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
HF_TRAINER_STATE = "trainer_state.json"
"""Written last by every Hugging Face ``Trainer`` save (``Trainer._save_checkpoint``)."""
HF_IN_PROGRESS = "checkpoint-is-incomplete.txt"
"""Hugging Face's sentinel of a SIGTERM save still being written (``transformers.trainer_jit_checkpoint``)."""


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


def is_marked_complete(path: Path) -> bool:
    """The trainer said ``path`` is complete: our marker, or (a trainer without our callback) the stack's own sign."""
    if (path / COMPLETE_MARKER).exists():
        return True
    return not runs_our_callback(path.parent) and finished_by_stack(path)


def runs_our_callback(output_dir: Path) -> bool:
    """The trainer writing ``output_dir`` watches the stop file (our callback, the ms-swift plugin, ``StopRequest``):
    it marks each checkpoint complete itself, once every rank has written its part."""
    return os.path.exists(watched_path(output_dir.parent / STOP_FILE_NAME))


def finished_by_stack(path: Path) -> bool:
    """Hugging Face finished this save (:func:`stack_step`)."""
    return stack_step(path) is not None


def stack_step(path: Path) -> int | None:
    """The step Hugging Face says this checkpoint holds, once it finished the save: ``trainer_state.json`` is there
    and whole (its ``global_step``), and no sentinel of a save in progress is left; None before. Only ``lstat`` and
    one small read (cached while the file is unchanged); never through a link."""
    try:
        info = (path / HF_TRAINER_STATE).lstat()
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or os.path.lexists(path / HF_IN_PROGRESS):
        return None
    return hf_global_step(path / HF_TRAINER_STATE, info.st_mtime_ns, info.st_size)


@lru_cache(maxsize=256)
def hf_global_step(state_file: Path, mtime_ns: int, size: int) -> int | None:
    """``global_step`` of a whole ``trainer_state.json`` (None: torn, unreadable or not Hugging Face's).
    ``mtime_ns`` and ``size`` key the cache: a file that changed is read again."""
    try:
        fd = os.open(state_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            state = json.loads(handle.read(size + 1))
    except (OSError, ValueError):
        return None
    step = state.get("global_step") if isinstance(state, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def complete_checkpoints(output_dir: Path, trainer_exited_cleanly: bool = False) -> list[LocalCheckpoint]:
    """The complete checkpoints, oldest first."""
    found = list_checkpoint_dirs(output_dir)
    complete = []
    for index, checkpoint in enumerate(found):
        superseded = index < len(found) - 1
        if superseded or trainer_exited_cleanly or is_marked_complete(checkpoint.path):
            complete.append(checkpoint)
    return complete


def newest_complete(output_dir: Path, trainer_exited_cleanly: bool = False) -> LocalCheckpoint | None:
    complete = complete_checkpoints(output_dir, trainer_exited_cleanly)
    return complete[-1] if complete else None
