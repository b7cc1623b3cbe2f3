"""Signals before an interruption, as pure decisions: a spot warning before the runner started relaunches at once;
a rebalance or a scheduled system event commits early and lets the spot authority move the job ahead of it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from bot.chat import render
from fakes.notes import note_type
from handlers.change import Change
from handlers.decide import decide, new_job
from handlers.jobs import ChatRef, Job, JobState
from handlers.lifecycle import Lifecycle
from handlers.messages import CloudEvent, Launched, Notify, ReportReceived
from handlers.reports import Notice, Progress, Standby, Started
from handlers.spot import SpotView
from tests.outboxes import dumped

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
VIEW = SpotView(zones=("us-east-1a", "us-east-1b"), spot_price=0.5, on_demand_price=1.5)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def kinds(change: Change) -> list[str]:
    return [f"{item['type']}:{item.get('channel', '')}{note_type(item)}".rstrip(":") for item in dumped(change)]


def report(job: Job, report_type: type[Any], attempt: int | None = None, **fields: Any) -> ReportReceived:
    return ReportReceived(report=report_type(job_id=job.id, attempt=attempt or job.attempt, **fields))


def launched(job: Job, instance: str, seconds: float) -> Job:
    message = Launched(job_id=job.id, attempt=job.attempt, instance_id=instance, zone="us-east-1a", price_per_hour=0.5)
    return decide(job, message, at(seconds)).job


def provisioning() -> Job:
    job = new_job("ft-ab12", "tiny", {}, "console:ana", ChatRef(platform="console", channel="c"), T0).job
    return launched(job, "i-1", 1)


def warning(instance: str, source: str = "aws.ec2") -> CloudEvent:
    return CloudEvent(kind="spot-interruption", instance_id=instance, source=source, deadline=at(140))


def thread_text(job: Job, change: Change, note: str) -> str:
    [told] = [item for item in change.outbox if isinstance(item, Notify) and item.note.type == note]
    return render.message_text(job, told, at(0))


def test_a_warning_before_the_runner_started_is_posted_and_relaunches_at_once() -> None:
    job = provisioning()
    assert job.state is JobState.PROVISIONING
    change = decide(job, warning("i-1"), at(10))
    moved = change.job
    assert moved.state is JobState.RECOVERING and moved.attempt == 2 and moved.interruptions == 1
    assert moved.attempt_numbered(1) is not None and moved.attempt_numbered(1).ended_at == at(10)  # type: ignore[union-attr]
    assert kinds(change) == [
        "terminate",  # the doomed instance is released, not left billing until it is taken
        "notify:alertinterruption-warning",
        "notify:threadwarned-before-start",
        "launch",  # at once: no wait for the instance to vanish
        "start-deadline",
        "notify:cardlaunch",
    ]
    assert dumped(change)[0]["instance_id"] == "i-1" and dumped(change)[3]["attempt"] == 2
    assert "before its runner started" in thread_text(moved, change, "warned-before-start")
    assert change.history["event"] == "warned-before-start" and change.history["next_attempt"] == 2

    # The same warning again by the other route (the runner saw it while restoring): the notes it would post carry
    # the ids already posted, and the instance's end changes nothing either.
    notes = {item.id for item in change.outbox if isinstance(item, Notify) and item.channel != "card"}
    again = decide(moved, report(moved, Notice, attempt=1, kind="spot-interruption", source="aws-imds"), at(11))
    assert again is not None and again.job.attempt == 2
    assert {item.id for item in again.outbox if isinstance(item, Notify)} <= notes
    gone = decide(moved, CloudEvent(kind="instance-gone", instance_id="i-1", source="aws.ec2"), at(12))
    assert gone is not None and gone.job == moved and gone.history["event"] == "ignored"


def test_the_runner_warned_while_it_restored_relaunches_the_same_way() -> None:
    job = provisioning()
    change = decide(job, report(job, Notice, kind="spot-interruption", source="aws-imds", deadline=at(130)), at(10))
    assert change is not None and change.job.state is JobState.RECOVERING and change.job.attempt == 2
    assert "launch" in kinds(change) and "terminate" in kinds(change)


def test_warnings_before_start_are_bounded_like_any_relaunch_without_progress() -> None:
    """Every doomed instance is an attempt without progress: the relaunches pause, then the job ends."""
    limits = Lifecycle(max_relaunches_without_progress=2, relaunch_pause_seconds=30)
    job = provisioning()
    instances = iter(["i-2", "i-3", "i-4"])
    seen: list[list[str]] = []
    for step in range(3):
        change = decide(job, warning(job.current.instance_id or ""), at(10 + step * 100), lifecycle=limits)  # type: ignore[union-attr]
        assert change is not None
        seen.append(kinds(change))
        job = change.job
        if job.state is JobState.RECOVERING:
            job = launched(job, next(instances), 20 + step * 100)
    assert "launch" in seen[0]  # the first relaunch is at once
    assert "relaunch-due" in seen[1] and "notify:threadrelaunch-paused" in seen[1]  # the next one waits
    # The third in a row ends the relaunches: a job that relaunched before pages on-call (RESUME_FAILED).
    assert job.state is JobState.RESUME_FAILED and job.page is not None


def test_a_warning_for_a_relaunched_instance_still_booting_relaunches_too() -> None:
    job = provisioning()
    job = decide(job, report(job, Started, time=at(5)), at(5)).job
    job = decide(job, warning("i-1"), at(20)).job  # RUNNING → INTERRUPTED
    assert job.state is JobState.INTERRUPTED
    job = decide(job, CloudEvent(kind="instance-gone", instance_id="i-1", source="aws.ec2"), at(150)).job
    assert job.state is JobState.RECOVERING
    job = launched(job, "i-2", 160)
    change = decide(job, warning("i-2"), at(170))
    assert change is not None and change.job.state is JobState.RECOVERING and change.job.attempt == 3
    assert kinds(change)[:3] == ["terminate", "notify:alertinterruption-warning", "notify:threadwarned-before-start"]


# -- early signals ---------------------------------------------------------------------------------------------


def running(total_steps: int) -> Job:
    """Started at 5 s, at step 12 of ``total_steps`` at 20 s: 1.25 s a step."""
    job = provisioning()
    job = decide(job, report(job, Started, time=at(5)), at(5)).job
    return decide(job, report(job, Progress, step=12, total_steps=total_steps, time=at(20)), at(20)).job


def rebalance(instance: str = "i-1") -> CloudEvent:
    return CloudEvent(kind="rebalance", instance_id=instance, source="aws.ec2", detail="rebalance recommendation")


def scheduled(instance: str = "i-1") -> CloudEvent:
    return CloudEvent(
        kind="scheduled-event",
        instance_id=instance,
        source="acs.ecs",
        deadline=at(86_400),
        detail="SystemMaintenance.Reboot",
    )


def test_a_rebalance_with_much_work_left_moves_the_job_ahead_make_before_break() -> None:
    job = running(total_steps=3000)  # ~66 min left against a 6 min restart
    change = decide(job, rebalance(), at(21), spot=VIEW)
    moved = change.job
    assert moved.state is JobState.RUNNING and moved.attempt == 1  # it trains on meanwhile
    assert moved.standby is not None and moved.standby.number == 2
    assert kinds(change) == ["notify:threadrebalance", "launch", "start-deadline"]
    assert dumped(change)[1]["zone"] == "us-east-1b"  # away from the zone at risk
    said = thread_text(moved, change, "rebalance")
    assert "Rebalance recommendation" in said and "Moving ahead of it" in said and "~66 min" in said

    # The runner saw the same rebalance: its word posts nothing new and launches nothing more.
    duplicate = decide(moved, report(moved, Notice, kind="rebalance", source="aws-imds"), at(22), spot=VIEW)
    assert duplicate is not None and "launch" not in kinds(duplicate) and duplicate.job.standby == moved.standby
    assert {item.id for item in duplicate.outbox} <= {item.id for item in change.outbox if isinstance(item, Notify)}

    # The replacement's runner stands by: the current attempt checkpoints and stops for it (the existing hand-over).
    job = decide(moved, Launched(job_id=job.id, attempt=2, instance_id="i-2", zone="us-east-1b"), at(60)).job
    handover = decide(job, report(job, Standby, attempt=2, node_rank=0, generation=1, cause="handover"), at(90))
    assert handover is not None and handover.job.state is JobState.STOPPING
    assert kinds(handover)[0] == "stop-runner" and dumped(handover)[0]["instance_id"] == "i-1"


def test_a_rebalance_near_the_end_stays_and_says_why() -> None:
    job = running(total_steps=30)  # 18 steps, ~22 s left: a move cannot pay
    change = decide(job, rebalance(), at(21), spot=VIEW)
    assert change.job.standby is None and kinds(change) == ["notify:threadrebalance"]
    assert "Staying" in thread_text(change.job, change, "rebalance")


def test_a_job_no_policy_steers_only_commits_early() -> None:
    job = running(total_steps=3000)
    change = decide(job, rebalance(), at(21))  # no spot view: the bot reads none for a job nobody steers
    assert change.job.standby is None and change.history["move"] == "stay"
    assert thread_text(change.job, change, "rebalance").endswith("checkpointing early.")


def test_a_scheduled_event_asks_the_runner_for_a_fresh_checkpoint_and_may_move_the_job() -> None:
    job = running(total_steps=3000)
    change = decide(job, scheduled(), at(21), spot=VIEW)
    assert kinds(change) == ["save-runner", "notify:threadrebalance", "launch", "start-deadline"]
    assert dumped(change)[0]["instance_id"] == "i-1"  # the runner cannot see it: the bot passes it on
    said = thread_text(change.job, change, "rebalance")
    assert "SystemMaintenance.Reboot" in said and "Moving ahead" in said
    assert change.history["system_event"] == "SystemMaintenance.Reboot"


def test_an_early_signal_for_an_instance_that_is_not_the_jobs_changes_nothing() -> None:
    job = running(total_steps=3000)
    change = decide(job, scheduled("i-9"), at(21), spot=VIEW)
    assert change is not None and change.job == job and change.outbox == [] and change.history["event"] == "ignored"


def test_a_runner_acknowledging_a_save_request_moves_nothing() -> None:
    job = running(total_steps=3000)
    change = decide(job, report(job, Notice, kind="save", source="control"), at(21), spot=VIEW)
    assert change is not None and change.job == job and change.outbox == []


def test_a_gang_node_warned_before_its_runner_started_is_lost_at_once_and_replaced() -> None:
    """Node 1 of a two-node gang is warned while it restores (node 0 already started): posted, its instance
    released, its replacement launched now; the other route's copy of the warning posts nothing more."""
    job = new_job("ft-gang1", "tiny", {}, "console:ana", ChatRef(platform="console", channel="c"), T0, nodes=2).job
    for attempt, instance in ((1, "i-0"), (2, "i-1")):
        up = Launched(job_id=job.id, attempt=attempt, instance_id=instance, zone="us-east-1a", private_ip="10.0.0.7")
        job = decide(job, up, at(attempt)).job
    job = decide(job, report(job, Started, attempt=1, node_rank=0, generation=1, instance_id="i-0"), at(5)).job
    assert job.state is JobState.PROVISIONING
    change = decide(job, warning("i-1"), at(10))
    moved = change.job
    assert moved.state is JobState.RECOVERING and moved.interruptions == 1
    sent = kinds(change)
    assert sent[:2] == ["notify:alertinterruption-warning", "notify:threadwarned-before-start"]
    assert "terminate" in sent and "launch" in sent and "notify:threadinstance-gone" not in sent
    [released] = [item for item in dumped(change) if item["type"] == "terminate"]
    [launch] = [item for item in dumped(change) if item["type"] == "launch"]
    assert released["instance_id"] == "i-1" and launch["attempt"] == 3  # node 1 again, at once
    assert moved.attempt_numbered(2).ended_at == at(10)  # type: ignore[union-attr]
    assert moved.attempt_numbered(1).ended_at is None  # type: ignore[union-attr]  # node 0 goes on
    assert change.history["event"] == "warned-before-start"
    # Node 1's runner saw the same warning while it restored: its attempt has ended, nothing more is done, and the
    # notes it would post carry the ids already posted (the outbox posts an id once).
    posted = {item.id for item in change.outbox if isinstance(item, Notify) and item.channel != "card"}
    again = decide(moved, report(moved, Notice, attempt=2, kind="spot-interruption", source="aws-imds"), at(11))
    assert again is not None and again.job.attempts == moved.attempts
    assert {item.id for item in again.outbox if isinstance(item, Notify)} <= posted
