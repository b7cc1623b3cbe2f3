"""How long to wait before trying again: one formula for every retry loop of the bot and the runner.

Pure (no I/O, no clock), so both sides import it from the core. Each caller keeps its own base and cap (a bus
retrying Redis within a second, a report target backing off to half a minute); only the shape is shared.
"""

from __future__ import annotations

import random


def backoff(attempt: int, *, base: float = 0.5, cap: float = 10.0, jitter: float = 0.2) -> float:
    """Seconds before try number ``attempt`` + 1 (``attempt`` = 1 after the first failure): ``base`` doubling up to
    ``cap``, less a random part of up to ``jitter`` of it, so that many waiters do not all come back at once
    (``jitter=0``: exact; ``jitter=1``: anywhere up to the delay)."""
    delay = min(cap, base * 2.0 ** max(attempt - 1, 0))
    return delay * (1.0 - jitter * random.random())
