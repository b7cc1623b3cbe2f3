"""The spot authority on an early signal: move a job ahead of an interruption that may come, or stay.

A rebalance recommendation (AWS) or a scheduled system event (Alibaba: maintenance, retirement) says the instance
is at risk, not when it goes. The runner commits a fresh checkpoint either way (no step is lost if it goes). What
is left to weigh is the restart: staying, an interruption costs a whole one (boot, restore, warm-up) while the job
waits; moving now, make-before-break (the replacement launched beside the current instance, which trains until the
replacement's runner stands by), costs only the checkpoint and the restore, but it is paid whether or not the
interruption comes. So a move pays when the work left is long next to a restart: more than :data:`MOVE_PAYS`
restarts of it. A job that would end sooner stays and trains on.

Only a job the policy steers moves (the bot read the cloud's view for it), one node, on a cloud that launches a
job's next instance beside its current one, with no move under way; anything else only notes the signal.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from handlers.job_cost import job_cost
from handlers.jobs import Job, JobState, Market
from handlers.spot.situation import DEFAULT_RESTART, SpotView

MOVE_PAYS = 2.0  # restarts of work left above which a move ahead of the interruption pays

EarlyAction = Literal["ahead", "short", "stay"]


@dataclass(frozen=True, slots=True)
class EarlyMove:
    """What the authority does: ``ahead`` (launch the replacement now, on ``market`` in ``zone``; None: the cloud
    orders the zones), ``short`` (too little work left to pay for a move), ``stay`` (no move possible or wanted).
    ``left_s`` and ``restart_s``: the work left and the restart it weighed (``left_s`` None: not measured yet)."""

    action: EarlyAction
    left_s: float | None
    restart_s: float
    market: Market = "spot"
    zone: str | None = None


def early_move(job: Job, view: SpotView | None, now: datetime) -> EarlyMove:
    """The authority's answer to an early signal for ``job``'s current instance (see the module docstring)."""
    restart = job.restart_seconds or (view.restart_s if view is not None else None) or DEFAULT_RESTART.total_seconds()
    per_step = job_cost(job, now).seconds_per_step
    left = max(job.total_steps - (job.step or 0), 0) * per_step if job.total_steps and per_step is not None else None
    current = job.current
    movable = view is not None and view.launches_ahead and job.nodes == 1 and job.state is JobState.RUNNING
    if not movable or current is None or current.instance_id is None or job.standby or job.switch_to:
        return EarlyMove("stay", left, restart)
    if left is None or left <= MOVE_PAYS * restart:
        return EarlyMove("short", left, restart)
    assert view is not None
    elsewhere = next((zone for zone in view.zones if zone and zone != current.zone), None)
    return EarlyMove("ahead", left, restart, market=current.market, zone=elsewhere)
