"""An attempt that ended on its own: relaunched, bounded (attempts without progress pause, then end the job), or
the job fails and on-call is paged; a switch of market under way goes on instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from handlers.change import Change
from handlers.decide import launching, steering
from handlers.decide.builders import change, chart_note, ignore, notify
from handlers.failures import Failure
from handlers.jobs import TERMINAL_STATES, Job, JobState, Market, Page
from handlers.lifecycle import Lifecycle, gives_up, relaunch_pause, without_progress
from handlers.messages import (
    Message,
    ReleaseGang,
)
from handlers.notes import (
    CardRefresh,
    FailedNote,
    Note,
    RelaunchPaused,
    Stopped,
)
from handlers.oncall import open_page
from handlers.spot import SpotView, managed
from handlers.transitions import Trigger, next_state


def failure(
    job: Job,
    trigger: Trigger,
    reason: Failure,
    now: datetime,
    outbox: Sequence[Message],
    limits: Lifecycle,
    spot: SpotView | None = None,
    **detail: Any,
) -> Change:
    """End the current attempt on ``reason``, kept as given (the job's ``failure``, the page's, the note's: the chat
    side words it); the attempt's end and the history keep its English."""
    state = next_state(job.state, trigger)
    if state is None:
        return ignore(job, trigger, f"the job is {job.state}")
    release: list[Message] = [*launching.releases(job)]
    history = {"event": trigger, "reason": reason.english, **detail}
    if state is JobState.STOPPED and job.switch_to is not None:
        # A runner failed while the policy's switch was stopping it: the job goes on, on the other market, from
        # what was committed (an attempt there that fails too is paged as any other). A gang's every node goes
        # with it (the failed node's part of the stop's checkpoint never comes, so the others' cannot count).
        return steering.switched(job, launching.end_attempt(job, now, reason.english), now, history, release)
    if job.nodes > 1 and state in TERMINAL_STATES:  # a gang that ends gives up its placement group too
        release.append(ReleaseGang(job_id=job.id))
    ended = launching.end_attempt(job, now, reason.english).model_copy(update={"failure": reason})
    if state is JobState.RECOVERING:  # the runner died during an interruption: relaunch
        market = job.current.market if job.current else "spot"
        moved = ended.model_copy(update={"state": state})
        return again(job, moved, market, now, history, release, [], limits, reason, spot)
    if state is JobState.RESUME_FAILED:  # page on-call: the first step goes out at once, the ladder follows
        page = Page(attempt=job.attempt, opened_at=now, reason=reason, detail=detail)
        paged = ended.model_copy(update={"page": page})
        first = open_page(paged, now)
        card = notify(paged, "card", CardRefresh(cause="resume-failed"))
        return change(paged, state, now, history, [*release, *outbox, first, card])
    told: Note
    if state is JobState.STOPPED:
        told = Stopped(step=job.checkpoint.step if job.checkpoint is not None else None)
    else:
        told = FailedNote(reason=reason, log_tail=detail.get("log_tail") or [], exit_code=detail.get("exit_code"))
    chart = [chart_note(ended, "failed")] if state is JobState.FAILED else []
    return change(ended, state, now, history, [*release, *outbox, notify(ended, "thread", told), *chart])


def again(
    before: Job,
    moved: Job,
    market: Market,
    now: datetime,
    history: dict[str, Any],
    release: Sequence[Message],
    notes: Sequence[Message],
    limits: Lifecycle,
    why: Failure,
    spot: SpotView | None = None,
    *,
    counts: bool = False,
    first_at_once: bool = False,
) -> Change:
    """Relaunch after the current attempt of ``before`` ended on its own (``moved`` is the job after it), bounded:
    an attempt without progress makes the next launch wait, and too many in a row end the job instead. A job the
    spot policy steers relaunches where the policy says (or waits, or stops for its budget); any other job where
    ``spot-first`` says (the zone, or on-demand once no zone has spot; a job on on-demand stays there). ``counts``:
    the attempt counts towards the bound whatever progress it made (it ended hung: a hang that comes back after
    every resume must not relaunch for ever). ``first_at_once``: the cloud took the attempt before it could train
    (a spot warning before its runner started), so the first such relaunch in a row does not wait; it still counts
    towards the bound."""
    if before.standby is not None:  # the next attempt was launched ahead already: it goes on from what was committed
        return steering.hand_over(moved, before.standby, now, history, [*release, *notes])
    in_a_row = before.attempts_without_progress + 1 if counts else without_progress(before)
    if gives_up(limits, in_a_row):
        reason = Failure.of("no-progress", count=in_a_row, last=why)
        trigger: Trigger = "no-progress" if before.attempt > 1 else "no-progress-first"
        counted = before.model_copy(update={"attempts_without_progress": in_a_row})
        detail = {"attempts_without_progress": in_a_row, "after": history.get("event")}
        # The notes said "relaunching"; the failure's own message (or page) says what happens instead.
        return failure(counted, trigger, reason, now, [], limits, None, **detail)
    pause = relaunch_pause(limits, in_a_row - 1 if first_at_once else in_a_row)
    counted = moved.model_copy(update={"attempts_without_progress": in_a_row})
    if pause:
        paused = RelaunchPaused(
            attempt=before.attempt,
            count=in_a_row,
            limit=limits.max_relaunches_without_progress,
            seconds=pause.total_seconds(),
        )
        notes = [*notes, notify(counted, "thread", paused)]
        history = {**history, "without_progress": in_a_row, "pause_seconds": pause.total_seconds()}
    if spot is not None and managed(counted):
        return steering.steer(before, counted, now, history, [*release, *notes], spot, "interrupted", delay=pause)
    view = SpotView()
    return steering.steer(
        before, counted, now, {**history, "market": market}, [*release, *notes], view, "interrupted", delay=pause
    )
