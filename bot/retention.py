"""Retention: a job that ended (STOPPED, SUCCEEDED, FAILED) is deleted ``policy.retention_days`` after it ended.

Why a sweep and not EXPIRE: Redis expires keys, not members of a set or fields of a hash, so a job's key could
expire while its id stayed in its state set, the creation and channel indexes and the instance map. The store
keeps an index of ended jobs scored by when they ended (written with the transition that ends them, removed by
one that resumes them), and :meth:`bot.store.JobStore.sweep` deletes a job with everything that names it in one
script. Every replica sweeps (at start, then hourly); a job deleted by one is skipped by the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from bot.store import JobStore

log = logging.getLogger(__name__)

SWEEP_SECONDS = 3600.0


class Retention:
    def __init__(
        self, store: JobStore, days: float, clock: Callable[[], datetime], every: float = SWEEP_SECONDS
    ) -> None:
        self.store = store
        self.keep = timedelta(days=days)
        self.clock = clock
        self.every = every

    async def sweep(self) -> int:
        """Delete every job that ended longer ago than the retention; how many were deleted."""
        cutoff = self.clock() - self.keep
        deleted = 0
        while True:
            batch = await self.store.sweep(cutoff)
            deleted += batch
            if batch == 0:
                return deleted

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep at once, then every ``every`` seconds, until ``stop``; a failed sweep is tried at the next one."""
        while not stop.is_set():
            try:
                deleted = await self.sweep()
                if deleted:
                    log.info("retention: deleted %d jobs that ended over %s ago", deleted, self.keep)
            except Exception as exc:
                log.warning("retention sweep failed (%s); trying again later", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every)
