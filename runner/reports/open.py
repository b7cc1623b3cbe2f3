"""Pick the target for a report URI (validated already by the spec)."""

from __future__ import annotations

from runner.reports.base import ReportTarget
from runner.reports.file import FileTarget
from runner.reports.http import HttpTarget
from runner.reports.sns import SnsTarget


def open_target(target: str) -> ReportTarget:
    if target.startswith("sns:"):
        return SnsTarget(target)
    if target.startswith(("http://", "https://")):
        return HttpTarget(target)
    if target.startswith("file:"):
        return FileTarget(target)
    raise ValueError(f"unsupported report target {target!r}")
