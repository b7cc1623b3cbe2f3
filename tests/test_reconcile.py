"""Reconciliation as a pure decision: the bot's jobs against the cloud's tagged instances."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from handlers.decide import decide
from handlers.jobs import Attempt, Job, JobState
from handlers.lifecycle import Lifecycle
from handlers.messages import parse_message
from handlers.reconcile import (
    CloudGroup,
    CloudInstance,
    ReconcileLimits,
    gone_event,
    limits_of,
    orphan_groups,
    probe,
    reconcile,
    release,
    release_group,
    silence_key,
)
from tests.outboxes import dumped

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
    assert [a.code for a in actions] == ["not-listed", "listed-as", "listed-as"]
    assert actions[1].values == {"instance": "i-2", "state": "terminated"} and actions[0].attempt == 1
    assert str(actions[0].reason) == "the cloud does not list i-1"


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
    assert [a.code for a in actions] == ["job-over", "moved-on", "job-unknown"]
    assert actions[1].values == {"job": "ft-bb22", "attempt": 1, "current": 2} and actions[1].attempt == 1
    assert str(actions[0].reason) == "its job ft-aa11 is SUCCEEDED"


def test_a_running_job_not_heard_of_for_too_long_is_probed() -> None:
    limits = ReconcileLimits(silent_after=timedelta(minutes=10))
    quiet = job("ft-aa11", JobState.RUNNING, attempt(1, "i-1"), updated=NOW - timedelta(minutes=11))
    recent = job("ft-bb22", JobState.RUNNING, attempt(1, "i-2"), updated=NOW - timedelta(minutes=9))
    stopping = job("ft-cc33", JobState.STOPPING, attempt(1, "i-3"), updated=NOW - HOUR)
    cloud = [listed("i-1", "ft-aa11", 1), listed("i-2", "ft-bb22", 1), listed("i-3", "ft-cc33", 1)]
    actions = reconcile([quiet, recent, stopping], cloud, NOW, limits)
    assert [(a.action, a.job_id, a.code) for a in actions] == [("probe", "ft-aa11", "silent")]
    assert actions[0].values == {"minutes": 11} and str(actions[0].reason) == "no report for 11 min"


def test_a_fresh_launch_the_cloud_lists_as_terminated_is_gone_at_once_an_unlisted_one_waits() -> None:
    died = job("ft-aa11", JobState.RUNNING, attempt(1, "i-1", launched=NOW - timedelta(seconds=5)))
    unlisted = job("ft-bb22", JobState.RUNNING, attempt(1, "i-2", launched=NOW - timedelta(seconds=5)))
    actions = reconcile([died, unlisted], [listed("i-1", "ft-aa11", 1, "terminated")], NOW)
    assert [(a.action, a.job_id, a.code) for a in actions] == [("instance-gone", "ft-aa11", "listed-as")]
    later = reconcile([unlisted], [], NOW + timedelta(minutes=5))  # the grace is over: unlisted means gone
    assert [(a.action, a.code) for a in later] == [("instance-gone", "not-listed")]


def test_an_untagged_attempt_of_a_moved_on_job_and_the_limits_from_the_settings() -> None:
    moved = job("ft-aa11", JobState.RUNNING, attempt(1, "i-1", ended=True), attempt(2, "i-2"))
    actions = reconcile([moved], [listed("i-2", "ft-aa11", 2), listed("i-1", "ft-aa11", None)], NOW)
    assert [(a.action, a.instance_id, a.code) for a in actions] == [("release", "i-1", "moved-on-untagged")]
    limits = limits_of(Lifecycle(reconcile_launch_grace_seconds=60, silent_after_seconds=120))
    assert limits == ReconcileLimits(launch_grace=timedelta(minutes=1), silent_after=timedelta(minutes=2))


def test_the_instance_gone_event_is_the_same_for_every_round_and_the_decision_relaunches_once() -> None:
    running = job("ft-aa11", JobState.RUNNING, attempt(1, "i-1"))
    [first] = reconcile([running], [], NOW)
    [second] = reconcile([running], [], NOW + HOUR)
    event, again = gone_event(first, NOW), gone_event(second, NOW + HOUR)
    assert event.id == again.id == "reconcile-gone-ft-aa11-1-i-1" and event.source == "reconcile"
    assert parse_message(event.model_dump(mode="json")) == event  # travels on the bus as it is
    change = decide(running, event, NOW)
    assert change.job.state is JobState.RECOVERING and change.job.attempt == 2
    # Had the repeat got past the bus's dedup, the job moved on: it is ignored, nothing launches.
    repeat = decide(change.job, again, NOW + HOUR)
    assert repeat.history["event"] == "ignored" and not dumped(repeat)


def test_a_release_terminates_and_tells_the_channel_without_touching_the_job() -> None:
    over = job("ft-aa11", JobState.SUCCEEDED, attempt(1, "i-1", ended=True), updated=NOW - HOUR)
    [action] = reconcile([over], [listed("i-1", "ft-aa11", 1)], NOW)
    change = release(over, action, window=7)
    assert change.job == over  # not news from the job: its updated_at stays
    terminate, note = dumped(change)
    assert (terminate["type"], terminate["instance_id"], terminate["id"]) == (
        "terminate",
        "i-1",
        "reconcile-release-i-1-7",
    )
    assert (note["note"]["type"], note["note"]["why"], note["note"]["values"]["state"]) == (
        "instance-released",
        "job-over",
        "SUCCEEDED",
    )
    assert change.history["event"] == "orphan-released" and change.history["reason"] == "job-over"


def test_a_probe_speaks_once_per_silence_and_not_once_the_job_was_heard_of() -> None:
    quiet = job("ft-aa11", JobState.RUNNING, attempt(1, "i-1"), updated=NOW - timedelta(minutes=40))
    [action] = reconcile([quiet], [listed("i-1", "ft-aa11", 1)], NOW)
    silence = silence_key(quiet)
    change = probe(quiet, action, silence)
    assert change is not None and change.job == quiet
    [note] = dumped(change)
    assert note["note"] == {"type": "no-reports", "instance": "i-1", "minutes": 40}
    assert note["id"] == dumped(probe(quiet, action, silence))[0]["id"]  # type: ignore[union-attr]
    heard = quiet.model_copy(update={"updated_at": NOW - timedelta(seconds=1)})
    assert probe(heard, action, silence) is None  # a report came in between the listing and the write
    assert silence_key(heard) != silence  # and a later silence is another one


def test_a_scaling_group_that_keeps_capacity_for_an_ended_or_unknown_job_is_set_to_zero() -> None:
    jobs = [
        job("ft-aa11", JobState.STOPPED, attempt(1, "i-1", ended=True)),
        job("ft-bb22", JobState.RUNNING, attempt(1, "i-2")),
    ]
    groups = [
        CloudGroup("finetune-ft-aa11", "ft-aa11", 1),
        CloudGroup("finetune-ft-bb22", "ft-bb22", 1),  # the running job's own
        CloudGroup("finetune-ft-zz99", "ft-zz99", 1),
        CloudGroup("finetune-ft-cc33", "ft-cc33", 0),  # at 0 already: costs nothing
        CloudGroup("web", None, 3),  # not ours
    ]
    actions = orphan_groups(jobs, groups)
    assert [(a.action, a.group, a.code) for a in actions] == [
        ("release-group", "finetune-ft-aa11", "job-over"),
        ("release-group", "finetune-ft-zz99", "job-unknown"),
    ]
    change = release_group(jobs[0], actions[0])
    assert change.job == jobs[0] and dumped(change)[0]["note"]["type"] == "group-released"


def test_an_instance_launched_ahead_of_a_switch_is_the_jobs_and_its_loss_is_an_event_the_decision_takes() -> None:
    limits = ReconcileLimits(silent_after=timedelta(minutes=10))
    waiting = job("ft-aa11", JobState.RUNNING, attempt(1, "i-1"), updated=NOW - timedelta(minutes=11))
    waiting = waiting.model_copy(update={"standby": attempt(2, "i-2"), "ahead_number": 2})
    in_flight = job("ft-bb22", JobState.RUNNING, attempt(1, "i-3")).model_copy(update={"standby": attempt(2, None)})
    cloud = [listed("i-1", "ft-aa11", 1), listed("i-2", "ft-aa11", 2), listed("i-3", "ft-bb22", 1)]
    cloud.append(listed("i-4", "ft-bb22", 2))  # its launch ahead, listed before its Launched was applied
    actions = reconcile([waiting, in_flight], cloud, NOW, limits)
    # Neither instance launched ahead is an orphan, and only the current attempt is probed for its silence.
    assert [(a.action, a.instance_id) for a in actions] == [("probe", "i-1")]

    gone = reconcile([waiting], [listed("i-1", "ft-aa11", 1), listed("i-2", "ft-aa11", 2, "terminated")], NOW)
    assert [(a.action, a.instance_id, a.attempt) for a in gone] == [("instance-gone", "i-2", 2)]
    given_up = decide(waiting, gone_event(gone[0], NOW), NOW)
    assert given_up is not None and given_up.job.standby is None and given_up.job.state is JobState.RUNNING
    assert [e["instance_id"] for e in dumped(given_up) if e["type"] == "terminate"] == ["i-2"]
