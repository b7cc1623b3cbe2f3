"""What a job's chart marks besides its loss, read from the job record: where each attempt was interrupted and
where the next resumed, which steps ran on spot and which on on-demand, and what the job had cost by each point.

Pure: the job (its attempts: markets, prices, start and end, the step each reached and resumed from) and the
points (:mod:`bot.charts.series`) in, steps and dollars out. The job record already survives everything the bot
survives, so nothing here is stored twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from bot.charts.series import Point
from handlers.job_cost import billed
from handlers.jobs import Attempt, Job, Market


@dataclass(frozen=True, slots=True)
class Mark:
    """An interruption (the step its attempt had reached) or a resume (the step the next attempt started from)."""

    step: int
    at: datetime
    attempt: int


@dataclass(frozen=True, slots=True)
class Stretch:
    """The steps one attempt trained, on its market."""

    start: int
    end: int
    market: Market
    attempt: int


@dataclass(frozen=True, slots=True)
class Marks:
    interruptions: list[Mark]
    resumes: list[Mark]
    stretches: list[Stretch]
    costs: list[float]  # the job's cost so far at each point's time, in the points' order
    last_step: int  # the furthest step known (the x axis reaches at least this far)


def chart_marks(job: Job, points: Sequence[Point], now: datetime) -> Marks:
    """The marks of ``job``'s chart, at ``now`` (an attempt still running is billed up to then)."""
    started = [attempt for attempt in job.attempts if attempt.started_at is not None]
    reached = {attempt.number: _reached(attempt, points) for attempt in started}
    interruptions: list[Mark] = []
    resumes: list[Mark] = []
    stretches: list[Stretch] = []
    for index, attempt in enumerate(started):
        later = started[index + 1 :]
        start = attempt.resumed_from_step or 0
        end = reached[attempt.number]
        if later and attempt.ended_at is not None:  # ended, and another attempt followed: an interruption
            end = max(end if end is not None else start, start)
            interruptions.append(Mark(end, attempt.ended_at, attempt.number))
        elif end is None or attempt is started[-1]:
            end = max(job.step or 0, end or 0, start)
        if index > 0 and attempt.started_at is not None:
            resumes.append(Mark(start, attempt.started_at, attempt.number))
        stretches.append(Stretch(start, max(end, start), attempt.market, attempt.number))
    costs = [_paid(job.attempts, point.at, now) for point in points]
    last = max([job.step or 0, *(point.step for point in points), *(s.end for s in stretches)])
    return Marks(interruptions, resumes, stretches, costs, last)


def _reached(attempt: Attempt, points: Sequence[Point]) -> int | None:
    """The step the attempt got to: what its interruption report said, else its last point."""
    if attempt.reached_step is not None:
        return attempt.reached_step
    steps = [point.step for point in points if point.attempt == attempt.number]
    return max(steps) if steps else None


def _paid(attempts: Sequence[Attempt], at: datetime, now: datetime) -> float:
    """What every attempt launched by ``at`` had billed by then (at the attempt's price at launch)."""
    total = 0.0
    for attempt in attempts:
        if attempt.instance_id is None or attempt.launched_at >= at:
            continue
        end = min(attempt.ended_at or now, at)
        total += billed(attempt, end)
    return total
