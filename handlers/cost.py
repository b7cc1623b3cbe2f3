"""What a job cost on spot against what the same hours would have cost on demand."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from handlers.jobs import Job


@dataclass(frozen=True, slots=True)
class Cost:
    paid: float
    on_demand: float
    hours: float

    @property
    def savings(self) -> float | None:
        """1 − paid / on-demand, or None when no on-demand price is known."""
        return 1 - self.paid / self.on_demand if self.on_demand > 0 else None


def job_cost(job: Job, now: datetime) -> Cost:
    """Price × run time of every attempt (launch to end), the interrupted ones included."""
    paid = on_demand = hours = 0.0
    for attempt in job.attempts:
        if attempt.instance_id is None:
            continue
        end = attempt.ended_at or now
        span = max((end - attempt.launched_at).total_seconds(), 0.0) / 3600
        hours += span
        paid += span * (attempt.price_per_hour or 0.0)
        on_demand += span * (attempt.on_demand_price_per_hour or attempt.price_per_hour or 0.0)
    return Cost(paid=paid, on_demand=on_demand, hours=hours)
