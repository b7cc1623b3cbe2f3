"""Pick the target for a report URI (validated already by the spec). The SNS target (and with it the AWS SDK) is
loaded only for an ``sns:`` target."""

from __future__ import annotations

from runner.reports.base import ReportTarget
from runner.reports.file import FileTarget
from runner.reports.http import HttpTarget
from runner.reports.key import report_key


def open_target(target: str, key: str | None = None) -> ReportTarget:
    """``key``: the attempt's report key when the runner fetched it (AWS), else ``FINETUNE_REPORT_SECRET``."""
    if target.startswith("sns:"):
        from runner.reports.sns import SnsTarget

        return SnsTarget(target, report_key(key))
    if target.startswith(("http://", "https://")):
        return HttpTarget(target, report_key(key))
    if target.startswith("file:"):
        return FileTarget(target)
    raise ValueError(f"unsupported report target {target!r}")
