"""Restart overhead from an attempt's own timestamps (launch → runner started → restore → first step)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from handlers.decide import decide
from handlers.jobs import Attempt, Job, JobState
from handlers.messages import ReportReceived
from handlers.reports import Progress, Started
from handlers.restart_overhead import attempt_restart_s, blend, first_step, first_step_was, job_restart_s

NOW = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)


def attempt(number: int, minutes_to_first_step: float | None) -> Attempt:
    launched = NOW + timedelta(hours=number)
    first = None if minutes_to_first_step is None else launched + timedelta(minutes=minutes_to_first_step)
    return Attempt(number=number, instance_id=f"i-{number}", launched_at=launched, first_step_at=first)


def test_an_attempt_costs_launch_to_first_step_and_a_job_the_median_of_its_attempts() -> None:
    assert attempt_restart_s(attempt(1, 7)) == 7 * 60
    assert attempt_restart_s(attempt(1, None)) is None
    # One slow boot among three does not move the median.
    assert job_restart_s([attempt(1, 5), attempt(2, 40), attempt(3, 6), attempt(4, None)]) == 6 * 60
    assert job_restart_s([attempt(1, None)]) is None
    # One launched ahead of a switch of market booted while the job trained on: no restart's measure (a relaunch
    # after an interruption boots in full), neither from its launch nor from its hand-over.
    ahead = attempt(3, 20).model_copy(update={"handed_over_at": NOW + timedelta(hours=3, minutes=17)})
    assert attempt_restart_s(ahead) is None
    assert job_restart_s([attempt(1, 5), attempt(2, 7), ahead]) == 6 * 60
    # The cross-job estimate follows new measurements, weighted.
    assert blend(None, 300.0) == 300.0
    assert blend(300.0, 600.0) == 300.0 * 0.7 + 600.0 * 0.3


def test_the_first_step_report_measures_the_attempt_once() -> None:
    job = Job(id="ft-ab12", recipe="tiny", requested_by="console:ana", attempts=[attempt(1, None)])
    at = NOW + timedelta(hours=1, minutes=9)
    updates = first_step(job, at)
    measured = job.model_copy(update=updates)
    assert measured.restart_seconds == 9 * 60 and first_step_was(measured, at)
    assert first_step(measured, at + timedelta(minutes=1)) == {}  # later steps change nothing
    assert not first_step_was(measured, at + timedelta(minutes=1))


def test_a_step_report_that_comes_after_a_later_one_still_sets_the_first_step() -> None:
    # Step 2's report is delivered first (step 1's was retried): the overhead is to step 1, not to step 2.
    job = Job(id="ft-ab12", recipe="tiny", requested_by="console:ana", attempts=[attempt(1, None)])
    step_1, step_2 = NOW + timedelta(hours=1, minutes=9), NOW + timedelta(hours=1, minutes=10)
    job = job.model_copy(update=first_step(job, step_2))
    assert job.restart_seconds == 10 * 60
    job = job.model_copy(update=first_step(job, step_1))
    assert job.current is not None and job.current.first_step_at == step_1 and job.restart_seconds == 9 * 60
    assert first_step_was(job, step_1) and first_step(job, step_2) == {}
    # Never before the launch, whatever a report's clock says.
    early = first_step(job, NOW)
    assert early["attempts"][-1].first_step_at == job.current.launched_at and early["restart_seconds"] == 0.0


def test_the_reports_of_a_run_put_the_restore_and_the_overhead_in_the_job_record() -> None:
    job = Job(
        id="ft-ab12",
        recipe="tiny",
        requested_by="console:ana",
        state=JobState.PROVISIONING,
        attempts=[attempt(1, None)],
    )
    launched = job.attempts[0].launched_at
    started = Started(job_id=job.id, attempt=1, time=launched + timedelta(minutes=3), restore_seconds=42.0)
    job = decide(job, ReportReceived(report=started), started.time).job
    assert job.current is not None and job.current.restore_seconds == 42.0 and job.restart_seconds is None
    step = Progress(job_id=job.id, attempt=1, time=launched + timedelta(minutes=4), step=1, total_steps=10)
    job = decide(job, ReportReceived(report=step), step.time).job
    assert job.current is not None and job.current.first_step_at == step.time
    assert job.restart_seconds == 4 * 60
