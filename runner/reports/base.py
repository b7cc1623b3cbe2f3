"""The report-target port: deliver one JSON report line somewhere the bot will read it."""

from __future__ import annotations

from typing import Protocol

from runner.errors import ReportRejected

__all__ = ["ReportRejected", "ReportTarget"]


class ReportTarget(Protocol):
    name: str

    async def deliver(self, line: str, report_type: str) -> None:
        """Send one report; raise to have it retried (a RunnerError saying why, from a target of ours), except
        ReportRejected: dropped, not retried."""
        ...

    async def close(self) -> None: ...
