"""A job's notice budget: would a commit driven by a spot notice finish before the cloud takes the machine?

Every checkpoint the runner commits comes with what it measured (:class:`handlers.reports.CheckpointSaved`): the
trainer's last observed save and this run's upload rate; every launch says the cloud's notice
(:class:`handlers.messages.Launched`: AWS 120 s, Alibaba 5 minutes, the local cloud its grace). On a notice the
runner has the trainer write a fresh checkpoint and uploads it, so the commit takes about
``save + bytes / rate``. The two are added, not overlapped: the upload keeps pace with the save only for a
writer that grows one file steadily, and a common one (the weights, then the optimizer state) makes them add up.

A job whose commit would not fit loses, on a notice, the work since its last periodic save, as an instance gone
without a notice does: the card says so, the thread is warned once, and the spot authority counts that work at
risk (:func:`steps_at_risk`, :mod:`handlers.spot.situation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handlers.jobs import Job
from handlers.notes import NoticeBudgetNote
from handlers.reports import CheckpointSaved


@dataclass(frozen=True, slots=True)
class NoticeBudget:
    commit_seconds: float  # a fresh save and its upload, as measured
    notice_seconds: float  # the cloud's notice to the reclaim

    @property
    def fits(self) -> bool:
        return self.commit_seconds <= self.notice_seconds


def notice_seconds(job: Job) -> float | None:
    """The cloud's notice, as the job's newest launch that said it."""
    return next((a.notice_seconds for a in reversed(job.attempts) if a.notice_seconds is not None), None)


def notice_budget(job: Job) -> NoticeBudget | None:
    """The job's budget, once its checkpoint's size and upload rate are measured and its cloud's notice known."""
    notice = notice_seconds(job)
    if notice is None or not job.checkpoint_bytes or job.upload_bytes_per_second is None:
        return None
    commit = (job.checkpoint_save_seconds or 0.0) + job.checkpoint_bytes / job.upload_bytes_per_second
    return NoticeBudget(commit_seconds=commit, notice_seconds=notice)


def steps_at_risk(job: Job) -> int:
    """The training steps a notice costs the job: none while its commit fits the notice (or is not measured yet);
    else those since its last periodic save, at worst its save interval."""
    budget = notice_budget(job)
    if budget is None or budget.fits:
        return 0
    return job.checkpoint_interval_steps or 0


def measured(job: Job, report: CheckpointSaved) -> tuple[dict[str, Any], NoticeBudgetNote | None]:
    """What a committed checkpoint changes of the job's budget (its size, the runner's rates, the interval between
    periodic saves), and the thread's warning the first time the commit would not fit the notice."""
    updates: dict[str, Any] = {"checkpoint_bytes": report.bytes}
    if report.save_seconds is not None:
        updates["checkpoint_save_seconds"] = report.save_seconds
    if report.upload_bytes_per_second is not None:
        updates["upload_bytes_per_second"] = report.upload_bytes_per_second
    if report.reason == "periodic":
        since = job.checkpoint.step if job.checkpoint is not None else 0
        if report.step > since:
            updates["checkpoint_interval_steps"] = report.step - since
    budget = notice_budget(job.model_copy(update=updates))
    if budget is None or budget.fits or job.notice_budget_warned:
        return updates, None
    updates["notice_budget_warned"] = True
    note = NoticeBudgetNote(
        commit_seconds=round(budget.commit_seconds, 1),
        notice_seconds=budget.notice_seconds,
        save_seconds=round(report.save_seconds or job.checkpoint_save_seconds or 0.0, 1),
        bytes=report.bytes,
        bytes_per_second=updates.get("upload_bytes_per_second", job.upload_bytes_per_second),
    )
    return updates, note
