"""The entry: which decision an input message gets (one node's, a gang's, an attempt launched ahead's, a timer's).

The one place that tells a gang from one node for reports and cloud events, so :mod:`handlers.decide.inputs` and
:mod:`handlers.decide.gangs` need not call each other.
"""

from __future__ import annotations

from datetime import datetime

from handlers.change import Change
from handlers.decide import gangs, inputs, launching, recovery, steering
from handlers.decide.builders import ignore
from handlers.egress import with_moved_bytes
from handlers.failures import Failure
from handlers.jobs import Job
from handlers.lifecycle import Lifecycle
from handlers.messages import (
    BusMessage,
    CloudEvent,
    GangHoldDue,
    Launched,
    LaunchFailed,
    PageStep,
    PolicyTick,
    RelaunchDue,
    ReportReceived,
    StartDeadline,
    StopDeadline,
    StopFailed,
)
from handlers.oncall import OnCall, page_step
from handlers.report_fence import claims_another_rank, spoke_too_late
from handlers.spot import SpotView, managed

DEFAULT_LIFECYCLE = Lifecycle()


def decide(
    job: Job,
    message: BusMessage,
    now: datetime,
    oncall: OnCall | None = None,
    lifecycle: Lifecycle | None = None,
    spot: SpotView | None = None,
) -> Change | None:
    """The change an input message makes to ``job`` (possibly only a history note that it was ignored); ``None``
    when the job already says what the message says (the other path's warning of the same interruption): a
    duplicate writes nothing, not even a history line.

    ``spot``: what the cloud said of zones and prices, for a job the spot policy steers; without it such a job
    is relaunched as any other (the bot could not read the cloud)."""
    limits = lifecycle or DEFAULT_LIFECYCLE
    if isinstance(message, PageStep):
        return page_step(job, message, oncall or OnCall(), now)
    if isinstance(message, ReportReceived):  # bytes moved are paid for, whatever the report then changes
        job = with_moved_bytes(job, message.report)
    if job.standby is not None:  # a switch of market launched ahead: what its launch and its runner say
        ahead = steering.ahead(job, job.standby, message, now, limits)
        if ahead is not None:
            return ahead
    if isinstance(message, ReportReceived):
        # An ended attempt's key, past its grace, or a gang node's naming another's rank: recorded, nothing more.
        # Judged by when the report was admitted (not after now: a test's clock may be behind the wall's).
        fenced = spoke_too_late(job, message.report, min(message.at, now)) or claims_another_rank(job, message.report)
        if fenced is not None:
            return ignore(job, f"report:{message.report.type}", fenced, attempt=message.report.attempt)
        if job.nodes > 1:
            return gangs.report(job, message.report, now, limits, spot)
        return inputs.report(job, message.report, now, limits, spot)
    if isinstance(message, CloudEvent):
        if job.nodes > 1:
            return gangs.cloud(job, message, now, limits, spot)
        return inputs.cloud(job, message, now, limits, spot)
    if isinstance(message, Launched):
        return gangs.launched(job, message, now) if job.nodes > 1 else inputs.launched(job, message, now)
    if isinstance(message, LaunchFailed) and job.nodes > 1:
        return gangs.launch_failed(job, message, now, limits, spot if spot is not None and managed(job) else SpotView())
    if isinstance(message, LaunchFailed):
        if message.attempt != job.attempt:
            return ignore(job, message.type, f"for attempt {message.attempt}, current is {job.attempt}")
        current = job.current
        if message.capacity and current is not None and current.market == "spot":  # the decision chooses again
            return steering.capacity(job, message, now, spot if spot is not None and managed(job) else SpotView())
        reason = Failure.of("launch-failed", error=message.reason)
        return recovery.failure(job, "launch-failed", reason, now, [], limits)
    if isinstance(message, StartDeadline):
        current = job.current
        if message.attempt != job.attempt or current is None or current.started_at is not None:
            return ignore(job, message.type, "the attempt started, or was replaced")
        if current.handed_over_at is not None and message.due < current.handed_over_at + launching.START_TIMEOUT:
            return ignore(job, message.type, "the deadline of its launch ahead: its hand-over set another")
        return recovery.failure(job, "start-timeout", Failure.of("start-timeout"), now, [], limits, spot)
    if isinstance(message, RelaunchDue):
        return inputs.relaunch_due(job, message, now)
    if isinstance(message, PolicyTick):
        return steering.tick(job, message, now, spot, limits)
    if isinstance(message, GangHoldDue):
        return gangs.hold_due(job, message, now, limits, spot if spot is not None and managed(job) else None)
    if isinstance(message, StopDeadline):
        if message.attempt != job.attempt:
            return ignore(job, message.type, f"for attempt {message.attempt}, current is {job.attempt}")
        return inputs.stopped_anyway(job, "stop-timeout", "the runner did not confirm the stop in time", now)
    if isinstance(message, StopFailed):
        current = job.current
        if current is None or current.instance_id != message.instance_id:
            return ignore(job, message.type, f"{message.instance_id} is not the current instance")
        why = f"the runner could not be asked to stop: {message.reason}"
        return inputs.stopped_anyway(job, "stop-failed", why, now)
    return ignore(job, message.type, "not an input")
