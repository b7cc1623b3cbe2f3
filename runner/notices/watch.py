"""The polling loop: ask the metadata service every interval, hand each new notice over exactly once.

An unreachable or erroring metadata service never stops training: the first failure of an outage is handed
to ``on_outage`` (the runner reports it once), the rest are only counted until the service answers again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from handlers.reports import InstanceNotice
from runner.notices.base import NoticeSource, NoticeUnavailable

log = logging.getLogger(__name__)

DEFAULT_POLL_SECONDS = 0.5


def poll_interval() -> float:
    """Seconds between polls, from ``FINETUNE_NOTICE_POLL_SECONDS``; never slower than once a second."""
    raw = os.environ.get("FINETUNE_NOTICE_POLL_SECONDS")
    value = float(raw) if raw else DEFAULT_POLL_SECONDS
    return min(max(value, 0.05), 1.0)


async def watch_notices(
    source: NoticeSource,
    notices: asyncio.Queue[InstanceNotice],
    on_outage: Callable[[str], None],
    interval: float | None = None,
) -> None:
    """Run until cancelled, putting each distinct notice on ``notices`` once."""
    period = interval if interval is not None else poll_interval()
    seen: set[InstanceNotice] = set()
    failures = 0
    while True:
        try:
            current = await source.poll()
        except NoticeUnavailable as exc:
            failures += 1
            if failures == 1:
                on_outage(f"{source.name} unreachable, training goes on: {exc}")
        else:
            if failures:
                log.info("%s answers again after %d failed polls", source.name, failures)
                failures = 0
            for notice in current:
                if notice not in seen:
                    seen.add(notice)
                    notices.put_nowait(notice)
        await asyncio.sleep(period)
