"""What an attempt's key may still say, as pure decisions: an ended attempt's word counts for a short grace only (its
checkpoint always, as before), a gang node's key speaks for its own rank, a report's URIs lie under its job's
prefix, and job ids are long enough never to repeat."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest

from handlers.decide import decide
from handlers.ids import JOB_ID_CHARS, JOB_ID_PATTERN, new_job_id
from handlers.jobs import Job, JobState
from handlers.messages import CloudEvent, Launched, ReportReceived
from handlers.report_fence import ENDED_ATTEMPT_GRACE, claims_another_rank, spoke_too_late
from handlers.report_scope import outside_prefix, under
from handlers.reports import CheckpointSaved, Completed, Interrupted, Notice, Progress
from tests.test_decide import at, running_job
from tests.test_gang_decide import NOW, running_gang

GRACE = ENDED_ATTEMPT_GRACE.total_seconds()


def told(job: Job, report_type: type, attempt: int, when: Any, **fields: Any) -> ReportReceived:
    """A report of ``attempt`` the gate admitted at ``when``."""
    return ReportReceived(report=report_type(job_id=job.id, attempt=attempt, **fields), at=when)


def relaunched_after_instance_gone() -> Job:
    """Attempt 1 judged gone at 30 s, attempt 2 launched in its place."""
    job = running_job()
    gone = decide(job, CloudEvent(kind="instance-gone", instance_id="i-1", source="local"), at(30)).job
    job = decide(gone, Launched(job_id=job.id, attempt=2, instance_id="i-2"), at(31)).job
    assert job.attempts[0].ended_at == at(30) and job.state is JobState.RECOVERING
    return job


# -- an ended attempt ---------------------------------------------------------------------------------------------


def test_an_ended_attempts_completion_within_the_grace_completes_the_job_and_after_it_changes_nothing() -> None:
    job = relaunched_after_instance_gone()
    done = Completed, {"step": 30, "output_uri": "s3://b/jobs/ft-ab12/output/"}
    within = told(job, done[0], 1, at(30 + GRACE), **done[1])
    assert decide(job, within, at(30 + GRACE)).job.state is JobState.SUCCEEDED  # judged gone, finished after all
    late = told(job, done[0], 1, at(30 + GRACE + 1), **done[1])
    change = decide(job, late, at(30 + GRACE + 1))
    assert change is not None and change.job == job and change.outbox == []  # not the state, not a note, no release
    assert change.history["event"] == "ignored" and "past the grace" in change.history["why"]
    # Judged by when the gate admitted it, not when the bot got to it: admitted in time, handled later, counts.
    queued = told(job, done[0], 1, at(60), **done[1])
    assert decide(job, queued, at(30 + 10 * GRACE)).job.state is JobState.SUCCEEDED


def test_an_ended_attempts_other_reports_past_the_grace_tell_nothing_but_its_checkpoint_still_counts() -> None:
    job = relaunched_after_instance_gone()
    weeks = at(30 + 14 * 24 * 3600)
    for kind, fields in [
        (Notice, {"kind": "spot-interruption", "source": "aws-imds"}),
        (Interrupted, {"reason": "spot-interruption", "step": 40, "uri": "s3://b/jobs/ft-ab12/checkpoint-40/"}),
        (Progress, {"step": 99}),
    ]:
        change = decide(job, told(job, kind, 1, weeks, **fields), weeks)
        assert change is not None and change.job == job and change.outbox == [], kind
    # A checkpoint it committed is a fact of the job's own storage however late it is told (as before the grace).
    uri = "s3://b/jobs/ft-ab12/checkpoint-20/"
    saved = told(job, CheckpointSaved, 1, weeks, step=20, uri=uri, bytes=1, seconds=1.0, reason="notice")
    change = decide(job, saved, weeks)
    assert change is not None and change.job.checkpoint is not None and change.job.checkpoint.step == 20


def test_the_grace_fence_is_exact_and_spares_live_attempts_and_checkpoints() -> None:
    job = relaunched_after_instance_gone()
    ended = job.attempts[0].ended_at
    assert ended is not None
    completed = Completed(job_id=job.id, attempt=1, output_uri="s3://b/out/")
    assert spoke_too_late(job, completed, ended + ENDED_ATTEMPT_GRACE) is None
    assert spoke_too_late(job, completed, ended + ENDED_ATTEMPT_GRACE + timedelta(microseconds=1)) is not None
    live = Completed(job_id=job.id, attempt=2, output_uri="s3://b/out/")
    assert spoke_too_late(job, live, ended + timedelta(days=30)) is None
    checkpoint = CheckpointSaved(job_id=job.id, attempt=1, step=5, uri="s3://b/c/", bytes=1, seconds=1.0)
    assert spoke_too_late(job, checkpoint, ended + timedelta(days=30)) is None
    assert timedelta(minutes=5) < ENDED_ATTEMPT_GRACE <= timedelta(minutes=15)  # the signing window, and a margin


# -- a gang node's rank ---------------------------------------------------------------------------------------------


def test_a_gang_nodes_key_cannot_claim_rank_0_and_complete_the_gang() -> None:
    job = running_gang()  # attempt 1 is node 0, attempt 2 node 1
    forged = told(job, Completed, 2, NOW, node_rank=0, output_uri="s3://b/jobs/ft-gang1/output/", step=9)
    change = decide(job, forged, NOW)
    assert change is not None and change.job == job and change.outbox == []
    assert change.history["event"] == "ignored" and "is node 1, not node 0" in change.history["why"]
    # Its own rank: that node's part is done (node 0 stores the output), the gang goes on.
    own = decide(job, told(job, Completed, 2, NOW, node_rank=1, output_uri="s3://b/out/"), NOW)
    assert own is not None and own.job.state is JobState.RUNNING and own.history["event"] == "node-completed"
    # Node 0's own completion completes the gang.
    node0 = decide(job, told(job, Completed, 1, NOW, node_rank=0, output_uri="s3://b/out/"), NOW)
    assert node0 is not None and node0.job.state is JobState.SUCCEEDED


def test_a_rank_claim_may_be_its_own_or_the_higher_one_before_a_regroup_never_lower() -> None:
    job = running_gang()
    assert claims_another_rank(job, Progress(job_id=job.id, attempt=2, step=1, node_rank=0)) is not None
    assert claims_another_rank(job, Progress(job_id=job.id, attempt=2, step=1, node_rank=1)) is None
    assert claims_another_rank(job, Progress(job_id=job.id, attempt=1, step=1, node_rank=0)) is None
    assert claims_another_rank(job, Progress(job_id=job.id, attempt=2, step=1)) is None  # names none: its record's
    # Node 1 regrouped to rank 0 after node 0 was lost: its runner may still finish as rank 1 of the old world.
    node1 = job.attempts[1].model_copy(update={"node_rank": 0})
    regrouped = job.model_copy(update={"attempts": [job.attempts[0], node1]})
    for rank in (0, 1):
        assert claims_another_rank(regrouped, Progress(job_id=job.id, attempt=2, step=1, node_rank=rank)) is None


# -- the job's prefix ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "inside"),
    [
        ("s3://b/jobs/ft-ab12/output/", True),
        ("s3://b/jobs/ft-ab12/checkpoint-40/", True),
        ("s3://b/jobs/ft-ab12/", True),
        ("s3://b/jobs/ft-ab12", False),
        ("s3://b/jobs/ft-ab123/output/", False),
        ("s3://b/jobs/ft-ab12/../ft-other/output/", False),
        ("s3://b/jobs/ft-ab12/%2E%2E/ft-other/", False),
        ("s3://b/jobs/ft-ab12/./output/", False),
        ("s3://b/jobs/ft-ab12/output/?x=1", False),
        ("s3://b/jobs/ft-ab12/output/#x", False),
        ("s3://b/jobs/ft-ab12/out\nput/", False),
        ("s3://b/jobs/ft-ab12/out%0aput/", False),
        ("s3://b/jobs/ft-ab12/out\\..\\x/", False),
        ("s3://other/jobs/ft-ab12/output/", False),
        ("https://example.com/s3://b/jobs/ft-ab12/output/", False),
    ],
)
def test_a_uri_is_under_the_jobs_prefix_only_as_plain_segments_after_it(uri: str, inside: bool) -> None:
    assert under(uri, "s3://b/jobs/ft-ab12/") is inside
    try:
        report = Completed(job_id="ft-ab12", attempt=1, output_uri=uri)  # as the report's parser keeps it
    except ValueError:  # or refuses it itself
        assert not inside
        return
    assert (outside_prefix(report, "s3://b/jobs/ft-ab12/") is None) is under(report.output_uri, "s3://b/jobs/ft-ab12/")


def test_every_uri_a_report_asks_the_bot_to_record_or_show_is_checked() -> None:
    prefix = "file:///var/ft/jobs/ft-ab12/"
    outside = "file:///etc/"
    assert outside_prefix(CheckpointSaved(job_id="ft-ab12", attempt=1, step=1, uri=outside, bytes=1, seconds=1), prefix)
    assert outside_prefix(Interrupted(job_id="ft-ab12", attempt=1, reason="r", uri=outside), prefix)
    assert outside_prefix(Interrupted(job_id="ft-ab12", attempt=1, reason="r"), prefix) is None  # names none
    assert outside_prefix(Progress(job_id="ft-ab12", attempt=1, step=1), prefix) is None
    assert not under(prefix + "output/", prefix.rstrip("/"))  # a prefix is a folder: it ends with "/"


# -- job ids ----------------------------------------------------------------------------------------------------


def test_job_ids_are_short_typeable_and_long_enough_never_to_repeat() -> None:
    ids = {new_job_id() for _ in range(20_000)}
    assert len(ids) == 20_000
    for job_id in ids:
        assert re.fullmatch(JOB_ID_PATTERN, job_id) and len(job_id) == 3 + JOB_ID_CHARS
        assert not set(job_id[3:]) & set("lo01")  # nothing read wrongly off a card
    # The docstring's arithmetic: a million jobs a year for ten years among 32**12 ids.
    jobs = 1_000 * 365 * 10
    assert jobs**2 / (2 * 32**JOB_ID_CHARS) < 1e-5
