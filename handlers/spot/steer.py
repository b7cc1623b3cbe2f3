"""What the decision means for the job: the next stretch's market and zone, whether the card keeps the plan and
whether the thread hears why, as data :mod:`handlers.decide` turns into effects (a launch, a timer, a note).

:func:`next_stretch` is asked at a launch, after an interruption or a capacity refusal and on a resume;
:func:`tick_market` on the policy's tick; :func:`refused` records a capacity refusal so the zone counts as without
spot for the cool-down. Pure: no I/O, no effects.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from handlers.jobs import Job, Market, PlanChoice
from handlers.spot.rules import Choice, Event
from handlers.spot.situation import SpotView, choose, managed


@dataclass(frozen=True, slots=True)
class Stretch:
    """Where the next stretch runs. ``market`` None: no launch now (``wait`` for the next tick, or ``stop``).
    ``plan``: kept on the job's card (a steered job's only). ``tell``: the thread hears the reason."""

    choice: Choice
    plan: PlanChoice | None
    market: Market | None
    zone: str | None
    tell: bool

    def history(self) -> dict[str, Any]:
        """What the job's history keeps of the decision (its English reason)."""
        return {"policy": self.choice.action, "policy_zone": self.choice.zone, "why": str(self.choice.reason)}


def next_stretch(before: Job, moved: Job, view: SpotView, now: datetime, event: Event) -> Stretch:
    """The decision for the attempt after ``before``'s (``moved``: the job now): a steered job's policy with the
    cloud's view, any other job's ``spot-first``. The thread hears why a steered job leaves spot or waits."""
    choice, plan = choose(moved, view, now, event)
    steered = managed(moved)
    previous = before.current.market if before.current is not None else "spot"
    changes = choice.action != previous or event != "launch"
    tell = steered and choice.action in ("on-demand", "wait") and changes
    return Stretch(choice, plan if steered else None, _market(choice), choice.zone or None, tell)


def tick_market(choice: Choice) -> Market | None:
    """The market a tick's choice asks for; None when it asks for none (wait, stop)."""
    return _market(choice)


def refused(job: Job, zone: str, now: datetime) -> Job:
    """The job with ``zone`` refused for capacity now: it counts as without spot for the cool-down."""
    return job.model_copy(update={"refused_zones": {**job.refused_zones, zone: now}})


def _market(choice: Choice) -> Market | None:
    if choice.action == "spot":
        return "spot"
    if choice.action == "on-demand":
        return "on-demand"
    return None
