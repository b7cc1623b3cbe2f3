"""What a decision returns: the job's new record, its history line, and the effects that follow (the outbox).

Its own module so that what builds one (``handlers.decide``, ``handlers.oncall``, ``handlers.reconcile``) and what
applies one (the store) depend on it, and it on the job and the messages, with no arrow back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from handlers.jobs import Job
from handlers.messages import Message
from handlers.reasons import Reason


@dataclass(frozen=True, slots=True)
class Change:
    """A decided change of one job: the new record, what to note in its history, what happens next.

    ``outbox`` holds typed messages (each with its id), written to their executors' queues in the same
    transaction as the job, so a crash can lose neither the state change nor what must follow from it. The store
    encodes each one once, on its way into Redis.
    """

    job: Job
    history: dict[str, Any]
    outbox: list[Message] = field(default_factory=list)
    reason: Reason | None = None  # why a person's command changed nothing (not stored; the history has it)
