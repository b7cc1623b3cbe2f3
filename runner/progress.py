"""Follow the trainer's progress file (JSON lines from our callback) without blocking on it.

The file is the trainer's (it creates it in the work directory), so the runner reads it as it would read
anything a stranger wrote: the name is opened without following a link (``O_NOFOLLOW``) and without waiting
(``O_NONBLOCK``: a FIFO there would otherwise hold the ``open`` until a writer came), only a regular file is read
(``fstat``), at most ``READ_LIMIT`` bytes per call (a line longer than ``LINE_LIMIT`` is skipped whole, never
held), and the agent reads it in a worker thread (:meth:`ProgressTail.refresh`), so even a slow disk never holds
the event loop that watches for the spot notice.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import stat
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

READ_LIMIT = 1 << 20  # bytes read per call at most: what is beyond waits for the next call
LINE_LIMIT = 64 * 1024  # a progress line is a few hundred bytes; a longer one is skipped, not parsed
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(slots=True)
class ProgressState:
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    epoch: float | None = None


class ProgressTail:
    """Reads only what was appended since the last call; tolerates a half-written last line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state = ProgressState()
        self._offset = 0
        self._skipping = False  # inside a line longer than LINE_LIMIT, skipped to its end
        self._refused = False  # said once that the file is not one to read
        self._steps: deque[tuple[float, int]] = deque(maxlen=20)  # (when we saw it, step)
        self.steps_seen = 0  # step lines read so far, of every trainer of the attempt: one more per step trained

    @property
    def step_seconds(self) -> float | None:
        """About how long one training step takes, from when new steps showed up (None: too few seen)."""
        if len(self._steps) < 2:
            return None
        (first_at, first), (last_at, last) = self._steps[0], self._steps[-1]
        return (last_at - first_at) / (last - first) if last > first else None

    async def refresh(self) -> None:
        """:meth:`read_new`, in a worker thread: the event loop never waits on the trainer's file."""
        await asyncio.to_thread(self.read_new)

    def read_new(self) -> None:
        """Fold the lines appended since the last call into ``state`` (at most ``READ_LIMIT`` bytes of them)."""
        chunk = self._read_chunk()
        if chunk is None:
            return
        if self._skipping:  # the rest of a line too long to keep
            end = chunk.find(b"\n")
            if end < 0:
                self._offset += len(chunk)
                return
            self._offset += end + 1
            chunk = chunk[end + 1 :]
            self._skipping = False
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        if not complete and len(chunk) > LINE_LIMIT:  # no end in sight: skip it, never hold it
            self._offset += len(chunk)
            self._skipping = True
        before = self.state.step
        for line in complete.splitlines():
            if len(line) > LINE_LIMIT:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            self._fold(record)
        step = self.state.step
        if step is not None and step != before and (not self._steps or step > self._steps[-1][1]):
            self._steps.append((time.monotonic(), step))

    def _read_chunk(self) -> bytes | None:
        """What follows the offset, up to ``READ_LIMIT`` bytes; None when there is no regular file to read."""
        try:
            fd = os.open(self.path, _OPEN_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            self._refuse("a link")
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self._refuse("not a regular file")
                return None
            if info.st_size < self._offset:  # truncated or replaced: start over
                self._offset, self._skipping = 0, False
            return os.pread(fd, READ_LIMIT, self._offset)
        finally:
            os.close(fd)

    def _refuse(self, what: str) -> None:
        if not self._refused:
            log.warning("the progress file %s is %s: not read", self.path, what)
        self._refused = True

    def _fold(self, record: dict[str, object]) -> None:
        step = record.get("step")
        if isinstance(step, int):
            self.state.step = step
            self.steps_seen += 1
        total = record.get("total_steps")
        if isinstance(total, int):
            self.state.total_steps = total
        loss = record.get("loss")
        if isinstance(loss, int | float):
            self.state.loss = float(loss)
        epoch = record.get("epoch")
        if isinstance(epoch, int | float):
            self.state.epoch = float(epoch)
