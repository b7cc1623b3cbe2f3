"""Open what the trainer wrote without following a link it put anywhere on the way.

The runner may be root; the trainer, an unprivileged user, owns its ``output/`` and may rename, replace or
symlink anything in it at any moment, from a process the runner does not wait for. ``O_NOFOLLOW`` on a path's
last component is not enough: a directory in the middle of the path, swapped for a link to ``/root`` between two
calls, is followed. So every component below a directory the runner trusts is opened on its own, relative to
the directory opened before it (``dir_fd``), with ``O_NOFOLLOW``: a link anywhere fails the open (``ELOOP`` /
``ENOTDIR``), and what is read, changed or handed over is the very file that was opened, never a name looked up
again. Walks enter each directory the same way (not :func:`os.fwalk`: it opens a directory it listed without
``O_NOFOLLOW`` or ``O_NONBLOCK`` and checks afterwards, so a FIFO swapped in holds it in ``open``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_dir(path: Path) -> int:
    """A descriptor of the directory ``path``, its last component not followed (its parent is the runner's)."""
    return os.open(path, _DIR_FLAGS)


def _relative_parts(relative: str | PurePosixPath) -> list[str]:
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"{relative!r} is not a plain relative path")
    return list(parts)


def open_file_at(top_fd: int, relative: str | PurePosixPath) -> int:
    """Open the regular file ``relative`` below the directory ``top_fd`` for reading, each component without
    following a link; the descriptor is blocking again. Anything but a plain file (a FIFO, a device, a socket: reading
    it could block or lie) is an OSError (EINVAL), so every reader that takes a vanished or unreadable file takes it
    the same way."""
    *dirs, name = _relative_parts(relative)
    fd = os.dup(top_fd)
    try:
        for part in dirs:
            inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
        # O_NONBLOCK: a FIFO put in the file's place must not hold the open (nor the read) forever.
        found = os.open(name, _FILE_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        if not stat.S_ISREG(os.fstat(found).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(relative))
        os.set_blocking(found, True)
    except BaseException:
        os.close(found)
        raise
    return found


def open_file_beneath(top: Path, path: Path) -> int:
    """Open ``path``, which lies below the directory ``top`` (the trainer's, in a directory of the runner's),
    without following a link at ``top`` or at any component below it."""
    relative = path.relative_to(top)
    top_fd = open_dir(top)
    try:
        return open_file_at(top_fd, relative.as_posix())
    finally:
        os.close(top_fd)


def entries(top_fd: int) -> Iterator[tuple[int, str, os.stat_result, PurePosixPath]]:
    """``(dir_fd, name, lstat, relative path)`` of everything below the directory ``top_fd``, parents first.

    A directory is entered by opening its name relative to its parent's descriptor with ``O_NOFOLLOW`` and
    ``O_DIRECTORY`` (and ``O_NONBLOCK``: a FIFO swapped in fails at once instead of holding the open): a link, or
    anything but a directory, put there after it was listed is not entered. ``dir_fd`` is valid only until the
    next item is asked for."""
    stack = [(os.dup(top_fd), PurePosixPath())]
    try:
        while stack:
            fd, here = stack.pop()
            try:
                for name in os.listdir(fd):
                    try:
                        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    yield fd, name, info, here / name
                    if stat.S_ISDIR(info.st_mode):
                        try:
                            stack.append((os.open(name, _DIR_FLAGS | os.O_NONBLOCK, dir_fd=fd), here / name))
                        except OSError:  # gone, or no longer a directory: nothing of ours to enter
                            continue
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)


@contextlib.contextmanager
def pinned(top: Path, path: Path) -> Iterator[Path]:
    """A name for the regular file ``path`` below the directory ``top``, opened without following a link at
    ``top`` or below (:func:`open_file_beneath`) and held open meanwhile: ``/proc/self/fd/<n>``.

    For code that reads a file by its name, perhaps several times in several threads (a store's parts): opening
    that name gives the very file opened here, whatever the trainer renames or swaps meanwhile. Linux only, as the
    runner is."""
    fd = open_file_beneath(top, path)
    try:
        yield fd_name(fd)
    finally:
        os.close(fd)


def fd_name(fd: int) -> Path:
    """The name of an open file that opens that very file again (Linux's ``/proc/self/fd``)."""
    return Path(f"/proc/self/fd/{fd}")


def regular_files(top: Path) -> list[str]:
    """The relative paths of the regular files below the directory ``top`` (not followed if it is a link: then
    none), found without following a link. A listing only: whoever reads one opens it with :func:`open_file_at`."""
    try:
        top_fd = open_dir(top)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return []
        raise
    try:
        return sorted(str(relative) for _, _, info, relative in entries(top_fd) if stat.S_ISREG(info.st_mode))
    finally:
        os.close(top_fd)


def chown_tree(top_fd: int, uid: int, gid: int) -> None:
    """Give ``uid``/``gid`` the directory ``top_fd`` and every directory and regular file below it, by descriptor.

    Each entry is opened relative to its pinned parent with ``O_NOFOLLOW`` (a link is left as it is: it names
    nothing of ours) and changed with ``fchown`` on that descriptor, so a name swapped between the listing and the
    change cannot point the change elsewhere. A file with more than one link is left alone: it may be a hard link
    to a file outside (where ``fs.protected_hardlinks`` is off), and nothing the runner writes has one."""
    os.fchown(top_fd, uid, gid)
    for dir_fd, name, info, _ in entries(top_fd):
        if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)) or (info.st_uid, info.st_gid) == (uid, gid):
            continue
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError:  # gone, or swapped for a link: nothing of ours
            continue
        try:
            now = os.fstat(fd)
            if stat.S_ISDIR(now.st_mode) or (stat.S_ISREG(now.st_mode) and now.st_nlink == 1):
                os.fchown(fd, uid, gid)
        finally:
            os.close(fd)
