"""Who the trainer runs as: never root when the runner is root.

The trainer runs code a chat user chose (a model, a data set, and whatever code they bring: ms-swift trusts a
model's own code), so a runner started as root (the systemd unit, a local cloud instance of a bot run as root)
starts it as an unprivileged user: ``FINETUNE_TRAINER_USER`` (default ``finetune-train``, which the images
create). A user this host does not have falls back to ``nobody``, said in the log. A runner that is not root runs
the trainer as itself (it cannot switch). Naming root (``FINETUNE_TRAINER_USER=root``) keeps the trainer as root:
only for a development host whose training stack no other user can reach, and said in the log as a warning.

The user owns what the trainer writes: its output directory and a HOME of its own, both in the work directory.
The work directory stays the runner's; its group may add files (the progress file, the stop-file marker) but,
being sticky, cannot touch the runner's own files there.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import beneath

log = logging.getLogger(__name__)

TRAINER_USER_ENV = "FINETUNE_TRAINER_USER"
DEFAULT_TRAINER_USER = "finetune-train"
FALLBACK_TRAINER_USER = "nobody"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class TrainerUser:
    """An unprivileged account the trainer is started as (its groups only: none of the runner's)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    def popen_args(self) -> dict[str, Any]:
        """The switch, for ``subprocess`` / ``asyncio.create_subprocess_exec`` (done before ``preexec_fn`` runs,
        so a parent-death signal set there survives the change of user)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def hand_over(self, work_dir: Path, owned: list[Path]) -> None:
        """Give the trainer what it writes: each of ``owned`` (names directly in ``work_dir``; created if missing,
        everything below it too), and the right to add files to ``work_dir`` without touching the runner's
        (group-writable, sticky).

        Nothing here follows a name the trainer can change (``runner.beneath``): ``work_dir`` is the runner's, so
        each of ``owned`` is opened relative to it without following a link (the trainer owns it and, the
        directory being sticky, may have replaced it by one: then it is removed and made again), and the tree
        below is walked and changed by descriptors. Called once every process of an earlier trainer is gone
        (``runner.trainer_box``), so nothing races it; it would not matter if something did. (Fresh directories
        instead of a walk would not do: a restarted trainer resumes from, and rotates, the checkpoints root
        restored into ``output/``, so those must become its own where they are.)
        """
        work_fd = beneath.open_dir(work_dir)
        try:
            for top in owned:
                if top.parent != work_dir:
                    raise ValueError(f"{top} is not directly in {work_dir}")
                top_fd = _own_directory(work_fd, top.name)
                try:
                    beneath.chown_tree(top_fd, self.uid, self.gid)
                finally:
                    os.close(top_fd)
            os.fchown(work_fd, -1, self.gid)
            os.fchmod(work_fd, stat.S_IMODE(os.fstat(work_fd).st_mode) | 0o070 | stat.S_ISVTX)
        finally:
            os.close(work_fd)


def _own_directory(work_fd: int, name: str) -> int:
    """A descriptor of the real directory ``name`` in the runner's directory ``work_fd``: made if missing, and
    made again if the trainer put something else there (a link, a FIFO)."""
    for _ in range(2):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=work_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            log.warning("%s in the work directory is not a directory: replaced by an empty one", name)
            os.unlink(name, dir_fd=work_fd)
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=work_fd)
    return os.open(name, _DIR_FLAGS, dir_fd=work_fd)


def _lookup(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        return None


def trainer_user(setting: str | None, runner_uid: int | None = None) -> TrainerUser | None:
    """The user to start the trainer as, or None to start it as the runner itself.

    ValueError when neither the named user nor ``nobody`` exists (a bad setting: nothing starts)."""
    uid = os.geteuid() if runner_uid is None else runner_uid
    wanted = setting or DEFAULT_TRAINER_USER
    if uid != 0:
        if setting:
            log.info("%s=%s ignored: the runner is not root, the trainer runs as the runner", TRAINER_USER_ENV, setting)
        return None
    entry = _lookup(wanted)
    if entry is None:
        entry = _lookup(FALLBACK_TRAINER_USER)
        if entry is None:
            raise ValueError(f"{TRAINER_USER_ENV}: neither {wanted!r} nor {FALLBACK_TRAINER_USER!r} exists here")
        log.warning("the trainer user %r does not exist here: the trainer runs as %s", wanted, entry.pw_name)
    if entry.pw_uid == 0:
        log.warning("%s=%s: the trainer runs as root, with every privilege of the runner", TRAINER_USER_ENV, wanted)
        return None
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    log.info("the trainer runs as %s (uid %d, gid %d)", entry.pw_name, entry.pw_uid, entry.pw_gid)
    return TrainerUser(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups)
