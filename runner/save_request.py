"""The save request between the runner and the processes that train: "save a checkpoint now, keep training".

An early signal (an AWS rebalance recommendation, an Alibaba scheduled system event the bot passed on) says the
instance is at risk but gives no deadline. Committing the newest existing checkpoint early loses every step since
it; a fresh save loses none and stops nothing. So the runner asks for one with a file beside the stop request:
``$FINETUNE_STOP_FILE.save`` holds a request number (1, 2, … within one trainer run), written whole (a new file
put in place), so a reader sees an old number or the new one, never half of it.

The trainer side (:class:`SaveRequest`, used by ``runner.hf.callback``) says it watches by creating
``$FINETUNE_STOP_FILE.save.watched`` at start-up. At every step boundary each rank reads the number; under
``torch.distributed`` the ranks take the largest (an all-reduce MAX, as the stop request agrees), so they all save
after the same step. A number larger than the last one honoured means: save at this step (``control.should_save``
in the HF Trainer), and training goes on. A trainer that does not say it watches gets nothing: the runner commits
its newest existing checkpoint instead (:mod:`runner.early_save`).

Only the trainer process imports torch, and only when the ranks really are distributed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from runner.stop_request import STOP_FILE_ENV, agree_max

log = logging.getLogger(__name__)

SAVE_SUFFIX = ".save"
"""Appended to the stop file's path: the save request (its content: the request's number)."""

SAVE_WATCHED_SUFFIX = ".save.watched"
"""Appended to the stop file's path: the trainer honours save requests."""


def save_path(stop_file: str | os.PathLike[str]) -> str:
    return os.fspath(stop_file) + SAVE_SUFFIX


def save_watched_path(stop_file: str | os.PathLike[str]) -> str:
    return os.fspath(stop_file) + SAVE_WATCHED_SUFFIX


def write_save_request(stop_file: Path, number: int) -> None:
    """Runner side: ask for save number ``number``, the whole file at once and never through a link the trainer put
    where it goes (the runner may be root, the trainer not)."""
    target = Path(save_path(stop_file))
    staging = target.with_name(target.name + ".tmp")
    staging.unlink(missing_ok=True)
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, f"{number}\n".encode())
    finally:
        os.close(fd)
    staging.replace(target)


def read_number(path: str) -> int:
    """The request number in ``path``; 0 when there is none (or it is not a number: nothing asked)."""
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read(32)
    except (OSError, UnicodeDecodeError):
        return 0
    text = text.strip()
    return int(text) if text.isdigit() else 0


class SaveRequest:
    """Trainer side: the runner's save requests, agreed between the ranks.

    Attributes:
        path: the save request file, or None when the trainer runs without the runner.
        honoured: the number of the last request this process saved for.
    """

    def __init__(self, stop_file: str | None = None) -> None:
        if stop_file is None:
            stop_file = os.environ.get(STOP_FILE_ENV) or None
        self.path: str | None = save_path(stop_file) if stop_file else None
        self.honoured = 0
        if stop_file:
            try:
                os.close(os.open(save_watched_path(stop_file), os.O_WRONLY | os.O_CREAT, 0o644))
            except OSError as exc:  # then the runner commits the newest existing checkpoint instead
                log.warning("cannot write %s: %s", save_watched_path(stop_file), exc)

    def asked(self) -> int:
        """The number of the newest request this process sees (0: none); what the ranks agree on."""
        return read_number(self.path) if self.path is not None else 0

    def honour(self, agreed: int) -> bool:
        """Whether to save at this step boundary for the ranks' ``agreed`` number (a request not yet honoured)."""
        if agreed <= self.honoured:
            return False
        self.honoured = agreed
        return True

    def due(self, device: Any = None) -> bool:
        """Whether to save at this step boundary, the same answer on every rank (a collective when
        ``torch.distributed`` is initialised: every rank calls it at the same point)."""
        return self.honour(agree_max([self.asked()], device)[0])
