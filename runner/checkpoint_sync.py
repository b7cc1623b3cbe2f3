"""Which local checkpoints go to the store, and when: the newest complete one, and the one being written.

While training, every look at the output directory (``scan``) starts an upload for the newest complete
checkpoint not yet committed and for the one the trainer is writing now, so its files go up as they land
(:mod:`runner.upload`); at most ``max_in_flight`` at once, older steps first on the wire (the step is the
upload's priority). A commit cancels older uploads it supersedes, is reported, and prunes the store.
Storage trouble is reported once per outage and retried with backoff; it never stops training.

Uploads are tasks of their own, not of whoever asked for them: a notice arriving mid-upload takes over the
uploads in flight (``notice_mode``) instead of cancelling them. From then on the notice path decides what is
dropped (``give_up``); ``situation`` tells it what is complete, in flight and on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

from handlers.backoff import backoff
from runner.checkpoints import CheckpointStore, CheckpointUpload, Committed
from runner.commit_plan import Candidate
from runner.local_checkpoints import LocalCheckpoint, complete_checkpoints, list_checkpoint_dirs
from runner.manifest import checkpoint_files
from runner.storage.base import StorageError
from runner.upload import FileChanged

log = logging.getLogger(__name__)

SyncReason = Literal["periodic", "rebalance", "notice"]
MAX_BACKOFF_SECONDS = 10.0


@dataclass(slots=True)
class _Flight:
    upload: CheckpointUpload
    task: asyncio.Task[Committed]


class CheckpointSync:
    def __init__(
        self,
        checkpoints: CheckpointStore,
        output_dir: Path,
        *,
        keep: int,
        on_commit: Callable[[Committed, SyncReason], None],
        on_trouble: Callable[[str], None],
        poll_seconds: float = 0.2,
        settle_seconds: float = 1.0,
        max_in_flight: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.checkpoints = checkpoints
        self.output_dir = output_dir
        self.keep = keep
        self.on_commit = on_commit
        self.on_trouble = on_trouble
        self.poll_seconds = poll_seconds
        self.settle_seconds = settle_seconds
        self.max_in_flight = max_in_flight
        self.clock = clock
        self.committed: Committed | None = None
        self.flights: dict[int, _Flight] = {}
        self.given_up: dict[int, str] = {}  # notice mode: steps dropped on purpose, never started again
        self.failures: dict[int, BaseException] = {}  # the last failure of each step's upload
        self.reason: SyncReason = "periodic"  # what the next commit is reported as
        self.early_past: int | None = None  # an early signal's fresh save: the first commit past this step is its
        self.notice_mode = False
        self.save_seconds: float | None = None  # how long the trainer's last observed save took
        self.checkpoint_bytes: int | None = None  # how big its last complete checkpoint was
        self._first_seen: dict[int, float] = {}
        self._complete_at: dict[int, float] = {}
        self._seen_incomplete: set[int] = set()
        self._failing = False
        self._failed_in_a_row = 0  # upload failures since the last commit: how long the next retry waits
        self._retry_at = 0.0
        self._prune: asyncio.Task[None] | None = None

    @property
    def committed_step(self) -> int | None:
        return self.committed.step if self.committed else None

    def scan(self, exited_cleanly: bool = False) -> None:
        """Look at the output directory once: mark what is complete, start what should be going up."""
        now = self.clock()
        dirs = list_checkpoint_dirs(self.output_dir)
        present = {checkpoint.step for checkpoint in dirs}
        complete = {checkpoint.step for checkpoint in complete_checkpoints(self.output_dir, exited_cleanly)}
        for checkpoint in dirs:
            self._first_seen.setdefault(checkpoint.step, now)
            if checkpoint.step not in complete:
                self._seen_incomplete.add(checkpoint.step)
        for step, flight in list(self.flights.items()):
            if step not in present:
                self._drop(step, "its directory is gone from the disk")
            elif step in complete:
                flight.upload.mark_complete()
        floor = self.committed_step
        newer = [checkpoint for checkpoint in dirs if floor is None or checkpoint.step > floor]
        done = [checkpoint for checkpoint in newer if checkpoint.step in complete]
        writing = [checkpoint for checkpoint in newer if checkpoint.step not in complete]
        targets = [done[-1]] if done else []
        if writing and (not done or writing[-1].step > done[-1].step):
            targets.append(writing[-1])
        for checkpoint in targets:
            if checkpoint.step in self.flights or checkpoint.step in self.given_up or now < self._retry_at:
                continue
            if not self.notice_mode and len(self.flights) >= self.max_in_flight:
                break
            self._start(checkpoint, checkpoint.step in complete)

    def enter_notice_mode(self) -> None:
        """The notice path takes over: keep what is in flight, stop pruning, retry quickly."""
        self.notice_mode = True
        self.reason = "notice"
        self._retry_at = 0.0
        self._failed_in_a_row = 0
        if self._prune is not None:
            self._prune.cancel()

    def complete_time(self, step: int) -> float | None:
        """When ``step``'s directory was seen complete (``time.monotonic()``), if it was."""
        flight = self.flights.get(step)
        if flight is not None and flight.upload.complete_at is not None:
            return flight.upload.complete_at
        return self._complete_at.get(step)

    def give_up(self, step: int, reason: str) -> None:
        """Drop ``step`` for good (the notice path decided it cannot or need not commit)."""
        self.given_up.setdefault(step, reason)
        self._drop(step, reason)

    def situation(self) -> list[Candidate]:
        """Every local checkpoint newer than the last commit and not given up: complete or not, how far up."""
        floor = self.committed_step
        complete = {checkpoint.step for checkpoint in complete_checkpoints(self.output_dir)}
        found = []
        for checkpoint in list_checkpoint_dirs(self.output_dir):
            if (floor is not None and checkpoint.step <= floor) or checkpoint.step in self.given_up:
                continue
            flight = self.flights.get(checkpoint.step)
            is_complete = checkpoint.step in complete or (flight is not None and flight.upload.complete.is_set())
            on_disk = max(flight.upload.bytes_on_disk if flight else 0, _dir_bytes(checkpoint.path))
            uploaded = flight.upload.bytes_uploaded if flight else 0
            found.append(Candidate(checkpoint.step, is_complete, on_disk, min(uploaded, on_disk), flight is not None))
        return found

    async def commit_newest(self, reason: SyncReason, newest: LocalCheckpoint | None = None) -> None:
        """Commit the newest complete checkpoint now (a rebalance, a crashed trainer) and wait for it."""
        self.reason = reason
        checkpoint = newest
        if checkpoint is None:
            done = complete_checkpoints(self.output_dir)
            checkpoint = done[-1] if done else None
        if checkpoint is None or (self.committed_step is not None and checkpoint.step <= self.committed_step):
            return
        flight = self.flights.get(checkpoint.step)
        if flight is None:
            flight = self._start(checkpoint, complete=True)
        flight.upload.mark_complete()
        # Shielded: whoever waits here may be cancelled (a notice); the upload goes on regardless.
        with contextlib.suppress(Exception):
            await asyncio.shield(flight.task)

    async def wait_any(self, timeout: float) -> None:
        """Until an upload finishes or ``timeout`` seconds pass."""
        tasks = [flight.task for flight in self.flights.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(timeout)

    async def aclose(self) -> None:
        """Cancel every upload still in flight (the attempt is over) and wait for them to go."""
        tasks: list[asyncio.Task[Any]] = [flight.task for flight in self.flights.values()]
        if self._prune is not None:
            tasks.append(self._prune)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self.flights.clear()

    # -- inside -------------------------------------------------------------------------------------------

    def _start(self, checkpoint: LocalCheckpoint, complete: bool) -> _Flight:
        upload = self.checkpoints.start_upload(
            checkpoint.path, checkpoint.step, poll_seconds=self.poll_seconds, settle_seconds=self.settle_seconds
        )
        if complete:
            upload.mark_complete()
        task = asyncio.create_task(upload.run(), name=f"commit:checkpoint-{checkpoint.step}")
        flight = _Flight(upload, task)
        self.flights[checkpoint.step] = flight
        task.add_done_callback(partial(self._finished, checkpoint.step, flight))
        return flight

    def _drop(self, step: int, reason: str) -> None:
        flight = self.flights.pop(step, None)
        if flight is not None and not flight.task.done():
            log.info("stopping the upload of checkpoint-%d: %s", step, reason)
            flight.task.cancel()

    def _finished(self, step: int, flight: _Flight, task: asyncio.Task[Committed]) -> None:
        if self.flights.get(step) is flight:
            del self.flights[step]
        if flight.upload.complete_at is not None:
            self._complete_at.setdefault(step, flight.upload.complete_at)
        if task.cancelled():
            return
        failure = task.exception()
        if failure is None:
            self._committed(task.result(), flight)
            return
        self.failures[step] = failure
        self._failed_in_a_row += 1
        cap = 2.0 if self.notice_mode else MAX_BACKOFF_SECONDS
        self._retry_at = self.clock() + backoff(self._failed_in_a_row, base=0.5, cap=cap, jitter=0)
        if isinstance(failure, StorageError):
            log.warning("upload of checkpoint-%d failed, will retry: %s", step, failure)
            if not self._failing and not self.notice_mode:
                self._failing = True
                self.on_trouble(f"checkpoint sync failing, will retry: {failure}")
        elif isinstance(failure, FileNotFoundError | FileChanged):
            log.warning("checkpoint-%d changed under the upload (%s); will retry", step, failure)
        else:
            log.error("upload of checkpoint-%d failed unexpectedly", step, exc_info=failure)

    def _committed(self, committed: Committed, flight: _Flight) -> None:
        self._failing = False
        self._failed_in_a_row = 0
        self._retry_at = 0.0
        self.checkpoint_bytes = committed.bytes
        first_seen = self._first_seen.get(committed.step)
        if committed.step in self._seen_incomplete and first_seen is not None and flight.upload.complete_at:
            # From first sight of the directory to its completion: the save, less up to one look's delay.
            self.save_seconds = flight.upload.complete_at - first_seen
        if self.committed is not None and committed.step <= self.committed.step:
            return
        rate = self.checkpoints.meter.rate
        committed = replace(committed, save_seconds=self.save_seconds, upload_bytes_per_second=rate)
        self.committed = committed
        early = self.early_past is not None and committed.step > self.early_past and not self.notice_mode
        self.on_commit(committed, "rebalance" if early else self.reason)
        if early:
            self.early_past = None
        if not self.notice_mode:
            self.reason = "periodic"
        for older in [step for step in self.flights if step < committed.step]:
            self._drop(older, f"superseded by checkpoint-{committed.step}")
        if not self.notice_mode and (self._prune is None or self._prune.done()):
            self._prune = asyncio.get_running_loop().create_task(self._prune_old())

    async def _prune_old(self) -> None:
        try:
            await self.checkpoints.prune(self.keep)
        except StorageError as exc:
            log.warning("pruning old checkpoints failed (will try after the next commit): %s", exc)


def _dir_bytes(path: Path) -> int:
    total = 0
    for file in checkpoint_files(path):
        with contextlib.suppress(OSError):
            total += os.stat(file).st_size
    return total
