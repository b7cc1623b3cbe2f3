"""Which queue each outbox message goes to: the one its executor reads, so nothing takes a detour.

A job change's outbox holds typed messages (effects, timers, inputs); each is encoded once, here, and written in the
same atomic step as the change to:

- ``chat``: a :class:`~handlers.messages.Notify`, as the chat outbox's entry (the note and the job's platform), and
  a :class:`~handlers.messages.CostsChart` (the platform it was asked on, in its channel's own lane);
- ``cloud``: ``launch``, ``terminate``, ``interrupt-test``, ``stop-runner``, ``hand-over``, ``regroup``,
  ``release-gang``, ``check-nodes`` (:data:`handlers.messages.CLOUD_EFFECTS`), for the cloud executor;
- ``timers``: ``start-deadline``, ``page-step``, ``relaunch-due``, ``stop-deadline`` and ``policy-tick``
  (:data:`handlers.messages.TIMERS`), scored by when they fall due (then they are inputs);
- ``events``: anything else (an input the bot decides on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pydantic_core
from pydantic import BaseModel, ConfigDict

from handlers.messages import CLOUD_EFFECTS, TIMERS, CostsChart, Message, Notify

Destination = Literal["events", "chat", "cloud", "timers"]
DESTINATIONS: tuple[Destination, ...] = ("events", "chat", "cloud", "timers")

EVENT_FIELD = "event"  # the field of a stream entry that holds the message's JSON
# Approximate cap on every queue's length: far above any backlog, so trimming only drops long-acknowledged entries.
STREAM_MAXLEN = 100_000


class ChatEntry(BaseModel):
    """What the chat outbox reads: the note, and the platform of the job it is about (its id is the note's); a
    costs chart names no job and runs in its channel's ``lane`` (:func:`bot.bus.partition_key`)."""

    model_config = ConfigDict(frozen=True)
    id: str
    job_id: str | None = None
    lane: str | None = None
    platform: str = ""
    note: Notify | CostsChart


@dataclass(frozen=True, slots=True)
class Routed:
    destination: Destination
    payload: str  # the JSON stored: a stream entry's field, or the timer set's member
    due: float = 0.0  # timers: when it falls due (a POSIX timestamp)


def chat_entry(note: Notify | CostsChart, platform: str) -> str:
    """A :class:`ChatEntry`'s JSON, put together around the note's own: the note is a model already (nothing to
    check again) and its JSON is made once, without building the entry model only to encode it."""
    if isinstance(note, Notify):  # a job's note: no lane (its job is its lane)
        head = pydantic_core.to_json({"id": note.id, "job_id": note.job_id, "platform": platform})
    else:
        head = pydantic_core.to_json({"id": note.id, "job_id": None, "lane": note.lane, "platform": platform})
    return f'{head[:-1].decode()},"note":{note.model_dump_json()}}}'


def route(message: Message, platform: str) -> Routed:
    """Where ``message`` goes, encoded once; ``platform`` is the chat platform of the job it concerns."""
    if isinstance(message, Notify | CostsChart):
        return Routed("chat", chat_entry(message, platform))
    if isinstance(message, CLOUD_EFFECTS):
        return Routed("cloud", message.model_dump_json())
    if isinstance(message, TIMERS):
        return Routed("timers", message.model_dump_json(), message.due.timestamp())
    return Routed("events", message.model_dump_json())
