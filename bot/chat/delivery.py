"""What a platform's sender promises whoever delivers notifications: send one, or say whether to try again.

A deliverer (``async deliver(job, note)``) either delivers, or raises :class:`TransientDeliveryError` (the
platform is down, slow or rate-limiting: try again, after ``retry_after`` seconds when it said so) or
:class:`PermanentDeliveryError` (the request itself is wrong: retrying changes nothing). That split is all a
durable outbox needs to keep a message until it can go, and to drop one that never will.
"""

from __future__ import annotations

from typing import Protocol

from handlers.jobs import Job
from handlers.messages import Notify


class DeliveryError(Exception):
    """A notification did not reach the platform."""


class TransientDeliveryError(DeliveryError):
    """5xx, 429, a timeout or a dropped connection: the same request may succeed later."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentDeliveryError(DeliveryError):
    """The platform refused the request for a reason a retry does not change (bad id, no permission, …)."""


class Deliverer(Protocol):
    async def deliver(self, job: Job, note: Notify) -> None:
        """Send ``note`` about ``job`` (or refresh its card), raising a :class:`DeliveryError` when it did not go."""
        ...
