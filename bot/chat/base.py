"""The chat port: how the bot tells people about a job, whichever platform they are on."""

from __future__ import annotations

from typing import Protocol

from handlers.jobs import Job
from handlers.messages import Notify


class ChatPort(Protocol):
    async def notify(self, job: Job, note: Notify) -> None:
        """Refresh the job's card (``card``) or post ``note`` to its thread, the alert channel or on-call."""
        ...


class PortDeliverer:
    """A chat port as the outbox's deliverer (the console's): each note handed straight to it."""

    def __init__(self, port: ChatPort) -> None:
        self.port = port

    async def deliver(self, job: Job, note: Notify) -> None:
        await self.port.notify(job, note)
