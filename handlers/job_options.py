"""Options of the job itself, given with ``start`` beside the recipe's overrides: ``deadline=36h budget=120``,
``nodes=2 efa=true``.

They steer where the job runs (the spot policy, :mod:`handlers.spot.rules`), not what it trains, so they are
not recipe parameters: :func:`split_overrides` takes them out of a ``start`` command's ``key=value`` words
before the recipe checks the rest, and a recipe may not declare a parameter by these names. A deadline is a
duration from the start (``36h``, ``90m``, ``2d``, ``1d12h``, ``1.5h``) or a moment with its time zone
(``2026-03-05T09:00Z``); a budget is an amount in the cloud account's currency (``120``, ``99.50``). ``nodes``
(2 to 64) makes the job a gang of that many instances training as one world (:mod:`handlers.gang`), up to
the recipe's ``max_nodes`` (a cap an admin lifts per team: :mod:`handlers.caps`); ``efa=true`` asks for EFA
interfaces on a gang's nodes where the instance type has them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict

from handlers.errors import ReasonError
from handlers.reasons import Wording

JOB_OPTIONS = ("deadline", "budget", "nodes", "efa")
MAX_NODES = 64
MIN_DEADLINE = timedelta(minutes=10)
MAX_DEADLINE = timedelta(days=90)
MAX_BUDGET = 10_000_000.0

_DURATION = re.compile(r"^(?:(\d{1,4}(?:\.\d{1,3})?)d)?(?:(\d{1,5}(?:\.\d{1,3})?)h)?(?:(\d{1,7}(?:\.\d{1,3})?)m)?$")
_AMOUNT = re.compile(r"^\d{1,9}(?:\.\d{1,2})?$")

WORDING = Wording(
    {
        "option.bad-deadline": (
            "deadline must be a duration like 36h, 90m or 1d12h, or a time with its zone like "
            "2026-03-05T09:00Z, not {raw!r}"
        ),
        "option.deadline-range": "deadline must be between 10 minutes and 90 days from now, not {raw!r}",
        "option.bad-budget": "budget must be an amount in the account's currency like 120 or 99.50, not {raw!r}",
        "option.budget-range": "budget must be more than 0 and at most {maximum:.0f}",
        "option.reserved": "{recipe} declares the parameter {name!r}, but {name} is a job option",
        "option.bad-nodes": "nodes must be a whole number from 1 to {maximum}, not {raw!r}",
        "option.bad-efa": "efa must be true or false, not {raw!r}",
        "option.efa-one-node": "efa=true is for a job of several nodes: give nodes=2 or more with it",
    }
)


class JobOptions(BaseModel):
    """What a job was started with: when it must be done by, and what it may cost at most (both optional)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    deadline: datetime | None = None
    budget: float | None = None
    nodes: int = 1  # more than 1: a gang of that many instances, one torch.distributed world
    efa: bool = False


def split_overrides(overrides: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the job options, the recipe's overrides) of a ``start`` command's ``key=value`` words."""
    options = {key: value for key, value in overrides.items() if key in JOB_OPTIONS}
    rest = {key: value for key, value in overrides.items() if key not in JOB_OPTIONS}
    return options, rest


def parse_job_options(raw: Mapping[str, str], now: datetime) -> JobOptions:
    """Typed options from their raw words (keys from :func:`split_overrides`); ReasonError (``option.*``) says what is
    wrong."""
    deadline = parse_deadline(raw["deadline"], now) if "deadline" in raw else None
    budget = parse_budget(raw["budget"]) if "budget" in raw else None
    nodes = parse_nodes(raw["nodes"]) if "nodes" in raw else 1
    efa = parse_efa(raw["efa"]) if "efa" in raw else False
    if efa and nodes < 2:
        raise ReasonError(WORDING("option.efa-one-node"))
    return JobOptions(deadline=deadline, budget=budget, nodes=nodes, efa=efa)


def parse_nodes(raw: str) -> int:
    """How many nodes train as one world: 1 (the default, no gang) to :data:`MAX_NODES`."""
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_NODES:
        raise ReasonError(WORDING("option.bad-nodes", raw=raw, maximum=MAX_NODES))
    return int(raw)


def parse_efa(raw: str) -> bool:
    if raw.lower() not in ("true", "false"):
        raise ReasonError(WORDING("option.bad-efa", raw=raw))
    return raw.lower() == "true"


def parse_deadline(raw: str, now: datetime) -> datetime:
    """The moment a deadline word names: ``now`` + a duration, or a time zone-aware ISO 8601 moment."""
    match = _DURATION.fullmatch(raw.lower())
    if match and any(match.groups()):
        days, hours, minutes = (float(part) if part else 0.0 for part in match.groups())
        span = timedelta(days=days, hours=hours, minutes=minutes)
        at = now + span
    else:
        try:
            at = datetime.fromisoformat(raw.replace("z", "Z"))
        except ValueError:
            raise ReasonError(WORDING("option.bad-deadline", raw=raw)) from None
        if at.tzinfo is None:
            raise ReasonError(WORDING("option.bad-deadline", raw=raw))
    if not MIN_DEADLINE <= at - now <= MAX_DEADLINE:
        raise ReasonError(WORDING("option.deadline-range", raw=raw))
    return at


def parse_budget(raw: str) -> float:
    if not _AMOUNT.fullmatch(raw):
        raise ReasonError(WORDING("option.bad-budget", raw=raw))
    amount = float(raw)
    if not 0 < amount <= MAX_BUDGET:
        raise ReasonError(WORDING("option.budget-range", maximum=MAX_BUDGET))
    return amount


def reserved_parameter(recipe: str, parameters: Mapping[str, object]) -> ReasonError | None:
    """The error for a recipe that declares a parameter named like a job option, or None."""
    for name in JOB_OPTIONS:
        if name in parameters:
            return ReasonError(WORDING("option.reserved", recipe=recipe, name=name))
    return None
