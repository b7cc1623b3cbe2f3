"""What a chat platform adapter provides to the shared outbox, and how a delivery can go wrong.

The outbox (``bot/chat/outbox.py``) owns durability, order, retries, dedup and card coalescing; a platform's
:class:`Deliverer` only turns a job and a note into that platform's API calls. It reports trouble as one of two
exceptions, so the retry policy lives in one place: :class:`RetryLater` (rate limited, platform down, network
gone: the message waits) or :class:`Undeliverable` (the platform refused it for good: logged and dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from handlers.jobs import Job
from handlers.messages import Notify


@dataclass(frozen=True, slots=True)
class MessageRef:
    """A message the bot posted, so it can be edited or replied to later (Slack: channel id and ``ts``)."""

    channel: str
    ts: str
    text: str = ""

    def dump(self) -> str:
        return json.dumps({"channel": self.channel, "ts": self.ts, "text": self.text})

    @classmethod
    def load(cls, raw: str) -> MessageRef:
        data = json.loads(raw)
        return cls(channel=str(data["channel"]), ts=str(data["ts"]), text=str(data.get("text", "")))


class RetryLater(Exception):
    """The platform cannot take the message now; ``after`` is its own hint (HTTP ``Retry-After``) if it gave one."""

    def __init__(self, reason: str, after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.after = after


class Undeliverable(Exception):
    """The platform refused the message for good (unknown channel, bot not invited, revoked token…)."""


class Deliverer(Protocol):
    """One platform's side of delivery. Every method either succeeds or raises RetryLater / Undeliverable.

    A method may be retried after a failure, so each does at most one non-repeatable post, as its last step.
    """

    async def post_card(self, job: Job) -> MessageRef:
        """Post the job's card (its latest state) where the job was started."""
        ...

    async def edit_card(self, job: Job, card: MessageRef) -> None:
        """Show the job's latest state on its card, in place."""
        ...

    async def post_note(self, job: Job, note: Notify, card: MessageRef | None) -> None:
        """Post a thread, alert or page note (``card`` is the job's card, to reply under, if it could be posted)."""
        ...


class Gate:
    """One pause shared by every sender of a platform: after a rate limit or a failure all of them wait.

    Lanes retrying on their own would hammer a platform that just said "slow down" or is down.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._until = 0.0

    def close_for(self, seconds: float) -> None:
        self._until = max(self._until, self.clock() + max(seconds, 0.0))

    @property
    def open(self) -> bool:
        return self.clock() >= self._until

    async def wait(self, stop: asyncio.Event) -> bool:
        """Wait until the gate opens; False if ``stop`` was set first."""
        while (left := self._until - self.clock()) > 0 and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), left)
        return not stop.is_set()


@dataclass(slots=True)
class Platform:
    """A platform as the outbox sees it: its deliverer and the pause all its senders share."""

    deliverer: Deliverer
    gate: Gate = field(default_factory=Gate)


def backoff(attempt: int, base: float = 0.5, cap: float = 10.0) -> float:
    """Seconds to wait before retry number ``attempt`` (1, 2, …): doubling up to ``cap``, with some jitter."""
    delay = min(cap, base * 2.0 ** max(attempt - 1, 0))
    return delay * random.uniform(0.8, 1.0)
