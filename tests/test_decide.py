"""The job's life as pure decisions: interruption and recovery, fencing, failures and commands."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from bot.chat import render
from fakes.notes import note_type
from handlers.change import Change
from handlers.decide import ack_command, decide, interrupt_test_command, new_job, resume_command, stop_command
from handlers.failures import Failure
from handlers.jobs import ChatRef, Job, JobState
from handlers.messages import (
    CloudEvent,
    Launched,
    LaunchFailed,
    Notify,
    PageStep,
    ReportReceived,
    StartDeadline,
    parse_message,
)
from handlers.reports import CheckpointSaved, Completed, Failed, Interrupted, Notice, Progress, Started
from handlers.transitions import TRANSITIONS
from tests.outboxes import dumped

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def kinds(change: Change) -> list[str]:
    return [f"{item['type']}:{item.get('channel', '')}{note_type(item)}".rstrip(":") for item in dumped(change)]


def EXITED(code: int) -> Failure:
    return Failure.of("trainer-exited-silent", exit_code=code, restarts=0)


def report(job: Job, report_type: type[Any], attempt: int | None = None, **fields: Any) -> ReportReceived:
    return ReportReceived(report=report_type(job_id=job.id, attempt=attempt or job.attempt, **fields))


def running_job() -> Job:
    job = new_job("ft-ab12", "tiny", {"steps": 30}, "console:ana", ChatRef(platform="console", channel="c"), T0).job
    job = decide(
        job,
        Launched(
            job_id=job.id,
            attempt=1,
            instance_id="i-1",
            zone="us-east-1a",
            price_per_hour=0.5,
            on_demand_price_per_hour=1.5,
        ),
        at(1),
    ).job
    job = decide(job, report(job, Started, time=at(5)), at(5)).job
    return decide(job, report(job, Progress, step=12, total_steps=30, loss=1.2), at(20)).job


def test_a_new_job_plans_attempt_one_and_asks_for_its_launch() -> None:
    change = new_job("ft-ab12", "tiny", {}, "console:ana", None, T0)
    assert change.job.state is JobState.PENDING and change.job.attempt == 1
    assert kinds(change) == ["launch", "start-deadline", "notify:cardlaunch"]
    assert dumped(change)[0]["attempt"] == 1 and dumped(change)[0]["market"] == "spot"


def test_interruption_and_recovery_with_fencing() -> None:
    job = running_job()
    assert job.state is JobState.RUNNING and job.step == 12

    warning = decide(
        job, CloudEvent(kind="spot-interruption", instance_id="i-1", source="aws.ec2", deadline=at(140)), at(20)
    )
    assert warning.job.state is JobState.INTERRUPTED and warning.job.interruptions == 1
    assert kinds(warning) == ["notify:alertinterruption-warning", "notify:threadinterruption-warning"]
    job = warning.job
    duplicate = decide(job, report(job, Notice, kind="spot-interruption", source="aws-imds", deadline=at(140)), at(21))
    assert duplicate is None  # the job says it already: nothing to write, not even a history line

    job = decide(job, report(job, Progress, step=13, total_steps=30), at(21)).job
    interrupted = decide(
        job,
        report(
            job,
            Interrupted,
            reason="spot-interruption",
            step=13,
            uri="s3://b/ft-ab12/checkpoint-13/",
            reached_step=13,
            time=at(22),
            seconds={"save": 0.2, "upload": 0.1, "total": 0.3},
        ),
        at(22),
    )
    job = interrupted.job
    assert job.state is JobState.RECOVERING and job.attempt == 2 and job.checkpoint is not None
    assert job.checkpoint.step == 13 and job.attempts[0].ended_at == at(22)
    assert kinds(interrupted) == [
        "terminate",
        "notify:threadinterrupted",
        "launch",
        "start-deadline",
        "notify:cardlaunch",
    ]

    late = decide(job, report(job, Progress, attempt=1, step=14), at(23))  # the dying instance's heartbeat
    assert late.job == job and late.history["event"] == "ignored" and "attempt 1" in late.history["why"]
    gone = decide(job, CloudEvent(kind="instance-gone", instance_id="i-1", source="aws.ec2"), at(30))
    assert gone.job == job and gone.history["event"] == "ignored"  # the old instance, reclaimed as expected

    job = decide(job, Launched(job_id=job.id, attempt=2, instance_id="i-2", zone="us-east-1c"), at(31)).job
    resumed = decide(job, report(job, Started, resumed_from_step=13, time=at(40)), at(40))
    job = resumed.job
    assert job.state is JobState.RUNNING and job.steps_lost == 0 and job.downtime_seconds == 18.0
    assert kinds(resumed) == ["notify:cardstarted", "notify:threadresumed"]
    assert dumped(resumed)[1]["note"]["lost"] == 0 and dumped(resumed)[1]["note"]["zone"] == "us-east-1c"

    done = decide(job, report(job, Completed, step=30, total_steps=30, output_uri="s3://b/ft-ab12/output/"), at(60))
    assert done.job.state is JobState.SUCCEEDED and done.job.output_uri == "s3://b/ft-ab12/output/"
    assert kinds(done) == ["terminate", "notify:threadcompleted", "notify:threadchart"]
    assert dumped(done)[2]["id"] == f"{job.id}.{job.attempt}.chart"  # one chart per ending, however often told


def test_a_reclaim_without_notice_loses_at_most_the_checkpoint_interval() -> None:
    job = running_job()
    gone = decide(job, CloudEvent(kind="instance-gone", instance_id="i-1", source="aws.ec2"), at(30))
    assert gone.job.state is JobState.RECOVERING and gone.job.attempt == 2
    job = decide(gone.job, Launched(job_id=job.id, attempt=2, instance_id="i-2"), at(31)).job
    started = decide(job, report(job, Started, resumed_from_step=10, time=at(40)), at(40))
    assert started.job.steps_lost == 2  # reached 12, resumed from the step-10 checkpoint
    [note] = [m["note"] for m in dumped(started) if m.get("channel") == "thread"]
    assert (note["type"], note["step"], note["lost"]) == ("resumed", 10, 2)  # and the thread says what it cost


def test_a_restore_newer_than_the_jobs_checkpoint_moves_its_checkpoint_and_step_and_the_card_agrees() -> None:
    """The bot was away while the instance trained on and committed step 25 (nobody heard it); the relaunch restores
    that: the job's checkpoint and step follow, and the card does not show step 10 under "resumed from step 25"."""
    job = running_job()  # step 12 heard
    saved = report(job, CheckpointSaved, step=10, uri="s3://b/ft-ab12/checkpoint-10/", bytes=1, seconds=0.1)
    job = decide(job, saved, at(21)).job
    job = decide(job, CloudEvent(kind="instance-gone", instance_id="i-1", source="reconcile"), at(30)).job
    job = decide(job, Launched(job_id=job.id, attempt=2, instance_id="i-2"), at(31)).job
    newest = "s3://b/ft-ab12/checkpoint-25/"
    resumed = decide(job, report(job, Started, resumed_from_step=25, restored_uri=newest, time=at(40)), at(40)).job
    assert resumed.checkpoint is not None and (resumed.checkpoint.step, resumed.checkpoint.uri) == (25, newest)
    assert resumed.step == 25 and resumed.steps_lost == 0
    fields = dict(render.card(resumed, at(41), "en").fields)
    assert fields["Checkpoint"] == f"step 25 · {newest}" and "25/30" in fields["Step"]
    # A restore older than the job's checkpoint (the newest was unusable) leaves the job's own as it was.
    older = "s3://b/ft-ab12/checkpoint-5/"
    kept = decide(job, report(job, Started, resumed_from_step=5, restored_uri=older, time=at(40)), at(40)).job
    assert kept.checkpoint is not None and kept.checkpoint.step == 10 and kept.step == 12


def test_resume_failures_page_and_commands_leave_resume_failed() -> None:
    job = running_job()
    job = decide(
        job, report(job, Interrupted, reason="spot-interruption", step=12, uri="s3://x/", time=at(22)), at(22)
    ).job
    failed = decide(job, LaunchFailed(job_id=job.id, attempt=2, reason="InsufficientInstanceCapacity"), at(23))
    assert failed.job.state is JobState.RESUME_FAILED
    assert "page-step" in kinds(failed)  # the page opens; its first step is due at once
    job = failed.job

    acked = ack_command(job, "console:oncall", at(30))
    assert acked.job.acked_by == "console:oncall" and acked.job.state is JobState.RESUME_FAILED
    again = ack_command(acked.job, "console:other", at(31))
    assert again.job == acked.job and "already acknowledged" in again.history["why"]

    retried = resume_command(acked.job, "console:oncall", on_demand=True, now=at(40))
    assert retried.job.state is JobState.RECOVERING and retried.job.attempt == 3
    assert retried.job.current is not None and retried.job.current.market == "on-demand"
    assert retried.job.acked_by is None
    assert next(item for item in dumped(retried) if item["type"] == "launch")["market"] == "on-demand"


def test_a_replacement_that_never_starts_times_out_into_resume_failed() -> None:
    job = running_job()
    job = decide(job, CloudEvent(kind="instance-gone", instance_id="i-1", source="local"), at(30)).job
    job = decide(job, Launched(job_id=job.id, attempt=2, instance_id="i-2"), at(31)).job
    late_timer = decide(job, StartDeadline(job_id=job.id, attempt=1, due=at(900)), at(900))
    assert late_timer.history["event"] == "ignored"
    timeout = decide(job, StartDeadline(job_id=job.id, attempt=2, due=at(931)), at(931))
    assert timeout.job.state is JobState.RESUME_FAILED and timeout.job.failure == Failure.of("start-timeout")


def test_a_replacement_judged_gone_whose_completion_comes_after_succeeds_and_stands_the_page_down() -> None:
    # A replica died with the replacement's reports in flight; the runner finished and exited, so the cloud's
    # instance-gone was decided first (RESUME_FAILED, on-call paged), and its reports come after.
    job = running_job()
    job = decide(job, CloudEvent(kind="instance-gone", instance_id="i-1", source="local"), at(30)).job
    job = decide(job, Launched(job_id=job.id, attempt=2, instance_id="i-2"), at(31)).job
    failed = decide(job, CloudEvent(kind="instance-gone", instance_id="i-2", source="local"), at(40))
    assert failed.job.state is JobState.RESUME_FAILED and "page-step" in kinds(failed)
    job = failed.job.model_copy(update={"page": failed.job.page.model_copy(update={"tools": ["pagerduty"]})})  # type: ignore[union-attr]
    late = decide(job, report(job, Started, resumed_from_step=10, time=at(35)), at(41))
    assert late.job.state is JobState.RESUME_FAILED and late.history["event"] == "started"  # it did resume: told
    assert "notify:threadresumed" in kinds(late) and late.job.steps_lost == 2  # reached 12, resumed from 10
    assert late.job.current is not None and late.job.current.started_at == at(35)
    again = decide(late.job, report(job, Started, resumed_from_step=10, time=at(35)), at(41))
    assert again.history["event"] == "ignored"  # once
    job = late.job
    done = decide(job, report(job, Completed, step=30, total_steps=30, output_uri="s3://b/out/", time=at(39)), at(42))
    assert done.job.state is JobState.SUCCEEDED and done.job.output_uri == "s3://b/out/" and done.job.step == 30
    assert done.job.failure is None and done.job.page is None  # nothing to show as failed, nobody to wake
    assert done.history["after"] == "resume-failed"
    assert {"notify:threadcompleted", "notify:threadchart"} <= set(kinds(done))
    [resolve] = [item for item in dumped(done) if item.get("note", {}).get("action") == "resolve"]
    assert resolve["note"]["tool"] == "pagerduty"
    # A page step due after that finds the job no longer RESUME_FAILED: the ladder stops.
    [step] = [message for message in failed.outbox if isinstance(message, PageStep)]
    assert decide(done.job, step.model_copy(update={"step": 1}), at(600)).history["event"] == "ignored"
    # A report of an attempt the job never had moves nothing.
    unknown = decide(job, report(job, Completed, attempt=7, step=30, output_uri="s3://b/x/", time=at(39)), at(42))
    assert unknown.job.state is JobState.RESUME_FAILED and unknown.history["event"] == "ignored"


def test_an_attempt_judged_gone_whose_completion_comes_after_the_relaunch_succeeds_and_ends_the_new_one() -> None:
    # The runner finished and exited; the cloud's instance-gone was decided while a dead replica held its
    # ``completed``, so attempt 2 was launched for nothing. Either word of the finish ends the job as SUCCEEDED.
    job = running_job()
    relaunched = decide(job, CloudEvent(kind="instance-gone", instance_id="i-1", source="local"), at(30))
    assert relaunched.job.state is JobState.RECOVERING and relaunched.job.attempt == 2
    job = decide(relaunched.job, Launched(job_id=job.id, attempt=2, instance_id="i-2"), at(31)).job

    late = decide(job, report(job, Completed, attempt=1, step=30, output_uri="s3://b/out/", time=at(29)), at(35))
    assert late.job.state is JobState.SUCCEEDED and late.job.output_uri == "s3://b/out/" and late.job.step == 30
    assert late.history["event"] == "completed" and late.history["attempt"] == 1
    assert kinds(late) == ["terminate", "notify:threadcompleted", "notify:threadchart"]
    assert dumped(late)[0]["instance_id"] == "i-2"  # the replacement launched for nothing is released
    assert late.job.attempts[0].end_reason == "instance gone: local"  # what the cloud said of it stays
    assert late.job.attempts[1].end_reason == "attempt 1 completed the job" and late.job.attempts[1].ended_at == at(35)
    again = decide(late.job, report(job, Completed, step=30, output_uri="s3://b/out/"), at(36))
    assert again.history["event"] == "ignored"  # the replacement's own word after that: told once is enough

    # The replacement's runner finds the output committed and says so before its start was heard: done as well.
    found = decide(job, report(job, Completed, step=30, output_uri="s3://b/out/", time=at(33)), at(34))
    assert found.job.state is JobState.SUCCEEDED and found.job.attempts[1].end_reason == "completed"
    assert kinds(found) == ["terminate", "notify:threadcompleted", "notify:threadchart"]


def test_a_crash_in_the_first_attempt_fails_the_job_with_its_log() -> None:
    job = running_job()
    failed = decide(job, report(job, Failed, failure=EXITED(1), log_tail=["OOM"], exit_code=1), at(30))
    assert failed.job.state is JobState.FAILED
    assert dumped(failed)[-2]["note"]["log_tail"] == ["OOM"]
    assert dumped(failed)[-1]["note"] == {"type": "chart", "occasion": "failed", "by": None}


def test_stop_and_interrupt_test_commands() -> None:
    job = running_job()
    interrupt = interrupt_test_command(job, "console:ana", at(21))
    assert (
        kinds(interrupt) == ["interrupt-test", "notify:threadinterrupt-test-started"]
        and dumped(interrupt)[0]["instance_id"] == "i-1"
    )
    stopping = stop_command(job, "console:ana", at(22))
    assert stopping.job.state is JobState.STOPPING
    assert kinds(stopping) == ["notify:threadstop-requested", "stop-runner", "stop-deadline"]
    refused = interrupt_test_command(stopping.job, "console:ana", at(23))
    assert refused.job == stopping.job and dumped(refused) == []
    stopped = decide(
        stopping.job, report(stopping.job, Interrupted, reason="stop", step=12, uri="s3://x/", time=at(24)), at(24)
    )
    assert stopped.job.state is JobState.STOPPED and kinds(stopped) == ["terminate", "notify:threadstopped"]
    assert stop_command(stopped.job, "console:ana", at(25)).history["event"] == "ignored"


def reachable_from(start: JobState) -> set[JobState]:
    """Every state a walk of the transition table reaches from ``start`` (``start`` included)."""
    seen, frontier = {start}, [start]
    while frontier:
        state = frontier.pop()
        for (source, _trigger), target in TRANSITIONS.items():
            if source is state and target not in seen:
                seen.add(target)
                frontier.append(target)
    return seen


def test_every_state_is_reachable_from_pending_and_terminal_states_only_leave_by_retry() -> None:
    """A new job starts PENDING: a state no chain of transitions leads to from there is dead code in the table (a
    state that is merely some transition's target may still be cut off, e.g. reachable only from itself)."""
    assert reachable_from(JobState.PENDING) == set(JobState)
    finals = {JobState.SUCCEEDED, JobState.STOPPED, JobState.FAILED}
    for state in JobState:  # and no state is a trap: every job can still end
        assert reachable_from(state) & finals, f"no way to end from {state}"
    for (state, trigger), _ in TRANSITIONS.items():
        if state is JobState.SUCCEEDED or (state in (JobState.STOPPED, JobState.FAILED) and trigger != "resume"):
            raise AssertionError(f"{state} must be final, but {trigger} leaves it")


def test_a_resumed_attempt_that_cannot_train_pages_on_call() -> None:
    job = running_job()
    job = decide(job, CloudEvent(kind="instance-gone", instance_id="i-1", source="local"), at(30)).job
    job = decide(job, Launched(job_id=job.id, attempt=2, instance_id="i-2"), at(31)).job
    job = decide(job, report(job, Started, resumed_from_step=10, time=at(40)), at(40)).job
    failed = decide(job, report(job, Failed, failure=EXITED(3), exit_code=3), at(50))
    assert failed.job.state is JobState.RESUME_FAILED
    step = next(item for item in dumped(failed) if item["type"] == "page-step")
    paged = decide(failed.job, parse_message(step), at(50))
    assert "notify:pageresume-failed" in kinds(paged)
    page = next(item for item in dumped(paged) if item["type"] == "notify")
    assert page["note"]["exit_code"] == 3 and page["note"]["everyone"] == "here"  # no rota: @here


def test_a_runners_coded_failure_is_kept_coded() -> None:
    """The job, the page and its note keep the runner's code and values (the chat side words them)."""
    job = running_job()
    job = decide(job, CloudEvent(kind="instance-gone", instance_id="i-1", source="local"), at(30)).job
    job = decide(job, Launched(job_id=job.id, attempt=2, instance_id="i-2"), at(31)).job
    job = decide(job, report(job, Started, resumed_from_step=10, time=at(40)), at(40)).job
    coded = Failure.of("trainer-exited", exit_code=3, restarts=0, line="CUDA error")
    failed = decide(job, report(job, Failed, failure=coded), at(50))
    assert failed.job.failure == coded and failed.job.page is not None and failed.job.page.reason == coded
    assert failed.history["reason"] == coded.english == failed.job.attempts[-1].end_reason  # English, for people
    step = next(item for item in dumped(failed) if item["type"] == "page-step")
    stepped = decide(failed.job, parse_message(step), at(50))
    page = next(item for item in dumped(stepped) if item["type"] == "notify")
    assert parse_message(page).note.reason == coded  # type: ignore[union-attr]


def test_a_late_report_of_an_old_attempt_moves_nothing_but_is_still_told() -> None:
    """Finding 2: the replica holding the runner's notice died; it comes back after the relaunch."""
    job = running_job()
    gone = decide(job, CloudEvent(kind="instance-gone", instance_id="i-1", source="local"), at(30)).job
    assert gone.state is JobState.RECOVERING and gone.attempt == 2

    notice = decide(gone, report(gone, Notice, attempt=1, kind="spot-interruption", source="aws-imds"), at(45))
    assert notice.job == gone and notice.history["event"] == "ignored"  # fenced: the job does not move
    assert kinds(notice) == ["notify:alertinterruption-warning", "notify:threadinterruption-warning"]
    assert [note["note"]["instance"] for note in dumped(notice)] == ["i-1", "i-1"]  # the old attempt's instance
    receipt = decide(
        gone,
        report(gone, Interrupted, attempt=1, reason="spot-interruption", step=12, uri="s3://x/", seconds={"save": 1}),
        at(46),
    )
    assert receipt.job == gone and kinds(receipt) == ["notify:threadinterrupted"]
    assert dumped(receipt)[0]["note"]["step"] == 12
    assert dumped(decide(gone, report(gone, Progress, attempt=1, step=14), at(47))) == []  # nothing to tell

    # The same warning told twice (the cloud's, late, and the runner's) is one note id per channel: posted once.
    from_cloud = decide(gone, CloudEvent(kind="spot-interruption", instance_id="i-1", source="aws.ec2"), at(48))
    assert [note["id"] for note in dumped(from_cloud)] == [note["id"] for note in dumped(notice)]
    warned = decide(job, CloudEvent(kind="spot-interruption", instance_id="i-1", source="aws.ec2"), at(20))
    assert [note["id"] for note in dumped(warned)] == [note["id"] for note in dumped(notice)]


def test_a_pending_job_moves_on_its_runner_or_ends_at_its_deadline() -> None:
    """Finding 1: the launch result was lost; the runner's own report, or the start deadline, still decides."""
    pending = new_job("ft-ab12", "tiny", {}, "console:ana", None, T0).job
    started = decide(pending, report(pending, Started, instance_id="i-1", time=at(5)), at(5))
    # The job moves; its instance is what the launch says, never what a report claims.
    assert started.job.state is JobState.RUNNING and started.job.instance_ids == []
    late = decide(started.job, Launched(job_id=pending.id, attempt=1, instance_id="i-1", zone="z1"), at(6))
    assert late.job.state is JobState.RUNNING and late.job.current is not None and late.job.current.zone == "z1"
    assert late.job.instance_ids == ["i-1"] and "terminate" not in kinds(late)

    timed_out = decide(pending, StartDeadline(job_id=pending.id, attempt=1, due=at(900)), at(900))
    assert timed_out.job.state is JobState.FAILED and timed_out.job.failure == Failure.of("start-timeout")
    released = decide(timed_out.job, Launched(job_id=pending.id, attempt=1, instance_id="i-late"), at(901))
    assert released.job == timed_out.job and kinds(released) == ["terminate"]  # nothing bills unseen
    assert dumped(released)[0]["instance_id"] == "i-late"


def test_a_started_naming_another_instance_changes_nothing() -> None:
    """A runner's report cannot point the job (and so its terminate) at an instance the bot did not launch."""
    launched = decide(
        new_job("ft-ab12", "tiny", {}, "console:ana", None, T0).job,
        Launched(job_id="ft-ab12", attempt=1, instance_id="i-1", zone="z1"),
        at(1),
    ).job
    forged = decide(launched, report(launched, Started, instance_id="i-other", time=at(5)), at(5))
    assert forged.job == launched and dumped(forged) == []
    assert forged.history["event"] == "ignored" and "i-other" in forged.history["why"]
    own = decide(launched, report(launched, Started, instance_id="i-1", time=at(5)), at(5))
    assert own.job.state is JobState.RUNNING and own.job.instance_ids == ["i-1"]
    unnamed = decide(launched, report(launched, Started, time=at(5)), at(5))
    assert unnamed.job.state is JobState.RUNNING and unnamed.job.instance_ids == ["i-1"]


def test_a_launch_result_for_an_attempt_not_running_releases_its_instance() -> None:
    job = running_job()
    other = decide(job, Launched(job_id=job.id, attempt=1, instance_id="i-spare"), at(21))
    assert other.job == job and kinds(other) == ["terminate"] and dumped(other)[0]["instance_id"] == "i-spare"
    same = decide(job, Launched(job_id=job.id, attempt=1, instance_id="i-1"), at(21))  # a duplicate
    assert "terminate" not in kinds(same) and same.job.state is JobState.RUNNING
    old = decide(job, Launched(job_id=job.id, attempt=3, instance_id="i-3"), at(21))
    assert kinds(old) == ["terminate"]


def test_every_state_before_running_ends_at_the_start_deadline() -> None:
    for state in (JobState.PENDING, JobState.PROVISIONING, JobState.RECOVERING):
        assert (state, "start-timeout") in TRANSITIONS, state


def test_the_steps_lost_are_the_runners_word_counted_at_the_interruption_and_corrected_by_a_late_commit() -> None:
    job = running_job()  # progress heard up to step 12; the trainer had reached 17 when it was held
    interrupted = decide(
        job,
        report(
            job,
            Interrupted,
            reason="spot-interruption",
            step=10,
            uri="s3://b/ft-ab12/checkpoint-10/",
            reached_step=17,
            committing=[15],
            saved_in_time=False,
            time=at(22),
        ),
        at(22),
    )
    job = interrupted.job
    assert job.steps_lost == 7 and job.step == 17 and job.attempts[0].lost_steps == 7
    [note] = [item["note"] for item in dumped(interrupted) if item.get("note", {}).get("type") == "interrupted"]
    assert (note["reached"], note["lost"]) == (17, 7)
    lang_en = render.message_text(job, parse_message(dumped(interrupted)[1]), at(22))
    assert "7 steps lost (the trainer had reached step 17)" in lang_en
    assert "丢失 7 步" in render.message_text(job, parse_message(dumped(interrupted)[1]), at(22), "zh-CN")
    assert "7 steps lost" in render.card_text(job, at(22))

    # checkpoint-15 was still going up at the report, and landed before the machine went.
    late = decide(
        job,
        report(
            job,
            CheckpointSaved,
            attempt=1,
            step=15,
            uri="s3://b/ft-ab12/checkpoint-15/",
            bytes=1,
            seconds=1.0,
            reason="notice",
        ),
        at(23),
    )
    job = late.job
    assert job.checkpoint is not None and job.checkpoint.step == 15 and job.steps_lost == 2
    job = decide(job, Launched(job_id=job.id, attempt=2, instance_id="i-2"), at(31)).job
    resumed = decide(job, report(job, Started, resumed_from_step=15, time=at(40)), at(40))
    assert resumed.job.steps_lost == 2  # corrected, not counted twice
    assert dumped(resumed)[1]["note"]["lost"] == 2


def took(seconds: float) -> dict[str, Any]:
    """A checkpoint report's commit: when (the runner's clock), its size and how long it took."""
    return {"time": at(seconds), "bytes": 1, "seconds": 1.0}


def test_a_checkpoint_raises_the_cards_step_and_one_committed_before_the_jobs_changes_nothing() -> None:
    job = running_job()  # progress heard up to step 12
    saved = decide(
        job, report(job, CheckpointSaved, step=15, uri="s3://b/ft-ab12/checkpoint-15/", **took(30)), at(30)
    ).job
    assert saved.checkpoint is not None and saved.checkpoint.step == 15 and saved.step == 15
    assert "15/30" in render.card_text(saved, at(30))

    # checkpoint-10's report, committed before checkpoint-15, comes after it (SNS to SQS keeps no order).
    late = decide(
        saved, report(saved, CheckpointSaved, step=10, uri="s3://b/ft-ab12/checkpoint-10/", **took(25)), at(31)
    )
    assert late.history["event"] == "ignored" and "not newer" in late.history["why"]
    # Nothing changes but the bytes its attempt moved: those were stored all the same (handlers/egress.py).
    assert late.job.attempts[-1].moved_bytes == saved.attempts[-1].moved_bytes + 1
    assert late.job.model_copy(update={"attempts": saved.attempts}) == saved

    # The next attempt resumed from checkpoint-10 (15 would not load): its own checkpoint-12 is the job's newest.
    interrupted = dict(reason="spot-interruption", step=15, uri="s3://b/ft-ab12/checkpoint-15/", saved_in_time=True)
    job = decide(saved, report(saved, Interrupted, **interrupted, time=at(35)), at(35)).job
    job = decide(job, Launched(job_id=job.id, attempt=2, instance_id="i-2"), at(40)).job
    job = decide(job, report(job, Started, resumed_from_step=10, time=at(45)), at(45)).job
    assert job.attempt == 2 and job.state is JobState.RUNNING
    newer = decide(job, report(job, CheckpointSaved, step=12, uri="s3://b/ft-ab12/checkpoint-12/", **took(50)), at(50))
    assert newer.job.checkpoint is not None and newer.job.checkpoint.step == 12 and newer.job.step == 15


def test_a_progress_report_older_than_the_last_moves_neither_the_step_nor_the_loss() -> None:
    job = running_job()  # step 12, loss 1.2
    newer = decide(job, report(job, Progress, step=14, total_steps=30, loss=0.9), at(30)).job
    older = decide(newer, report(newer, Progress, step=13, total_steps=30, loss=1.0), at(31)).job
    assert (older.step, older.loss) == (14, 0.9)
    assert "14/30 · loss 0.9" in render.card_text(older, at(31))


def test_a_trainer_whose_step_the_runner_cannot_see_loses_an_unknown_number_of_steps_never_0() -> None:
    # A plain Trainer script writes no progress file: the job's step is only what its checkpoints said (10), and the
    # runner's report has no reached step. Counting from the step heard would say 0 lost; it is unknown.
    job = new_job("ft-ab12", "tiny", {"steps": 30}, "console:ana", ChatRef(platform="console", channel="c"), T0).job
    job = decide(job, Launched(job_id=job.id, attempt=1, instance_id="i-1", zone="us-east-1a"), at(1)).job
    job = decide(job, report(job, Started, time=at(5)), at(5)).job
    job = decide(
        job, report(job, CheckpointSaved, step=10, uri="s3://b/ft-ab12/checkpoint-10/", seconds=0.1, bytes=1), at(21)
    ).job
    told = report(
        job,
        Interrupted,
        reason="spot-interruption",
        step=10,
        uri="s3://b/ft-ab12/checkpoint-10/",
        time=at(22),
        saved_in_time=False,
    )
    interrupted = decide(job, told, at(22))
    job = interrupted.job
    assert job.steps_lost == 0 and job.steps_lost_unknown and job.attempts[0].steps_unknown
    [note] = [item for item in interrupted.outbox if isinstance(item, Notify) and item.channel == "thread"]
    assert render.message_text(job, note, at(22)).count("steps lost: unknown") == 1
    assert "丢失步数：未知" in render.message_text(job, note, at(22), "zh-CN")
    assert "steps lost: unknown" in render.card_text(job, at(22))

    job = decide(job, Launched(job_id=job.id, attempt=2, instance_id="i-2", zone="us-east-1c"), at(31)).job
    resumed = decide(job, report(job, Started, resumed_from_step=10, time=at(40)), at(40))
    [note] = [item for item in resumed.outbox if isinstance(item, Notify) and item.channel == "thread"]
    assert dumped(resumed)[1]["note"]["lost"] is None
    assert "steps lost: unknown" in render.message_text(resumed.job, note, at(40))
    assert "0 steps lost" not in render.message_text(resumed.job, note, at(40))
