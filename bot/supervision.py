"""The service's long-running loops, watched: one that ends while the bot is not stopping is a dead replica part.

Every loop (the bus, the timers, the chat outbox, the cloud effects, …) retries what fails inside it and returns
only once ``stopping`` is set. One that returns or raises before that leaves the replica up and healthy-looking
while its part of the work stalls (a partition's events unread, notes unposted): seen when redis-py's cluster
client raised an error the bus did not take for an outage. The supervisor logs it as CRITICAL, records the cause
and sets :attr:`Supervisor.failed`, which ``finetune-bot serve`` waits on to exit 1, so that the platform (ECS,
Kubernetes, systemd) replaces the replica and another takes over its pending entries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Supervisor:
    """The service's loops; :attr:`failed` is set (and :attr:`cause` says which and why) when one ends early."""

    def __init__(self, stopping: asyncio.Event) -> None:
        self.stopping = stopping
        self.tasks: list[asyncio.Task[None]] = []
        self.failed = asyncio.Event()
        self.cause: str | None = None

    def start(self, loop: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(loop, name=name)
        task.add_done_callback(self._ended)
        self.tasks.append(task)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self.stopping.is_set():
            return
        error = None if task.cancelled() else task.exception()
        why = "cancelled" if task.cancelled() else f"{type(error).__name__}: {error}" if error else "returned"
        log.critical("service loop %r ended while the bot runs (%s)", task.get_name(), why, exc_info=error)
        if self.cause is None:
            self.cause = f"{task.get_name()} {why}"
        self.failed.set()

    async def wait(self) -> None:
        """Every loop ended (after ``stopping`` is set); what they raised was logged already."""
        await asyncio.gather(*self.tasks, return_exceptions=True)
