"""Notes for tests, written as the handlers write them: a type and its fields (validated into the typed note)."""

from __future__ import annotations

from typing import Any

from handlers.messages import Notify, NotifyChannel


def notify(job_id: str, channel: NotifyChannel, topic: str, /, **fields: Any) -> Notify:
    """A note of type ``topic`` (a card note: ``topic`` is its cause) with ``fields``, as the chat outbox gets it."""
    note = {"type": "card", "cause": topic} if channel == "card" else {"type": topic, **fields}
    return Notify.model_validate({"job_id": job_id, "channel": channel, "note": note})


def topic(item: dict[str, Any]) -> str:
    """What an outbox entry tells: a note's type (a card note's cause), '' for anything else."""
    note = item.get("note") or {}
    return str(note.get("cause") or note.get("type") or "")
