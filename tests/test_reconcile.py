"""Reconciliation as a pure decision: the bot's jobs against the cloud's tagged instances."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from handlers.jobs import Attempt, Job, JobState
from handlers.reconcile import CloudInstance, ReconcileLimits, reconcile

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def job(job_id: str, state: JobState, *attempts: Attempt, updated: datetime = NOW) -> Job:
    return Job(
        id=job_id, recipe="tiny", requested_by="console:ana", state=state, attempts=list(attempts), updated_at=updated
    )


def attempt(number: int, instance: str | None, launched: datetime = NOW - HOUR, ended: bool = False) -> Attempt:
    return Attempt(
        number=number, instance_id=instance, launched_at=launched, ended_at=launched + HOUR if ended else None
    )


def listed(instance: str, job_id: str | None, number: int | None, state: str = "running") -> CloudInstance:
    return CloudInstance(instance, state, job_id, number, launched_at=NOW - HOUR)


def test_when_belief_and_cloud_agree_nothing_is_done() -> None:
    jobs = [job("ft-aa11", JobState.RUNNING, attempt(1, "i-1")), job("ft-bb22", JobState.SUCCEEDED, attempt(1, "i-2"))]
    assert reconcile(jobs, [listed("i-1", "ft-aa11", 1), listed("i-2", "ft-bb22", 1, "terminated")], NOW) == []


def test_an_active_job_whose_instance_is_gone_or_stopped_is_handled_as_instance_gone() -> None:
    jobs = [
        job("ft-aa11", JobState.RUNNING, attempt(1, "i-1")),
        job("ft-bb22", JobState.PROVISIONING, attempt(1, "i-2")),
        job("ft-cc33", JobState.STOPPING, attempt(1, "i-3")),
    ]
    actions = reconcile(jobs, [listed("i-2", "ft-bb22", 1, "terminated"), listed("i-3", "ft-cc33", 1, "Stopped")], NOW)
    assert [(a.action, a.job_id, a.instance_id) for a in actions] == [
        ("instance-gone", "ft-aa11", "i-1"),
        ("instance-gone", "ft-bb22", "i-2"),
        ("instance-gone", "ft-cc33", "i-3"),
    ]
    assert "does not list it" in actions[0].reason and "terminated" in actions[1].reason


def test_fresh_launches_and_jobs_between_attempts_are_left_alone() -> None:
    fresh = job("ft-aa11", JobState.RECOVERING, attempt(1, "i-0", ended=True), attempt(2, "i-1", launched=NOW))
    between = job("ft-bb22", JobState.RECOVERING, attempt(1, "i-2", ended=True), attempt(2, None))
    # The launch of ft-bb22's attempt 2 is listed before its Launched was applied: it is not an orphan.
    in_flight = CloudInstance("i-9", "pending", "ft-bb22", 2, launched_at=NOW)
    assert reconcile([fresh, between], [in_flight], NOW) == []


def test_instances_of_jobs_that_are_over_unknown_or_moved_on_are_released() -> None:
    jobs = [
        job("ft-aa11", JobState.SUCCEEDED, attempt(1, "i-1", ended=True)),
        job("ft-bb22", JobState.RUNNING, attempt(1, "i-2", ended=True), attempt(2, "i-3")),
        job("ft-cc33", JobState.RESUME_FAILED, attempt(1, "i-5", ended=True)),
    ]
    cloud = [
        listed("i-1", "ft-aa11", 1),
        listed("i-2", "ft-bb22", 1),  # the old attempt's instance still runs
        listed("i-3", "ft-bb22", 2),
        listed("i-4", "ft-zz99", 1),  # a job the bot does not know
        listed("i-5", "ft-cc33", 1, "shutting-down"),  # already going
        listed("i-6", None, None),  # not one of ours
    ]
    actions = reconcile(jobs, cloud, NOW)
    assert [(a.action, a.instance_id) for a in actions] == [("release", "i-1"), ("release", "i-2"), ("release", "i-4")]
    assert "SUCCEEDED" in actions[0].reason and "attempt 2" in actions[1].reason and "unknown" in actions[2].reason


def test_a_running_job_not_heard_of_for_too_long_is_probed() -> None:
    limits = ReconcileLimits(silent_after=timedelta(minutes=10))
    quiet = job("ft-aa11", JobState.RUNNING, attempt(1, "i-1"), updated=NOW - timedelta(minutes=11))
    recent = job("ft-bb22", JobState.RUNNING, attempt(1, "i-2"), updated=NOW - timedelta(minutes=9))
    stopping = job("ft-cc33", JobState.STOPPING, attempt(1, "i-3"), updated=NOW - HOUR)
    cloud = [listed("i-1", "ft-aa11", 1), listed("i-2", "ft-bb22", 1), listed("i-3", "ft-cc33", 1)]
    actions = reconcile([quiet, recent, stopping], cloud, NOW, limits)
    assert [(a.action, a.job_id) for a in actions] == [("probe", "ft-aa11")] and "11 min" in actions[0].reason
