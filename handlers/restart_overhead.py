"""Restart overhead, measured: what a new instance of a job spends before it trains again.

The spot policy weighs every switch in restarts, so the restart it plans with should be what this recipe on
this instance type costs, not a constant. Each attempt already carries its timestamps: launched, runner
started, restore took so long, first step; the overhead is launch to first step (boot + runner start +
restore + warm-up). A job keeps the median of its attempts; the bot keeps a per-(recipe, instance type)
estimate across jobs, so a new job starts its policy with what the previous ones measured.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from typing import Any

from handlers.jobs import Attempt, Job

# Weight of the newest measurement in the cross-job estimate: recent enough to follow a changed image or
# checkpoint size, steady enough that one slow boot does not swing the policy.
NEW_WEIGHT = 0.3


def attempt_restart_s(attempt: Attempt) -> float | None:
    """Launch to first step of ``attempt`` in seconds; None until its first step is known, and for an attempt launched
    ahead of a switch of market. Its boot overlapped the previous attempt's training, so counted from its launch it
    would take in the wait, and from its hand-over it would make every restart look cheaper than the relaunch after
    an interruption, which boots in full: the deadline's fallback would be planned too short."""
    if attempt.first_step_at is None or attempt.handed_over_at is not None:
        return None
    return max((attempt.first_step_at - attempt.launched_at).total_seconds(), 0.0)


def job_restart_s(attempts: list[Attempt]) -> float | None:
    """The median overhead of the attempts that reached a first step (the median: one odd boot is noise)."""
    measured = [value for value in map(attempt_restart_s, attempts) if value is not None]
    return statistics.median(measured) if measured else None


def earlier_first_step(attempt: Attempt, at: datetime) -> Attempt | None:
    """``attempt`` with a step report of time ``at`` taken in: its first step is the earliest report's (reports may
    come out of order, a retried one after a later one), never before its launch; None where nothing changes."""
    first = max(at, attempt.launched_at)
    if attempt.first_step_at is not None and attempt.first_step_at <= first:
        return None
    return attempt.model_copy(update={"first_step_at": first})


def first_step(job: Job, at: datetime) -> dict[str, Any]:
    """The job's updates when a step report comes at ``at``: the current attempt's first step and the job's
    measured overhead with it; nothing when a report at least as early has come already."""
    current = job.current
    attempt = earlier_first_step(current, at) if current is not None else None
    if attempt is None:
        return {}
    attempts = [*job.attempts[:-1], attempt]
    return {"attempts": attempts, "restart_seconds": job_restart_s(attempts)}


def first_step_was(job: Job, at: datetime) -> bool:
    """Was the step report of time ``at`` the current attempt's first (so its overhead was just measured)?"""
    current = job.current
    return current is not None and current.first_step_at is not None and current.first_step_at >= at


def blend(previous: float | None, measured: float) -> float:
    """The cross-job estimate after one more measurement (an exponentially weighted mean)."""
    if previous is None:
        return measured
    return (1 - NEW_WEIGHT) * previous + NEW_WEIGHT * measured
