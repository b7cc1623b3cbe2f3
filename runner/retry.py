"""Retry an async storage step with backoff until it works or its time is up; the time bounds each attempt too.

A check of the clock between attempts is not enough under a deadline: one attempt against a store that
answers 503 can spend half a minute in the SDK's own retries. So the attempt itself runs under the deadline
and is cancelled when it passes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from handlers.backoff import backoff
from runner.storage.base import ObjectMissing, StorageError

log = logging.getLogger(__name__)
T = TypeVar("T")

FIRST_BACKOFF = 0.5
MAX_BACKOFF = 10.0


async def with_retries(
    what: str,
    step: Callable[[], Awaitable[T]],
    give_up_after: float | None = None,
    *,
    until: float | None = None,
    max_backoff: float = MAX_BACKOFF,
) -> T:
    """Run ``step``; on StorageError retry (0.5 s doubling to ``max_backoff``) until ``give_up_after`` seconds
    from now or the ``time.monotonic()`` instant ``until``, whichever is first. An attempt still running then
    is cancelled and a StorageError (``… did not succeed in time``) raised. A missing object is not retried:
    waiting will not create it."""
    limits = (until, None if give_up_after is None else time.monotonic() + give_up_after)
    ends = [limit for limit in limits if limit is not None]
    if not ends:
        raise ValueError("with_retries needs give_up_after or until")
    deadline = min(ends)
    failures = 0
    last: StorageError | None = None
    while True:
        try:
            async with asyncio.timeout_at(deadline):  # the loop's clock is time.monotonic()
                return await step()
        except TimeoutError:
            message = f"{what} did not succeed in time"
            raise StorageError(f"{message}; last error: {last}" if last else message) from last
        except ObjectMissing:
            raise
        except StorageError as exc:
            last = exc
            failures += 1
            delay = backoff(failures, base=FIRST_BACKOFF, cap=max_backoff, jitter=0)
            if time.monotonic() + delay >= deadline:
                raise
            log.warning("%s failed, retrying in %.1fs: %s", what, delay, exc)
            await asyncio.sleep(delay)
