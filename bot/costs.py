"""The costs report read from the store: the one path ``/finetune costs`` and ``GET /costs`` share."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from bot.store import JobStore
from handlers.cost_report import CostReport, cost_report, window_start


async def read_costs(store: JobStore, window: str, end: datetime, teams: Iterable[str] | None) -> CostReport:
    """The report of ``window`` ending at ``end``, over the jobs the store finds active in it (not every job)."""
    jobs = await store.active_since(window_start(window, end))
    return cost_report(jobs, window, end, teams)
