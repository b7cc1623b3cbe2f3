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
    closed = out_of_reach(Path(sys.executable), _SOURCE_TREE, state_dir)
    if closed is None:
        return None
    return (
        f"the trainers of local jobs run as root: {closed} is closed to other users, so the unprivileged trainer user "
        f"could not start them; set {TRAINER_USER_ENV}=<user> (one who can reach {closed}) to choose their user"
    )


def out_of_reach(program: Path, *folders: Path) -> Path | None:
    """The first of ``program`` (run) and ``folders`` (entered) that a user with no group in common could not
    reach, or None. A link is followed both ways: the folders on the way to it and those on the way to its target."""
    if not _runnable(program):
        return program
    for folder in folders:
        if not _enterable(folder):
            return folder
    return None


def _runnable(program: Path) -> bool:
    named = program.absolute()
    target = named.resolve()
    try:
        executable = bool(target.stat().st_mode & stat.S_IXOTH)
    except OSError:
        return False
    return executable and _enterable(named.parent) and _enterable(target.parent)


def _enterable(folder: Path) -> bool:
    """Whether others may pass through ``folder`` and every folder above it (the part not made yet: as it will be)."""
    named = folder.absolute()
    for path in (named, named.resolve()):
        for place in [path, *path.parents]:
            try:
                mode = place.stat().st_mode
            except FileNotFoundError:
                continue  # made later, with the usual modes
            except OSError:
                return False
            if not mode & stat.S_IXOTH:
                return False
    return True
