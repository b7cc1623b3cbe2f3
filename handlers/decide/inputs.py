"""What a one-node job's runner and cloud say: reports (started, progress, checkpoint, notice, interrupted,
completed, failed), cloud events, launch results and timers. Fencing happens here and in :mod:`handlers.decide.gangs`:
a report or event for an attempt other than the current one never moves the job, but what it tells people is
still told (a late spot warning alerts once per attempt; a late checkpoint receipt is posted).

The pieces a gang's node says the same way (a notice, a rebalance, a fenced report, a failure) are public here for
:mod:`handlers.decide.gangs`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from handlers.change import Change
from handlers.decide import early_signals, launching, recovery, steering
from handlers.decide.builders import advance, change, chart_note, ignore, make, notify
from handlers.failures import Failure
from handlers.instance_claims import foreign_instance
from handlers.jobs import TERMINAL_STATES, CheckpointRef, Job, JobState
from handlers.lifecycle import Lifecycle, furthest_step, restored
from handlers.messages import (
    CloudEvent,
    Launched,
    Message,
    Notify,
    RelaunchDue,
    Terminate,
)
from handlers.notes import (
    CardRefresh,
    CompletedNote,
    HungNote,
    InstanceGone,
    InterruptedNote,
    InterruptionWarning,
    RebalanceCheckpoint,
    Resumed,
    Stopped,
)
from handlers.notice_budget import measured
from handlers.pagers import resolutions
from handlers.reports import (
    CheckpointSaved,
    Completed,
    Failed,
    Hung,
    Interrupted,
    Notice,
    Progress,
    RunnerReport,
    RunnerWarning,
    Standby,
    Started,
)
from handlers.restart_overhead import first_step
from handlers.spot import SpotView
from handlers.transitions import Trigger, next_state


def report(
    job: Job, report: RunnerReport, now: datetime, limits: Lifecycle, spot: SpotView | None
) -> Change | None:
    if report.attempt != job.attempt:
        if isinstance(report, Completed) and job.attempt_numbered(report.attempt) is not None:
            return _completed(job, report, now)  # an attempt judged gone finished the job after all
        return fenced(job, report, now)
    if isinstance(report, Started):
        return _started(job, report, now)
    if isinstance(report, Progress):
        return advance(
            job,
            "progress",
            now,
            {**progress_updates(job, report), **first_step(job, report.time)},
            history=None,
            outbox=[notify(job, "card", CardRefresh(cause="progress"))],
        )
    if isinstance(report, CheckpointSaved) and job.current is not None and job.current.ended_at is not None:
        return _late_commit(job, report, now)  # after its interrupted report
    if isinstance(report, CheckpointSaved):
        return _checkpoint_saved(job, report, now)
    if isinstance(report, Notice):
        if report.kind == "rebalance":
            return rebalance(job, report.source, now, spot)
        if report.kind == "stop":
            return ignore(job, "notice:stop", "the runner acknowledges a stop")
        if report.kind == "save":
            return ignore(job, "notice:save", "the runner acknowledges a save request")
        if early_signals.before_start(job):  # the runner saw it while restoring: it will not train there
            return early_signals.warned_before_start(job, report.source, report.deadline, now, limits, spot)
        return spot_interruption(job, report.source, report.deadline, now)
    if isinstance(report, Interrupted):
        return _interrupted(job, report, now, limits, spot)
    if isinstance(report, Completed):
        return _completed(job, report, now)
    return report_rest(job, report, now, limits, spot)


def progress_updates(job: Job, report: Progress) -> dict[str, Any]:
    """A progress report's word on the job: its step never goes back, and the loss shown is the furthest step's, so
    a report that comes after a newer one (SNS to a standard SQS queue keeps no order) moves neither."""
    newest = report.step >= (job.step or 0)
    return {
        "step": furthest_step(job, report.step),
        "total_steps": report.total_steps or job.total_steps,
        "loss": report.loss if newest else job.loss,
    }


def report_rest(job: Job, report: RunnerReport, now: datetime, limits: Lifecycle, spot: SpotView | None) -> Change:
    """A failure, a gang node standing by, or a warning: the same for one node and for a gang."""
    if isinstance(report, Failed):
        detail = {"log_tail": report.log_tail[-10:], "exit_code": report.exit_code}
        trigger: Trigger = "failed" if job.attempt == 1 else "resume-failed"
        return recovery.failure(job, trigger, report.failure, now, [], limits, spot, **detail)
    if isinstance(report, Standby):
        return Change(job, standby_history(report))
    if isinstance(report, RunnerWarning):
        return Change(job, {"event": "runner-warning", "kind": report.kind, "message": report.message})
    if isinstance(report, Hung):
        return hung(job, report, now, limits, spot)
    return ignore(job, f"report:{report.type}", "not for this job's state")


def hung(job: Job, report: Hung, now: datetime, limits: Lifecycle, spot: SpotView | None) -> Change:
    """The runner found its trainer hung and ended it: the thread hears where it hung and what follows. The first
    hang of an attempt is restarted in place (a gang's node regroups); the second ends the attempt, and the job
    relaunches on another instance (a hang can be the host's), the attempt counted towards the relaunch bound."""
    frames = report.frames[:5]
    then: Literal["restart", "relaunch", "regroup"] = "restart"
    if job.nodes > 1:
        then = "regroup"
    elif report.ends_attempt:
        then = "relaunch"
    note = HungNote(
        step=report.step,
        seconds=report.seconds,
        limit=report.limit_seconds,
        frames=frames,
        then=then,
        restart_from=report.restart_from,
    )
    history: dict[str, Any] = {
        "event": "hung",
        "step": report.step,
        "seconds": report.seconds,
        "frames": [f"{frame.function} ({frame.file}:{frame.line})" for frame in frames],
        "ends_attempt": report.ends_attempt,
    }
    told: list[Message] = [notify(job, "thread", note)]
    if then != "relaunch":
        return Change(job, history, told)
    state = next_state(job.state, "hung")
    if state is None:
        return Change(job, {**history, "ignored": f"the job is {job.state}"}, told)
    why = Failure.of("hung", step=str(report.step) if report.step is not None else "?")
    ended = launching.end_attempt(job, report.time, why.english)
    release = launching.releases(job)
    if state is JobState.STOPPED:  # a stop was under way: the job keeps what was committed
        kept = job.checkpoint.step if job.checkpoint is not None else None
        return change(ended, state, now, history, [*release, *told, notify(ended, "thread", Stopped(step=kept))])
    market = job.current.market if job.current else "spot"
    moved = ended.model_copy(update={"state": state})
    return recovery.again(job, moved, market, now, history, release, told, limits, why, spot, counts=True)


def standby_history(report: Standby) -> dict[str, Any]:
    """A gang node waits for the next generation: recorded in the job's history (acting on it is the gang's own
    decision: regroup, or move the whole gang)."""
    return {
        "event": "standby",
        "node_rank": report.node_rank,
        "generation": report.generation,
        "step": report.step,
        "cause": report.cause,
    }


def fenced(job: Job, report: RunnerReport, now: datetime) -> Change:
    """A report of an older attempt: recorded, not applied; what it tells people is still told (and a checkpoint it
    committed after its ``interrupted`` report is the job's newest)."""
    if isinstance(report, CheckpointSaved) and report.reason == "notice":
        return _late_commit(job, report, now)
    ignored = ignore(job, f"report:{report.type}", f"from attempt {report.attempt}, current is {job.attempt}")
    notes: list[Notify] = []
    if isinstance(report, Notice) and report.kind == "spot-interruption":
        notes = _warning_notes(job, report.attempt, report.source, report.deadline)
    elif isinstance(report, Interrupted):
        notes = [notify(job, "thread", interrupted_note(report, *steps_lost(job, report)))]
    return Change(job, ignored.history, list(notes))


def cloud(job: Job, event: CloudEvent, now: datetime, limits: Lifecycle, spot: SpotView | None) -> Change | None:
    current = job.current
    if current is None or current.instance_id != event.instance_id:
        ignored = ignore(job, f"cloud:{event.kind}", f"{event.instance_id} is not the current instance")
        old = next((a for a in job.attempts if a.instance_id == event.instance_id), None)
        if event.kind != "spot-interruption" or old is None:
            return ignored
        notes = _warning_notes(job, old.number, event.source, event.deadline)
        return Change(job, ignored.history, list(notes))
    if event.kind == "spot-interruption" and early_signals.before_start(job):
        return early_signals.warned_before_start(job, event.source, event.deadline, now, limits, spot)
    if event.kind == "spot-interruption":
        return spot_interruption(job, event.source, event.deadline, now)
    if event.kind == "rebalance":
        return rebalance(job, event.source, now, spot)
    if event.kind == "scheduled-event":
        return scheduled_event(job, event, now, spot)
    state = next_state(job.state, "instance-gone")
    if state is None:
        return ignore(job, "cloud:instance-gone", f"the job is {job.state}")
    history = {"event": "instance-gone", "instance": event.instance_id, "source": event.source}
    why = Failure.of("instance-gone", detail=event.detail or event.source)
    if job.switch_to is not None and job.state is JobState.STOPPING:  # gone before its checkpoint: switch anyway
        return steering.switched(job, launching.end_attempt(job, now, why.english), now, history)
    if state is JobState.RECOVERING:
        ended = launching.end_attempt(job, now, why.english)
        return recovery.again(
            job,
            ended.model_copy(update={"state": state}),
            current.market,
            now,
            history,
            [],
            [notify(job, "thread", InstanceGone(instance=event.instance_id))],
            limits,
            why,
            spot,
        )
    if state is JobState.RESUME_FAILED:
        reason = Failure.of("replacement-gone", instance=event.instance_id)
        return recovery.failure(job, "instance-gone", reason, now, [], limits)
    ended = launching.end_attempt(job, now, "stopped")
    kept = job.checkpoint.step if job.checkpoint is not None else None
    return change(ended, state, now, {**history, "kept_step": kept}, [notify(job, "thread", Stopped(step=kept))])


def _started(job: Job, report: Started, now: datetime) -> Change:
    state = next_state(job.state, "started")
    current = job.current
    if state is None or current is None:
        return ignore(job, "report:started", f"the job is {job.state}")
    if job.state is JobState.RESUME_FAILED and current.started_at is not None:  # its start is told once
        return ignore(job, "report:started", "the attempt's start is recorded already")
    foreign = foreign_instance(current, report.instance_id)
    if foreign is not None:
        return ignore(job, "report:started", foreign, instance=report.instance_id)
    # The attempt's instance is what its launch said (``launched``), never what a report claims: a report that
    # comes first moves the job, and the launch result brings the instance when it arrives.
    attempt = current.model_copy(
        update={
            "started_at": report.time,
            "restore_seconds": report.restore_seconds,
            "resumed_from_step": report.resumed_from_step,
        }
    )
    updates: dict[str, Any] = {"attempts": [*job.attempts[:-1], attempt]}
    updates.update(restored(job, report.resumed_from_step, report.restored_uri, report.time))
    fields: dict[str, Any] = {"attempt": attempt.number, "resumed_from_step": report.resumed_from_step}
    resumed = Resumed(attempt=attempt.number, step=report.resumed_from_step)
    if attempt.number > 1:
        lost = max((job.step or 0) - (report.resumed_from_step or 0), 0)
        previous = job.attempts[-2]
        downtime = (report.time - (previous.ended_at or previous.launched_at)).total_seconds()
        counted = previous.lost_steps or 0  # already in the total since its interruption: corrected, not added
        updates["steps_lost"] = max(job.steps_lost + lost - counted, 0)
        told_lost: int | None = None if previous.steps_unknown else lost  # the furthest step heard was no measure
        updates["downtime_seconds"] = job.downtime_seconds + max(downtime, 0.0)
        fields.update(
            lost=told_lost,
            downtime=round(max(downtime, 0.0), 1),
            zone=attempt.zone,
            skipped=[skip.model_dump() for skip in report.skipped],
        )
        resumed = resumed.model_copy(
            update={
                "lost": told_lost,
                "downtime": fields["downtime"],
                "zone": attempt.zone,
                "skipped": len(report.skipped),
            }
        )
    moved = job.model_copy(update=updates)
    outbox = [notify(moved, "card", CardRefresh(cause="started"))]
    if attempt.number > 1:
        outbox.append(notify(moved, "thread", resumed))
    return change(moved, state, now, {"event": "started", **fields}, outbox)


def rebalance(job: Job, source: str, now: datetime, spot: SpotView | None = None) -> Change:
    """Advice, not an interruption: the runner commits a fresh checkpoint early, the spot authority may move the job
    ahead of it (:mod:`handlers.decide.early_signals`); the thread hears what was done."""
    return early_signals.early_signal(job, "rebalance", source, now, spot)


def scheduled_event(job: Job, event: CloudEvent, now: datetime, spot: SpotView | None = None) -> Change:
    """A scheduled system event for one of the job's instances (Alibaba: maintenance, retirement): as a rebalance,
    and the runner, which cannot see it, is asked for the fresh checkpoint."""
    return early_signals.early_signal(
        job, "scheduled-event", event.source, now, spot, event.detail or None, event.deadline, event.instance_id
    )


def spot_interruption(job: Job, source: str, deadline: datetime | None, now: datetime) -> Change | None:
    state = next_state(job.state, "spot-interruption")
    if state is None:
        return ignore(job, "spot-interruption", f"the job is {job.state}")
    if job.state is JobState.INTERRUPTED:  # the other path (runner or cloud) already told us: nothing to write
        return None
    history = {"event": "spot-interruption", "source": source, "deadline": deadline.isoformat() if deadline else None}
    warned = job.model_copy(update={"interruptions": job.interruptions + 1})
    return change(warned, state, now, history, _warning_notes(warned, job.attempt, source, deadline))


def _warning_notes(job: Job, attempt: int, source: str, deadline: datetime | None) -> list[Notify]:
    """The alert and the thread message of attempt ``attempt``'s interruption warning, with ids of their own: the
    runner and the cloud both warn, late or not, and the chat outbox posts a note id once."""
    warned = job.attempt_numbered(attempt)
    instance = warned.instance_id if warned is not None else None
    warning = InterruptionWarning(instance=instance, source=source, deadline=deadline)
    return [
        Notify(id=f"{job.id}.{attempt}.interruption-warning.{channel}", job_id=job.id, channel=channel, note=warning)
        for channel in ("alert", "thread")
    ]


def _interrupted(job: Job, report: Interrupted, now: datetime, limits: Lifecycle, spot: SpotView | None) -> Change:
    state = next_state(job.state, "interrupted")
    if state is None:
        return ignore(job, "report:interrupted", f"the job is {job.state}")
    updates: dict[str, Any] = {}
    if report.step is not None and report.uri:
        updates["checkpoint"] = CheckpointRef(step=report.step, uri=report.uri, at=report.time)
    if job.state is JobState.RUNNING:  # no warning came first: count the interruption here
        updates["interruptions"] = job.interruptions + 1
    reached, lost = steps_lost(job, report)
    if reached is not None and lost is not None and job.current is not None:
        updates["step"] = furthest_step(job, reached)
        updates["steps_lost"] = job.steps_lost + lost
        counted = job.current.model_copy(update={"reached_step": reached, "lost_steps": lost})
        updates["attempts"] = [*job.attempts[:-1], counted]
    elif job.current is not None:
        updates["steps_lost_unknown"] = True
        updates["attempts"] = [*job.attempts[:-1], job.current.model_copy(update={"steps_unknown": True})]
    updated = job.model_copy(update=updates)
    why = Failure.of("interrupted", notice=report.reason)
    ended = launching.end_attempt(updated, report.time, why.english)
    fields = interrupted_fields(report)
    history = {"event": "interrupted", **fields, "reached_step": reached, "lost": lost}
    instance = job.current.instance_id if job.current else None
    release: list[Terminate] = [Terminate(job_id=job.id, instance_id=instance)] if instance else []
    if state is JobState.STOPPED and job.switch_to is not None:  # the policy's switch: checkpointed, relaunch
        return steering.switched(updated, ended, now, history, release)
    if state is JobState.STOPPED:
        return change(ended, state, now, history, [*release, notify(ended, "thread", Stopped(step=report.step))])
    market = job.current.market if job.current else "spot"
    return recovery.again(
        updated,
        ended.model_copy(update={"state": state}),
        market,
        now,
        history,
        release,
        [notify(ended, "thread", interrupted_note(report, reached, lost))],  # the relaunch refreshes the card
        limits,
        why,
        spot,
    )


def steps_lost(job: Job, report: Interrupted) -> tuple[int | None, int | None]:
    """The step the trainer stopped at (the runner's word) and the steps trained past the committed checkpoint; both
    None when the runner could not see the trainer's step (it writes no progress and saved nothing fresh): the
    furthest step heard is then only the last checkpoint, and counting from it would say 0 lost."""
    reached = report.reached_step
    if reached is None:
        return None, None
    committed = report.step if report.step is not None else (job.checkpoint.step if job.checkpoint else 0)
    return reached, max(reached - committed, 0)


def _checkpoint_saved(job: Job, report: CheckpointSaved, now: datetime) -> Change:
    """The current attempt committed a checkpoint: the job's newest, and word that the trainer got that far (the
    card's step is never behind its checkpoint). One this attempt committed before the job's checkpoint changes
    nothing: SNS to a standard SQS queue does not keep order. One of a lower step than an earlier attempt's counts:
    this attempt may have resumed from an older checkpoint than the newest it was told of."""
    held = job.checkpoint
    started = job.current.started_at if job.current is not None else None
    if held is not None and started is not None and held.at >= started and report.step <= held.step:
        return ignore(job, "report:checkpoint_saved", "not newer than the job's checkpoint")
    checkpoint = CheckpointRef(step=report.step, uri=report.uri, at=report.time)
    outbox = [notify(job, "card", CardRefresh(cause="checkpoint"))]
    if report.reason == "rebalance":
        outbox.append(notify(job, "thread", RebalanceCheckpoint(step=report.step, seconds=report.seconds)))
    budget, warning = measured(job, report)
    if warning is not None:
        outbox.append(notify(job, "thread", warning))
    return advance(
        job,
        "checkpoint",
        now,
        {"checkpoint": checkpoint, "step": furthest_step(job, report.step), **budget},
        {"event": "checkpoint", "step": report.step, "reason": report.reason},
        outbox,
    )


def _late_commit(job: Job, report: CheckpointSaved, now: datetime) -> Change:
    """A checkpoint the runner committed after its ``interrupted`` report, before its machine went: the job's
    checkpoint and its steps lost say so (unless a later attempt has started since, from what it found)."""
    newer = job.checkpoint is None or report.step > job.checkpoint.step
    later_started = any(a.number > report.attempt and a.started_at is not None for a in job.attempts)
    attempt = job.attempt_numbered(report.attempt)
    if not newer or later_started or attempt is None:
        return ignore(job, "report:checkpoint_saved", "not newer than the job's checkpoint")
    updates: dict[str, Any] = {
        "checkpoint": CheckpointRef(step=report.step, uri=report.uri, at=report.time),
        "checkpoint_bytes": report.bytes,
    }
    if attempt.reached_step is not None and attempt.lost_steps is not None:
        lost = max(attempt.reached_step - report.step, 0)
        updates["steps_lost"] = max(job.steps_lost + lost - attempt.lost_steps, 0)
        corrected = attempt.model_copy(update={"lost_steps": lost})
        updates["attempts"] = [corrected if a.number == report.attempt else a for a in job.attempts]
    moved = job.model_copy(update={**updates, "updated_at": now})
    history = {"event": "late-commit", "attempt": report.attempt, "step": report.step}
    return make(moved, history, [notify(moved, "card", CardRefresh(cause="checkpoint"))])


def interrupted_note(report: Interrupted, reached: int | None, lost: int | None) -> InterruptedNote:
    return InterruptedNote(
        step=report.step,
        seconds=report.seconds,
        saved_in_time=report.saved_in_time,
        late=report.late,
        reached=reached,
        lost=lost if reached is not None else None,
    )


def interrupted_fields(report: Interrupted) -> dict[str, Any]:
    """The history's record of an interruption (English, for operators)."""
    return {
        "step": report.step,
        "seconds": report.seconds,
        "saved_in_time": report.saved_in_time,
        "note": report.note,
        "reason": report.reason,
    }


def _completed(job: Job, report: Completed, now: datetime) -> Change:
    """The job's output is committed: it succeeded, whichever of its attempts says so. An older attempt's word
    counts too (the cloud's instance-gone came first, while a dead replica held its report: a newer attempt was
    launched for nothing and is terminated)."""
    state = next_state(job.state, "completed")
    if state is None:
        return ignore(job, "report:completed", f"the job is {job.state}")
    older = report.attempt != job.attempt
    ending = (now, f"attempt {report.attempt} completed the job") if older else (report.time, "completed")
    cleared, resolved = stand_down(job)
    done = launching.end_attempt(job, *ending).model_copy(
        update={
            "output_uri": report.output_uri,
            "step": report.step or job.step,
            "total_steps": report.total_steps or job.total_steps,
            **cleared,
        }
    )
    instance = job.current.instance_id if job.current else None
    outbox: list[Message] = [
        notify(done, "thread", CompletedNote(output_uri=report.output_uri)),
        chart_note(done, "completed"),
        *resolved,
    ]
    if instance:
        outbox.insert(0, Terminate(job_id=job.id, instance_id=instance))
    history: dict[str, Any] = {"event": "completed", "output_uri": report.output_uri}
    if older:
        history["attempt"] = report.attempt
    if cleared:
        history["after"] = "resume-failed"
    return change(done, state, now, history, outbox)


def stand_down(job: Job) -> tuple[dict[str, Any], list[Message]]:
    """What a completion clears when the job had been judged failed (RESUME_FAILED) and finished after all: its
    failure and its page (nothing to show, nobody to wake), with the page resolved in its tools. Nothing otherwise."""
    if job.state is not JobState.RESUME_FAILED:
        return {}, []
    return {"failure": None, "page": None}, list(resolutions(job, job.page))


def launched(job: Job, message: Launched, now: datetime) -> Change:
    current = job.current
    state = next_state(job.state, "launched")
    if current is None or message.attempt != current.number:
        return launching.unwanted(job, message, f"for attempt {message.attempt}, current is {job.attempt}")
    if current.instance_id not in (None, message.instance_id):
        return launching.unwanted(job, message, f"attempt {current.number} runs on {current.instance_id}")
    if state is None and (job.state in TERMINAL_STATES or current.ended_at is not None):
        return launching.unwanted(job, message, f"the job is {job.state}")
    if state is None:  # the runner reported before the launch result arrived: keep the state, note the details
        state = job.state
    attempt = current.model_copy(update=launching.launch_details(message))
    moved = job.model_copy(update={"attempts": [*job.attempts[:-1], attempt]})
    history = {
        "event": "launched",
        "attempt": attempt.number,
        "instance": message.instance_id,
        "zone": message.zone,
        "market": message.market,
    }
    outbox: list[Message] = [notify(moved, "card", CardRefresh(cause="launched"))]
    if state is JobState.STOPPING:
        outbox.append(Terminate(job_id=job.id, instance_id=message.instance_id))
    return change(moved, state, now, history, outbox)


def relaunch_due(job: Job, message: RelaunchDue, now: datetime) -> Change:
    """The pause is over: launch the attempt that was planned, unless the job has moved on meanwhile."""
    current = job.current
    state = next_state(job.state, "relaunch-due")
    if current is None or message.attempt != current.number or current.instance_id or current.ended_at:
        return ignore(job, message.type, f"for attempt {message.attempt}, current is {job.attempt}")
    if state is None:
        return ignore(job, message.type, f"the job is {job.state}")
    history = {"event": "relaunch-due", "attempt": current.number}
    if job.nodes > 1:
        return change(job, state, now, history, launching.launch_first(job, message.market, now, message.zone))
    launch = launching.launch_order(job, current.number, message.market, now, message.zone)
    return change(job, state, now, history, launch)


def stopped_anyway(job: Job, trigger: Trigger, why: str, now: datetime) -> Change:
    """A stop that cannot wait for the runner: terminate the instance; the job keeps what was committed."""
    state = next_state(job.state, trigger)
    if state is None:
        return ignore(job, trigger, f"the job is {job.state}")
    kept = job.checkpoint.step if job.checkpoint is not None else None
    outbox: list[Message] = list(launching.releases(job))
    ended = launching.end_attempt(job, now, why)
    if job.switch_to is not None:  # the policy's switch of market: relaunch from what was committed
        return steering.switched(job, ended, now, {"event": trigger, "reason": why, "kept_step": kept}, outbox)
    outbox.append(notify(ended, "thread", Stopped(step=kept)))
    return change(ended, state, now, {"event": trigger, "reason": why, "kept_step": kept}, outbox)
