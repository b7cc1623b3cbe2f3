"""The notice budget (handlers/notice_budget.py) as pure decisions: the runner's measured rates against the cloud's
notice, the card's line, one warning in the thread, and the spot authority's risk for a job that cannot commit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from bot.chat.render import card, card_text
from handlers.decide import decide, new_job
from handlers.jobs import Attempt, ChatRef, Job, JobState
from handlers.messages import Launched, Notify, ReportReceived
from handlers.notes import NoticeBudgetNote
from handlers.notice_budget import notice_budget, steps_at_risk
from handlers.reports import CheckpointSaved, Progress, Started
from handlers.spot.rules import deadline_aware
from handlers.spot.situation import live_situation
from tests.test_gang_decide import running_gang

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
MiB = 1024 * 1024


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def running(notice_seconds: float | None) -> Job:
    """A job on a cloud whose spot notice is ``notice_seconds``, trained to step 12."""
    job = new_job("ft-ab12", "tiny", {"steps": 30}, "console:ana", ChatRef(platform="console", channel="c"), T0).job
    launched = Launched(job_id=job.id, attempt=1, instance_id="i-1", zone="us-east-1a", notice_seconds=notice_seconds)
    job = decide(job, launched, at(1)).job
    job = decide(job, ReportReceived(report=Started(job_id=job.id, attempt=1, time=at(5))), at(5)).job
    return decide(job, ReportReceived(report=Progress(job_id=job.id, attempt=1, step=12, total_steps=30)), at(20)).job


def saved(job: Job, step: int, **fields: Any) -> ReportReceived:
    uri = f"s3://b/checkpoint-{step}/"
    return ReportReceived(report=CheckpointSaved(job_id=job.id, attempt=1, step=step, uri=uri, seconds=0.1, **fields))


def budget_notes(outbox: list[Any]) -> list[NoticeBudgetNote]:
    return [m.note for m in outbox if isinstance(m, Notify) and isinstance(m.note, NoticeBudgetNote)]


def test_a_commit_longer_than_the_notice_is_said_once_in_the_thread_and_on_the_card() -> None:
    job = running(notice_seconds=20.0)
    # 64 MiB at 4 MiB/s after a 9 s save: ~25 s, past a 20 s notice.
    first = decide(job, saved(job, 10, bytes=64 * MiB, save_seconds=9.0, upload_bytes_per_second=4 * MiB), at(30))
    assert first is not None
    [note] = budget_notes(first.outbox)
    assert [m.channel for m in first.outbox if isinstance(m, Notify) and m.note is note] == ["thread"]
    assert (note.commit_seconds, note.notice_seconds, note.save_seconds) == (25.0, 20.0, 9.0)
    job = first.job
    assert job.notice_budget_warned and job.checkpoint_interval_steps == 10
    budget = notice_budget(job)
    assert budget is not None and not budget.fits
    shown = card_text(job, at(30))
    assert "Notice budget: commit ~25s of 20s: does not fit, a notice loses the work since the last save" in shown
    assert dict(card(job, at(30), "zh-CN").fields)["通知预算"].startswith("提交约 25 秒 / 通知 20 秒：来不及")

    # The next periodic save says it again, no louder: one warning per job; its interval is measured anew.
    second = decide(job, saved(job, 15, bytes=64 * MiB, save_seconds=9.5, upload_bytes_per_second=4 * MiB), at(60))
    assert second is not None and budget_notes(second.outbox) == []
    assert second.job.checkpoint_interval_steps == 5 and second.job.checkpoint_save_seconds == 9.5


def test_a_commit_within_the_notice_is_shown_and_not_warned() -> None:
    job = running(notice_seconds=120.0)
    change = decide(job, saved(job, 10, bytes=64 * MiB, save_seconds=9.0, upload_bytes_per_second=4 * MiB), at(30))
    assert change is not None and budget_notes(change.outbox) == []
    assert not change.job.notice_budget_warned and steps_at_risk(change.job) == 0
    assert "Notice budget: commit ~25s of 120s\n" in card_text(change.job, at(30)) + "\n"


def test_nothing_is_shown_until_the_rate_and_the_notice_are_known() -> None:
    unknown_notice = running(notice_seconds=None)
    change = decide(unknown_notice, saved(unknown_notice, 10, bytes=MiB, upload_bytes_per_second=1.0), at(30))
    assert change is not None and notice_budget(change.job) is None and budget_notes(change.outbox) == []
    job = running(notice_seconds=2.0)
    unmeasured = decide(job, saved(job, 10, bytes=64 * MiB), at(30))  # no upload rate measured yet
    assert unmeasured is not None and notice_budget(unmeasured.job) is None
    assert "Notice budget" not in card_text(unmeasured.job, at(30))


def steered(job: Job) -> Job:
    """``job`` after 120 of 480 steps at 60 s a step on spot, its instance reclaimed, the next attempt planned."""
    lost = Attempt(
        number=1,
        instance_id="i-1",
        zone="zone-a",
        price_per_hour=1.0,
        on_demand_price_per_hour=3.0,
        launched_at=T0,
        started_at=T0 + timedelta(minutes=6),
        ended_at=T0 + timedelta(hours=2, minutes=6),
        end_reason="interrupted: spot",
        notice_seconds=120.0,
    )
    planned = Attempt(number=2, launched_at=T0 + timedelta(hours=2, minutes=6))
    return job.model_copy(
        update={
            "state": JobState.RECOVERING,
            "attempts": [lost, planned],
            "step": 120,
            "total_steps": 480,
            "created_at": T0,
        }
    )


def test_the_authority_counts_a_save_interval_at_risk_for_a_job_that_cannot_commit_within_the_notice() -> None:
    """checkpoint_interval_s: the work a notice takes when the commit cannot fit (40 steps of 60 s); none when it
    fits. With the deadline 30 min past what a fresh on-demand instance needs, the policy keeps the job on spot
    while a notice costs nothing, and goes on-demand once a notice would cost the 40 minutes since the last save."""
    base = running(notice_seconds=120.0)
    rates = {"checkpoint_bytes": 112 * 2**30, "checkpoint_interval_steps": 40, "upload_bytes_per_second": 1e9}
    slow = steered(base).model_copy(update={**rates, "checkpoint_save_seconds": 30.0})  # ~150 s of 120
    quick = steered(base).model_copy(update={**rates, "upload_bytes_per_second": 50e9})  # ~2.4 s
    now = T0 + timedelta(hours=2, minutes=7)
    deadline = now + timedelta(minutes=6 + 360 + 30)

    def situation(job: Job) -> Any:
        s = live_situation(
            job,
            now,
            "interrupted",
            deadline=deadline,
            budget=None,
            zones=["zone-b"],
            spot_price=1.0,
            on_demand_price=3.0,
            period=timedelta(minutes=5),
        )
        assert s is not None
        return s

    assert steps_at_risk(slow) == 40 and steps_at_risk(quick) == 0
    assert situation(slow).checkpoint_interval_s == 40 * 60.0
    assert situation(quick).checkpoint_interval_s == 0.0
    assert deadline_aware(situation(quick)).action == "spot"
    assert deadline_aware(situation(slow)).action == "on-demand"


def test_a_gangs_checkpoint_from_node_0_warns_the_same_way() -> None:
    job = running_gang()
    job = job.model_copy(update={"attempts": [a.model_copy(update={"notice_seconds": 10.0}) for a in job.attempts]})
    fields = {"bytes": 64 * MiB, "save_seconds": 9.0, "upload_bytes_per_second": 4 * MiB}
    report = CheckpointSaved(job_id=job.id, attempt=1, step=10, uri="s3://b/c-10/", seconds=0.1, node_rank=0, **fields)
    change = decide(job, ReportReceived(report=report), at(30))
    assert change is not None and change.job.notice_budget_warned and change.job.checkpoint_interval_steps == 10
    [note] = budget_notes(change.outbox)
    assert (note.commit_seconds, note.notice_seconds) == (25.0, 10.0)
