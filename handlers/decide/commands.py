"""What people ask of a job: start (:func:`new_job`), interrupt-test, ack, resume (the stop is
:mod:`handlers.decide.stop`). Each returns a Change, or one that only records why nothing changed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from handlers.change import Change
from handlers.decide import gangs, launching, steering
from handlers.decide.builders import WORDING, change, ignore, make, notify
from handlers.jobs import ChatRef, Job, JobState, Market
from handlers.messages import (
    InterruptTest,
    Message,
)
from handlers.notes import (
    Acked,
    CardRefresh,
    InterruptTestStarted,
    ResumeRequested,
)
from handlers.pagers import Tool, acknowledgements, resolutions
from handlers.spot import SpotView, managed
from handlers.transitions import next_state


def new_job(
    job_id: str,
    recipe: str,
    params: dict[str, Any],
    user: str,
    chat: ChatRef | None,
    now: datetime,
    total_steps: int | None = None,
    *,
    deadline: datetime | None = None,
    budget: float | None = None,
    spot_policy: str | None = None,
    spot: SpotView | None = None,
    team: str | None = None,
    nodes: int = 1,
    efa: bool = False,
) -> Change:
    """A job is created PENDING with its first attempt planned; the launch follows through the outbox. A job the
    spot policy steers (a deadline, a budget: :func:`handlers.spot.managed`) launches where the policy says, and
    its policy ticks start; any other job launches where ``spot-first`` says (:mod:`handlers.spot`)."""
    job = Job(
        id=job_id,
        recipe=recipe,
        params=params,
        requested_by=user,
        chat=chat,
        team=team,  # its owner, home channel and team decide who may act on it (handlers/permissions.py)
        total_steps=total_steps,  # known from the recipe before any report: `list` shows step 0/300, not 0/?
        deadline=deadline,
        budget=budget,
        spot_policy=spot_policy,
        restart_seconds=spot.restart_s if spot is not None else None,  # the recipe's, until the job measures its own
        nodes=nodes,  # more than one: a gang (handlers/decide/gangs.py)
        efa=efa,
        created_at=now,
        updated_at=now,
    )
    history: dict[str, Any] = {"event": "created", "by": user, "recipe": recipe, "params": params}
    if team is not None:
        history["team"] = team
    if nodes > 1:
        history.update(nodes=nodes, efa=efa)
    if spot is not None and managed(job):
        history.update(deadline=deadline.isoformat() if deadline else None, budget=budget, policy=spot_policy)
        ticking, tick = steering.next_tick(job, now, spot.period)
        return steering.steer(ticking, ticking, now, history, [tick], spot, "launch")
    return steering.steer(job, job, now, history, [], SpotView(), "launch")


def interrupt_test_command(job: Job, user: str, now: datetime, node: int | None = None) -> Change:
    """A real spot interruption of the job's instance (a gang's: of node ``node``, by default its last)."""
    instance = job.current.instance_id if job.current else None
    if job.nodes > 1:
        drilled = gangs.drilled(job, node)
        instance = drilled.instance_id if drilled is not None else None
    elif node is not None:
        return ignore(job, "interrupt-test", WORDING("ignored.not-a-gang", node=node), by=user)
    state = next_state(job.state, "interrupt-test")
    if state is None or instance is None:
        return ignore(job, "interrupt-test", WORDING("ignored.interrupt-test", state=job.state), by=user)
    outbox: list[Message] = [
        InterruptTest(job_id=job.id, instance_id=instance, requested_by=user),
        notify(job, "thread", InterruptTestStarted(by=user, instance=instance)),
    ]
    return change(job, state, now, {"event": "interrupt-test", "by": user}, outbox)


def ack_command(job: Job, user: str, now: datetime, via: Tool | None = None) -> Change:
    """``user`` owns the page now: in chat, or (``via``) in a paging tool; every other tool it is open in hears."""
    if next_state(job.state, "ack") is None:
        return ignore(job, "ack", WORDING("ignored.ack", state=job.state), by=user)
    if job.page is None:
        return ignore(job, "ack", WORDING("ignored.no-page"), by=user)
    if job.page.acked_by:
        return ignore(job, "ack", WORDING("ignored.already-acked", by=job.page.acked_by), by=user)
    page = job.page.model_copy(update={"acked_by": user, "acked_at": now, "acked_via": via})
    acked = job.model_copy(update={"page": page, "updated_at": now})
    history: dict[str, Any] = {"event": "ack", "by": user, "at": now.isoformat(), "after_steps": page.sent}
    if via is not None:
        history["via"] = via
    return make(
        acked,
        history,
        [
            notify(acked, "thread", Acked(by=user, at=now, via=via)),
            notify(acked, "card", CardRefresh(cause="acked")),
            *acknowledgements(acked, page, user, via),
        ],
    )


def resume_command(job: Job, user: str, on_demand: bool, now: datetime, spot: SpotView | None = None) -> Change:
    if next_state(job.state, "resume") is None:
        return ignore(job, "resume", WORDING("ignored.resume", state=job.state), by=user)
    market: Market = "on-demand" if on_demand else "spot"
    # A person chose to try again: the count of attempts without progress starts over.
    moved = job.model_copy(
        update={"state": JobState.RECOVERING, "failure": None, "page": None, "attempts_without_progress": 0}
    )
    history = {"event": "resume", "by": user, "market": market}
    notes: list[Message] = [notify(job, "thread", ResumeRequested(by=user, market=market)), *resolutions(job, job.page)]
    if spot is not None and managed(moved):
        moved, tick = steering.next_tick(moved, now, spot.period)  # the job's ticks ended with it: a new chain starts
        notes.append(tick)
        if not on_demand:  # a person who asks for on-demand gets it; otherwise the policy chooses
            return steering.steer(job, moved, now, history, notes, spot, "launch")
    elif not on_demand:  # spot-first chooses the zone (and on-demand, when no zone has spot)
        return steering.steer(job, moved, now, history, notes, SpotView(), "launch")
    return launching.relaunch(job, moved, market, now, history, notes)
