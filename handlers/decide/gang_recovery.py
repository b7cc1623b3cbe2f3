"""A gang that lost one node: replace that node, or restart the whole gang, whichever the job's measured launch and
restore times say is sooner training again (:func:`handlers.spot.gang.replace_or_restart`).

Measured: each fresh node's launch (the provider's figure of it, where it gives one, plus the wait from its
instance up to its runner's start less its restore) and its restore (its ``started`` report). A whole gang's
launch (``Attempt.launched_with``) gives both figures replace-one and whole-gang need: its node 0, launched alone
first, is what one replacement takes; its slowest is what a whole gang waits for. Where the job has no such figure
yet, the defaults of :mod:`handlers.spot.gang` stand (a cloud's: replace-one).

A whole-gang restart waits for every survivor to stand by with its part committed (so the gang restarts from the
step they hold), then releases them and launches every node again in their zone.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from typing import Any

from handlers.change import Change
from handlers.decide import launching
from handlers.jobs import Attempt, Job
from handlers.notes import SpotPolicyNote
from handlers.policy_reasons import WORDING
from handlers.spot.gang import (
    DEFAULT_LAUNCH_SECONDS,
    DEFAULT_RESTORE_SECONDS,
    GangRecovery,
    RecoveryTimes,
    replace_or_restart,
)


def launch_s(attempt: Attempt) -> float | None:
    """``attempt``'s launch: the provider's figure plus its instance-up to runner-started less its restore."""
    if attempt.started_at is None or attempt.handed_over_at is not None or attempt.started_at < attempt.launched_at:
        return None  # not started, launched ahead (its boot overlapped training), or clocks that disagree
    boot = (attempt.started_at - attempt.launched_at).total_seconds() - (attempt.restore_seconds or 0.0)
    return (attempt.launch_seconds or 0.0) + max(boot, 0.0)


def recovery_times(job: Job) -> RecoveryTimes:
    """The job's measured figures where it has them (a whole gang's launch), else defaults."""
    alone: list[float] = []
    slowest: list[float] = []
    restores: list[float] = []
    whole = sorted((a for a in job.attempts if a.launched_with == job.nodes), key=lambda a: a.number)
    for start in range(0, len(whole) - job.nodes + 1, job.nodes):  # a whole gang's numbers run on, node 0's first
        nodes = whole[start : start + job.nodes]
        launches = [launch_s(a) for a in nodes]
        if any(value is None for value in launches):
            continue  # not every node of it started
        measured = [value for value in launches if value is not None]
        alone.append(measured[0])
        slowest.append(max(measured))
        restores.extend(a.restore_seconds for a in nodes if a.restore_seconds is not None)
    if not alone:
        return RecoveryTimes(job.nodes, DEFAULT_LAUNCH_SECONDS, DEFAULT_RESTORE_SECONDS)
    restore = statistics.median(restores) if restores else DEFAULT_RESTORE_SECONDS
    return RecoveryTimes(
        job.nodes,
        statistics.median(alone),
        restore,
        gang_launch_seconds=statistics.median(slowest),
        measured=True,
    )


def choose(job: Job) -> tuple[GangRecovery, RecoveryTimes]:
    times = recovery_times(job)
    return replace_or_restart(times), times


def note(job: Job, choice: GangRecovery, times: RecoveryTimes) -> SpotPolicyNote:
    """The thread's word on the choice: which, and the two estimates it weighed."""
    values: dict[str, str | float] = {
        "replace_s": round(times.replace_one()),
        "whole_s": round(times.whole_gang()),
        "launch_s": round(times.launch_seconds),
        "restore_s": round(times.restore_seconds, 1),
        "nodes": job.nodes,
    }
    key = f"gang.{choice}" + ("" if times.measured else ".default")
    return SpotPolicyNote(reason=str(WORDING(key, **values).key), values=values)


def history(choice: GangRecovery, times: RecoveryTimes) -> dict[str, Any]:
    return {
        "recovery": choice,
        "replace_s": round(times.replace_one(), 1),
        "whole_s": round(times.whole_gang(), 1),
        "measured": times.measured,
    }


def restart_when_stood_by(job: Job, now: datetime) -> Change | None:
    """The whole gang again, once every survivor of a gang chosen for a whole-gang restart stands by (its part of
    the step it holds committed); None while one has not, or where no such restart is due."""
    if not job.restart_whole:
        return None
    survivors = launching.live(job)
    if any(a.standby_step is None for a in survivors):
        return None
    zone = next((a.zone for a in survivors if a.zone), None)
    market = survivors[0].market if survivors else "spot"
    release = launching.releases(job)
    ended = launching.end_attempt(job, now, "restarted with the whole gang")
    moved = ended.model_copy(update={"restart_whole": False})
    return launching.relaunch(job, moved, market, now, {"event": "gang-restart", "zone": zone}, release, zone=zone)
