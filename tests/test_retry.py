"""Retries under a deadline: the deadline bounds each attempt, not only the gaps between attempts."""

from __future__ import annotations

import asyncio
import time

import pytest

from runner.retry import with_retries
from runner.storage.base import ObjectMissing, StorageError


async def test_an_attempt_still_running_at_the_deadline_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def hangs() -> None:
        try:
            await asyncio.sleep(3600)  # an SDK call retrying 503s inside itself
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(StorageError, match=r"^committing did not succeed in time$"):
        await with_retries("committing", hangs, until=time.monotonic() + 0.3)
    assert cancelled.is_set()


async def test_failures_are_retried_until_one_works_and_the_last_error_is_kept() -> None:
    calls = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise StorageError("503 SlowDown")
        return "done"

    assert await with_retries("uploading", flaky, give_up_after=30) == "done"
    assert len(calls) == 3

    async def always() -> None:
        calls.append(1)
        raise StorageError("503 SlowDown")

    with pytest.raises(StorageError, match="503 SlowDown"):
        await with_retries("uploading", always, give_up_after=1.0)


async def test_a_missing_object_is_not_retried() -> None:
    calls = []

    async def missing() -> None:
        calls.append(1)
        raise ObjectMissing("s3://b/k does not exist")

    with pytest.raises(ObjectMissing):
        await with_retries("downloading", missing, give_up_after=30)
    assert calls == [1]
