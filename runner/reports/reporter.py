"""Fan every report out to every target, in the background, with retries.

Each target has its own queue and worker, so a slow or dead target (SNS throttling, the bot restarting)
delays neither the other targets nor training: ``emit`` never waits. On shutdown the queues get a bounded
time to drain; what is still undelivered then is logged, never allowed to hold the instance.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from handlers.backoff import backoff
from handlers.reports import RunnerReport, dump_report
from runner.reports.base import ReportRejected, ReportTarget

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 30.0


class Reporter:
    def __init__(self, targets: Sequence[ReportTarget], first_backoff: float = 0.5) -> None:
        self.targets = list(targets)
        self.first_backoff = first_backoff
        self._queues: list[asyncio.Queue[tuple[str, str]]] = [asyncio.Queue() for _ in self.targets]
        self._workers: list[asyncio.Task[None]] = []
        self.delivered = 0

    def start(self) -> None:
        self._workers = [
            asyncio.create_task(self._deliver_forever(target, queue), name=f"report:{target.name}")
            for target, queue in zip(self.targets, self._queues, strict=True)
        ]

    def emit(self, report: RunnerReport) -> None:
        """Queue ``report`` for every target; returns at once."""
        line = dump_report(report)
        log.info("report %s", line)
        for queue in self._queues:
            queue.put_nowait((line, report.type))

    async def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every queued report to be delivered (or dropped as refused)."""
        try:
            await asyncio.wait_for(asyncio.gather(*(queue.join() for queue in self._queues)), timeout)
            return True
        except TimeoutError:
            left = sum(queue.qsize() for queue in self._queues)
            log.error("%d report(s) still undelivered after %.0fs", left, timeout)
            return False

    async def aclose(self, timeout: float = 15.0) -> None:
        """Give the queues ``timeout`` seconds to drain, then stop the workers and close the targets."""
        await self.drain(timeout)
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        for target in self.targets:
            try:
                await target.close()
            except Exception:  # closing must not turn a finished job into a crash
                log.exception("closing report target %s", target.name)

    async def _deliver_forever(self, target: ReportTarget, queue: asyncio.Queue[tuple[str, str]]) -> None:
        while True:
            line, report_type = await queue.get()
            try:
                await self._deliver_with_retry(target, line, report_type)
            finally:
                queue.task_done()

    async def _deliver_with_retry(self, target: ReportTarget, line: str, report_type: str) -> None:
        failures = 0
        while True:
            try:
                await target.deliver(line, report_type)
                self.delivered += 1
                if failures:
                    log.info("report target %s delivered after %d retries", target.name, failures)
                return
            except ReportRejected as exc:
                log.error("report dropped by %s: %s", target.name, exc)
                return
            except Exception as exc:
                failures += 1
                if failures == 1:
                    log.warning("report target %s failing, will retry: %r", target.name, exc)
                await asyncio.sleep(backoff(failures, base=self.first_backoff, cap=MAX_BACKOFF_SECONDS))
