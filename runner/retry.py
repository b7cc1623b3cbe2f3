"""Retry an async storage step with backoff until it works or its time is up."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from runner.storage.base import StorageError

log = logging.getLogger(__name__)
T = TypeVar("T")


async def with_retries(what: str, step: Callable[[], Awaitable[T]], give_up_after: float) -> T:
    """Run ``step``; on StorageError retry (0.5 s doubling to 10 s) until ``give_up_after`` seconds passed."""
    deadline = time.monotonic() + give_up_after
    backoff = 0.5
    while True:
        try:
            return await step()
        except StorageError as exc:
            if time.monotonic() + backoff > deadline:
                raise
            log.warning("%s failed, retrying in %.1fs: %s", what, backoff, exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
