"""Which queue each outbox message goes to: the one its executor reads, so nothing takes a detour.

A job change's outbox holds effects and timers. Each is written, in the same atomic step as the change, to:

- ``chat``: a :class:`~handlers.messages.Notify`, as the chat outbox's entry (the note and the job's platform);
- ``cloud``: ``launch``, ``terminate``, ``interrupt-test``, ``stop-runner``, for the cloud executor;
- ``timers``: ``start-deadline``, ``page-step``, ``relaunch-due``, ``stop-deadline`` and ``policy-tick``
  (:data:`handlers.messages.TIMERS`), scored by when they fall due (then they are inputs);
- ``events``: anything else (an input the bot decides on).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import pydantic_core

from handlers.messages import TIMERS, upgraded

Destination = Literal["events", "chat", "cloud", "timers"]
DESTINATIONS: tuple[Destination, ...] = ("events", "chat", "cloud", "timers")

EVENT_FIELD = "event"  # the field of a stream entry that holds the message's JSON
# Approximate cap on every queue's length: far above any backlog, so trimming only drops long-acknowledged entries.
STREAM_MAXLEN = 100_000

CLOUD_TYPES = frozenset({"launch", "terminate", "interrupt-test", "stop-runner"})
# The timers are the ones handlers/messages.py names: each type is written once, there.
TIMER_TYPES: frozenset[str] = frozenset(timer.model_fields["type"].default for timer in TIMERS)


@dataclass(frozen=True, slots=True)
class Routed:
    destination: Destination
    payload: str  # the JSON stored: a stream entry's field, or the timer set's member
    due: float = 0.0  # timers: when it falls due (a POSIX timestamp)


def chat_entry(note: dict[str, Any], platform: str) -> dict[str, Any]:
    """What the chat outbox reads: the note, and the platform of the job it is about (its id is the note's)."""
    return {"id": note["id"], "job_id": note.get("job_id"), "platform": platform, "note": note}


def route(message: dict[str, Any], platform: str) -> Routed:
    """Where ``message`` (with its ``id``) goes; ``platform`` is the chat platform of the job it concerns."""
    message = upgraded(message)  # one written before ``type`` was the discriminator goes on in today's shape
    kind = message.get("type")
    if kind == "notify":
        return Routed("chat", _json(chat_entry(message, platform)))
    if kind in CLOUD_TYPES:
        return Routed("cloud", _json(message))
    if kind in TIMER_TYPES:
        return Routed("timers", _json(message), _due(message.get("due")))
    return Routed("events", _json(message))


def _due(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        return datetime.fromisoformat(value).timestamp()
    raise ValueError(f"a timer needs a due time, got {value!r}")


def _json(value: dict[str, Any]) -> str:
    return pydantic_core.to_json(value).decode()
