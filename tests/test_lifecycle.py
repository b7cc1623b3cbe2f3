"""Bounded relaunches and stops that end, as pure decisions (handlers/lifecycle.py, handlers/decide/)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from fakes.notes import note_type
from handlers.change import Change
from handlers.decide import decide, new_job, resume_command, stop_command
from handlers.failures import Failure
from handlers.jobs import ChatRef, CheckpointRef, Job, JobState
from handlers.lifecycle import Lifecycle, relaunch_pause
from handlers.messages import (
    CloudEvent,
    Launched,
    RelaunchDue,
    ReportReceived,
    StopDeadline,
    StopFailed,
    parse_message,
)
from handlers.policy_config import PolicyConfig
from handlers.reports import CheckpointSaved, Failed, Interrupted, Notice, Progress, Started
from tests.outboxes import dumped

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LIMITS = Lifecycle(max_relaunches_without_progress=2, relaunch_pause_seconds=10, relaunch_pause_max_seconds=25)


CUDA = Failure.of("trainer-exited", exit_code=1, restarts=0, line="CUDA error")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def kinds(change: Change) -> list[str]:
    return [f"{item['type']}:{item.get('channel', '')}{note_type(item)}".rstrip(":") for item in dumped(change)]


def of_kind(change: Change, kind: str) -> dict[str, Any]:
    return next(item for item in dumped(change) if item["type"] == kind)


def report(job: Job, report_type: type[Any], **fields: Any) -> ReportReceived:
    return ReportReceived(report=report_type(job_id=job.id, attempt=job.attempt, **fields))


def launched(job: Job, seconds: float) -> Job:
    instance = f"i-{job.attempt}"
    message = Launched(job_id=job.id, attempt=job.attempt, instance_id=instance)
    return decide(job, message, at(seconds), None, LIMITS).job


def started_job(seconds: float = 0) -> Job:
    job = new_job("ft-ab12", "tiny", {}, "console:ana", ChatRef(platform="console", channel="c"), at(seconds)).job
    job = launched(job, seconds + 1)
    return decide(job, report(job, Started, time=at(seconds + 2)), at(seconds + 2), None, LIMITS).job


def gone(job: Job, seconds: float) -> Change:
    instance = job.current.instance_id if job.current else None
    assert instance is not None
    event = CloudEvent(kind="instance-gone", instance_id=instance, source="local")
    return decide(job, event, at(seconds), None, LIMITS)


def due(change: Change, seconds: float) -> Change:
    """Fire the change's held-back launch (the timer) at ``seconds``."""
    timer = parse_message(of_kind(change, "relaunch-due"))
    assert isinstance(timer, RelaunchDue)
    return decide(change.job, timer, at(seconds), None, LIMITS)


def test_a_trainer_that_cannot_start_is_relaunched_with_growing_pauses_then_pages() -> None:
    job = started_job()
    launches = 1
    pauses: list[float] = []
    clock = 10.0
    while True:
        ended = gone(job, clock)  # the runner died before its first step
        if "relaunch-due" not in kinds(ended):
            break
        assert "launch" not in kinds(ended)  # held back: nothing launches before the pause is over
        timer = of_kind(ended, "relaunch-due")
        pauses.append((datetime.fromisoformat(timer["due"]) - at(clock)).total_seconds())
        assert "notify:threadrelaunch-paused" in kinds(ended)
        fired = due(ended, clock + pauses[-1])
        assert kinds(fired)[:2] == ["launch", "start-deadline"]
        launches += 1
        job = launched(fired.job, clock + pauses[-1] + 1)
        job = decide(job, report(job, Started), at(clock + pauses[-1] + 2), None, LIMITS).job
        clock += pauses[-1] + 10
    assert launches == 1 + LIMITS.max_relaunches_without_progress
    assert pauses == [10, 20]  # doubling, capped at 25 (a third would have waited 25, not 40)
    assert ended.job.state is JobState.RESUME_FAILED and ended.job.attempts_without_progress == 3
    failure = ended.job.failure
    assert isinstance(failure, Failure) and failure.code == "no-progress" and failure.values["count"] == 3
    assert failure.english.startswith("3 attempt(s) in a row ended without progress, the last one instance gone")
    assert "page-step" in kinds(ended) and "launch" not in kinds(ended)
    assert ended.history["event"] == "no-progress" and ended.history["after"] == "instance-gone"


def test_without_relaunches_allowed_a_first_attempt_that_cannot_start_fails_the_job() -> None:
    never = Lifecycle(max_relaunches_without_progress=0)
    job = started_job()
    ended = decide(job, CloudEvent(kind="instance-gone", instance_id="i-1", source="local"), at(5), None, never)
    assert ended.job.state is JobState.FAILED and "page-step" not in kinds(ended)
    assert "notify:threadfailed" in kinds(ended) and "launch" not in kinds(ended)


def test_progress_resets_the_count_and_relaunches_at_once() -> None:
    job = started_job()
    first = gone(job, 5)
    assert first.job.attempts_without_progress == 1
    job = launched(due(first, 15).job, 16)
    job = decide(job, report(job, Started, time=at(17)), at(17), None, LIMITS).job
    job = decide(job, report(job, Progress, step=3, total_steps=30), at(20), None, LIMITS).job
    after_progress = gone(job, 30)
    assert after_progress.job.attempts_without_progress == 0 and after_progress.job.state is JobState.RECOVERING
    assert kinds(after_progress)[1:3] == ["launch", "start-deadline"]  # no pause
    assert "relaunch-due" not in kinds(after_progress)


def test_a_committed_checkpoint_past_the_mark_is_progress_and_a_repeated_crash_is_not() -> None:
    job = started_job()
    job = decide(job, report(job, Progress, step=10), at(5), None, LIMITS).job
    job = decide(
        job, report(job, Notice, kind="spot-interruption", source="aws-imds", deadline=at(120)), at(6), None, LIMITS
    ).job
    interrupted = decide(
        job, report(job, Interrupted, reason="spot-interruption", step=10, uri="s3://b/10/"), at(7), None, LIMITS
    )
    assert interrupted.job.attempts_without_progress == 0 and "launch" in kinds(interrupted)
    job = launched(interrupted.job, 8)
    job = decide(job, report(job, Started, resumed_from_step=10), at(9), None, LIMITS).job
    # The resumed attempt dies at once, over and over: the same crash after every resume.
    job = decide(
        job, report(job, Notice, kind="spot-interruption", source="aws-imds", deadline=at(120)), at(10), None, LIMITS
    ).job
    crashed = decide(job, report(job, Failed, failure=CUDA), at(11), None, LIMITS)  # INTERRUPTED → relaunch
    assert crashed.job.state is JobState.RECOVERING and crashed.job.attempts_without_progress == 1
    assert "relaunch-due" in kinds(crashed)
    job = launched(due(crashed, 30).job, 31)
    job = decide(job, report(job, Started, resumed_from_step=10), at(32), None, LIMITS).job
    saved = decide(job, report(job, CheckpointSaved, step=14, uri="s3://b/14/", bytes=1, seconds=0.1), at(40))
    assert saved.job.checkpoint is not None and saved.job.checkpoint.step == 14
    gone_after_commit = gone(saved.job, 50)
    assert gone_after_commit.job.attempts_without_progress == 0


def test_a_person_resuming_starts_the_count_over() -> None:
    job = started_job()
    for clock in (5, 30):
        change = gone(job, clock)
        job = launched(due(change, clock + 20).job, clock + 21)
        job = decide(job, report(job, Started), at(clock + 22), None, LIMITS).job
    ended = gone(job, 100)
    assert ended.job.state is JobState.RESUME_FAILED
    retried = resume_command(ended.job, "console:oncall", on_demand=False, now=at(200))
    assert retried.job.attempts_without_progress == 0 and kinds(retried)[1] == "launch"


def test_the_pause_doubles_up_to_its_cap_and_bad_limits_are_refused() -> None:
    limits = Lifecycle(relaunch_pause_seconds=30, relaunch_pause_max_seconds=100)
    assert [relaunch_pause(limits, n).total_seconds() for n in range(5)] == [0, 30, 60, 100, 100]
    assert PolicyConfig().lifecycle == Lifecycle()  # the defaults, when the config file says nothing
    config = PolicyConfig.model_validate({"lifecycle": {"max_relaunches_without_progress": 5}})
    assert config.lifecycle.stop_timeout_seconds
    for bad in ({"max_relaunches_without_progress": -1}, {"stop_timeout_seconds": 0}, {"relaunch_pause": 3}):
        with pytest.raises(ValidationError):
            PolicyConfig.model_validate({"lifecycle": bad})


def test_a_held_back_launch_is_dropped_once_the_job_was_stopped_or_resumed() -> None:
    change = gone(started_job(), 5)
    stopped = stop_command(change.job, "console:ana", at(6), LIMITS)
    assert stopped.job.state is JobState.STOPPED  # between attempts: nothing to wait for
    assert "stop-runner" not in kinds(stopped) and "notify:threadstopped" in kinds(stopped)
    timer = parse_message(of_kind(change, "relaunch-due"))
    late = decide(stopped.job, timer, at(20), None, LIMITS)
    assert dumped(late) == [] and late.history["event"] == "ignored"
    resumed = resume_command(stopped.job, "console:ana", on_demand=False, now=at(30))
    assert resumed.job.attempt == 3 and kinds(resumed)[1] == "launch"
    assert dumped(decide(resumed.job, timer, at(31), None, LIMITS)) == []  # the old attempt's timer


def test_an_instance_launched_for_a_job_that_moved_on_is_released() -> None:
    change = new_job("ft-ab12", "tiny", {}, "console:ana", None, T0)
    stopped = stop_command(change.job, "console:ana", at(1))
    assert stopped.job.state is JobState.STOPPED
    late = decide(stopped.job, Launched(job_id="ft-ab12", attempt=1, instance_id="i-late"), at(2))
    assert late.job == stopped.job and kinds(late) == ["terminate"] and dumped(late)[0]["instance_id"] == "i-late"
    old = decide(started_job(), Launched(job_id="ft-ab12", attempt=7, instance_id="i-old"), at(3))
    assert kinds(old) == ["terminate"] and dumped(old)[0]["instance_id"] == "i-old"


# -- stops that end -------------------------------------------------------------------------------------------


def stopping_job() -> Change:
    job = started_job()
    job = decide(job, report(job, CheckpointSaved, step=31, uri="s3://b/31/", bytes=1, seconds=0.1), at(5)).job
    return stop_command(job, "console:ana", at(10), LIMITS)


def test_a_stop_has_a_deadline_after_which_the_instance_goes_and_the_checkpoint_stays() -> None:
    stopping = stopping_job()
    assert stopping.job.state is JobState.STOPPING
    deadline = parse_message(of_kind(stopping, "stop-deadline"))
    assert isinstance(deadline, StopDeadline) and deadline.due == at(10) + LIMITS.stop_timeout
    ended = decide(stopping.job, deadline, deadline.due, None, LIMITS)
    assert ended.job.state is JobState.STOPPED and kinds(ended) == ["terminate", "notify:threadstopped"]
    assert dumped(ended)[0]["instance_id"] == "i-1" and dumped(ended)[1]["note"]["step"] == 31
    assert ended.job.checkpoint == CheckpointRef(step=31, uri="s3://b/31/", at=ended.job.checkpoint.at)
    # The runner's own answer, late, changes nothing; nor does the deadline of a stop that already ended.
    interrupted = report(ended.job, Interrupted, reason="stop", step=31, uri="s3://b/31/")
    assert dumped(decide(ended.job, interrupted, at(20))) == []
    on_time = decide(stopping.job, interrupted, at(20))
    assert on_time.job.state is JobState.STOPPED
    assert dumped(decide(on_time.job, deadline, deadline.due)) == []


def test_a_stop_the_runner_cannot_hear_ends_at_once() -> None:
    stopping = stopping_job()
    failed = StopFailed(job_id="ft-ab12", instance_id="i-1", reason="instance i-1 is not running")
    ended = decide(stopping.job, failed, at(11))
    assert ended.job.state is JobState.STOPPED and kinds(ended) == ["terminate", "notify:threadstopped"]
    assert "could not be asked to stop" in ended.history["reason"] and ended.history["kept_step"] == 31
    other = StopFailed(job_id="ft-ab12", instance_id="i-0", reason="x")
    assert decide(stopping.job, other, at(11)).job == stopping.job


def test_a_stopped_job_resumes_from_its_kept_checkpoint() -> None:
    stopping = stopping_job()
    stopped = decide(
        stopping.job, report(stopping.job, Interrupted, reason="stop", step=31, uri="s3://b/31/"), at(12)
    ).job
    resumed = resume_command(stopped, "console:ana", on_demand=False, now=at(20))
    assert resumed.job.state is JobState.RECOVERING and resumed.job.attempt == 2
    assert resumed.job.current is not None and resumed.job.current.from_step == 31
    assert kinds(resumed) == ["notify:threadresume-requested", "launch", "start-deadline", "notify:cardlaunch"]
