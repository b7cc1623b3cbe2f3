"""Signals that come before an interruption: a spot warning for an instance that has not started training, and the
early signals of an instance at risk (an AWS rebalance recommendation, an Alibaba scheduled system event).

- A spot warning while the job's runner has not started (PROVISIONING, or RECOVERING with the relaunched instance
  booting: launched, pulling its image, restoring): the instance will not live to train. The thread hears so, the
  instance is terminated and the next attempt launched at once, through the relaunch every ended attempt takes
  (bounded: an attempt that never trained counts as one without progress).
- An early signal for a running job's instance: the runner commits a fresh checkpoint without stopping (it sees a
  rebalance itself; a scheduled event only the bot heard is passed on as a save request), and the spot authority
  (:mod:`handlers.spot.early`) may move the job ahead of the interruption, make-before-break, when that pays. One
  note per attempt and signal says what was done, whichever route (the runner, the cloud) told it first.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from handlers.change import Change
from handlers.decide import launching, recovery, steering
from handlers.decide.builders import advance, ignore
from handlers.failures import Failure
from handlers.jobs import Attempt, Job, JobState
from handlers.lifecycle import Lifecycle
from handlers.messages import Message, Notify, SaveRunner, Terminate
from handlers.notes import EarlySignalKind, InterruptionWarning, Rebalance, WarnedBeforeStart
from handlers.spot import SpotView
from handlers.spot.early import early_move
from handlers.transitions import next_state

BEFORE_START = (JobState.PROVISIONING, JobState.RECOVERING)


def before_start(job: Job) -> bool:
    """Is the job's current instance launched but its runner not started (a warning for it ends it at once)?"""
    current = job.current
    launched = current is not None and current.instance_id is not None and current.ended_at is None
    return job.state in BEFORE_START and launched and current is not None and current.started_at is None


def node_warned_before_start(job: Job, attempt: Attempt) -> bool:
    """Is a gang's node (``attempt``) launched but its runner not started (restoring, or a replacement waiting for
    its go)? A warning for it ends that node at once, as the gang's loss of a node."""
    return job.state in BEFORE_START and attempt.instance_id is not None and attempt.started_at is None


def warned_notes(job: Job, attempt: int, instance: str, source: str, deadline: datetime | None) -> list[Message]:
    """The alert and the thread's word for a warning before the runner started. Their ids are the attempt's: a
    later warning of the same attempt (the other route, the runner or the cloud) posts nothing."""
    prefix = f"{job.id}.{attempt}.interruption-warning"
    alert = InterruptionWarning(instance=instance, source=source, deadline=deadline)
    told = WarnedBeforeStart(instance=instance, source=source)
    return [
        Notify(id=f"{prefix}.alert", job_id=job.id, channel="alert", note=alert),
        Notify(id=f"{prefix}.thread", job_id=job.id, channel="thread", note=told),
    ]


def warned_before_start(
    job: Job, source: str, deadline: datetime | None, now: datetime, limits: Lifecycle, spot: SpotView | None
) -> Change:
    """A spot warning for an instance whose runner has not started: posted, released, relaunched at once."""
    current = job.current
    state = next_state(job.state, "warned-before-start")
    if state is None or current is None or current.instance_id is None or not before_start(job):
        return ignore(job, "spot-interruption", f"the job is {job.state}")
    instance = current.instance_id
    warned = job.model_copy(update={"interruptions": job.interruptions + 1})
    why = Failure.of("interrupted", notice=f"spot warning before the runner started ({source})")
    ended = launching.end_attempt(warned, now, why.english).model_copy(update={"state": state})
    history: dict[str, Any] = {
        "event": "warned-before-start",
        "instance": instance,
        "source": source,
        "deadline": deadline.isoformat() if deadline else None,
    }
    notes = warned_notes(job, current.number, instance, source, deadline)
    release = [Terminate(job_id=job.id, instance_id=instance)]
    return recovery.again(
        warned, ended, current.market, now, history, release, notes, limits, why, spot, first_at_once=True
    )


def early_signal(
    job: Job,
    signal: EarlySignalKind,
    source: str,
    now: datetime,
    spot: SpotView | None,
    event: str | None = None,
    due: datetime | None = None,
    instance: str | None = None,
) -> Change:
    """An early signal for ``instance`` (default: the current one) of a running job (see the module docstring). A
    scheduled event only the bot heard (the runner cannot have seen it) goes on to the runner as a save request."""
    current = job.current
    if next_state(job.state, "rebalance") is None or current is None or current.instance_id is None:
        return ignore(job, f"early-signal:{signal}", f"the job is {job.state}")
    instance = instance or current.instance_id
    move = early_move(job, spot, now)
    minutes = {
        "left_minutes": round(move.left_s / 60, 1) if move.left_s is not None else None,
        "restart_minutes": round(move.restart_s / 60, 1),
    }
    action = move.action if move.action != "stay" else "commit"
    note = Rebalance(signal=signal, event=event, due=due, action=action, **minutes)
    history: dict[str, Any] = {"event": "rebalance", "signal": signal, "source": source, "move": move.action}
    if event:
        history["system_event"] = event
    outbox: list[Message] = [
        Notify(id=f"{job.id}.{current.number}.early-signal.{signal}", job_id=job.id, channel="thread", note=note)
    ]
    if signal == "scheduled-event":
        outbox.insert(0, SaveRunner(job_id=job.id, instance_id=instance, at=now))
    noted = advance(job, "rebalance", now, {}, history, outbox)
    if move.action != "ahead":
        return noted
    ahead = steering.launch_ahead(noted.job, move.market, move.zone, now)
    return Change(ahead.job, {**noted.history, **ahead.history}, [*noted.outbox, *ahead.outbox])
