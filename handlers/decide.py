"""Every decision about a job, as pure functions: (job, what happened, now) → Change.

The bus handler loads the job, calls :func:`decide` inside the store's transaction and commits the Change;
commands from chat call the ``*_command`` functions the same way. Fencing happens here: a report or event for
an attempt other than the current one (a dying instance's late heartbeat, the old instance's termination
after a relaunch) never moves the job, as anything the transition table does not allow. Fencing stops an old
report from moving the job, not from being told: a late spot warning still alerts (once per attempt: its notes
have fixed ids, so the chat outbox posts whichever comes first and drops the other), and a late checkpoint
receipt is still posted. A launch result nobody wants any more (the job ended, or another attempt is current)
terminates its instance, so nothing bills unseen.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from handlers import gang_decide as gang  # a cycle: the gang's decisions call back into this module's helpers
from handlers.failures import Failure
from handlers.instance_claims import foreign_instance
from handlers.jobs import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    Attempt,
    Change,
    ChatRef,
    CheckpointRef,
    Job,
    JobState,
    Market,
    Page,
)
from handlers.lifecycle import Lifecycle, best_step, furthest_step, gives_up, relaunch_pause, without_progress
from handlers.messages import (
    BusMessage,
    CloudEvent,
    GangHoldDue,
    HandOver,
    InterruptTest,
    Launch,
    Launched,
    LaunchFailed,
    Message,
    Notify,
    NotifyChannel,
    PageStep,
    PolicyTick,
    RelaunchDue,
    ReleaseGang,
    ReportReceived,
    StartDeadline,
    StopDeadline,
    StopFailed,
    StopRunner,
    Terminate,
)
from handlers.notes import (
    Acked,
    CardRefresh,
    ChartNote,
    CompletedNote,
    FailedNote,
    InstanceGone,
    InterruptedNote,
    InterruptionWarning,
    InterruptTestStarted,
    Note,
    Rebalance,
    RebalanceCheckpoint,
    RelaunchPaused,
    Resumed,
    ResumeRequested,
    SpotPolicyNote,
    Stopped,
    StopRequested,
)
from handlers.oncall import OnCall, open_page, page_step
from handlers.pagers import Tool, acknowledgements, resolutions
from handlers.reasons import Reason, Wording
from handlers.report_fence import claims_another_rank, spoke_too_late
from handlers.reports import (
    CheckpointSaved,
    Completed,
    Failed,
    Interrupted,
    Notice,
    Progress,
    RunnerReport,
    RunnerWarning,
    Standby,
    Started,
)
from handlers.restart import first_step
from handlers.spot import Choice, Event, SpotView, choose, managed
from handlers.spot.steer import next_stretch, refused, tick_market
from handlers.transitions import Trigger, next_state

START_TIMEOUT = timedelta(minutes=15)
POLICY_USER = "spot-policy"  # who a stop for the budget is by, in the history and the thread
DEFAULT_TICK = timedelta(minutes=5)  # the next tick, when the cloud could not be read for the period
DEFAULT_LIFECYCLE = Lifecycle()

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


def new_job(
    job_id: str,
    recipe: str,
    params: dict[str, Any],
    user: str,
    chat: ChatRef | None,
    now: datetime,
    total_steps: int | None = None,
    *,
    deadline: datetime | None = None,
    budget: float | None = None,
    spot_policy: str | None = None,
    spot: SpotView | None = None,
    team: str | None = None,
    nodes: int = 1,
    efa: bool = False,
) -> Change:
    """A job is created PENDING with its first attempt planned; the launch follows through the outbox. A job the
    spot policy steers (a deadline, a budget: :func:`handlers.spot.managed`) launches where the policy says, and
    its policy ticks start; any other job launches where ``spot-first`` says (:mod:`handlers.spot`)."""
    job = Job(
        id=job_id,
        recipe=recipe,
        params=params,
        requested_by=user,
        chat=chat,
        team=team,  # its owner, home channel and team decide who may act on it (handlers/permissions.py)
        total_steps=total_steps,  # known from the recipe before any report: `list` shows step 0/300, not 0/?
        deadline=deadline,
        budget=budget,
        spot_policy=spot_policy,
        restart_seconds=spot.restart_s if spot is not None else None,  # the recipe's, until the job measures its own
        nodes=nodes,  # more than one: a gang (handlers/gang_decide.py)
        efa=efa,
        created_at=now,
        updated_at=now,
    )
    history: dict[str, Any] = {"event": "created", "by": user, "recipe": recipe, "params": params}
    if team is not None:
        history["team"] = team
    if nodes > 1:
        history.update(nodes=nodes, efa=efa)
    if spot is not None and managed(job):
        history.update(deadline=deadline.isoformat() if deadline else None, budget=budget, policy=spot_policy)
        ticking, tick = _next_tick(job, now, spot.period)
        return _steer(ticking, ticking, now, history, [tick], spot, "launch")
    return _steer(job, job, now, history, [], SpotView(), "launch")


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
    if job.standby is not None:  # a switch of market launched ahead: what its launch and its runner say
        ahead = _ahead(job, job.standby, message, now, limits)
        if ahead is not None:
            return ahead
    if isinstance(message, ReportReceived):
        # An ended attempt's key, past its grace, or a gang node's naming another's rank: recorded, nothing more.
        # Judged by when the report was admitted (not after now: a test's clock may be behind the wall's).
        fenced = spoke_too_late(job, message.report, min(message.at, now)) or claims_another_rank(job, message.report)
        if fenced is not None:
            return _ignored(job, f"report:{message.report.type}", fenced, attempt=message.report.attempt)
        return _report(job, message.report, now, limits, spot)
    if isinstance(message, CloudEvent):
        return _cloud(job, message, now, limits, spot)
    if isinstance(message, Launched):
        return gang.launched(job, message, now) if job.nodes > 1 else _launched(job, message, now)
    if isinstance(message, LaunchFailed) and job.nodes > 1:
        return gang.launch_failed(job, message, now, limits, spot if spot is not None and managed(job) else SpotView())
    if isinstance(message, LaunchFailed):
        if message.attempt != job.attempt:
            return _ignored(job, message.type, f"for attempt {message.attempt}, current is {job.attempt}")
        current = job.current
        if message.capacity and current is not None and current.market == "spot":  # the decision chooses again
            return _capacity(job, message, now, spot if spot is not None and managed(job) else SpotView())
        return _failure(job, "launch-failed", Failure.of("launch-failed", error=message.reason), now, [], limits)
    if isinstance(message, StartDeadline):
        current = job.current
        if message.attempt != job.attempt or current is None or current.started_at is not None:
            return _ignored(job, message.type, "the attempt started, or was replaced")
        if current.handed_over_at is not None and message.due < current.handed_over_at + START_TIMEOUT:
            return _ignored(job, message.type, "the deadline of its launch ahead: its hand-over set another")
        return _failure(job, "start-timeout", Failure.of("start-timeout"), now, [], limits, spot)
    if isinstance(message, RelaunchDue):
        return _relaunch_due(job, message, now)
    if isinstance(message, PolicyTick):
        return _tick(job, message, now, spot, limits)
    if isinstance(message, GangHoldDue):
        return gang.hold_due(job, message, now, limits, spot if spot is not None and managed(job) else None)
    if isinstance(message, StopDeadline):
        if message.attempt != job.attempt:
            return _ignored(job, message.type, f"for attempt {message.attempt}, current is {job.attempt}")
        return _stopped_anyway(job, "stop-timeout", "the runner did not confirm the stop in time", now)
    if isinstance(message, StopFailed):
        current = job.current
        if current is None or current.instance_id != message.instance_id:
            return _ignored(job, message.type, f"{message.instance_id} is not the current instance")
        return _stopped_anyway(job, "stop-failed", f"the runner could not be asked to stop: {message.reason}", now)
    return _ignored(job, message.type, "not an input")


# -- commands ---------------------------------------------------------------------------------------------


def stop_command(job: Job, user: str, now: datetime, lifecycle: Lifecycle | None = None) -> Change:
    """Checkpoint, then release: the runner is asked to save and stop, with a deadline; a job with no live
    instance (between attempts, or its instance gone) is STOPPED at once with what was committed."""
    state = next_state(job.state, "stop")
    if job.state is JobState.STOPPING and job.switch_to is not None:
        # The policy's switch of market was under way: the checkpoint it waits for now ends the job instead.
        keeping = job.model_copy(update={"switch_to": None, "switch_zone": None})
        history = {"event": "stop", "by": user, "cancelled_switch": job.switch_to}
        return _change(keeping, job.state, now, history, [_note(job, "thread", StopRequested(by=user))])
    if state is None:
        return _ignored(job, "stop", WORDING("ignored.stop", state=job.state), by=user)
    current = job.current
    instance = current.instance_id if current is not None and current.ended_at is None else None
    outbox: list[Message] = [_note(job, "thread", StopRequested(by=user)), *resolutions(job, job.page)]
    job = job.model_copy(update={"page": None})  # a stop closes the page: nobody needs waking for it
    if job.nodes > 1:
        instance = next((a.instance_id for a in job.gang_attempts.values() if a.instance_id), None)
    if state is JobState.STOPPING and instance is None:  # nothing runs that could save a checkpoint
        state = next_state(job.state, "stop-no-instance") or JobState.STOPPED
    if state is JobState.STOPPING and instance:
        due = now + (lifecycle or DEFAULT_LIFECYCLE).stop_timeout
        runners = gang.stop_runners(job) if job.nodes > 1 else [StopRunner(job_id=job.id, instance_id=instance)]
        if job.nodes > 1:  # the nodes not launched yet end now: their launches in flight start nothing that stays
            job = gang.end_unlaunched(job, now, f"stopped by {user} before its launch")
        outbox.extend(runners)
        outbox.append(StopDeadline(job_id=job.id, attempt=job.attempt, due=due))
        return _change(job, state, now, {"event": "stop", "by": user}, outbox)
    if job.nodes > 1:
        outbox.extend(_releases(job))
    elif instance:
        outbox.append(Terminate(job_id=job.id, instance_id=instance))
    ended = _end_attempt(job, now, f"stopped by {user}")
    kept = job.checkpoint.step if job.checkpoint is not None else None
    outbox.append(_note(ended, "thread", Stopped(step=kept)))
    return _change(ended, state, now, {"event": "stop", "by": user, "kept_step": kept}, outbox)


def interrupt_test_command(job: Job, user: str, now: datetime, node: int | None = None) -> Change:
    """A real spot interruption of the job's instance (a gang's: of node ``node``, by default its last)."""
    instance = job.current.instance_id if job.current else None
    if job.nodes > 1:
        drilled = gang.drilled(job, node)
        instance = drilled.instance_id if drilled is not None else None
    elif node is not None:
        return _ignored(job, "interrupt-test", WORDING("ignored.not-a-gang", node=node), by=user)
    state = next_state(job.state, "interrupt-test")
    if state is None or instance is None:
        return _ignored(job, "interrupt-test", WORDING("ignored.interrupt-test", state=job.state), by=user)
    outbox: list[Message] = [
        InterruptTest(job_id=job.id, instance_id=instance, requested_by=user),
        _note(job, "thread", InterruptTestStarted(by=user, instance=instance)),
    ]
    return _change(job, state, now, {"event": "interrupt-test", "by": user}, outbox)


def ack_command(job: Job, user: str, now: datetime, via: Tool | None = None) -> Change:
    """``user`` owns the page now: in chat, or (``via``) in a paging tool; every other tool it is open in hears."""
    if next_state(job.state, "ack") is None:
        return _ignored(job, "ack", WORDING("ignored.ack", state=job.state), by=user)
    if job.page is None:
        return _ignored(job, "ack", WORDING("ignored.no-page"), by=user)
    if job.page.acked_by:
        return _ignored(job, "ack", WORDING("ignored.already-acked", by=job.page.acked_by), by=user)
    page = job.page.model_copy(update={"acked_by": user, "acked_at": now, "acked_via": via})
    acked = job.model_copy(update={"page": page, "updated_at": now})
    history: dict[str, Any] = {"event": "ack", "by": user, "at": now.isoformat(), "after_steps": page.sent}
    if via is not None:
        history["via"] = via
    return _make(
        acked,
        history,
        [
            _note(acked, "thread", Acked(by=user, at=now, via=via)),
            _note(acked, "card", CardRefresh(cause="acked")),
            *acknowledgements(acked, page, user, via),
        ],
    )


def resume_command(job: Job, user: str, on_demand: bool, now: datetime, spot: SpotView | None = None) -> Change:
    if next_state(job.state, "resume") is None:
        return _ignored(job, "resume", WORDING("ignored.resume", state=job.state), by=user)
    market: Market = "on-demand" if on_demand else "spot"
    # A person chose to try again: the count of attempts without progress starts over.
    moved = job.model_copy(
        update={"state": JobState.RECOVERING, "failure": None, "page": None, "attempts_without_progress": 0}
    )
    history = {"event": "resume", "by": user, "market": market}
    notes: list[Message] = [_note(job, "thread", ResumeRequested(by=user, market=market)), *resolutions(job, job.page)]
    if spot is not None and managed(moved):
        moved, tick = _next_tick(moved, now, spot.period)  # the job's ticks ended with it: a new chain starts
        notes.append(tick)
        if not on_demand:  # a person who asks for on-demand gets it; otherwise the policy chooses
            return _steer(job, moved, now, history, notes, spot, "launch")
    elif not on_demand:  # spot-first chooses the zone (and on-demand, when no zone has spot)
        return _steer(job, moved, now, history, notes, SpotView(), "launch")
    return _relaunch(job, moved, market, now, history, notes)


# -- inputs -----------------------------------------------------------------------------------------------


def _report(
    job: Job, report: RunnerReport, now: datetime, limits: Lifecycle, spot: SpotView | None
) -> Change | None:
    if job.nodes > 1:
        return gang.report(job, report, now, limits, spot)
    if report.attempt != job.attempt:
        if isinstance(report, Completed) and job.attempt_numbered(report.attempt) is not None:
            return _completed(job, report, now)  # an attempt judged gone finished the job after all
        return _fenced(job, report, now)
    if isinstance(report, Started):
        return _started(job, report, now)
    if isinstance(report, Progress):
        return _update(
            job,
            "progress",
            now,
            {**progress_updates(job, report), **first_step(job, report.time)},
            history=None,
            outbox=[_note(job, "card", CardRefresh(cause="progress"))],
        )
    if isinstance(report, CheckpointSaved) and job.current is not None and job.current.ended_at is not None:
        return _late_commit(job, report, now)  # after its interrupted report
    if isinstance(report, CheckpointSaved):
        return _checkpoint_saved(job, report, now)
    if isinstance(report, Notice):
        if report.kind == "rebalance":
            return _rebalance(job, report.source, now)
        if report.kind == "stop":
            return _ignored(job, "notice:stop", "the runner acknowledges a stop")
        return _spot_interruption(job, report.source, report.deadline, now)
    if isinstance(report, Interrupted):
        return _interrupted(job, report, now, limits, spot)
    if isinstance(report, Completed):
        return _completed(job, report, now)
    return _report_rest(job, report, now, limits, spot)


def progress_updates(job: Job, report: Progress) -> dict[str, Any]:
    """A progress report's word on the job: its step never goes back, and the loss shown is the furthest step's, so
    a report that comes after a newer one (SNS to a standard SQS queue keeps no order) moves neither."""
    newest = report.step >= (job.step or 0)
    return {
        "step": furthest_step(job, report.step),
        "total_steps": report.total_steps or job.total_steps,
        "loss": report.loss if newest else job.loss,
    }


def _report_rest(job: Job, report: RunnerReport, now: datetime, limits: Lifecycle, spot: SpotView | None) -> Change:
    """A failure, a gang node standing by, or a warning: the same for one node and for a gang."""
    if isinstance(report, Failed):
        detail = {"log_tail": report.log_tail[-10:], "exit_code": report.exit_code}
        trigger: Trigger = "failed" if job.attempt == 1 else "resume-failed"
        return _failure(job, trigger, report.failure, now, [], limits, spot, **detail)
    if isinstance(report, Standby):
        return Change(job, _standby_history(report))
    if isinstance(report, RunnerWarning):
        return Change(job, {"event": "runner-warning", "kind": report.kind, "message": report.message})
    return _ignored(job, f"report:{report.type}", "not for this job's state")


def _standby_history(report: Standby) -> dict[str, Any]:
    """A gang node waits for the next generation: recorded in the job's history (acting on it is the gang's own
    decision: regroup, or move the whole gang)."""
    return {
        "event": "standby",
        "node_rank": report.node_rank,
        "generation": report.generation,
        "step": report.step,
        "cause": report.cause,
    }


def _fenced(job: Job, report: RunnerReport, now: datetime) -> Change:
    """A report of an older attempt: recorded, not applied; what it tells people is still told (and a checkpoint it
    committed after its ``interrupted`` report is the job's newest)."""
    if isinstance(report, CheckpointSaved) and report.reason == "notice":
        return _late_commit(job, report, now)
    ignored = _ignored(job, f"report:{report.type}", f"from attempt {report.attempt}, current is {job.attempt}")
    notes: list[Notify] = []
    if isinstance(report, Notice) and report.kind == "spot-interruption":
        notes = _warning_notes(job, report.attempt, report.source, report.deadline)
    elif isinstance(report, Interrupted):
        notes = [_note(job, "thread", _interrupted_note(report))]
    return Change(job, ignored.history, list(notes))


def _cloud(job: Job, event: CloudEvent, now: datetime, limits: Lifecycle, spot: SpotView | None) -> Change | None:
    if job.nodes > 1:
        return gang.cloud(job, event, now, limits, spot)
    current = job.current
    if current is None or current.instance_id != event.instance_id:
        ignored = _ignored(job, f"cloud:{event.kind}", f"{event.instance_id} is not the current instance")
        old = next((a for a in job.attempts if a.instance_id == event.instance_id), None)
        if event.kind != "spot-interruption" or old is None:
            return ignored
        notes = _warning_notes(job, old.number, event.source, event.deadline)
        return Change(job, ignored.history, list(notes))
    if event.kind == "spot-interruption":
        return _spot_interruption(job, event.source, event.deadline, now)
    if event.kind == "rebalance":
        return _rebalance(job, event.source, now)
    state = next_state(job.state, "instance-gone")
    if state is None:
        return _ignored(job, "cloud:instance-gone", f"the job is {job.state}")
    history = {"event": "instance-gone", "instance": event.instance_id, "source": event.source}
    why = Failure.of("instance-gone", detail=event.detail or event.source)
    if job.switch_to is not None and job.state is JobState.STOPPING:  # gone before its checkpoint: switch anyway
        return _switched(job, _end_attempt(job, now, why.english), now, history)
    if state is JobState.RECOVERING:
        ended = _end_attempt(job, now, why.english)
        return _again(
            job,
            ended.model_copy(update={"state": state}),
            current.market,
            now,
            history,
            [],
            [_note(job, "thread", InstanceGone(instance=event.instance_id))],
            limits,
            why,
            spot,
        )
    if state is JobState.RESUME_FAILED:
        reason = Failure.of("replacement-gone", instance=event.instance_id)
        return _failure(job, "instance-gone", reason, now, [], limits)
    ended = _end_attempt(job, now, "stopped")
    kept = job.checkpoint.step if job.checkpoint is not None else None
    return _change(ended, state, now, {**history, "kept_step": kept}, [_note(job, "thread", Stopped(step=kept))])


def _started(job: Job, report: Started, now: datetime) -> Change:
    state = next_state(job.state, "started")
    current = job.current
    if state is None or current is None:
        return _ignored(job, "report:started", f"the job is {job.state}")
    if job.state is JobState.RESUME_FAILED and current.started_at is not None:  # its start is told once
        return _ignored(job, "report:started", "the attempt's start is recorded already")
    foreign = foreign_instance(current, report.instance_id)
    if foreign is not None:
        return _ignored(job, "report:started", foreign, instance=report.instance_id)
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
    fields: dict[str, Any] = {"attempt": attempt.number, "resumed_from_step": report.resumed_from_step}
    resumed = Resumed(attempt=attempt.number, step=report.resumed_from_step)
    if attempt.number > 1:
        lost = max((job.step or 0) - (report.resumed_from_step or 0), 0)
        previous = job.attempts[-2]
        downtime = (report.time - (previous.ended_at or previous.launched_at)).total_seconds()
        counted = previous.lost_steps or 0  # already in the total since its interruption: corrected, not added
        updates["steps_lost"] = max(job.steps_lost + lost - counted, 0)
        updates["downtime_seconds"] = job.downtime_seconds + max(downtime, 0.0)
        fields.update(
            lost=lost,
            downtime=round(max(downtime, 0.0), 1),
            zone=attempt.zone,
            skipped=[skip.model_dump() for skip in report.skipped],
        )
        resumed = resumed.model_copy(
            update={"lost": lost, "downtime": fields["downtime"], "zone": attempt.zone, "skipped": len(report.skipped)}
        )
    moved = job.model_copy(update=updates)
    outbox = [_note(moved, "card", CardRefresh(cause="started"))]
    if attempt.number > 1:
        outbox.append(_note(moved, "thread", resumed))
    return _change(moved, state, now, {"event": "started", **fields}, outbox)


def _rebalance(job: Job, source: str, now: datetime) -> Change:
    """Advice, not an interruption: the runner commits early; the thread hears about it."""
    return _update(
        job, "rebalance", now, {}, {"event": "rebalance", "source": source}, [_note(job, "thread", Rebalance())]
    )


def _spot_interruption(job: Job, source: str, deadline: datetime | None, now: datetime) -> Change | None:
    state = next_state(job.state, "spot-interruption")
    if state is None:
        return _ignored(job, "spot-interruption", f"the job is {job.state}")
    if job.state is JobState.INTERRUPTED:  # the other path (runner or cloud) already told us: nothing to write
        return None
    history = {"event": "spot-interruption", "source": source, "deadline": deadline.isoformat() if deadline else None}
    warned = job.model_copy(update={"interruptions": job.interruptions + 1})
    return _change(warned, state, now, history, _warning_notes(warned, job.attempt, source, deadline))


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
        return _ignored(job, "report:interrupted", f"the job is {job.state}")
    updates: dict[str, Any] = {}
    if report.step is not None and report.uri:
        updates["checkpoint"] = CheckpointRef(step=report.step, uri=report.uri, at=report.time)
    if job.state is JobState.RUNNING:  # no warning came first: count the interruption here
        updates["interruptions"] = job.interruptions + 1
    reached, lost = _steps_lost(job, report)
    if reached is not None and job.current is not None:
        updates["step"] = furthest_step(job, reached)
        updates["steps_lost"] = job.steps_lost + lost
        counted = job.current.model_copy(update={"reached_step": reached, "lost_steps": lost})
        updates["attempts"] = [*job.attempts[:-1], counted]
    updated = job.model_copy(update=updates)
    why = Failure.of("interrupted", notice=report.reason)
    ended = _end_attempt(updated, report.time, why.english)
    fields = _interrupted_fields(report)
    history = {"event": "interrupted", **fields, "reached_step": reached, "lost": lost}
    instance = job.current.instance_id if job.current else None
    release: list[Terminate] = [Terminate(job_id=job.id, instance_id=instance)] if instance else []
    if state is JobState.STOPPED and job.switch_to is not None:  # the policy's switch: checkpointed, relaunch
        return _switched(updated, ended, now, history, release)
    if state is JobState.STOPPED:
        return _change(ended, state, now, history, [*release, _note(ended, "thread", Stopped(step=report.step))])
    market = job.current.market if job.current else "spot"
    return _again(
        updated,
        ended.model_copy(update={"state": state}),
        market,
        now,
        history,
        release,
        [_note(ended, "thread", _interrupted_note(report, reached, lost))],  # the relaunch refreshes the card
        limits,
        why,
        spot,
    )


def _steps_lost(job: Job, report: Interrupted) -> tuple[int | None, int]:
    """The step the trainer stopped at (the runner's word; without it, from a trainer that writes no progress, the
    furthest step heard) and the steps trained past the committed checkpoint."""
    reached = report.reached_step if report.reached_step is not None else job.step
    if reached is None:
        return None, 0
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
        return _ignored(job, "report:checkpoint_saved", "not newer than the job's checkpoint")
    checkpoint = CheckpointRef(step=report.step, uri=report.uri, at=report.time)
    outbox = [_note(job, "card", CardRefresh(cause="checkpoint"))]
    if report.reason == "rebalance":
        outbox.append(_note(job, "thread", RebalanceCheckpoint(step=report.step, seconds=report.seconds)))
    return _update(
        job,
        "checkpoint",
        now,
        {"checkpoint": checkpoint, "step": furthest_step(job, report.step)},
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
        return _ignored(job, "report:checkpoint_saved", "not newer than the job's checkpoint")
    updates: dict[str, Any] = {"checkpoint": CheckpointRef(step=report.step, uri=report.uri, at=report.time)}
    if attempt.reached_step is not None and attempt.lost_steps is not None:
        lost = max(attempt.reached_step - report.step, 0)
        updates["steps_lost"] = max(job.steps_lost + lost - attempt.lost_steps, 0)
        corrected = attempt.model_copy(update={"lost_steps": lost})
        updates["attempts"] = [corrected if a.number == report.attempt else a for a in job.attempts]
    moved = job.model_copy(update={**updates, "updated_at": now})
    history = {"event": "late-commit", "attempt": report.attempt, "step": report.step}
    return _make(moved, history, [_note(moved, "card", CardRefresh(cause="checkpoint"))])


def _interrupted_note(report: Interrupted, reached: int | None = None, lost: int | None = None) -> InterruptedNote:
    return InterruptedNote(
        step=report.step,
        seconds=report.seconds,
        saved_in_time=report.saved_in_time,
        late=report.late,
        reached=reached,
        lost=lost if reached is not None else None,
    )


def _interrupted_fields(report: Interrupted) -> dict[str, Any]:
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
        return _ignored(job, "report:completed", f"the job is {job.state}")
    older = report.attempt != job.attempt
    ending = (now, f"attempt {report.attempt} completed the job") if older else (report.time, "completed")
    cleared, resolved = stand_down(job)
    done = _end_attempt(job, *ending).model_copy(
        update={
            "output_uri": report.output_uri,
            "step": report.step or job.step,
            "total_steps": report.total_steps or job.total_steps,
            **cleared,
        }
    )
    instance = job.current.instance_id if job.current else None
    outbox: list[Message] = [
        _note(done, "thread", CompletedNote(output_uri=report.output_uri)),
        _chart(done, "completed"),
        *resolved,
    ]
    if instance:
        outbox.insert(0, Terminate(job_id=job.id, instance_id=instance))
    history: dict[str, Any] = {"event": "completed", "output_uri": report.output_uri}
    if older:
        history["attempt"] = report.attempt
    if cleared:
        history["after"] = "resume-failed"
    return _change(done, state, now, history, outbox)


def stand_down(job: Job) -> tuple[dict[str, Any], list[Message]]:
    """What a completion clears when the job had been judged failed (RESUME_FAILED) and finished after all: its
    failure and its page (nothing to show, nobody to wake), with the page resolved in its tools. Nothing otherwise."""
    if job.state is not JobState.RESUME_FAILED:
        return {}, []
    return {"failure": None, "page": None}, list(resolutions(job, job.page))


def launch_details(message: Launched) -> dict[str, object]:
    """What an attempt records of its instance once the launch says where it runs (a gang node's too)."""
    return {
        "instance_id": message.instance_id,
        "instance_type": message.instance_type,
        "zone": message.zone,
        "market": message.market,
        "price_per_hour": message.price_per_hour,
        "on_demand_price_per_hour": message.on_demand_price_per_hour,
        "private_ip": message.private_ip,
        "launched_at": message.at,
    }


def _launched(job: Job, message: Launched, now: datetime) -> Change:
    current = job.current
    state = next_state(job.state, "launched")
    if current is None or message.attempt != current.number:
        return _unwanted(job, message, f"for attempt {message.attempt}, current is {job.attempt}")
    if current.instance_id not in (None, message.instance_id):
        return _unwanted(job, message, f"attempt {current.number} runs on {current.instance_id}")
    if state is None and (job.state in TERMINAL_STATES or current.ended_at is not None):
        return _unwanted(job, message, f"the job is {job.state}")
    if state is None:  # the runner reported before the launch result arrived: keep the state, note the details
        state = job.state
    attempt = current.model_copy(update=launch_details(message))
    moved = job.model_copy(update={"attempts": [*job.attempts[:-1], attempt]})
    history = {
        "event": "launched",
        "attempt": attempt.number,
        "instance": message.instance_id,
        "zone": message.zone,
        "market": message.market,
    }
    outbox: list[Message] = [_note(moved, "card", CardRefresh(cause="launched"))]
    if state is JobState.STOPPING:
        outbox.append(Terminate(job_id=job.id, instance_id=message.instance_id))
    return _change(moved, state, now, history, outbox)


def _unwanted(job: Job, message: Launched, why: str) -> Change:
    """A launch result for an attempt the job no longer runs: its instance is released, not left billing."""
    ignored = _ignored(job, "launched", why, instance=message.instance_id)
    release = Terminate(job_id=job.id, instance_id=message.instance_id)
    return Change(job, {**ignored.history, "released": True}, [release])


def _failure(
    job: Job,
    trigger: Trigger,
    reason: Failure,
    now: datetime,
    outbox: Sequence[Message],
    limits: Lifecycle,
    spot: SpotView | None = None,
    **detail: Any,
) -> Change:
    """End the current attempt on ``reason``, kept as given (the job's ``failure``, the page's, the note's: the chat
    side words it); the attempt's end and the history keep its English."""
    state = next_state(job.state, trigger)
    if state is None:
        return _ignored(job, trigger, f"the job is {job.state}")
    release: list[Message] = [*_releases(job)]
    history = {"event": trigger, "reason": reason.english, **detail}
    if state is JobState.STOPPED and job.switch_to is not None:
        # A runner failed while the policy's switch was stopping it: the job goes on, on the other market, from
        # what was committed (an attempt there that fails too is paged as any other). A gang's every node goes
        # with it (the failed node's part of the stop's checkpoint never comes, so the others' cannot count).
        return _switched(job, _end_attempt(job, now, reason.english), now, history, release)
    if job.nodes > 1 and state in TERMINAL_STATES:  # a gang that ends gives up its placement group too
        release.append(ReleaseGang(job_id=job.id))
    ended = _end_attempt(job, now, reason.english).model_copy(update={"failure": reason})
    if state is JobState.RECOVERING:  # the runner died during an interruption: relaunch
        market = job.current.market if job.current else "spot"
        moved = ended.model_copy(update={"state": state})
        return _again(job, moved, market, now, history, release, [], limits, reason, spot)
    if state is JobState.RESUME_FAILED:  # page on-call: the first step goes out at once, the ladder follows
        page = Page(attempt=job.attempt, opened_at=now, reason=reason, detail=detail)
        paged = ended.model_copy(update={"page": page})
        first = open_page(paged, now)
        card = _note(paged, "card", CardRefresh(cause="resume-failed"))
        return _change(paged, state, now, history, [*release, *outbox, first, card])
    told: Note
    if state is JobState.STOPPED:
        told = Stopped(step=job.checkpoint.step if job.checkpoint is not None else None)
    else:
        told = FailedNote(reason=reason, log_tail=detail.get("log_tail") or [], exit_code=detail.get("exit_code"))
    chart = [_chart(ended, "failed")] if state is JobState.FAILED else []
    return _change(ended, state, now, history, [*release, *outbox, _note(ended, "thread", told), *chart])


def _relaunch_due(job: Job, message: RelaunchDue, now: datetime) -> Change:
    """The pause is over: launch the attempt that was planned, unless the job has moved on meanwhile."""
    current = job.current
    state = next_state(job.state, "relaunch-due")
    if current is None or message.attempt != current.number or current.instance_id or current.ended_at:
        return _ignored(job, message.type, f"for attempt {message.attempt}, current is {job.attempt}")
    if state is None:
        return _ignored(job, message.type, f"the job is {job.state}")
    history = {"event": "relaunch-due", "attempt": current.number}
    if job.nodes > 1:
        return _change(job, state, now, history, gang.launch_first(job, message.market, now, message.zone))
    launch = _launch_now(job, current.number, message.market, now, message.zone)
    return _change(job, state, now, history, launch)


def _stopped_anyway(job: Job, trigger: Trigger, why: str, now: datetime) -> Change:
    """A stop that cannot wait for the runner: terminate the instance; the job keeps what was committed."""
    state = next_state(job.state, trigger)
    if state is None:
        return _ignored(job, trigger, f"the job is {job.state}")
    kept = job.checkpoint.step if job.checkpoint is not None else None
    outbox: list[Message] = list(_releases(job))
    ended = _end_attempt(job, now, why)
    if job.switch_to is not None:  # the policy's switch of market: relaunch from what was committed
        return _switched(job, ended, now, {"event": trigger, "reason": why, "kept_step": kept}, outbox)
    outbox.append(_note(ended, "thread", Stopped(step=kept)))
    return _change(ended, state, now, {"event": trigger, "reason": why, "kept_step": kept}, outbox)


# -- the spot policy (handlers/spot/) -----------------------------------------------------------------------------


def _steer(
    before: Job,
    moved: Job,
    now: datetime,
    history: dict[str, Any],
    outbox: Sequence[Message],
    spot: SpotView,
    event: Event,
    delay: timedelta = timedelta(),
    limits: Lifecycle | None = None,
) -> Change:
    """Plan the next attempt of ``before`` where the policy says: spot in its zone or on-demand (at once, or after
    ``delay``), nothing until the next tick (wait), or a stop for the budget. ``moved``: the job now. A job no
    policy steers runs ``spot-first``: its choice goes to the history, not to the card or the thread."""
    stretch = next_stretch(before, moved, spot, now, event)
    planned = moved.model_copy(update={"plan": stretch.plan}) if stretch.plan is not None else moved
    history = {**history, **stretch.history()}
    if stretch.tell:
        outbox = [*outbox, _policy_note(planned, stretch.choice)]  # the thread hears why the job leaves spot, or waits
    if stretch.choice.action == "stop":
        return _policy_stop(planned, stretch.choice, now, history, outbox, limits)
    if stretch.market is None:  # wait: the attempt is planned, the next tick launches it
        return _relaunch(before, planned, "spot", now, history, outbox, launch_now=False)
    return _relaunch(before, planned, stretch.market, now, history, outbox, delay=delay, zone=stretch.zone)


def _capacity(job: Job, message: LaunchFailed, now: datetime, spot: SpotView) -> Change:
    """A spot launch refused for capacity: the zone counts as without spot for a while (so nothing launches there
    in a loop), and the policy chooses again (another zone, on-demand, or waiting for the next tick)."""
    current = job.current
    zone = message.zone or (current.zone if current is not None else None) or ""
    ended = _end_attempt(job, now, Failure.of("capacity", error=message.reason).english)
    history = {"event": "launch-failed", "capacity": True, "zone": zone, "reason": message.reason}
    return _steer(job, refused(ended, zone, now), now, history, [], spot, "capacity")


def _tick(job: Job, message: PolicyTick, now: datetime, spot: SpotView | None, limits: Lifecycle) -> Change:
    """The policy's periodic look: launch a waiting attempt once the policy says so, move a running job to the
    other market through a checkpoint (on-demand back to spot when that is safe, spot to on-demand when the
    deadline needs it), stop it for its budget, or only refresh the card's plan. Each tick sets the next one
    while the job is active, so one chain runs per job (a tick of another number is stale and ignored)."""
    if message.tick != job.tick:
        return _ignored(job, message.type, f"tick {message.tick} is stale (the job's ticks are at {job.tick})")
    if job.state not in ACTIVE_STATES or not managed(job):
        return _ignored(job, message.type, f"the job is {job.state}")  # the chain ends; a resume starts another
    ticking, tick = _next_tick(job, now, spot.period if spot is not None else DEFAULT_TICK)
    history: dict[str, Any] = {"event": "policy-tick", "tick": message.tick}
    current = job.current
    if spot is None or current is None or job.state is JobState.STOPPING:
        return _make(ticking, history, [tick])
    waiting = current.instance_id is None and current.ended_at is None and job.plan is not None
    waiting = waiting and job.plan is not None and job.plan.action == "wait"
    holding = current.instance_id is not None and current.ended_at is None and job.state is JobState.RUNNING
    if not waiting and not holding:
        return _make(ticking, history, [tick])  # a launch or a start is under way: its outcome asks again
    choice, plan = choose(ticking, spot, now, "tick")
    planned = ticking.model_copy(update={"plan": plan, "updated_at": now})
    history.update(policy=choice.action, policy_zone=choice.zone, why=str(choice.reason))
    card = _note(planned, "card", CardRefresh(cause="policy"))
    if choice.action == "stop":
        return _policy_stop(planned, choice, now, history, [tick], limits)
    target = tick_market(choice)
    if waiting:
        if target is None:
            return _make(planned, history, [tick, card])
        if job.nodes > 1:  # every planned node on that market; node 0 first, the others into its zone
            launching = gang.on_market(planned, target, now)
            return _make(launching, history, [tick, *gang.launch_first(launching, target, now, choice.zone), card])
        attempt = current.model_copy(update={"market": target, "launched_at": now})
        launching = planned.model_copy(update={"attempts": [*planned.attempts[:-1], attempt]})
        launch = _launch_now(launching, attempt.number, target, now, choice.zone)
        return _make(launching, history, [tick, *launch, card])
    if job.standby is not None and job.switch_to is None and target != job.standby.market:
        # The policy no longer wants the move its launch ahead was for (the deadline came closer while it booted).
        return _give_up_standby(planned, now, history, [tick, card])
    if target is None or target == current.market or current.instance_id is None or job.standby is not None:
        return _make(planned, history, [tick, card])  # (a switch launched ahead is under way: its outcome decides)
    if job.nodes == 1 and spot.launches_ahead:  # make-before-break: the other market's instance first
        ahead = _launch_ahead(planned, target, choice.zone or None, now)
        # The thread hears why once the new instance is up and the move begins (a refusal changes nothing).
        return _make(ahead.job, {**history, "switch": target, **ahead.history}, [tick, *ahead.outbox, card])
    switching = planned.model_copy(update={"switch_to": target, "switch_zone": choice.zone or None})
    runners = gang.stop_runners(job) if job.nodes > 1 else [StopRunner(job_id=job.id, instance_id=current.instance_id)]
    outbox: list[Message] = [
        tick,
        *runners,  # a gang's every node: they stop at one step and each commits its part
        StopDeadline(job_id=job.id, attempt=job.attempt, due=now + limits.stop_timeout),
        _policy_note(switching, choice),
        card,
    ]
    return _change(switching, JobState.STOPPING, now, {**history, "switch": target}, outbox)


def _switched(
    before: Job, ended: Job, now: datetime, history: dict[str, Any], release: Sequence[Message] = ()
) -> Change:
    """The checkpoint of a switch of market is in (or the instance is gone): the attempt launched ahead goes on from
    it, or (none) a relaunch on the other market."""
    target: Market = before.switch_to or "spot"
    moved = ended.model_copy(update={"state": JobState.RECOVERING, "switch_to": None, "switch_zone": None})
    if before.standby is not None:
        return _hand_over(moved, before.standby, now, {**history, "switched_to": target}, release)
    return _relaunch(
        before, moved, target, now, {**history, "switched_to": target}, list(release), zone=before.switch_zone
    )


# -- a switch of market launched ahead (make-before-break) ------------------------------------------------------


def _launch_ahead(job: Job, market: Market, zone: str | None, now: datetime) -> Change:
    """The next attempt on the other market, launched while the current one trains on: a refusal costs nothing (the
    job stays where it is, the zone counts as refused), and the current one is asked to checkpoint and stop only
    once the new instance's runner stands by, so the switch costs the checkpoint and the restore, not the boot."""
    number = job.next_number
    standby = Attempt(number=number, market=market, zone=zone, launched_at=now)
    ahead = job.model_copy(update={"standby": standby, "ahead_number": number})
    return Change(ahead, {"ahead": number}, list(_launch_now(ahead, number, market, now, zone)))


def _keeps_standby(job: Job) -> bool:
    """Whether the switch a standby was launched for is still on: the job trains until the standby is up, then stops
    through a checkpoint for it; an interruption of the current attempt hands over to it early. Anything else (a
    stop, a completion, a failure) gives it up."""
    if job.state is JobState.RUNNING:
        return job.switch_to is None
    if job.state is JobState.STOPPING:
        return job.switch_to is not None
    return job.state is JobState.INTERRUPTED


def _ahead(job: Job, standby: Attempt, message: BusMessage, now: datetime, limits: Lifecycle) -> Change | None:
    """What a message for the attempt launched ahead does; None when the message is not for it."""
    fields: dict[str, Any] = {"attempt": standby.number, "ahead": True}
    if isinstance(message, Launched) and message.attempt == standby.number:
        if standby.instance_id not in (None, message.instance_id):
            return _unwanted(job, message, f"attempt {standby.number} runs on {standby.instance_id}")
        launched = standby.model_copy(update=launch_details(message))
        history = {"event": "launched", **fields, "instance": message.instance_id, "zone": message.zone}
        return _make(job.model_copy(update={"standby": launched, "updated_at": now}), history, [])
    if isinstance(message, LaunchFailed) and message.attempt == standby.number:
        zone = message.zone or standby.zone or ""
        kept = refused(job, zone, now) if message.capacity and standby.market == "spot" and zone else job
        history = {"event": "launch-failed", **fields, "capacity": message.capacity, "zone": zone}
        return _give_up_standby(kept, now, {**history, "reason": message.reason})
    if isinstance(message, StartDeadline) and message.attempt == standby.number:
        if job.switch_to is not None:
            return _ignored(job, message.type, f"attempt {standby.number} stood by: the switch is under way")
        return _give_up_standby(job, now, {"event": "start-timeout", **fields})
    if isinstance(message, ReportReceived) and message.report.attempt == standby.number:
        return _ahead_report(job, standby, message.report, now, limits)
    if isinstance(message, CloudEvent) and message.instance_id == standby.instance_id:
        if message.kind == "rebalance":
            return _ignored(job, "cloud:rebalance", f"attempt {standby.number} only waits for its hand-over")
        gone = {"event": f"cloud:{message.kind}", **fields, "instance": message.instance_id}
        return _give_up_standby(_spot_lost(job, standby, now), now, gone)
    return None


def _ahead_report(job: Job, standby: Attempt, report: RunnerReport, now: datetime, limits: Lifecycle) -> Change:
    """The runner launched ahead is up (``standby``): the current attempt checkpoints and stops, and the thread hears
    why the job moves. Interrupted or failed before its hand-over: given up, the job trains on where it is."""
    fields: dict[str, Any] = {"attempt": standby.number, "ahead": True}
    if isinstance(report, Standby) and report.cause == "handover":
        current = job.current
        if job.state is JobState.INTERRUPTED:  # the current attempt is being taken: its end hands over
            return _ignored(job, "report:standby", "the current attempt is interrupted: it hands over as it ends")
        if job.switch_to is not None or current is None or current.instance_id is None:
            return _ignored(job, "report:standby", "the switch is under way already", **fields)
        breaking = job.model_copy(update={"switch_to": standby.market, "switch_zone": standby.zone})
        outbox: list[Message] = [
            StopRunner(job_id=job.id, instance_id=current.instance_id),
            StopDeadline(job_id=job.id, attempt=job.attempt, due=now + limits.stop_timeout),
        ]
        if job.plan is not None:  # the policy's reason for the move, told once the move really happens
            outbox.append(_note(job, "thread", SpotPolicyNote(reason=job.plan.reason, values=dict(job.plan.values))))
        history = {"event": "standby", **fields, "switch": standby.market}
        return _change(breaking, JobState.STOPPING, now, history, outbox)
    if isinstance(report, Interrupted) or (isinstance(report, Notice) and report.kind == "spot-interruption"):
        return _give_up_standby(_spot_lost(job, standby, now), now, {"event": f"report:{report.type}", **fields})
    if isinstance(report, Failed):
        return _give_up_standby(job, now, {"event": f"report:{report.type}", **fields})
    return _ignored(job, f"report:{report.type}", f"from attempt {standby.number}, which waits for its hand-over")


def _spot_lost(job: Job, standby: Attempt, now: datetime) -> Job:
    """``job`` with the zone of its spot instance launched ahead, which the cloud just took, out for the cool-down
    (as a reclaim of the current attempt's is): the next look does not launch there again at once."""
    return refused(job, standby.zone, now) if standby.market == "spot" and standby.zone else job


def _give_up_standby(job: Job, now: datetime, history: dict[str, Any], outbox: Sequence[Message] = ()) -> Change:
    """The attempt launched ahead will not take over: its instance (if any) is released and the job goes on as it
    was (a switch already under way relaunches on the other market as it always did)."""
    released = _without_standby(job.model_copy(update={"updated_at": now}))
    return Change(released.job, {**history, **released.history}, [*outbox, *released.outbox])


def _without_standby(job: Job) -> Change:
    """``job`` without its standby: its instance, if it has one, released (the history says which attempt)."""
    standby = job.standby
    released = [Terminate(job_id=job.id, instance_id=standby.instance_id)] if standby and standby.instance_id else []
    history = {"standby_released": standby.number} if standby else {}
    return Change(job.model_copy(update={"standby": None}), history, list(released))


def _hand_over(
    job: Job, standby: Attempt, now: datetime, history: dict[str, Any], release: Sequence[Message]
) -> Change:
    """The previous attempt's checkpoint is in (or its instance is gone): the attempt launched ahead becomes the
    job's current one and is told to go; it restores the newest complete checkpoint and reports ``started``."""
    attempt = standby.model_copy(update={"handed_over_at": now, "from_step": best_step(job)})
    moved = job.model_copy(update={"attempts": [*job.attempts, attempt], "standby": None, "updated_at": now})
    outbox = [
        *release,
        HandOver(job_id=job.id, attempt=attempt.number),
        StartDeadline(job_id=job.id, attempt=attempt.number, due=now + START_TIMEOUT),
        _note(moved, "card", CardRefresh(cause="launch")),
    ]
    return _make(moved, {**history, "state": moved.state.value, "handed_over": attempt.number}, outbox)


def _policy_stop(
    job: Job,
    choice: Choice,
    now: datetime,
    history: dict[str, Any],
    outbox: Sequence[Message],
    limits: Lifecycle | None,
) -> Change:
    """Stop with a checkpoint because the policy says so (the budget), and tell the thread why."""
    stopped = stop_command(job, POLICY_USER, now, limits)
    effects = [*outbox, _policy_note(job, choice)]
    return Change(stopped.job, {**history, **stopped.history}, [*effects, *stopped.outbox])


def _policy_note(job: Job, choice: Choice) -> Notify:
    """A thread message with the policy's reason, as data (a catalogue key and its values)."""
    return _note(job, "thread", SpotPolicyNote(reason=choice.reason.key, values=dict(choice.reason.values)))


def _next_tick(job: Job, now: datetime, period: timedelta) -> tuple[Job, PolicyTick]:
    number = job.tick + 1
    return job.model_copy(update={"tick": number}), PolicyTick(job_id=job.id, tick=number, due=now + period)


# -- helpers ----------------------------------------------------------------------------------------------


def _again(
    before: Job,
    moved: Job,
    market: Market,
    now: datetime,
    history: dict[str, Any],
    release: Sequence[Message],
    notes: Sequence[Message],
    limits: Lifecycle,
    why: Failure,
    spot: SpotView | None = None,
) -> Change:
    """Relaunch after the current attempt of ``before`` ended on its own (``moved`` is the job after it), bounded:
    an attempt without progress makes the next launch wait, and too many in a row end the job instead. A job the
    spot policy steers relaunches where the policy says (or waits, or stops for its budget); any other job where
    ``spot-first`` says (the zone, or on-demand once no zone has spot; a job on on-demand stays there)."""
    if before.standby is not None:  # the next attempt was launched ahead already: it goes on from what was committed
        return _hand_over(moved, before.standby, now, history, [*release, *notes])
    in_a_row = without_progress(before)
    if gives_up(limits, in_a_row):
        reason = Failure.of("no-progress", count=in_a_row, last=why)
        trigger: Trigger = "no-progress" if before.attempt > 1 else "no-progress-first"
        counted = before.model_copy(update={"attempts_without_progress": in_a_row})
        detail = {"attempts_without_progress": in_a_row, "after": history.get("event")}
        # The notes said "relaunching"; the failure's own message (or page) says what happens instead.
        return _failure(counted, trigger, reason, now, [], limits, None, **detail)
    pause = relaunch_pause(limits, in_a_row)
    counted = moved.model_copy(update={"attempts_without_progress": in_a_row})
    if pause:
        paused = RelaunchPaused(
            attempt=before.attempt,
            count=in_a_row,
            limit=limits.max_relaunches_without_progress,
            seconds=pause.total_seconds(),
        )
        notes = [*notes, _note(counted, "thread", paused)]
        history = {**history, "without_progress": in_a_row, "pause_seconds": pause.total_seconds()}
    if spot is not None and managed(counted):
        return _steer(before, counted, now, history, [*release, *notes], spot, "interrupted", delay=pause)
    view = SpotView()
    return _steer(
        before, counted, now, {**history, "market": market}, [*release, *notes], view, "interrupted", delay=pause
    )


def _relaunch(
    before: Job,
    job: Job,
    market: Market,
    now: datetime,
    history: dict[str, Any],
    outbox: Sequence[Message] | None = None,
    delay: timedelta = timedelta(),
    zone: str | None = None,
    launch_now: bool = True,
) -> Change:
    """Plan the next attempt now (so reports of the old one are fenced off at once) and ask for its launch,
    at once or, after attempts without progress, once ``delay`` is over (a timer on the bus). ``launch_now``
    False: the attempt waits for the spot policy's next tick to launch it."""
    if job.nodes > 1:
        return gang.relaunch(before, job, market, now, history, outbox or [], delay, zone, launch_now)
    number = job.next_number
    attempt = Attempt(number=number, market=market, launched_at=now, from_step=best_step(job))
    planned = job.model_copy(update={"attempts": [*job.attempts, attempt], "updated_at": now})
    if not launch_now:
        launch: Sequence[Message] = []
    elif delay > timedelta():
        launch = [RelaunchDue(job_id=job.id, attempt=number, market=market, zone=zone, due=now + delay)]
    else:
        launch = _launch_now(planned, number, market, now, zone)
    effects = [*(outbox or []), *launch, _note(planned, "card", CardRefresh(cause="launch"))]
    return _make(planned, {**history, "state": planned.state.value, "next_attempt": number}, effects)


def _launch_now(job: Job, number: int, market: Market, now: datetime, zone: str | None = None) -> Sequence[Message]:
    """The launch the decision chose: this market, in this zone (None: the cloud orders the zones within the
    launch). The deadline is set with the launch request, so even a launch lost on the way ends in a page."""
    return [
        Launch(job_id=job.id, attempt=number, market=market, zone=zone or None),
        StartDeadline(job_id=job.id, attempt=number, due=now + START_TIMEOUT),
    ]


def _releases(job: Job) -> list[Terminate]:
    """Terminate the job's live instance (a gang's: every live node's)."""
    if job.nodes > 1:
        return gang.releases(job)
    instance = job.current.instance_id if job.current else None
    return [Terminate(job_id=job.id, instance_id=instance)] if instance else []


def _end_attempt(job: Job, at: datetime, reason: str) -> Job:
    if job.nodes > 1:
        return gang.end_all(job, at, reason)
    current = job.current
    if current is None or current.ended_at is not None:
        return job
    ended = current.model_copy(update={"ended_at": at, "end_reason": reason})
    return job.model_copy(update={"attempts": [*job.attempts[:-1], ended]})


def _update(
    job: Job,
    trigger: Trigger,
    now: datetime,
    updates: dict[str, Any],
    history: dict[str, Any] | None,
    outbox: Sequence[Message],
) -> Change:
    state = next_state(job.state, trigger)
    if state is None:
        return _ignored(job, trigger, f"the job is {job.state}")
    moved = job.model_copy(update={**updates, "state": state, "updated_at": now})  # one copy: as _change, at once
    return _make(moved, {**(history or {"event": trigger}), "state": state.value}, outbox)


def _change(job: Job, state: JobState, now: datetime, history: dict[str, Any], outbox: Sequence[Message]) -> Change:
    moved = job.model_copy(update={"state": state, "updated_at": now})
    return _make(moved, {**history, "state": state.value}, outbox)


def _make(job: Job, history: dict[str, Any], outbox: Sequence[Message]) -> Change:
    if job.standby is not None and not _keeps_standby(job):  # the switch it was launched for will not happen
        released = _without_standby(job)
        return Change(released.job, {**history, **released.history}, [*outbox, *released.outbox])
    return Change(job, history, list(outbox))


def _ignored(job: Job, what: str, why: str | Reason, **extra: Any) -> Change:
    """Record that ``what`` was not applied and why; the job itself does not change.

    ``why`` is a Reason when a person asked (the bot answers them in their language); the history keeps English.
    """
    history = {"event": "ignored", "what": what, "why": str(why), "state": job.state.value, **extra}
    return Change(job, history, reason=why if isinstance(why, Reason) else None)


def _note(job: Job, channel: NotifyChannel, note: Note) -> Notify:
    return Notify(job_id=job.id, channel=channel, note=note)


def _chart(job: Job, occasion: Literal["completed", "failed"]) -> Notify:
    """The chart posted when the job ends: one id per attempt that ended it, so it is posted once."""
    chart = ChartNote(occasion=occasion)
    return Notify(id=f"{job.id}.{job.attempt}.chart", job_id=job.id, channel="thread", note=chart)
