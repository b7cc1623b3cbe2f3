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

import logging
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TRAINER_USER_ENV = "FINETUNE_TRAINER_USER"
DEFAULT_TRAINER_USER = "finetune-train"
FALLBACK_TRAINER_USER = "nobody"


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
        """Give the trainer what it writes: each of ``owned`` (created if missing, everything below it too), and
        the right to add files to ``work_dir`` without touching the runner's (group-writable, sticky)."""
        for top in owned:
            top.mkdir(parents=True, exist_ok=True)
            for dirpath, dirs, files in os.walk(top):
                for name in [*dirs, *files]:
                    os.lchown(os.path.join(dirpath, name), self.uid, self.gid)
            os.lchown(top, self.uid, self.gid)
        os.lchown(work_dir, -1, self.gid)
        work_dir.chmod(stat.S_IMODE(work_dir.stat().st_mode) | 0o070 | stat.S_ISVTX)


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
