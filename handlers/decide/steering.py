"""The spot policy's decisions (:mod:`handlers.spot`): where the next attempt runs, the periodic tick, a switch of
market through a checkpoint, and a switch launched ahead (make-before-break) with its hand-over.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from handlers.change import Change
from handlers.decide import launching, stop
from handlers.decide.builders import change, ignore, make, notify, without_standby
from handlers.failures import Failure
from handlers.jobs import ACTIVE_STATES, Attempt, Job, JobState, Market
from handlers.lifecycle import Lifecycle, best_step
from handlers.messages import (
    BusMessage,
    CloudEvent,
    HandOver,
    Launched,
    LaunchFailed,
    Message,
    Notify,
    PolicyTick,
    ReportReceived,
    StartDeadline,
    StopDeadline,
    StopRunner,
)
from handlers.notes import (
    CardRefresh,
    SpotPolicyNote,
)
from handlers.reports import (
    Failed,
    Interrupted,
    Notice,
    RunnerReport,
    Standby,
)
from handlers.spot import Choice, Event, SpotView, choose, managed
from handlers.spot.steer import next_stretch, refused, tick_market

POLICY_USER = "spot-policy"  # who a stop for the budget is by, in the history and the thread


DEFAULT_TICK = timedelta(minutes=5)  # the next tick, when the cloud could not be read for the period


def steer(
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
        return launching.relaunch(before, planned, "spot", now, history, outbox, launch_now=False)
    return launching.relaunch(before, planned, stretch.market, now, history, outbox, delay=delay, zone=stretch.zone)


def capacity(job: Job, message: LaunchFailed, now: datetime, spot: SpotView) -> Change:
    """A spot launch refused for capacity: the zone counts as without spot for a while (so nothing launches there
    in a loop), every other zone the launch tried too (a region whose every zone refused is then avoided:
    :func:`handlers.spot.zones.refused_regions`), and the policy chooses again (another zone, on-demand, or waiting
    for the next tick)."""
    current = job.current
    zone = message.zone or (current.zone if current is not None else None) or ""
    ended = launching.end_attempt(job, now, Failure.of("capacity", error=message.reason).english)
    history = {"event": "launch-failed", "capacity": True, "zone": zone, "reason": message.reason}
    for tried in message.refused_zones:
        ended = refused(ended, tried, now)
    return steer(job, refused(ended, zone, now), now, history, [], spot, "capacity")


def tick(job: Job, message: PolicyTick, now: datetime, spot: SpotView | None, limits: Lifecycle) -> Change:
    """The policy's periodic look: launch a waiting attempt once the policy says so, move a running job to the
    other market through a checkpoint (on-demand back to spot when that is safe, spot to on-demand when the
    deadline needs it), stop it for its budget, or only refresh the card's plan. Each tick sets the next one
    while the job is active, so one chain runs per job (a tick of another number is stale and ignored)."""
    if message.tick != job.tick:
        return ignore(job, message.type, f"tick {message.tick} is stale (the job's ticks are at {job.tick})")
    if job.state not in ACTIVE_STATES or not managed(job):
        return ignore(job, message.type, f"the job is {job.state}")  # the chain ends; a resume starts another
    ticking, tick = next_tick(job, now, spot.period if spot is not None else DEFAULT_TICK)
    history: dict[str, Any] = {"event": "policy-tick", "tick": message.tick}
    current = job.current
    if spot is None or current is None or job.state is JobState.STOPPING:
        return make(ticking, history, [tick])
    waiting = current.instance_id is None and current.ended_at is None and job.plan is not None
    waiting = waiting and job.plan is not None and job.plan.action == "wait"
    holding = current.instance_id is not None and current.ended_at is None and job.state is JobState.RUNNING
    if not waiting and not holding:
        return make(ticking, history, [tick])  # a launch or a start is under way: its outcome asks again
    choice, plan = choose(ticking, spot, now, "tick")
    planned = ticking.model_copy(update={"plan": plan, "updated_at": now})
    history.update(policy=choice.action, policy_zone=choice.zone, why=str(choice.reason))
    card = notify(planned, "card", CardRefresh(cause="policy"))
    if choice.action == "stop":
        return _policy_stop(planned, choice, now, history, [tick], limits)
    target = tick_market(choice)
    if waiting:
        if target is None:
            return make(planned, history, [tick, card])
        if job.nodes > 1:  # every planned node on that market; node 0 first, the others into its zone
            starting = launching.on_market(planned, target, now)
            return make(starting, history, [tick, *launching.launch_first(starting, target, now, choice.zone), card])
        attempt = current.model_copy(update={"market": target, "launched_at": now})
        starting = planned.model_copy(update={"attempts": [*planned.attempts[:-1], attempt]})
        launch = launching.launch_order(starting, attempt.number, target, now, choice.zone)
        return make(starting, history, [tick, *launch, card])
    if job.standby is not None and job.switch_to is None and target != job.standby.market:
        # The policy no longer wants the move its launch ahead was for (the deadline came closer while it booted).
        return _give_up_standby(planned, now, history, [tick, card])
    if target is None or target == current.market or current.instance_id is None or job.standby is not None:
        return make(planned, history, [tick, card])  # (a switch launched ahead is under way: its outcome decides)
    if job.nodes == 1 and spot.launches_ahead:  # make-before-break: the other market's instance first
        ahead = _launch_ahead(planned, target, choice.zone or None, now)
        # The thread hears why once the new instance is up and the move begins (a refusal changes nothing).
        return make(ahead.job, {**history, "switch": target, **ahead.history}, [tick, *ahead.outbox, card])
    switching = planned.model_copy(update={"switch_to": target, "switch_zone": choice.zone or None})
    one = [StopRunner(job_id=job.id, instance_id=current.instance_id)]
    runners = launching.stop_runners(job) if job.nodes > 1 else one
    outbox: list[Message] = [
        tick,
        *runners,  # a gang's every node: they stop at one step and each commits its part
        StopDeadline(job_id=job.id, attempt=job.attempt, due=now + limits.stop_timeout),
        _policy_note(switching, choice),
        card,
    ]
    return change(switching, JobState.STOPPING, now, {**history, "switch": target}, outbox)


def switched(
    before: Job, ended: Job, now: datetime, history: dict[str, Any], release: Sequence[Message] = ()
) -> Change:
    """The checkpoint of a switch of market is in (or the instance is gone): the attempt launched ahead goes on from
    it, or (none) a relaunch on the other market."""
    target: Market = before.switch_to or "spot"
    moved = ended.model_copy(update={"state": JobState.RECOVERING, "switch_to": None, "switch_zone": None})
    if before.standby is not None:
        return hand_over(moved, before.standby, now, {**history, "switched_to": target}, release)
    return launching.relaunch(
        before, moved, target, now, {**history, "switched_to": target}, list(release), zone=before.switch_zone
    )


def launch_ahead(job: Job, market: Market, zone: str | None, now: datetime) -> Change:
    """Move ``job`` make-before-break (an early signal, :mod:`handlers.decide.early_signals`): its next attempt is
    launched beside the current one, which trains on until that one stands by, then checkpoints and hands over."""
    return _launch_ahead(job, market, zone, now)


def _launch_ahead(job: Job, market: Market, zone: str | None, now: datetime) -> Change:
    """The next attempt on the other market, launched while the current one trains on: a refusal costs nothing (the
    job stays where it is, the zone counts as refused), and the current one is asked to checkpoint and stop only
    once the new instance's runner stands by, so the switch costs the checkpoint and the restore, not the boot."""
    number = job.next_number
    standby = Attempt(number=number, market=market, zone=zone, launched_at=now)
    ahead = job.model_copy(update={"standby": standby, "ahead_number": number})
    return Change(ahead, {"ahead": number}, list(launching.launch_order(ahead, number, market, now, zone)))


def ahead(job: Job, standby: Attempt, message: BusMessage, now: datetime, limits: Lifecycle) -> Change | None:
    """What a message for the attempt launched ahead does; None when the message is not for it."""
    fields: dict[str, Any] = {"attempt": standby.number, "ahead": True}
    if isinstance(message, Launched) and message.attempt == standby.number:
        if standby.instance_id not in (None, message.instance_id):
            return launching.unwanted(job, message, f"attempt {standby.number} runs on {standby.instance_id}")
        launched = standby.model_copy(update=launching.launch_details(message))
        history = {"event": "launched", **fields, "instance": message.instance_id, "zone": message.zone}
        return make(job.model_copy(update={"standby": launched, "updated_at": now}), history, [])
    if isinstance(message, LaunchFailed) and message.attempt == standby.number:
        zone = message.zone or standby.zone or ""
        kept = refused(job, zone, now) if message.capacity and standby.market == "spot" and zone else job
        history = {"event": "launch-failed", **fields, "capacity": message.capacity, "zone": zone}
        return _give_up_standby(kept, now, {**history, "reason": message.reason})
    if isinstance(message, StartDeadline) and message.attempt == standby.number:
        if job.switch_to is not None:
            return ignore(job, message.type, f"attempt {standby.number} stood by: the switch is under way")
        return _give_up_standby(job, now, {"event": "start-timeout", **fields})
    if isinstance(message, ReportReceived) and message.report.attempt == standby.number:
        return _ahead_report(job, standby, message.report, now, limits)
    if isinstance(message, CloudEvent) and message.instance_id == standby.instance_id:
        if message.kind in ("rebalance", "scheduled-event"):
            return ignore(job, f"cloud:{message.kind}", f"attempt {standby.number} only waits for its hand-over")
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
            return ignore(job, "report:standby", "the current attempt is interrupted: it hands over as it ends")
        if job.switch_to is not None or current is None or current.instance_id is None:
            return ignore(job, "report:standby", "the switch is under way already", **fields)
        breaking = job.model_copy(update={"switch_to": standby.market, "switch_zone": standby.zone})
        outbox: list[Message] = [
            StopRunner(job_id=job.id, instance_id=current.instance_id),
            StopDeadline(job_id=job.id, attempt=job.attempt, due=now + limits.stop_timeout),
        ]
        if job.plan is not None:  # the policy's reason for the move, told once the move really happens
            outbox.append(notify(job, "thread", SpotPolicyNote(reason=job.plan.reason, values=dict(job.plan.values))))
        history = {"event": "standby", **fields, "switch": standby.market}
        return change(breaking, JobState.STOPPING, now, history, outbox)
    if isinstance(report, Interrupted) or (isinstance(report, Notice) and report.kind == "spot-interruption"):
        return _give_up_standby(_spot_lost(job, standby, now), now, {"event": f"report:{report.type}", **fields})
    if isinstance(report, Failed):
        return _give_up_standby(job, now, {"event": f"report:{report.type}", **fields})
    return ignore(job, f"report:{report.type}", f"from attempt {standby.number}, which waits for its hand-over")


def _spot_lost(job: Job, standby: Attempt, now: datetime) -> Job:
    """``job`` with the zone of its spot instance launched ahead, which the cloud just took, out for the cool-down
    (as a reclaim of the current attempt's is): the next look does not launch there again at once."""
    return refused(job, standby.zone, now) if standby.market == "spot" and standby.zone else job


def _give_up_standby(job: Job, now: datetime, history: dict[str, Any], outbox: Sequence[Message] = ()) -> Change:
    """The attempt launched ahead will not take over: its instance (if any) is released and the job goes on as it
    was (a switch already under way relaunches on the other market as it always did)."""
    released = without_standby(job.model_copy(update={"updated_at": now}))
    return Change(released.job, {**history, **released.history}, [*outbox, *released.outbox])


def hand_over(
    job: Job, standby: Attempt, now: datetime, history: dict[str, Any], release: Sequence[Message]
) -> Change:
    """The previous attempt's checkpoint is in (or its instance is gone): the attempt launched ahead becomes the
    job's current one and is told to go; it restores the newest complete checkpoint and reports ``started``."""
    attempt = standby.model_copy(update={"handed_over_at": now, "from_step": best_step(job)})
    moved = job.model_copy(update={"attempts": [*job.attempts, attempt], "standby": None, "updated_at": now})
    outbox = [
        *release,
        HandOver(job_id=job.id, attempt=attempt.number),
        StartDeadline(job_id=job.id, attempt=attempt.number, due=now + launching.START_TIMEOUT),
        notify(moved, "card", CardRefresh(cause="launch")),
    ]
    return make(moved, {**history, "state": moved.state.value, "handed_over": attempt.number}, outbox)


def _policy_stop(
    job: Job,
    choice: Choice,
    now: datetime,
    history: dict[str, Any],
    outbox: Sequence[Message],
    limits: Lifecycle | None,
) -> Change:
    """Stop with a checkpoint because the policy says so (the budget), and tell the thread why."""
    stopped = stop.stop_command(job, POLICY_USER, now, limits)
    effects = [*outbox, _policy_note(job, choice)]
    return Change(stopped.job, {**history, **stopped.history}, [*effects, *stopped.outbox])


def _policy_note(job: Job, choice: Choice) -> Notify:
    """A thread message with the policy's reason, as data (a catalogue key and its values)."""
    return notify(job, "thread", SpotPolicyNote(reason=choice.reason.key, values=dict(choice.reason.values)))


def next_tick(job: Job, now: datetime, period: timedelta) -> tuple[Job, PolicyTick]:
    number = job.tick + 1
    return job.model_copy(update={"tick": number}), PolicyTick(job_id=job.id, tick=number, due=now + period)
