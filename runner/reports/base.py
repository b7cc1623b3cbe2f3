"""The report-target port: deliver one JSON report line somewhere the bot will read it."""

from __future__ import annotations

from typing import Protocol


class PermanentDeliveryError(RuntimeError):
    """The target refused the report for good (e.g. HTTP 400/401): retrying cannot help."""


class ReportTarget(Protocol):
    name: str

    async def deliver(self, line: str, report_type: str) -> None:
        """Send one report; raise to have it retried (PermanentDeliveryError: dropped, not retried)."""
        ...

    async def close(self) -> None: ...
