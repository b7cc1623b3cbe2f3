"""Reconciliation: what the bot believes against what the cloud lists, and what to do about each difference.

The cloud's events can be lost (a queue purged, a bot down while an instance died, a local instance gone with
its bot), so at start and then periodically the bot lists the instances tagged ``finetune:job`` and compares:

- an active job whose current instance the cloud no longer has (or has stopped) is handled as if the cloud had
  said "instance gone" (:func:`gone_event`): the usual decision follows (relaunch, bounded, or end);
- an instance tagged for a job that is over, unknown, or now on another instance is an orphan that bills: it is
  released (:func:`release`: terminated, and the log and the job's channel say so);
- a RUNNING job whose instance is listed live but that has not been heard of for too long is probed
  (:func:`probe`): the channel hears once per silence that no report came for N minutes.

Pure: the listing and the jobs come in, a list of :class:`Reconciliation` actions goes out, and each action
becomes an input or a change through the functions below. Reasons are a code and its values (a catalogue key),
never a sentence. A fresh launch the cloud does not list yet gets a grace period (a listing can lag a launch; a
launch's ``Launched`` can lag the listing); an instance the cloud lists as stopped or terminated is gone at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from handlers.change import Change
from handlers.jobs import Attempt, Job, JobState
from handlers.lifecycle import Lifecycle
from handlers.messages import CloudEvent, Notify, Terminate
from handlers.notes import GroupReleased, InstanceReleased, NoReports, ReconcileCode
from handlers.reasons import Reason, Wording

LIVE_STATES = frozenset({"pending", "running", "starting", "stopping"})  # lower-cased cloud instance states
# Jobs whose current attempt is meant to have a live instance.
HOLDING = frozenset(
    {JobState.PROVISIONING, JobState.RUNNING, JobState.INTERRUPTED, JobState.RECOVERING, JobState.STOPPING}
)
OVER = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED, JobState.RESUME_FAILED})
SOURCE = "reconcile"  # the ``source`` of the cloud events reconciliation puts on the bus

WORDING = Wording(
    {
        "reconcile.not-listed": "the cloud does not list {instance}",
        "reconcile.listed-as": "the cloud lists {instance} as {state}",
        "reconcile.job-unknown": "its job {job} is unknown to the bot",
        "reconcile.job-over": "its job {job} is {state}",
        "reconcile.moved-on": "it ran attempt {attempt} of {job}, which is now on attempt {current}",
        "reconcile.moved-on-untagged": "it ran an earlier attempt of {job}, which is now on attempt {current}",
        "reconcile.silent": "no report for {minutes} min",
    }
)

Action = Literal["instance-gone", "release", "probe", "release-group"]


@dataclass(frozen=True, slots=True)
class CloudInstance:
    """One instance as the cloud lists it, with the job and attempt its tags name (None: untagged or unreadable)."""

    instance_id: str
    state: str  # the cloud's word, e.g. running, pending, shutting-down, terminated (AWS), Running, Stopped (ECS)
    job_id: str | None
    attempt: int | None
    launched_at: datetime | None = None

    @property
    def live(self) -> bool:
        return self.state.lower() in LIVE_STATES


@dataclass(frozen=True, slots=True)
class CloudGroup:
    """A scaling group tagged for a job (AWS Auto Scaling mode makes one per job), as the cloud lists it."""

    name: str
    job_id: str | None
    desired: int  # the capacity it keeps: above 0, it launches (and bills) until told otherwise


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """One difference and what to do about it. ``code`` names the reason (``reconcile.<code>`` in the catalogue)
    and ``values`` fill it in (JSON values only: they travel in notes and events). ``attempt`` is the job's
    attempt the action concerns (instance-gone, probe) or the one the instance's tags name (release)."""

    action: Action
    job_id: str | None
    instance_id: str | None
    code: ReconcileCode
    values: Mapping[str, Any] = field(default_factory=dict)
    attempt: int | None = None
    group: str | None = None  # release-group: the group's name

    @property
    def reason(self) -> Reason:
        """The reason as a catalogue entry (``str()`` of it is the English, for logs and the job's history)."""
        return WORDING(f"reconcile.{self.code}", **self.values)


@dataclass(frozen=True, slots=True)
class ReconcileLimits:
    launch_grace: timedelta = timedelta(minutes=5)  # how long a launch may go unlisted before it counts as gone
    silent_after: timedelta = timedelta(minutes=30)  # a RUNNING job not heard of for this long is probed


def limits_of(lifecycle: Lifecycle) -> ReconcileLimits:
    """The limits configured in ``policy.lifecycle``."""
    return ReconcileLimits(
        launch_grace=timedelta(seconds=lifecycle.reconcile_launch_grace_seconds),
        silent_after=timedelta(seconds=lifecycle.silent_after_seconds),
    )


def reconcile(
    jobs: Iterable[Job],
    instances: Iterable[CloudInstance],
    now: datetime,
    limits: ReconcileLimits | None = None,
) -> list[Reconciliation]:
    """What to do so that the bot's jobs and the cloud's instances agree again (nothing when they do).

    ``jobs`` should hold every job the tags could name that the bot still has (active ones at least, and the
    ended ones the listing names); a tagged instance whose job is not among them is released as unknown.
    """
    limits = limits or ReconcileLimits()
    by_id = {job.id: job for job in jobs}
    listed = {instance.instance_id: instance for instance in instances}
    actions: list[Reconciliation] = []

    for job in sorted(by_id.values(), key=lambda job: job.id):
        for current in _held(job):
            actions.extend(_compare(job, current, listed, now, limits))

    for instance in sorted(listed.values(), key=lambda instance: instance.instance_id):
        if not instance.live or instance.job_id is None:
            continue  # already going, or not one of ours
        orphaned = _orphaned(by_id.get(instance.job_id), instance, now, limits)
        if orphaned is not None:
            code, values = orphaned
            actions.append(
                Reconciliation("release", instance.job_id, instance.instance_id, code, values, instance.attempt)
            )
    return actions


def _held(job: Job) -> list[Attempt]:
    """The attempts of ``job`` meant to have a live instance now: its current one (a gang's: every live node's)."""
    if job.state not in HOLDING:
        return []
    if job.nodes > 1:
        return list(job.gang_attempts.values())
    current = job.current
    live = [current] if current is not None and current.ended_at is None else []
    return [*live, job.standby] if job.standby is not None else live  # and one launched ahead of a switch


def _compare(
    job: Job, current: Attempt, listed: dict[str, CloudInstance], now: datetime, limits: ReconcileLimits
) -> list[Reconciliation]:
    """What to do about one attempt the job holds, by what the cloud lists."""
    instance_id = current.instance_id
    if instance_id is None:
        return []  # between attempts, or its launch not yet reported: nothing to compare
    seen = listed.get(instance_id)
    if seen is not None and seen.live:
        silent = job.state is JobState.RUNNING and now - job.updated_at > limits.silent_after
        if silent and current.number == job.attempt:  # (one launched ahead only waits: it says nothing)
            minutes = int((now - job.updated_at).total_seconds() // 60)
            return [Reconciliation("probe", job.id, instance_id, "silent", {"minutes": minutes}, current.number)]
        return []
    if seen is None:
        if now - current.launched_at < limits.launch_grace:
            return []  # the listing may not show a fresh launch yet
        gone = Reconciliation("instance-gone", job.id, instance_id, "not-listed", {"instance": instance_id})
    else:  # listed, and stopped or terminated: that is definite, however fresh the launch
        values = {"instance": instance_id, "state": seen.state}
        gone = Reconciliation("instance-gone", job.id, instance_id, "listed-as", values)
    return [_with_attempt(gone, current.number)]


def orphan_groups(jobs: Iterable[Job], groups: Iterable[CloudGroup]) -> list[Reconciliation]:
    """Scaling groups that keep capacity for a job that is over or unknown: set to 0 (a group of a job still
    running is the job's, whatever its instances do; the instance checks above cover those)."""
    by_id = {job.id: job for job in jobs}
    actions: list[Reconciliation] = []
    for group in sorted(groups, key=lambda group: group.name):
        if group.job_id is None or group.desired <= 0:
            continue
        job = by_id.get(group.job_id)
        code: ReconcileCode
        values: dict[str, Any]
        if job is None:
            code, values = "job-unknown", {"job": group.job_id}
        elif job.state in OVER:
            code, values = "job-over", {"job": job.id, "state": job.state}
        else:
            continue
        actions.append(Reconciliation("release-group", group.job_id, None, code, values, group=group.name))
    return actions


def _with_attempt(action: Reconciliation, attempt: int) -> Reconciliation:
    return Reconciliation(action.action, action.job_id, action.instance_id, action.code, action.values, attempt)


def _orphaned(
    job: Job | None, instance: CloudInstance, now: datetime, limits: ReconcileLimits
) -> tuple[ReconcileCode, dict[str, Any]] | None:
    """Why nobody will use this tagged instance (a code and its values), or None when its job still may."""
    if job is None:
        return "job-unknown", {"job": instance.job_id}
    if job.state in OVER:
        return "job-over", {"job": job.id, "state": job.state}  # a StrEnum: JSON as its name, said in words
    current = job.current
    if current is not None and current.instance_id == instance.instance_id and current.ended_at is None:
        return None
    # A gang's live nodes, or one launched ahead of a switch of market; each also while its launch is not yet reported.
    for node in [*job.gang_attempts.values(), *([job.standby] if job.standby is not None else [])]:
        if node.instance_id == instance.instance_id or (node.instance_id is None and instance.attempt == node.number):
            return None
    young = instance.launched_at is not None and now - instance.launched_at < limits.launch_grace
    if current is not None and current.instance_id is None and instance.attempt == current.number:
        return None  # the current attempt's launch, not yet reported back
    if young and (instance.attempt is None or instance.attempt >= job.attempt):
        return None  # too fresh to judge
    if instance.attempt is None:
        return "moved-on-untagged", {"job": job.id, "current": job.attempt}
    return "moved-on", {"job": job.id, "attempt": instance.attempt, "current": job.attempt}


# -- what each action becomes --------------------------------------------------------------------------------


def gone_event(action: Reconciliation, now: datetime) -> CloudEvent:
    """An instance-gone action as the cloud event the bot decides on, as if the cloud had sent it.

    Its id is fixed by (job, attempt, instance): a second round, or a second replica, puts the same event on the
    bus and the bot's dedup drops it, so the job is relaunched (or ended) once.
    """
    assert action.action == "instance-gone" and action.instance_id is not None
    return CloudEvent(
        id=f"reconcile-gone-{action.job_id}-{action.attempt}-{action.instance_id}",
        at=now,
        kind="instance-gone",
        instance_id=action.instance_id,
        source=SOURCE,
        detail=json.dumps({"reason": action.code, **action.values}, sort_keys=True),
    )


def release_effect(action: Reconciliation, window: int) -> Terminate:
    """The terminate of an orphan; one id per instance and release window (``window`` counts them), so replicas
    and rounds within a window send one terminate, and an orphan that survived it is released again later."""
    assert action.action == "release" and action.instance_id is not None and action.job_id is not None
    return Terminate(
        id=f"reconcile-release-{action.instance_id}-{window}", job_id=action.job_id, instance_id=action.instance_id
    )


def release(job: Job, action: Reconciliation, window: int) -> Change:
    """A known job's orphan: terminate it, note it in the job's history and channel. The job itself is as it was
    (its ``updated_at`` included: the release is not news from the job)."""
    history = {
        "event": "orphan-released",
        "instance": action.instance_id,
        "attempt": action.attempt,
        "reason": action.code,
        "why": str(action.reason),
    }
    assert action.instance_id is not None
    released = InstanceReleased(instance=action.instance_id, why=action.code, values=dict(action.values))
    note = Notify(
        id=f"reconcile-released-{action.instance_id}-{window}", job_id=job.id, channel="thread", note=released
    )
    return Change(job, history, [release_effect(action, window), note])


def release_group(job: Job, action: Reconciliation) -> Change:
    """A known job's orphaned group, set to 0 by the reconciler: the job's history and channel say so."""
    history = {"event": "group-released", "group": action.group, "reason": action.code, "why": str(action.reason)}
    assert action.group is not None
    released = GroupReleased(group=action.group, why=action.code, values=dict(action.values))
    note = Notify(job_id=job.id, channel="thread", note=released)
    return Change(job, history, [note])


def probe(job: Job, action: Reconciliation, silence: str) -> Change | None:
    """A silent RUNNING job whose instance the cloud lists live: the channel hears it once per silence (the
    caller dedups on ``silence``, the :func:`silence_key` of the job as listed). None when the job moved on since
    the listing (it reported, or left the attempt): nothing to say."""
    if job.state is not JobState.RUNNING or silence_key(job) != silence:
        return None
    history = {"event": "probe", "instance": action.instance_id, "reason": action.code, **action.values}
    assert action.instance_id is not None
    silent = NoReports(instance=action.instance_id, minutes=int(action.values.get("minutes", 0)))
    note = Notify(id=f"reconcile-silent-{silence_key(job)}", job_id=job.id, channel="thread", note=silent)
    return Change(job, history, [note])


def silence_key(job: Job) -> str:
    """One silence of a job: its attempt and when it was last heard of (a report ends the silence)."""
    return f"{job.id}-{job.attempt}-{int(job.updated_at.timestamp())}"
