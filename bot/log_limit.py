"""Log lines that outsiders can cause, at a bounded rate: a refused request, a request answered 503.

Anyone who can reach the bot's port can send it requests, and every refusal deserves a line in the log, but a
flood of them must not fill the disk or bury the lines that matter. :class:`LimitedLog` lets ``burst`` lines
through per ``window`` seconds for each kind of line (a kind is a fixed name chosen by the code, never taken from
the request); the rest are only counted, and the count is said in one line when the next window opens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

BURST = 20
WINDOW_SECONDS = 60.0


@dataclass(slots=True)
class _Window:
    start: float
    logged: int = 0
    dropped: int = 0


class LimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        burst: int = BURST,
        window: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.burst = burst
        self.window = window
        self.clock = clock
        self.suppressed = 0  # lines not logged so far, all kinds together
        self._windows: dict[str, _Window] = {}

    def warning(self, kind: str, message: str, *args: object) -> None:
        self.log(logging.WARNING, kind, message, *args)

    def info(self, kind: str, message: str, *args: object) -> None:
        self.log(logging.INFO, kind, message, *args)

    def log(self, level: int, kind: str, message: str, *args: object) -> None:
        """Log ``message % args`` unless ``kind`` already used its lines in this window (then count it)."""
        now = self.clock()
        window = self._windows.get(kind)
        if window is None or now - window.start >= self.window:
            if window is not None and window.dropped:
                self.logger.warning(
                    "%d more %s lines were not logged in the last %.0f s", window.dropped, kind, now - window.start
                )
            window = self._windows[kind] = _Window(start=now)
        if window.logged < self.burst:
            window.logged += 1
            self.logger.log(level, message, *args)
        else:
            window.dropped += 1
            self.suppressed += 1
