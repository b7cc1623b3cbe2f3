"""The decisions of a gang job (``nodes`` > 1; the world's arithmetic is :mod:`handlers.gang`).

:mod:`handlers.decide.dispatch` hands a gang job's launch results, reports, cloud events and hold timers here;
what a node says the way one node does (a notice, a rebalance, a fenced report) is decided in
:mod:`handlers.decide.inputs`, a relaunch of the whole gang in :mod:`handlers.decide.launching`, a failure's page in
:mod:`handlers.decide.recovery`.

A gang is RUNNING once every live node's runner has started in the job's current generation. Losing one node (its
``interrupted`` report, or its instance gone without one) ends only that node's attempt: the survivors keep their
instances and stand by (their runners say ``standby``), one replacement is launched into the gang's zone for the next
generation, and once its runner has restored, each survivor's regroup is written to its own control object.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from handlers.change import Change
from handlers.decide import early_signals, gang_recovery, inputs, launching, recovery, steering
from handlers.decide.builders import advance, change, ignore, make, notify
from handlers.decide.launching import live, with_attempt
from handlers.failures import Failure
from handlers.gang import place_in, rank_of, regrouped
from handlers.instance_claims import foreign_instance
from handlers.job_cost import job_cost
from handlers.jobs import TERMINAL_STATES, Attempt, CheckpointRef, Job, JobState
from handlers.lifecycle import Lifecycle, best_step, furthest_step, restored
from handlers.messages import (
    CheckNodes,
    CloudEvent,
    GangHoldDue,
    HandOver,
    Launch,
    Launched,
    LaunchFailed,
    Message,
    Notify,
    Regroup,
    ReleaseGang,
    StartDeadline,
    Terminate,
)
from handlers.notes import (
    CardRefresh,
    CompletedNote,
    HeldStep,
    InstanceGone,
    Note,
    Resumed,
    SpotPolicyNote,
    Stopped,
)
from handlers.notice_budget import measured
from handlers.policy_reasons import WORDING
from handlers.reports import (
    CheckpointSaved,
    Completed,
    Interrupted,
    Notice,
    Progress,
    RunnerReport,
    Standby,
    Started,
)
from handlers.restart_overhead import earlier_first_step, job_restart_s
from handlers.spot import SpotView, managed
from handlers.spot.gang import GangHold, short_of_slack, wait_or_move
from handlers.spot.situation import lost_zones
from handlers.spot.steer import refused
from handlers.transitions import next_state

DEFAULT_RESTART_SECONDS = 300.0  # a node's launch-to-training overhead, until the job has measured its own


# A gang refused for capacity twice in a zone within this long goes on-demand: each refusal releases the nodes it had
# launched (they cannot train apart), so a gang, unlike one node, does not try a zone again at every look.
GANG_REFUSED_AGAIN = timedelta(minutes=30)


def launched(job: Job, message: Launched, now: datetime) -> Change:
    """A node's instance is up: noted on its attempt; node 0's first brings the others' launches, in its zone."""
    attempt = job.attempt_numbered(message.attempt)
    if attempt is None or attempt.ended_at is not None or job.state in TERMINAL_STATES:
        return launching.unwanted(job, message, f"attempt {message.attempt} of {job.id} is not a live node")
    if attempt.instance_id not in (None, message.instance_id):
        return launching.unwanted(job, message, f"attempt {attempt.number} runs on {attempt.instance_id}")
    state = next_state(job.state, "launched") or job.state
    updated = attempt.model_copy(update=launching.launch_details(message))
    moved = with_attempt(job, updated).model_copy(update={"held_since": None})
    outbox: list[Message] = [notify(moved, "card", CardRefresh(cause="launched"))]
    if job.state is JobState.STOPPING:
        outbox.append(Terminate(job_id=job.id, instance_id=message.instance_id))
    elif attempt.instance_id is None and rank_of(attempt) == 0:
        for other in live(moved):
            if other.instance_id is None and other.number != attempt.number and other.generation == job.generation:
                outbox.append(Launch(job_id=job.id, attempt=other.number, market=other.market, zone=message.zone))
    history = {
        "event": "launched",
        "attempt": attempt.number,
        "node_rank": rank_of(attempt),
        "instance": message.instance_id,
        "zone": message.zone,
        "market": message.market,
    }
    return change(moved, state, now, history, outbox)


def launch_failed(job: Job, message: LaunchFailed, now: datetime, limits: Lifecycle, spot: SpotView) -> Change:
    """A node could not be launched. A replacement refused for capacity holds the survivors (they stand by,
    billing) until :func:`hold_due`; a spot node refused for capacity while no node stands by (the gang's first
    launch, or a move) places the whole gang again (:func:`_placed_again`); any other refusal fails the gang as
    one (its other nodes released)."""
    attempt = job.attempt_numbered(message.attempt)
    if attempt is None or attempt.ended_at is not None:
        return ignore(job, message.type, f"attempt {message.attempt} is not a live node")
    survivors = [a for a in live(job) if a.next_rank is not None and a.instance_id]
    if message.capacity and not survivors and attempt.market == "spot" and job.state not in TERMINAL_STATES:
        return _placed_again(job, attempt, message, now, spot)
    if message.capacity and survivors and job.state not in TERMINAL_STATES:
        zone = message.zone or attempt.zone or ""
        held = refused(job, zone, now)
        history = {"event": "gang-hold", "attempt": attempt.number, "zone": zone, "reason": message.reason}
        if job.held_since is not None:  # still refused after a wait: the pending hold timer decides again
            return make(held, history, [])
        slack = _slack_s(job, now)
        restart = job.restart_seconds or DEFAULT_RESTART_SECONDS
        if slack is not None and short_of_slack(slack, limits.gang_hold_seconds, restart):
            # A hold would spend the slack a move needs (wait_or_move's bound, applied before the first hold too).
            moving = {**history, "choice": "move", "slack": round(slack, 1)}
            return _move(job, attempt, zone, 0.0, now, moving, limits, spot if managed(job) else None)
        held = held.model_copy(update={"held_since": now, "updated_at": now})
        told = _why("gang.hold", attempt, zone, limits.gang_hold_seconds)
        timer = GangHoldDue(job_id=job.id, attempt=attempt.number, due=now + limits.gang_hold)
        card = notify(held, "card", CardRefresh(cause="policy"))
        return make(held, history, [timer, notify(held, "thread", told), card])
    reason = Failure.of("launch-failed", error=message.reason)
    return recovery.failure(job, "launch-failed", reason, now, [], limits)


def _placed_again(job: Job, attempt: Attempt, message: LaunchFailed, now: datetime, spot: SpotView) -> Change:
    """A gang that cannot form in its zone: the nodes launched so far are released (one without the others trains
    nothing, and would bill until the start deadline), the zone counts as without spot for the cool-down, and the
    policy places the whole gang again, as a one-node job's capacity refusal does. A refusal that names no zone
    (the cloud tried each of its own), or a zone refused again within its cool-down, places the gang on
    on-demand: spot would only be asked again where it was just refused, in a loop."""
    zone = message.zone or attempt.zone or ""
    ended = launching.end_attempt(job, now, Failure.of("capacity", error=message.reason).english)
    moved = refused(ended, zone, now) if zone else ended
    again = not zone or zone in lost_zones(job, now, job.refused_zones, GANG_REFUSED_AGAIN)
    history = {
        "event": "launch-failed",
        "capacity": True,
        "node_rank": rank_of(attempt),
        "zone": zone,
        "reason": message.reason,
    }
    release: list[Message] = [*launching.releases(job), ReleaseGang(job_id=job.id)]
    if again:
        history["policy"] = "on-demand"
        return launching.relaunch(job, moved, "on-demand", now, history, release, timedelta(), None, True)
    return steering.steer(job, moved, now, history, release, spot, "capacity")


def report(job: Job, message: RunnerReport, now: datetime, limits: Lifecycle, spot: SpotView | None) -> Change | None:
    attempt = job.attempt_numbered(message.attempt)
    if attempt is None or attempt.ended_at is not None:
        if attempt is not None and isinstance(message, Completed) and _output_committed(attempt, message):
            return _completed(job, attempt, message, now)  # node 0, judged gone, finished the job after all
        if attempt is not None and isinstance(message, CheckpointSaved) and attempt.generation == job.generation:
            return _checkpoint(job, message, now)  # committed before its node went, told after it ended (no order)
        return inputs.fenced(job, message, now)
    if isinstance(message, Started):
        return started(job, attempt, message, now)
    if isinstance(message, Progress):
        if rank_of(attempt) != 0:
            return None  # every node reports the same steps: node 0's stand for the gang
        updates = {**inputs.progress_updates(job, message), **_first_steps(job, message.time)}
        card = notify(job, "card", CardRefresh(cause="progress"))
        return advance(job, "progress", now, updates, None, [card])
    if isinstance(message, CheckpointSaved):
        return _checkpoint(job, message, now)
    if isinstance(message, Notice):
        if message.kind == "rebalance":
            return inputs.rebalance(job, message.source, now)
        if message.kind == "stop":
            return ignore(job, "notice:stop", "the runner acknowledges a stop")
        if message.kind == "save":
            return ignore(job, "notice:save", "the runner acknowledges a save request")
        if early_signals.node_warned_before_start(job, attempt):  # its runner saw it while restoring
            return _warned_before_start(job, attempt, message.source, message.deadline, now, limits, spot)
        return inputs.spot_interruption(job, message.source, message.deadline, now)
    if isinstance(message, Interrupted):
        return _node_lost(job, attempt, now, limits, message, spot=spot)
    if isinstance(message, Completed):
        return _completed(job, attempt, message, now)
    if isinstance(message, Standby):
        return _standby(job, attempt, message, now)
    return inputs.report_rest(job, message, now, limits, spot)


def _first_steps(job: Job, at: datetime) -> dict[str, Any]:
    """Node 0's step stands for the gang's: each node started in this generation without a first step has it now,
    once, and the job's measured restart (launch to training, the median over nodes; what :func:`hold_due` weighs)
    with them (an earlier report that comes later moves it back). A survivor keeps its first generation's: its
    instance did not restart."""
    fresh = {a.number: earlier_first_step(a, at) for a in live(job) if a.started_generation == job.generation}
    changed = {number: attempt for number, attempt in fresh.items() if attempt is not None}
    if not changed:
        return {}
    attempts = [changed.get(a.number, a) for a in job.attempts]
    return {"attempts": attempts, "restart_seconds": job_restart_s(attempts)}


def _standby(job: Job, attempt: Attempt, message: Standby, now: datetime) -> Change:
    """A survivor stands by with the newest complete checkpoint (``peer-lost``: its world just broke, said before
    it commits anything: :func:`_peer_lost`); the replacement, launched the moment its node was lost, says it is up
    and waits (``handover``). Once both are so, the replacement is told to go, so it restores the very checkpoint the
    survivors will (the step they held, or the marker of a checkpoint a lost node 0 was still completing, which may
    come after its ``interrupted`` report)."""
    if message.cause == "peer-lost":
        return _peer_lost(job, attempt, message, now)
    if message.cause == "handover":
        moved = with_attempt(job, attempt.model_copy(update={"standby_step": 0}))
        history = {"event": "replacement-waits", "attempt": attempt.number, "node_rank": rank_of(attempt)}
        return make(moved.model_copy(update={"updated_at": now}), history, _replacement_go(job, moved))
    history = inputs.standby_history(message)
    moved = with_attempt(job, attempt.model_copy(update={"standby_step": message.step if message.step else 0}))
    moved = moved.model_copy(update={"updated_at": now})
    notes: list[Message] = []
    if message.rebuilt and message.step is not None:  # the step the survivors held is the gang's checkpoint
        history["rebuilt"] = dict(message.rebuilt)
        held = HeldStep(node=rank_of(attempt) or 0, step=message.step, rebuilt=dict(message.rebuilt))
        notes.append(notify(moved, "thread", held))
    restart = gang_recovery.restart_when_stood_by(moved, now)  # the authority chose a whole-gang restart
    if restart is not None:
        return Change(restart.job, {**restart.history, **history}, [*notes, *restart.outbox])
    return make(moved, history, [*_replacement_go(job, moved), *notes])


def _peer_lost(job: Job, attempt: Attempt, message: Standby, now: datetime) -> Change:
    """A node's world broke with no notice of its own: its peers' instances are looked at now (a gone one is lost
    as of this word, :func:`cloud`), not at the next reconcile."""
    peers = [a.instance_id for a in live(job) if a.number != attempt.number and a.instance_id]
    history = {"event": "peer-lost", "attempt": attempt.number, "node_rank": rank_of(attempt), "peers": peers}
    if not peers or job.state in TERMINAL_STATES:
        return make(job, history, [])
    return make(job, history, [CheckNodes(job_id=job.id, instance_ids=peers, lost_at=message.time)])


def _replacement_launch(job: Job, replacement: Attempt, now: datetime) -> list[Message]:
    """The replacement's launch, the moment its node is lost: its runner is up while the survivors commit, and waits
    for its go (:func:`_replacement_go`) before it restores."""
    zone = next((a.zone for a in live(job) if a.zone), None)
    return [
        Launch(job_id=job.id, attempt=replacement.number, market=replacement.market, zone=zone),
        StartDeadline(job_id=job.id, attempt=replacement.number, due=now + launching.START_TIMEOUT),
    ]


def _replacement_go(before: Job, job: Job) -> list[Message]:
    """The replacement's go, once (in ``job``, not yet in ``before``) it is up and waiting and every survivor stands
    by with the gang's checkpoint."""

    def ready(gang: Job) -> Attempt | None:
        nodes = live(gang)
        survivors = [a for a in nodes if a.next_rank is not None]
        # The replacement: its standby may come before its launch's result, so it is up once it says so.
        fresh = [a for a in nodes if a.next_rank is None and a.generation == gang.generation]
        if len(fresh) != 1 or fresh[0].standby_step is None or fresh[0].started_generation == gang.generation:
            return None
        if not survivors or any(a.standby_step is None for a in survivors):
            return None
        return fresh[0]

    replacement = ready(job)
    if replacement is None or ready(before) is not None:
        return []
    return [HandOver(job_id=job.id, attempt=replacement.number)]


def started(job: Job, attempt: Attempt, message: Started, now: datetime) -> Change:
    """A node's runner started in the job's current world; once every fresh node of it has, the survivors
    standing by are regrouped into it; once every node has, the gang is RUNNING."""
    foreign = foreign_instance(attempt, message.instance_id)
    if foreign is not None:
        return ignore(job, "report:started", foreign, instance=message.instance_id)
    generation = message.generation or attempt.generation or job.generation
    if generation != job.generation:
        return ignore(job, "report:started", f"generation {generation}, the gang is in {job.generation}")
    moved = with_attempt(
        job,
        attempt.model_copy(
            update={
                "started_at": attempt.started_at or message.time,
                "started_generation": generation,
                "restore_seconds": message.restore_seconds,
                "resumed_from_step": message.resumed_from_step,
                "standby_step": None,  # a replacement that waited for its go trains now
            }
        ),
    )
    outbox: list[Message] = []
    pending = [a for a in live(moved) if a.next_rank is not None]
    fresh = [a for a in live(moved) if a.next_rank is None]
    if pending and all(a.started_generation == job.generation for a in fresh):
        for survivor in pending:
            assert survivor.next_rank is not None and survivor.instance_id is not None
            outbox.append(
                Regroup(
                    job_id=job.id,
                    instance_id=survivor.instance_id,
                    attempt=survivor.number,
                    generation=survivor.generation or 1,
                    node_rank=survivor.node_rank or 0,
                    gang=place_in(moved, survivor.next_rank),
                )
            )
        for survivor in pending:
            told = {
                "node_rank": survivor.next_rank,
                "generation": job.generation,
                "next_rank": None,
                "standby_step": None,
            }
            moved = with_attempt(moved, survivor.model_copy(update=told))
    history: dict[str, Any] = {
        "event": "started",
        "attempt": attempt.number,
        "node_rank": rank_of(attempt),
        "generation": generation,
        "resumed_from_step": message.resumed_from_step,
        "regrouped": [a.number for a in pending] if outbox else [],
    }
    waiting = [a.number for a in live(moved) if a.started_generation != job.generation]
    state = next_state(job.state, "started")
    if waiting or state is None:
        moved = moved.model_copy(update={"updated_at": now})
        card = notify(moved, "card", CardRefresh(cause="started"))
        return make(moved, {**history, "waiting_for": waiting}, [*outbox, card])
    updates: dict[str, Any] = restored(job, message.resumed_from_step, message.restored_uri, message.time)
    notes: list[Message] = []
    if job.generation > 1:  # the gang trains again after a loss: what it cost
        lost_attempt = max((a for a in moved.attempts if a.ended_at is not None), key=lambda a: a.ended_at or now)
        resumed = message.resumed_from_step or 0
        lost = max((job.step or 0) - resumed, 0)
        downtime = max((message.time - (lost_attempt.ended_at or message.time)).total_seconds(), 0.0)
        updates["steps_lost"] = max(job.steps_lost + lost - (lost_attempt.lost_steps or 0), 0)
        updates["downtime_seconds"] = job.downtime_seconds + downtime
        told_lost: int | None = None if lost_attempt.steps_unknown else lost  # the furthest step heard was no measure
        history.update(lost=told_lost, downtime=round(downtime, 1))
        note = Resumed(
            attempt=attempt.number, step=message.resumed_from_step, lost=told_lost, downtime=round(downtime, 1)
        )
        notes.append(notify(moved, "thread", note.model_copy(update={"zone": attempt.zone})))
    moved = moved.model_copy(update=updates)
    card = notify(moved, "card", CardRefresh(cause="started"))
    return change(moved, state, now, history, [*outbox, card, *notes])


def _checkpoint(job: Job, message: CheckpointSaved, now: datetime) -> Change:
    """Node 0's word that a checkpoint counts (every node's part and the marker): the job's, whatever its state, and
    word that the gang got that far (the card's step is never behind its checkpoint)."""
    if job.checkpoint is not None and message.step <= job.checkpoint.step:
        return ignore(job, "report:checkpoint_saved", "not newer than the job's checkpoint")
    checkpoint = CheckpointRef(step=message.step, uri=message.uri, at=message.time)
    reached = furthest_step(job, message.step)
    budget, warning = measured(job, message)
    moved = job.model_copy(update={"checkpoint": checkpoint, "step": reached, **budget, "updated_at": now})
    history = {"event": "checkpoint", "step": message.step, "reason": message.reason}
    warned = [notify(moved, "thread", warning)] if warning is not None else []
    return make(moved, history, [notify(moved, "card", CardRefresh(cause="checkpoint")), *warned])


def _output_committed(attempt: Attempt, message: Completed) -> bool:
    """Whether this node's completion means the job's output is stored: node 0 stores it, and any node that found
    it stored says so. The rank is the one the node finished as, from its report: a survivor due to take rank 0
    may finish as rank 1 of the old world."""
    rank = message.node_rank if message.node_rank is not None else rank_of(attempt)
    return message.already_complete or rank == 0


def _completed(job: Job, attempt: Attempt, message: Completed, now: datetime) -> Change:
    """Node 0's completion completes the gang (every node released, the placement removed), as does any node's that
    found the output stored; another node's only ends that node (node 0 stores the output)."""
    if not _output_committed(attempt, message):
        ended = with_attempt(job, attempt.model_copy(update={"ended_at": message.time, "end_reason": "completed"}))
        release = [Terminate(job_id=job.id, instance_id=attempt.instance_id)] if attempt.instance_id else []
        return make(ended, {"event": "node-completed", "attempt": attempt.number}, release)
    state = next_state(job.state, "completed")
    if state is None:
        return ignore(job, "report:completed", f"the job is {job.state}")
    cleared, resolved = inputs.stand_down(job)
    done = launching.end_attempt(job, message.time, "completed").model_copy(
        update={
            "output_uri": message.output_uri,
            "step": message.step or job.step,
            "total_steps": message.total_steps or job.total_steps,
            **cleared,
        }
    )
    outbox: list[Message] = [*launching.releases(job), ReleaseGang(job_id=job.id)]
    outbox.append(notify(done, "thread", CompletedNote(output_uri=message.output_uri)))
    outbox.extend(resolved)
    return change(done, state, now, {"event": "completed", "output_uri": message.output_uri}, outbox)


def cloud(job: Job, event: CloudEvent, now: datetime, limits: Lifecycle, spot: SpotView | None = None) -> Change | None:
    """The cloud's word about one node's instance (``spot``: the view of a gang the policy steers)."""
    attempt = next((a for a in live(job) if a.instance_id == event.instance_id), None)
    if attempt is None:
        return ignore(job, f"cloud:{event.kind}", f"{event.instance_id} is not a live node of {job.id}")
    if event.kind == "spot-interruption":
        if early_signals.node_warned_before_start(job, attempt):
            return _warned_before_start(job, attempt, event.source, event.deadline, now, limits, spot)
        return inputs.spot_interruption(job, event.source, event.deadline, now)
    if event.kind == "rebalance":
        return inputs.rebalance(job, event.source, now)
    if event.kind == "scheduled-event":
        return inputs.scheduled_event(job, event, now)
    return _node_lost(job, attempt, now, limits, None, gone=event, spot=spot)


def _warned_before_start(
    job: Job,
    attempt: Attempt,
    source: str,
    deadline: datetime | None,
    now: datetime,
    limits: Lifecycle,
    spot: SpotView | None,
) -> Change | None:
    """A node warned before its runner started will not live to train: posted, and lost at once (released, its
    replacement launched now) instead of when its instance vanishes."""
    gone = CloudEvent(kind="instance-gone", instance_id=attempt.instance_id or "", source=source, at=now)
    lost = _node_lost(job, attempt, now, limits, None, gone=gone, spot=spot)
    if lost.job is job:  # not a loss the gang can take now: the warning alone is said
        return inputs.spot_interruption(job, source, deadline, now)
    notes = early_signals.warned_notes(job, attempt.number, attempt.instance_id or "", source, deadline)
    history = {**lost.history, "event": "warned-before-start", "lost": "node-lost", "source": source}
    said = [m for m in lost.outbox if not (isinstance(m, Notify) and isinstance(m.note, InstanceGone))]
    return Change(lost.job, history, [*notes, *said])


def _node_lost(
    job: Job,
    attempt: Attempt,
    now: datetime,
    limits: Lifecycle,
    told: Interrupted | None,
    gone: CloudEvent | None = None,
    spot: SpotView | None = None,
) -> Change:
    """One node is lost (with its notice's checkpoint, or without a word): only it is replaced; the last one, the
    whole gang again, where the job's policy says for a gang it steers (``spot``)."""
    if job.state is JobState.STOPPING:
        return _stopping_node_ended(job, attempt, now, told)
    state = next_state(job.state, "interrupted") or next_state(job.state, "instance-gone")
    if job.state is JobState.RECOVERING:
        state = JobState.RECOVERING
    if state is None or state is not JobState.RECOVERING:
        return ignore(job, "node-lost", f"the job is {job.state}")
    updates: dict[str, Any] = {}
    if job.state in (JobState.RUNNING, JobState.PROVISIONING):  # no warning came first: count it here
        updates["interruptions"] = job.interruptions + 1
    reached, lost_steps = inputs.steps_lost(job, told) if told is not None else (None, 0)
    unknown = told is not None and lost_steps is None
    checkpoint = _newer_checkpoint(job, told)
    if checkpoint is not None:
        updates["checkpoint"] = checkpoint
    ended_at = told.time if told is not None else _lost_at(gone, now)
    if told is not None:
        why = Failure.of("interrupted", notice=told.reason)
    else:
        why = Failure.of("instance-gone", detail=(gone.detail or gone.source) if gone is not None else "lost")
    ended = attempt.model_copy(
        update={
            "ended_at": ended_at,
            "end_reason": why.english,
            "reached_step": reached,
            "lost_steps": lost_steps,
            "steps_unknown": unknown,
        }
    )
    if reached is not None and lost_steps is not None:
        updates["step"] = furthest_step(job, reached)
        updates["steps_lost"] = job.steps_lost + lost_steps
    if unknown:
        updates["steps_lost_unknown"] = True
    ranks, free = regrouped(job, attempt)
    # A node that reported its interruption still completes its part (node 0: the marker) until its deadline, when
    # its cloud takes it: it is not terminated here (reconciliation releases an instance that outlives it).
    gone_now = told is None and attempt.instance_id is not None
    release: list[Message] = [Terminate(job_id=job.id, instance_id=attempt.instance_id)] if gone_now else []
    note: Note
    if told is not None:
        note = inputs.interrupted_note(told, reached, lost_steps)
    else:
        note = InstanceGone(instance=attempt.instance_id or "")
    moved = with_attempt(job, ended).model_copy(update={**updates, "state": state, "updated_at": now})
    history: dict[str, Any] = {"event": "node-lost", "attempt": attempt.number, "node_rank": rank_of(attempt)}
    if told is not None:
        history.update(inputs.interrupted_fields(told), reached_step=reached, lost=lost_steps)
    if not ranks:  # no node left: the whole gang again
        told_all = [*release, notify(moved, "thread", note)]
        if spot is not None and managed(job):
            return steering.steer(job, moved, now, history, told_all, spot, "interrupted", limits=limits)
        return launching.relaunch(job, moved, attempt.market, now, history, told_all, timedelta(), None, True)
    choice, times = gang_recovery.choose(moved)
    history.update(gang_recovery.history(choice, times))
    chose = notify(moved, "thread", gang_recovery.note(moved, choice, times))
    if choice == "whole-gang":  # once every survivor stands by with the step it holds: every node again
        whole = moved.model_copy(update={"restart_whole": True})
        restart = gang_recovery.restart_when_stood_by(whole, now)
        told_whole: list[Message] = [*release, notify(whole, "thread", note), chose]
        if restart is not None:
            return Change(restart.job, {**restart.history, **history}, [*told_whole, *restart.outbox])
        return make(whole, {**history, "state": state.value}, told_whole)
    generation = job.generation + 1
    survivors = {number: rank for number, rank in ranks.items()}
    for survivor in live(moved):
        moved = with_attempt(moved, survivor.model_copy(update={"next_rank": survivors[survivor.number]}))
    zone = next((a.zone for a in live(moved) if a.zone), None) or attempt.zone
    replacement = Attempt(
        number=job.attempt + 1,
        market=attempt.market,
        node_rank=free[0],
        generation=generation,
        launched_at=now,
        from_step=best_step(job),
    )
    moved = moved.model_copy(update={"attempts": [*moved.attempts, replacement], "generation": generation})
    history.update(generation=generation, replacement=replacement.number, zone=zone, ranks=survivors)
    outbox: list[Message] = [
        *release,
        notify(moved, "thread", note),
        chose,
        *_replacement_launch(moved, replacement, now),  # now: it waits for the survivors' checkpoint, up
        notify(moved, "card", CardRefresh(cause="launch")),
    ]
    return make(moved, {**history, "state": state.value}, outbox)


def _lost_at(gone: CloudEvent | None, now: datetime) -> datetime:
    """When a node went without a word: a survivor's report of its broken world says (``CheckNodes``), else now."""
    return min(gone.at, now) if gone is not None and gone.source == "peer-lost" else now


def _stopping_node_ended(job: Job, attempt: Attempt, now: datetime, told: Interrupted | None) -> Change:
    """A node of a gang being stopped has saved and ended; the last one ends the job STOPPED, or, where the spot
    policy stopped it to switch market, relaunches the gang on the other market from that checkpoint."""
    ended = with_attempt(job, attempt.model_copy(update={"ended_at": now, "end_reason": "stopped"}))
    checkpoint = _newer_checkpoint(job, told)
    if checkpoint is not None:
        ended = ended.model_copy(update={"checkpoint": checkpoint})
    release: list[Message] = [Terminate(job_id=job.id, instance_id=attempt.instance_id)] if attempt.instance_id else []
    history = {"event": "node-stopped", "attempt": attempt.number, "step": told.step if told else None}
    if live(ended):
        return make(ended.model_copy(update={"updated_at": now}), history, release)
    if job.switch_to is not None:
        return steering.switched(job, ended, now, history, release)
    kept = ended.checkpoint.step if ended.checkpoint is not None else None
    outbox = [*release, ReleaseGang(job_id=job.id), notify(ended, "thread", Stopped(step=kept))]
    return change(ended, JobState.STOPPED, now, {**history, "kept_step": kept}, outbox)


def _newer_checkpoint(job: Job, told: Interrupted | None) -> CheckpointRef | None:
    """The checkpoint an ``interrupted`` report committed, when it is newer than the job's."""
    if told is None or told.step is None or not told.uri:
        return None
    if job.checkpoint is not None and told.step <= job.checkpoint.step:
        return None
    return CheckpointRef(step=told.step, uri=told.uri, at=told.time)


def hold_due(job: Job, message: GangHoldDue, now: datetime, limits: Lifecycle, spot: SpotView | None = None) -> Change:
    """The survivors waited the hold time for replacement ``message.attempt``: the spot policy's choice
    (:func:`handlers.spot.gang.wait_or_move`, which a deadline's slack bounds) tries that node again and waits
    another hold, or moves the whole gang elsewhere (the survivors released; the thread hears why): where the job's
    policy says, for a gang it steers (``spot``), else on the same market."""
    attempt = job.attempt_numbered(message.attempt)
    if attempt is None or attempt.ended_at is not None or attempt.instance_id or job.held_since is None:
        return ignore(job, message.type, f"replacement {message.attempt} came, or the gang moved on")
    survivors = [a for a in live(job) if a.instance_id]
    zone = next((a.zone for a in survivors if a.zone), None) or attempt.zone or ""
    restart = job.restart_seconds or DEFAULT_RESTART_SECONDS
    hold = GangHold(
        nodes=job.nodes,
        survivors=len(survivors),
        node_price_per_hour=next((a.price_per_hour for a in survivors if a.price_per_hour), 0.0) or 0.0,
        waited_seconds=(now - job.held_since).total_seconds(),
        hold_seconds=limits.gang_hold_seconds,
        replace_seconds=restart,
        move_seconds=restart,
        availability=0.0 if zone in job.refused_zones else 0.5,
        slack_seconds=_slack_s(job, now),
    )
    choice = wait_or_move(hold)
    history: dict[str, Any] = {"event": "gang-hold-due", "choice": choice, "waited": round(hold.waited_seconds, 1)}
    if choice == "wait":
        again: list[Message] = [
            Launch(job_id=job.id, attempt=attempt.number, market=attempt.market, zone=zone or None),
            GangHoldDue(job_id=job.id, attempt=attempt.number, due=now + limits.gang_hold),
        ]
        return make(job.model_copy(update={"updated_at": now}), history, again)
    return _move(job, attempt, zone, hold.waited_seconds, now, history, limits, spot)


def _move(
    job: Job,
    attempt: Attempt,
    zone: str,
    waited_s: float,
    now: datetime,
    history: dict[str, Any],
    limits: Lifecycle,
    spot: SpotView | None,
) -> Change:
    """The whole gang elsewhere, its lost node ``attempt`` not to be had in ``zone``: the survivors released, the
    zone counted as without spot, the thread told why; where the job's policy says for a gang it steers
    (``spot``), else on the same market."""
    why = _why("gang.move", attempt, zone, waited_s)
    release = launching.releases(job)
    ended = launching.end_attempt(job, now, "moved: the gang's lost node could not be replaced in its zone")
    moved = ended.model_copy(update={"held_since": None, "state": JobState.RECOVERING})
    moved = refused(moved, zone, now) if zone else moved
    notes: list[Message] = [*release, ReleaseGang(job_id=job.id), notify(moved, "thread", why)]
    if spot is not None:
        return steering.steer(job, moved, now, {**history, "from_zone": zone}, notes, spot, "capacity", limits=limits)
    moving = {**history, "from_zone": zone}
    return launching.relaunch(job, moved, attempt.market, now, moving, notes, timedelta(), None, True)


def _slack_s(job: Job, now: datetime) -> float | None:
    """Seconds to the deadline beyond the work left (None: no deadline, or no step measured yet), as the simulator
    bounds a hold by."""
    if job.deadline is None or not job.total_steps:
        return None
    per_step = job_cost(job, now).seconds_per_step
    if per_step is None:
        return None
    return (job.deadline - now).total_seconds() - max(job.total_steps - (job.step or 0), 0) * per_step


def _why(key: str, attempt: Attempt, zone: str, seconds: float) -> SpotPolicyNote:
    """The thread's word on a hold or a move: which node, where, for how long (the catalogue words it)."""
    values: dict[str, str | float] = {"node": attempt.node_rank or 0, "zone": zone, "minutes": round(seconds / 60, 1)}
    return SpotPolicyNote(reason=str(WORDING(key, **values).key), values=values)


def drilled(job: Job, node: int | None) -> Attempt | None:
    """The live node an interrupt-test means: rank ``node`` (None: the last), if it has an instance."""
    nodes = job.gang_attempts
    if not nodes:
        return None
    attempt = nodes.get(max(nodes) if node is None else node)
    return attempt if attempt is not None and attempt.instance_id else None
