"""The Change builders every decision uses: a note to the chat, a history line, a move through the state table,
a command that changed nothing (and why, in the person's language: :data:`WORDING`).

:func:`make` also gives up an attempt launched ahead (``job.standby``) once the job no longer wants the switch it
was launched for, so no decision can leave one billing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from handlers.change import Change
from handlers.jobs import Job, JobState
from handlers.messages import (
    Message,
    Notify,
    NotifyChannel,
    Terminate,
)
from handlers.notes import (
    ChartNote,
    Note,
)
from handlers.reasons import Reason, Wording
from handlers.transitions import Trigger, next_state

# Why a person's command changed nothing (the catalogue's ``ignored.*``); the history keeps the English.
WORDING = Wording(
    {
        "ignored.stop": "the job is {state}",
        "ignored.interrupt-test": "the job is {state}, not RUNNING",
        "ignored.ack": "nothing to acknowledge: the job is {state}",
        "ignored.no-page": "no page is open",
        "ignored.already-acked": "already acknowledged by {by}",
        "ignored.resume": "the job is {state}; only failed or stopped jobs can be resumed",
        "ignored.not-a-gang": "node={node} is for a job of several nodes; this one runs on one",
    }
)


def _keeps_standby(job: Job) -> bool:
    """Whether the switch a standby was launched for is still on: the job trains until the standby is up, then stops
    through a checkpoint for it; an interruption of the current attempt hands over to it early. Anything else (a
    stop, a completion, a failure) gives it up."""
    if job.state is JobState.RUNNING:
        return job.switch_to is None
    if job.state is JobState.STOPPING:
        return job.switch_to is not None
    return job.state is JobState.INTERRUPTED


def without_standby(job: Job) -> Change:
    """``job`` without its standby: its instance, if it has one, released (the history says which attempt)."""
    standby = job.standby
    released = [Terminate(job_id=job.id, instance_id=standby.instance_id)] if standby and standby.instance_id else []
    history = {"standby_released": standby.number} if standby else {}
    return Change(job.model_copy(update={"standby": None}), history, list(released))


def advance(
    job: Job,
    trigger: Trigger,
    now: datetime,
    updates: dict[str, Any],
    history: dict[str, Any] | None,
    outbox: Sequence[Message],
) -> Change:
    state = next_state(job.state, trigger)
    if state is None:
        return ignore(job, trigger, f"the job is {job.state}")
    moved = job.model_copy(update={**updates, "state": state, "updated_at": now})  # one copy: as _change, at once
    return make(moved, {**(history or {"event": trigger}), "state": state.value}, outbox)


def change(job: Job, state: JobState, now: datetime, history: dict[str, Any], outbox: Sequence[Message]) -> Change:
    moved = job.model_copy(update={"state": state, "updated_at": now})
    return make(moved, {**history, "state": state.value}, outbox)


def make(job: Job, history: dict[str, Any], outbox: Sequence[Message]) -> Change:
    if job.standby is not None and not _keeps_standby(job):  # the switch it was launched for will not happen
        released = without_standby(job)
        return Change(released.job, {**history, **released.history}, [*outbox, *released.outbox])
    return Change(job, history, list(outbox))


def ignore(job: Job, what: str, why: str | Reason, **extra: Any) -> Change:
    """Record that ``what`` was not applied and why; the job itself does not change.

    ``why`` is a Reason when a person asked (the bot answers them in their language); the history keeps English.
    """
    history = {"event": "ignored", "what": what, "why": str(why), "state": job.state.value, **extra}
    return Change(job, history, reason=why if isinstance(why, Reason) else None)


def notify(job: Job, channel: NotifyChannel, note: Note) -> Notify:
    return Notify(job_id=job.id, channel=channel, note=note)


def chart_note(job: Job, occasion: Literal["completed", "failed"]) -> Notify:
    """The chart posted when the job ends: one id per attempt that ended it, so it is posted once."""
    chart = ChartNote(occasion=occasion)
    return Notify(id=f"{job.id}.{job.attempt}.chart", job_id=job.id, channel="thread", note=chart)
