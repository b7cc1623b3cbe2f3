"""Notes for tests, written as the handlers write them: a type and its fields (validated into the typed note)."""

from __future__ import annotations

from typing import Any

from handlers.messages import Notify, NotifyChannel


def notify(job_id: str, channel: NotifyChannel, note_type: str, /, **fields: Any) -> Notify:
    """A note of ``note_type`` (a card note: ``note_type`` is its cause) with ``fields``, as the chat outbox gets
    it."""
    note = {"type": "card", "cause": note_type} if channel == "card" else {"type": note_type, **fields}
    return Notify.model_validate({"job_id": job_id, "channel": channel, "note": note})


def note_type(item: dict[str, Any]) -> str:
    """What an outbox entry tells: a note's type (a card note's cause), '' for anything else."""
    note = item.get("note") or {}
    return str(note.get("cause") or note.get("type") or "")
