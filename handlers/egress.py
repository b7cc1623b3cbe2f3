"""Checkpoint bytes a job moves between regions, and what they cost it (the card's ``egress $…``, ``costs``).

The bucket stays in the home region (the bucket's, the topic's, the bot's). A runner whose zone is in another region
restores from it and commits to it across regions, and the cloud bills those bytes at its inter-region price. So each
attempt carries what it pays per GB it moves (:func:`egress_price`, fixed at its launch as its hourly price is: zero
in the home region) and the bytes its runner said it moved (a restore's ``restored_bytes``, each commit's ``bytes``);
its egress is their product (:func:`attempt_egress`), part of the job's cost (:mod:`handlers.job_cost`).
"""

from __future__ import annotations

from handlers.jobs import Attempt, Job
from handlers.regions import region_of, transfer_cost
from handlers.reports import CheckpointSaved, RunnerReport, Started


def egress_price(zone: str | None, home_region: str | None, price_per_gb: float) -> float:
    """What an attempt in ``zone`` pays per GB it moves to or from the bucket of ``home_region``: ``price_per_gb``
    when its region is another, else nothing (no zone or no home region known: nothing either)."""
    if not zone or not home_region or region_of(zone) == home_region:
        return 0.0
    return max(price_per_gb, 0.0)


def moved_bytes(report: RunnerReport) -> int:
    """The checkpoint bytes a report says its runner moved: what its restore fetched, or what a commit stored."""
    if isinstance(report, Started):
        return report.restored_bytes
    if isinstance(report, CheckpointSaved):
        return max(report.bytes, 0)
    return 0


def with_moved_bytes(job: Job, report: RunnerReport) -> Job:
    """``job`` with the report's bytes added to its attempt's (an attempt launched ahead's too); unchanged when the
    report moved none or names no attempt of the job."""
    moved = moved_bytes(report)
    if moved <= 0:
        return job
    if job.attempt_numbered(report.attempt) is not None:
        attempts = [_plus(a, moved) if a.number == report.attempt else a for a in job.attempts]
        return job.model_copy(update={"attempts": attempts})
    if job.standby is not None and job.standby.number == report.attempt:
        return job.model_copy(update={"standby": _plus(job.standby, moved)})
    return job


def attempt_egress(attempt: Attempt) -> float:
    """Dollars the attempt's moved bytes cost at its price per GB (zero in the home region)."""
    return transfer_cost(attempt.moved_bytes, attempt.egress_price_per_gb)


def _plus(attempt: Attempt, moved: int) -> Attempt:
    return attempt.model_copy(update={"moved_bytes": attempt.moved_bytes + moved})
