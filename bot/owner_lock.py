"""One owner per directory: an OS lock (``flock``) on a file in it, held for as long as the owner process lives.

A pid file outlives a crashed process and can name a pid the OS has since given to someone else; a ``flock``
is let go by the kernel the moment its holder dies, however it dies. So a second bot on the same state dir is
refused while the first one lives, and a bot that finds the lock free knows that whoever held it is gone. The
file is never deleted (deleting a lock file races with the next taker); it keeps the owner's pid, for the
message only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO

from bot.errors import ConfigError


class AlreadyOwned(ConfigError):
    """Another live process holds the lock: the directory (a state dir, a data dir) cannot be used by this one."""

    def __init__(self, path: Path, pid: int | None) -> None:
        super().__init__(f"{path} is held by pid {pid if pid is not None else '?'}")
        self.path = path
        self.pid = pid


class OwnerLock:
    """``acquire()`` takes the lock or raises :class:`AlreadyOwned`; ``release()`` (or exiting) gives it back.

    The descriptor is not inheritable (Python's default), so children (the embedded Valkey, local runner
    instances) never keep a dead bot's lock alive.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> None:
        if self._file is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")  # not "w": the file must not be emptied before it is ours
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            text = handle.read().strip()
            handle.close()
            raise AlreadyOwned(self.path, int(text) if text.isdigit() else None) from None
        except BaseException:
            handle.close()
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle

    def release(self) -> None:
        handle, self._file = self._file, None
        if handle is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()

    def __enter__(self) -> OwnerLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
