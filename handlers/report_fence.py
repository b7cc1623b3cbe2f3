"""What a report may still say for its job, given what the bot knows of the attempt that signed it.

The gate proved the report was signed with its attempt's key (:mod:`handlers.report_keys`); the key is good for
as long as the bot keeps the attempt's record, so the fence here is what keeps an old key from speaking for the job:

- **An ended attempt speaks for a short grace only.** A report admitted more than :data:`ENDED_ATTEMPT_GRACE` after
  its attempt ended changes nothing (not the state, not a note, not an instance): whoever read an old attempt's key
  (its user data, its key object) cannot mark the job done, end its instance or post in its thread weeks later. A
  ``checkpoint_saved`` is the exception, as before: it says a checkpoint was committed under the job's own prefix
  (the gate checks that), which stays true however late it is told, and it is applied only when newer than the
  job's checkpoint.
- **A gang node speaks for its own rank.** Each node is its own attempt with its own key (:mod:`handlers.gang`),
  so the rank a report claims must be one that attempt holds: ranks only close up towards 0 when a node is lost
  (:func:`handlers.gang.regrouped`), so a runner may name its current rank or the higher one it had before its
  regroup reached it, never a lower one. Node 1's key cannot claim rank 0 (whose completion completes the gang).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from handlers.jobs import Job
from handlers.reports import CheckpointSaved, RunnerReport

# How long after its attempt ended (as the bot recorded it) a report still counts, judged by when the bot admitted
# the report. Long enough for every report the attempt's runner sent while it lived: the gate admits a report at most
# 5 minutes after it was signed (handlers/signing.py's window; a queued one by its queue's receive time), and the
# bot may record the end before the runner's last reports are signed (the cloud's instance-gone beats the runner's
# ``completed``, a spot machine commits for up to 2 minutes after its notice). 10 minutes covers both with room; a
# key read off an ended attempt later than that speaks for nothing.
ENDED_ATTEMPT_GRACE = timedelta(minutes=10)


def spoke_too_late(job: Job, report: RunnerReport, received: datetime) -> str | None:
    """Why ``report`` (admitted at ``received``) may change nothing: its attempt ended more than the grace before;
    None when it may (its attempt lives, ended within the grace, is unknown to the job, or it is a checkpoint)."""
    attempt = job.attempt_numbered(report.attempt)
    if attempt is None or attempt.ended_at is None or isinstance(report, CheckpointSaved):
        return None
    if received - attempt.ended_at <= ENDED_ATTEMPT_GRACE:
        return None
    return f"from attempt {attempt.number}, which ended at {attempt.ended_at.isoformat()}, past the grace"


def claims_another_rank(job: Job, report: RunnerReport) -> str | None:
    """Why ``report`` speaks for a rank its attempt does not hold (a gang node's key naming a lower rank); None
    when the rank it names is its own (or it names none, or the job is one node)."""
    if job.nodes <= 1 or report.node_rank is None:
        return None
    attempt = job.attempt_numbered(report.attempt)
    if attempt is None or attempt.node_rank is None or report.node_rank >= attempt.node_rank:
        return None
    return f"attempt {attempt.number} is node {attempt.node_rank}, not node {report.node_rank}"
