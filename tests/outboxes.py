"""A change's outbox as the JSON its executors read, for tests that look into what was decided."""

from __future__ import annotations

from typing import Any

from handlers.change import Change
from handlers.messages import dump_message


def dumped(change: Change) -> list[dict[str, Any]]:
    """Each outbox message as it is written to its queue (``type`` the discriminator, notes as their JSON)."""
    return [dump_message(message) for message in change.outbox]
