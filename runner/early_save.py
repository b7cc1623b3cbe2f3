"""An early signal commits a fresh checkpoint at once, without stopping the trainer.

A rebalance recommendation (AWS) or a scheduled system event the bot passed on (Alibaba) says the instance is at
risk, not when it goes. The trainer keeps training; the runner asks it for a save at the next step boundary
(:mod:`runner.save_request`) and commits that checkpoint as soon as it is complete, so an interruption that follows
costs no step trained before the signal. A trainer that does not honour save requests, or whose save does not come
within ``early_save_seconds``, gets the newest existing checkpoint committed instead (what every trainer allows).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from runner.local_checkpoints import newest_complete
from runner.periodic_sync import PeriodicSync
from runner.save_request import read_number, save_path, write_save_request
from runner.trainer import TrainerProcess

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2


async def commit_fresh(
    trainer: TrainerProcess,
    sync: PeriodicSync,
    reached: Callable[[], int | None],
    wait_seconds: float,
    poll_seconds: float = POLL_SECONDS,
) -> int | None:
    """Ask ``trainer`` for a fresh checkpoint and commit it once complete; the newest existing one when the trainer
    does not honour save requests or its save does not come in time. ``reached``: the step the trainer reported
    last (the fresh checkpoint is one past it or later). Returns the step of the fresh checkpoint, None when it
    fell back."""
    output_dir = sync.output_dir
    existing = newest_complete(output_dir)
    floor = max(existing.step if existing is not None else 0, reached() or 0)
    if not trainer.watches_save_requests:
        log.info("early signal: the trainer does not honour save requests; committing the newest checkpoint")
        await sync.commit_newest("rebalance")
        return None
    stop_file = trainer.files.stop_file
    number = read_number(save_path(stop_file)) + 1
    try:
        write_save_request(stop_file, number)
    except OSError as exc:  # the trainer holds the name: what it has is what can be committed
        log.warning("cannot write the save request %s: %s", save_path(stop_file), exc)
        await sync.commit_newest("rebalance")
        return None
    log.info("early signal: asked the trainer for a fresh checkpoint past step %d (request %d)", floor, number)
    sync.sync.early_past = floor  # whichever look commits it first, it is reported as the early one
    until = time.monotonic() + wait_seconds
    while trainer.running and time.monotonic() < until:
        fresh = newest_complete(output_dir)
        if fresh is not None and fresh.step > floor:
            await sync.commit_newest("rebalance", fresh)
            return fresh.step
        await asyncio.sleep(poll_seconds)
    log.warning("early signal: no fresh checkpoint past step %d came; committing the newest one", floor)
    await sync.commit_newest("rebalance")
    return None
