"""How long the bot keeps trying: bounded relaunches without progress, and how long a stop may take.

On a real cloud a relaunch loop costs money without end: a trainer that cannot start, an instance that dies
before its first step or the same crash after every resume all look like "the instance went away, relaunch".
So an attempt that ends without progress counts, the next launch waits a growing pause, and after
``max_relaunches_without_progress`` such relaunches the job ends (RESUME_FAILED, which pages on-call; FAILED
when it never got past its first attempt). Any progress resets the count, as does a person's ``resume``.

Progress is measured against the job's best known step (reported or committed) when the attempt was planned:
an attempt that trained past it, or committed a checkpoint past it, made progress.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from handlers.jobs import CheckpointRef, Job


class Lifecycle(BaseModel):
    """The ``policy.lifecycle`` section of the config file; the defaults suit a real cloud."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Relaunches after attempts that made no progress, in a row, before the job ends (0: never relaunch one).
    max_relaunches_without_progress: int = Field(default=3, ge=0, le=100)
    # The pause before the first such relaunch; each further one waits twice as long, up to the cap.
    relaunch_pause_seconds: float = Field(default=30.0, ge=0, le=86_400)
    relaunch_pause_max_seconds: float = Field(default=900.0, ge=0, le=86_400)
    # How long a stop may wait for the runner's checkpoint before the instance is terminated anyway.
    stop_timeout_seconds: float = Field(default=900.0, gt=0, le=86_400)
    # Reconciliation (handlers/reconcile.py): how often the bot compares its jobs with the cloud's listing (and
    # once at start; 0: never), how long a launch may go unlisted, and how long a RUNNING job may go unheard of
    # before the channel hears of it.
    reconcile_seconds: float = Field(default=300.0, ge=0, le=86_400)
    reconcile_launch_grace_seconds: float = Field(default=300.0, ge=0, le=86_400)
    silent_after_seconds: float = Field(default=1800.0, gt=0, le=7 * 86_400)
    # A gang that lost a node whose replacement the cloud refused: how long the survivors wait (billing) before
    # the spot policy chooses between waiting another such stretch and moving the whole gang (handlers/spot/gang.py).
    gang_hold_seconds: float = Field(default=600.0, gt=0, le=86_400)

    @property
    def stop_timeout(self) -> timedelta:
        return timedelta(seconds=self.stop_timeout_seconds)

    @property
    def gang_hold(self) -> timedelta:
        return timedelta(seconds=self.gang_hold_seconds)


def furthest_step(job: Job, step: int) -> int:
    """The job's step once word comes that it got to ``step``: it never goes back (reports come out of order)."""
    return max(job.step or 0, step)


def restored(job: Job, step: int | None, uri: str | None, at: datetime) -> dict[str, Any]:
    """The job's updates when a runner restored the checkpoint of ``step`` (at ``uri``) and it is newer than the
    job's own: one committed while no bot heard of it (the bot was down, the instance trained on). The job's
    checkpoint and step move up to it, so the card never shows an older checkpoint under "resumed from step N"."""
    if step is None or not uri or (job.checkpoint is not None and job.checkpoint.step >= step):
        return {}
    return {"checkpoint": CheckpointRef(step=step, uri=uri, at=at), "step": furthest_step(job, step)}


def best_step(job: Job) -> int:
    """The furthest the job has got: the highest step reported or committed (0 before any)."""
    committed = job.checkpoint.step if job.checkpoint is not None else 0
    return furthest_step(job, committed)


def made_progress(job: Job) -> bool:
    """Did the current attempt get the job further than it was when the attempt was planned?

    Attempts stored before this was recorded (no ``from_step``) count as progress: nothing is held against them.
    """
    current = job.current
    if current is None or current.from_step is None:
        return True
    return best_step(job) > current.from_step


def without_progress(job: Job) -> int:
    """How many attempts in a row, the current one included, ended without progress."""
    return 0 if made_progress(job) else job.attempts_without_progress + 1


def relaunch_pause(lifecycle: Lifecycle, in_a_row: int) -> timedelta:
    """The pause before relaunching after ``in_a_row`` attempts without progress: none after progress, then
    ``relaunch_pause_seconds`` doubling each time, capped."""
    if in_a_row <= 0:
        return timedelta()
    seconds = lifecycle.relaunch_pause_seconds * 2 ** min(in_a_row - 1, 30)
    return timedelta(seconds=min(seconds, max(lifecycle.relaunch_pause_max_seconds, lifecycle.relaunch_pause_seconds)))


def gives_up(lifecycle: Lifecycle, in_a_row: int) -> bool:
    """True when one more relaunch would exceed the bound."""
    return in_a_row > lifecycle.max_relaunches_without_progress
