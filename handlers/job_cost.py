"""What a job cost, against what its *useful* work would have cost on one on-demand instance.

- paid: Σ over attempts of price × billed time (launch to end); a price that changed during an attempt is
  billed piece by piece (``price_changes``), else the attempt's price at launch; plus the egress: checkpoint bytes
  an attempt outside the bucket's region restored or committed, at the inter-region price (:mod:`handlers.egress`);
- the on-demand counterfactual: the useful training time (steps done × the measured time per step) plus one
  start-up, at the on-demand price: what a single on-demand instance would have billed for the same result;
- savings = 1 − paid / counterfactual. Interrupted time, redone steps and extra start-ups are what spot cost on
  top, so they shrink the saving instead of inflating it; lost work, restarts and downtime are reported beside.
- a gang (``nodes`` N) pays every node's attempts, survivors' waiting included; its nodes train the same steps side
  by side, so a step's time is their training hours over N, and the counterfactual is N on-demand instances.

``finetune-bot simulate`` reports the same counterfactual (``on_demand_cost``: the work plus one restart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from handlers.egress import attempt_egress
from handlers.jobs import Attempt, Job

# A price that took effect at a moment, per hour.
PricePoint = tuple[datetime, float]


@dataclass(frozen=True, slots=True)
class Cost:
    paid: float  # Σ price × billed time, every attempt, plus the egress
    on_demand: float  # (useful hours + one start-up) × the on-demand price; 0 when that price is unknown
    hours: float  # billed hours, every attempt
    useful_hours: float  # steps done × hours per step
    startup_hours: float  # the first attempt's launch to its runner's start (the one start-up counted)
    lost_hours: float  # work done and then redone (steps lost at interruptions × hours per step)
    restarts: int  # attempts after the first that got an instance
    downtime_hours: float  # from each lost instance to its replacement's start
    seconds_per_step: float | None  # measured over every attempt's training time; None before any step
    egress: float = 0.0  # checkpoint bytes moved between regions × the price per GB (part of ``paid``)

    @property
    def savings(self) -> float | None:
        """1 − paid / counterfactual; None when nothing useful is measured yet or no on-demand price is known."""
        if self.on_demand <= 0 or self.useful_hours <= 0:
            return None
        return 1 - self.paid / self.on_demand


def job_cost(job: Job, now: datetime, price_changes: Mapping[int, Sequence[PricePoint]] | None = None) -> Cost:
    """The job's cost so far (``now`` ends the attempt still running). ``price_changes`` maps an attempt number
    to the spot prices that took effect during it, when the cloud reported any."""
    launched = [attempt for attempt in job.attempts if attempt.instance_id is not None]
    # An instance launched ahead of a switch of market bills while it waits for its hand-over.
    ahead = [job.standby] if job.standby is not None and job.standby.instance_id is not None else []
    paid = hours = training = egress = 0.0
    for attempt in [*launched, *ahead]:
        end = attempt.ended_at or now
        hours += _span(attempt.launched_at, end) / 3600
        paid += billed(attempt, end, (price_changes or {}).get(attempt.number, ()))
        egress += attempt_egress(attempt)
        if attempt.started_at is not None:
            training += _span(attempt.started_at, end)
    first = launched[0] if launched else None
    begun_at = (first.resumed_from_step or 0) if first else 0
    steps_done = max((job.step or 0) - begun_at, 0)
    steps_trained = steps_done + job.steps_lost
    width = max(job.nodes, 1)  # a gang's nodes train the same steps side by side: their hours are one step's
    per_step = training / width / steps_trained if steps_trained > 0 and training > 0 else None
    startup = _span(first.launched_at, first.started_at) if first and first.started_at else 0.0
    useful = steps_done * per_step if per_step is not None else 0.0
    price = _on_demand_price(launched)
    return Cost(
        paid=paid + egress,
        on_demand=(useful + startup) / 3600 * price * width if price is not None else 0.0,
        hours=hours,
        useful_hours=useful / 3600,
        startup_hours=startup / 3600,
        lost_hours=job.steps_lost * per_step / 3600 if per_step is not None else 0.0,
        restarts=max(len(launched) - width, 0),  # a gang launches its nodes at once: none of them is a restart
        downtime_hours=job.downtime_seconds / 3600,
        seconds_per_step=per_step,
        egress=egress,
    )


def billed(attempt: Attempt, end: datetime, changes: Sequence[PricePoint] = ()) -> float:
    """Price × time of one attempt from its launch to ``end``, each price for the stretch it was in effect."""
    price = attempt.price_per_hour or 0.0
    at = attempt.launched_at
    total = 0.0
    for since, new_price in sorted(changes):
        if since >= end:
            break
        if since > at:
            total += _span(at, since) / 3600 * price
            at = since
        price = new_price
    return total + _span(at, end) / 3600 * price


def _on_demand_price(attempts: Sequence[Attempt]) -> float | None:
    """The newest known on-demand price (an on-demand attempt's own price counts)."""
    for attempt in reversed(attempts):
        if attempt.on_demand_price_per_hour:
            return attempt.on_demand_price_per_hour
        if attempt.market == "on-demand" and attempt.price_per_hour:
            return attempt.price_per_hour
    return None


def _span(start: datetime, end: datetime) -> float:
    return max((end - start).total_seconds(), 0.0)
