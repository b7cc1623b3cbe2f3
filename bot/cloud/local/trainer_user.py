"""Who a local instance's trainer runs as when the bot is root: the user the runner would choose only if it can
reach the trainer.

A runner started as root starts its trainer as an unprivileged user (``FINETUNE_TRAINER_USER``, by default
``finetune-train``; ``runner/trainer_user.py``). On a cloud the image puts the training stack where that user
reaches it. A local instance is a process of this machine: its trainer is this bot's interpreter, imports this
bot's source tree and writes in this bot's state directory. When any of them is closed to other users (a
virtualenv or a checkout under ``/root``, mode 0700), that user could not even start the trainer. Then, unless the
operator named the user, the trainer stays with the user who started the bot, and the bot says so once, with the
way to choose otherwise. A user the operator named is kept: if it cannot reach the trainer, the job fails with a
sentence naming the user and the fix (``failure.trainer-out-of-reach``).

Every local instance of every command (``serve``, ``chat``, ``demo``, the benches) starts through
:class:`~bot.cloud.local.provider.LocalCloud`, which applies this rule: there is no other place to forget it.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

TRAINER_USER_ENV = "FINETUNE_TRAINER_USER"
_SOURCE_TREE = Path(__file__).resolve().parents[3]  # the folder holding the bot and runner packages


def trainer_stays_with_root(state_dir: Path, environ: Mapping[str, str]) -> str | None:
    """The sentence to say when the local trainers run as root because their usual user could not reach them
    (the caller then sets ``FINETUNE_TRAINER_USER=root`` in their environment); None when nothing changes: the
    bot is not root, the operator named the user, or everything is in reach."""
    if os.geteuid() != 0 or TRAINER_USER_ENV in environ:
        return None
    found = out_of_reach(Path(sys.executable), _SOURCE_TREE, state_dir)
    if found is None:
        return None
    needed, closed = found
    return (
        f"the trainers of local jobs run as root: {closed} is closed to other users, so the unprivileged trainer "
        f"user could not reach {needed}; set {TRAINER_USER_ENV}=<user> (one who can) to choose their user"
    )


def out_of_reach(program: Path, *folders: Path) -> tuple[Path, Path] | None:
    """The first of ``program`` (run) and ``folders`` (entered) that a user with no group in common could not
    reach, with what stops it (a folder on the way, or the program itself); None when all are in reach. A link is
    followed both ways: the folders on the way to it and those on the way to its target."""
    closed = _closed_to_run(program)
    if closed is not None:
        return program, closed
    for folder in folders:
        closed = _closed_to_enter(folder)
        if closed is not None:
            return folder, closed
    return None


def _closed_to_run(program: Path) -> Path | None:
    named = program.absolute()
    closed = _closed_to_enter(named.parent)
    if closed is not None:
        return closed
    target = named.resolve()
    try:
        executable = bool(target.stat().st_mode & stat.S_IXOTH)
    except OSError:
        return target
    return _closed_to_enter(target.parent) or (None if executable else target)


def _closed_to_enter(folder: Path) -> Path | None:
    """The first folder from the root down to ``folder`` that others may not pass through (the part not made yet:
    as it will be, with the usual modes); None when there is none."""
    named = folder.absolute()
    for path in (named, named.resolve()):
        for place in [*reversed(path.parents), path]:
            try:
                mode = place.stat().st_mode
            except FileNotFoundError:
                break  # made later
            except OSError:
                return place
            if not mode & stat.S_IXOTH:
                return place
    return None
