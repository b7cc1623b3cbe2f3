"""Reconciliation: what the bot believes against what the cloud lists, and what to do about each difference.

The cloud's events can be lost (a queue purged, a bot down while an instance died, a local instance gone with
its bot), so now and then the bot lists the instances tagged ``finetune:job`` and compares:

- an active job whose current instance the cloud no longer has (or has stopped) is handled as if the cloud had
  said "instance gone": the usual decision follows (relaunch, bounded, or end);
- an instance tagged for a job that is over, unknown, or now on another instance is an orphan that bills: it is
  released (and the log and the job's channel say so);
- a RUNNING job that has not been heard of for too long is probed (the runner may hang, or its reports be lost).

Pure: the listing and the jobs come in, a list of :class:`Reconciliation` actions goes out. Just launched
instances get a grace period either way (a listing can lag a launch; a launch's Launched can lag the listing).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from handlers.jobs import Job, JobState

LIVE_STATES = frozenset({"pending", "running", "starting", "stopping"})  # lower-cased cloud instance states
# Jobs whose current attempt is meant to have a live instance.
HOLDING = frozenset(
    {JobState.PROVISIONING, JobState.RUNNING, JobState.INTERRUPTED, JobState.RECOVERING, JobState.STOPPING}
)
OVER = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED, JobState.RESUME_FAILED})


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


Action = Literal["instance-gone", "release", "probe"]


@dataclass(frozen=True, slots=True)
class Reconciliation:
    action: Action
    job_id: str | None
    instance_id: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class ReconcileLimits:
    launch_grace: timedelta = timedelta(minutes=5)  # how young an instance (or attempt) is left alone
    silent_after: timedelta = timedelta(minutes=30)  # a RUNNING job not heard of for this long is probed


def reconcile(
    jobs: Iterable[Job],
    instances: Iterable[CloudInstance],
    now: datetime,
    limits: ReconcileLimits | None = None,
) -> list[Reconciliation]:
    """What to do so that the bot's jobs and the cloud's instances agree again (nothing when they do).

    ``jobs`` should hold every job the tags could name that the bot still has (active ones at least, and the
    recently ended ones); a tagged instance whose job is not among them is released as unknown.
    """
    limits = limits or ReconcileLimits()
    by_id = {job.id: job for job in jobs}
    listed = {instance.instance_id: instance for instance in instances}
    actions: list[Reconciliation] = []

    for job in sorted(by_id.values(), key=lambda job: job.id):
        current = job.current
        if job.state not in HOLDING or current is None or current.ended_at is not None:
            continue
        instance_id = current.instance_id
        if instance_id is None:
            continue  # between attempts, or its launch not yet reported: nothing to compare
        seen = listed.get(instance_id)
        if seen is not None and seen.live:
            if job.state is JobState.RUNNING and now - job.updated_at > limits.silent_after:
                silent = int((now - job.updated_at).total_seconds() // 60)
                actions.append(Reconciliation("probe", job.id, instance_id, f"no report for {silent} min"))
            continue
        if now - current.launched_at < limits.launch_grace:
            continue  # the listing may not show a fresh launch yet
        why = "the cloud does not list it" if seen is None else f"the cloud lists it as {seen.state}"
        actions.append(Reconciliation("instance-gone", job.id, instance_id, why))

    for instance in sorted(listed.values(), key=lambda instance: instance.instance_id):
        if not instance.live or instance.job_id is None:
            continue  # already going, or not one of ours
        orphaned = _orphaned(by_id.get(instance.job_id), instance, now, limits)
        if orphaned is not None:
            actions.append(Reconciliation("release", instance.job_id, instance.instance_id, orphaned))
    return actions


def _orphaned(job: Job | None, instance: CloudInstance, now: datetime, limits: ReconcileLimits) -> str | None:
    """Why nobody will use this tagged instance, or None when its job still may."""
    if job is None:
        return f"its job {instance.job_id} is unknown to the bot"
    if job.state in OVER:
        return f"its job {job.id} is {job.state.value}"
    current = job.current
    if current is not None and current.instance_id == instance.instance_id and current.ended_at is None:
        return None
    young = instance.launched_at is not None and now - instance.launched_at < limits.launch_grace
    if current is not None and current.instance_id is None and instance.attempt == current.number:
        return None  # the current attempt's launch, not yet reported back
    if young and (instance.attempt is None or instance.attempt >= job.attempt):
        return None  # too fresh to judge
    attempt = f"attempt {instance.attempt}" if instance.attempt is not None else "an earlier attempt"
    return f"it ran {attempt} of {job.id}, which is now on attempt {job.attempt}"
