"""The runner's own files are nobody else's: no name the trainer's user can change leads to them.

A root runner keeps the attempt's key in its environment file (``handlers.spec.RUNNER_ENV_FILE``: on
Alibaba it holds ``FINETUNE_REPORT_SECRET``) and works in its work directory, where it writes as root and which it
opens to the trainer's group. Before a trainer of another user starts, both are checked:

* every directory from ``/`` down to each is root's (or the runner's own user's) and writable by nobody else,
  unless sticky (``/tmp``): then others may add names there but not replace this one, which is root's. So no
  component is a name the trainer could swap for a link, and none is followed if it is one meanwhile (each is
  opened relative to the one above it with ``O_NOFOLLOW``). A missing work directory is made on the way, 0755;
* the environment file is a plain file of root's with no other link to it; a mode that lets others read it is
  tightened to the owner's alone (said in the log).

A path that fails is a host the runner cannot keep its key on: a :class:`PermissionError` (an OSError, as every other
way the path can fail is) says which and why, and the runner starts nothing.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from pathlib import Path

from handlers.spec import RUNNER_ENV_FILE

log = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _trusted_owner(info: os.stat_result) -> bool:
    return info.st_uid in (0, os.geteuid())


def _check_dir(path: Path, info: os.stat_result) -> None:
    if not _trusted_owner(info):
        raise PermissionError(f"{path} belongs to uid {info.st_uid}, not to root or the runner")
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise PermissionError(f"{path} may be changed by others (mode {stat.S_IMODE(info.st_mode):o}, not sticky)")


def open_own_dir(path: Path, create: bool = False) -> int:
    """A descriptor of the directory ``path``, every directory on the way checked and opened from the one above
    it without following a link; made where missing if ``create``. A link on the way is followed only if it is
    root's (or the runner's) in a directory that passed (``/var/run``): one the trainer made (a work directory
    swapped for a link to ``/etc``) is refused. PermissionError when one is someone else's to change."""
    wanted = Path(os.path.abspath(path))
    for _ in range(40):  # as many links as the kernel follows in one path
        resolved = _open_checked(wanted, create)
        if isinstance(resolved, int):
            return resolved
        wanted = resolved
    raise PermissionError(f"{path}: too many links on the way")


def _open_checked(wanted: Path, create: bool) -> int | Path:
    """The directory's descriptor, or the path to try again with a trusted link on the way resolved."""
    fd = os.open("/", _DIR_FLAGS)
    try:
        _check_dir(Path("/"), os.fstat(fd))
        here = Path("/")
        parts = wanted.parts[1:]
        for index, part in enumerate(parts):
            here = here / part
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            try:
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                info = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(info.st_mode):
                    raise PermissionError(f"{here} is not a directory") from exc
                if not _trusted_owner(info):
                    theirs = f"{here} is a link of uid {info.st_uid}'s, not root's or the runner's"
                    raise PermissionError(theirs) from exc
                target = os.readlink(part, dir_fd=fd)
                return Path(os.path.normpath(here.parent / target)).joinpath(*parts[index + 1 :])
            os.close(fd)
            fd = inner
            _check_dir(here, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_env_file(path: Path = Path(RUNNER_ENV_FILE)) -> None:
    """The runner's environment file, where there is one, is root's alone (see the module docstring)."""
    try:
        parent = open_own_dir(path.parent)
    except FileNotFoundError:
        return
    try:
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise PermissionError(f"{path} is not a plain file: {exc.strerror}") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                raise PermissionError(f"{path} is not a plain file with one name")
            if not _trusted_owner(info):
                raise PermissionError(f"{path} belongs to uid {info.st_uid}, not to root or the runner")
            if info.st_mode & 0o077:
                log.warning("%s was readable by others (mode %o): now 600", path, stat.S_IMODE(info.st_mode))
                os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
    finally:
        os.close(parent)


def check_own_paths(work_dir: Path, env_file: Path = Path(RUNNER_ENV_FILE)) -> None:
    """Both checks, before a trainer of another user starts; makes ``work_dir`` where it is missing."""
    os.close(open_own_dir(work_dir, create=True))
    check_env_file(env_file)
