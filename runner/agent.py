"""The runner agent: restore, supervise the trainer, sync checkpoints, honour the spot notice, report.

One ``Runner`` runs one attempt of one job on one instance::

    restore newest valid checkpoint ─► start trainer ─┬─► trainer exits 0 ──► upload output, COMPLETED
                                                      ├─► trainer crashes ──► restart from last checkpoint
                                                      └─► notice ──► stop request, wait for save, commit, exit 75

While the trainer runs, complete checkpoints are committed in the background and a rebalance recommendation
commits the newest one early. Storage, metadata and reporting trouble is reported and retried; it never
stops training.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from handlers.events import (
    CheckpointSaved,
    Completed,
    Failed,
    Interrupted,
    Progress,
    RunnerWarning,
    Started,
)
from handlers.events import Notice as NoticeReport
from handlers.spec import JobSpec
from runner.checkpoints import CheckpointStore, Committed
from runner.local_checkpoints import LocalCheckpoint, list_checkpoint_dirs, newest_complete
from runner.notices.aliyun import AliyunMetadataSource
from runner.notices.aws import AwsImdsSource
from runner.notices.base import Notice, NoticeSource
from runner.notices.control import CONTROL_POLL_SECONDS, ControlObjectSource
from runner.notices.watch import watch_notices
from runner.progress import ProgressTail
from runner.release import release_capacity
from runner.reports.open import open_target
from runner.reports.reporter import Reporter
from runner.retry import with_retries
from runner.storage.base import ObjectStore, StorageError
from runner.storage.open import open_store
from runner.trainer import TrainerFiles, TrainerProcess, TrainerStartError, cannot_start

log = logging.getLogger(__name__)

SyncReason = Literal["periodic", "rebalance", "notice"]

# Exit codes (documented in the README): the bot and systemd units read them.
EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_BAD_SPEC = 2
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: this attempt ended early on purpose; the job goes on elsewhere


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    work_dir: Path
    stop_grace_seconds: float = 90.0  # a SIGTERM to the runner itself (systemctl stop) has no cloud deadline
    progress_seconds: float = 10.0  # at most one progress report per this many seconds
    sync_seconds: float = 1.0  # how often to look for a newly completed checkpoint
    storage_patience_seconds: float = 300.0  # how long start-up and completion keep retrying storage
    echo_trainer: bool = True
    control_seconds: float = CONTROL_POLL_SECONDS  # how often to look for a stop or drill from the bot

    @classmethod
    def from_env(cls, work_dir: Path) -> RunnerOptions:
        def number(name: str, default: float) -> float:
            raw = os.environ.get(name)
            return float(raw) if raw else default

        return cls(
            work_dir=work_dir,
            stop_grace_seconds=number("FINETUNE_STOP_GRACE_SECONDS", 90.0),
            progress_seconds=number("FINETUNE_PROGRESS_SECONDS", 10.0),
            sync_seconds=number("FINETUNE_SYNC_SECONDS", 1.0),
            storage_patience_seconds=number("FINETUNE_STORAGE_PATIENCE_SECONDS", 300.0),
            echo_trainer=os.environ.get("FINETUNE_TRAINER_ECHO", "1") != "0",
            control_seconds=number("FINETUNE_CONTROL_POLL_SECONDS", CONTROL_POLL_SECONDS),
        )


def notice_source_for(spec: JobSpec) -> NoticeSource | None:
    if spec.notice == "aws":
        return AwsImdsSource()
    if spec.notice == "aliyun":
        return AliyunMetadataSource()
    return None


class Runner:
    def __init__(
        self,
        spec: JobSpec,
        options: RunnerOptions,
        store: ObjectStore | None = None,
        notice_source: NoticeSource | None = None,
    ) -> None:
        self.spec = spec
        self.options = options
        self.store = store or open_store(spec.checkpoint_uri)
        self.checkpoints = CheckpointStore(self.store, spec.job_id, spec.attempt)
        self.notice_source = notice_source if notice_source is not None else notice_source_for(spec)
        self.reporter = Reporter([open_target(target) for target in spec.report])
        self.files = TrainerFiles.under(options.work_dir)
        self.output_dir = self.files.output_dir
        self.progress = ProgressTail(self.files.progress_file)
        self.notices: asyncio.Queue[Notice] = asyncio.Queue()
        self.committed: Committed | None = None
        self.instance_id: str | None = None
        self._commit_lock = asyncio.Lock()
        self._storage_failing = False
        self._last_progress_report = 0.0
        self._last_reported_step: int | None = None

    @property
    def ids(self) -> dict[str, str | int]:
        return {"job_id": self.spec.job_id, "attempt": self.spec.attempt}

    async def run(self) -> int:
        """Run the attempt to its end; returns the process exit code."""
        self.reporter.start()
        control = ControlObjectSource(self.store, self.spec.attempt)
        watchers = [
            asyncio.create_task(
                watch_notices(control, self.notices, self._outage("control"), self.options.control_seconds),
                name="control",
            )
        ]
        try:
            if self.notice_source is not None:
                self.instance_id = await self.notice_source.instance_id()
                watchers.append(
                    asyncio.create_task(
                        watch_notices(self.notice_source, self.notices, self._outage("metadata")), name="notices"
                    )
                )
            self._install_signal_handlers()
            return await self._run()
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            if self.notice_source is not None:
                await self.notice_source.close()
            self._remove_signal_handlers()
            await self.reporter.aclose()
            await self.store.close()

    async def _run(self) -> int:
        patience = self.options.storage_patience_seconds
        try:
            record = await with_retries(
                "reading the job's completion record", self.checkpoints.completed_record, patience
            )
            if record is not None:
                return await self._already_complete(record)
            missing = cannot_start(self.spec.command, self.spec.env, self.files)
            if missing is not None:  # before downloading a checkpoint it could never use
                self.reporter.emit(Failed(**self.ids, reason=missing))
                return EXIT_FAILED
            self._reset_output_dir()
            restored = await with_retries(
                "restoring the newest checkpoint", lambda: self.checkpoints.restore(self.output_dir), patience
            )
        except StorageError as exc:
            self.reporter.emit(Failed(**self.ids, reason=f"checkpoint storage unreachable: {exc}"))
            return EXIT_FAILED
        if restored.step is not None:
            self.committed = Committed(restored.step, restored.uri or "", 0, 0.0)
        self.reporter.emit(
            Started(
                **self.ids,
                resumed_from_step=restored.step,
                restored_uri=restored.uri,
                restore_seconds=round(restored.seconds, 3),
                skipped=restored.skipped,
                instance_id=self.instance_id,
            )
        )
        return await self._supervise(restored.path)

    async def _supervise(self, resume_from: Path | None) -> int:
        restarts = 0
        while True:
            try:
                trainer = await TrainerProcess.start(
                    self.spec.command, self.spec.env, resume_from, self.files, echo=self.options.echo_trainer
                )
            except TrainerStartError as exc:
                self.reporter.emit(Failed(**self.ids, reason=str(exc), step=self.progress.state.step))
                return EXIT_FAILED
            outcome = await self._watch(trainer)
            if isinstance(outcome, Notice):
                return await self._interrupt(trainer, outcome)
            if outcome == 0:
                return await self._complete()
            newest = newest_complete(self.output_dir)
            await self._sync_newest("periodic", newest)
            if restarts >= self.spec.max_restarts:
                self.reporter.emit(
                    Failed(
                        **self.ids,
                        reason=f"trainer exited with code {outcome}; gave up after {restarts} restart(s)"
                        + (f": {trainer.tail[-1]}" if trainer.tail else ""),
                        step=self.progress.state.step,
                        exit_code=outcome,
                        log_tail=list(trainer.tail),
                    )
                )
                return EXIT_FAILED
            restarts += 1
            resume_from = newest.path if newest else resume_from
            self.reporter.emit(
                RunnerWarning(
                    **self.ids,
                    kind="trainer-restart",
                    message=f"trainer exited with code {outcome}; restart {restarts} of {self.spec.max_restarts} "
                    f"from step {newest.step if newest else 'scratch'}",
                )
            )

    async def _watch(self, trainer: TrainerProcess) -> int | Notice:
        """Until the trainer exits (its code) or an interrupting notice arrives (the notice)."""
        background = [
            asyncio.create_task(self._sync_loop(), name="sync"),
            asyncio.create_task(self._progress_loop(), name="progress"),
        ]
        exited = asyncio.create_task(trainer.wait(), name="trainer")
        try:
            while True:
                next_notice = asyncio.create_task(self.notices.get())
                await asyncio.wait({exited, next_notice}, return_when=asyncio.FIRST_COMPLETED)
                if exited.done():
                    # A trainer that finished on its own wins over a notice that raced it.
                    if next_notice.done():
                        self.notices.put_nowait(next_notice.result())
                    next_notice.cancel()
                    self._report_progress(force=True)
                    return exited.result()
                notice = next_notice.result()
                self.reporter.emit(
                    NoticeReport(**self.ids, kind=notice.kind, source=notice.source, deadline=notice.deadline)
                )
                if notice.interrupts:
                    return notice
                background.append(asyncio.create_task(self._sync_newest("rebalance"), name="rebalance-sync"))
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    async def _interrupt(self, trainer: TrainerProcess, notice: Notice) -> int:
        """SIGTERM the trainer, commit its checkpoint the moment it is complete, report, before the deadline."""
        noticed = time.monotonic()
        deadline = notice.deadline or datetime.now(UTC) + timedelta(seconds=self.options.stop_grace_seconds)
        known = {checkpoint.step for checkpoint in list_checkpoint_dirs(self.output_dir)}
        trainer.request_stop()
        # Leave room to upload: twice the last commit's time, at least 10 s, but never all of the window.
        window = (deadline - datetime.now(UTC)).total_seconds()
        reserve = max(10.0, 2 * (self.committed.seconds if self.committed else 0.0))
        fresh = await self._fresh_checkpoint(trainer, known, budget=max(window - reserve, window / 2, 5.0))
        saved = time.monotonic()
        if fresh is None and trainer.running:
            log.error("trainer saved nothing %.0fs after SIGTERM; killing it", saved - noticed)
            trainer.kill()
            await trainer.wait()
        self._report_progress(force=True)
        newest = fresh or newest_complete(self.output_dir, trainer_exited_cleanly=not trainer.killed)
        note = None
        if fresh is None:
            note = "trainer did not save a checkpoint in time; committed the newest complete one"
        remaining = max((deadline - datetime.now(UTC)).total_seconds(), 5.0)
        try:
            await with_retries(
                "committing the notice checkpoint", lambda: self._sync_newest("notice", newest), remaining
            )
        except StorageError as exc:
            note = f"upload failed before the deadline: {exc}"
        uploaded = time.monotonic()
        self.reporter.emit(
            Interrupted(
                **self.ids,
                reason=notice.kind,
                step=self.committed.step if self.committed else None,
                uri=self.committed.uri if self.committed else None,
                deadline=deadline,
                saved_in_time=fresh is not None,
                note=note,
                seconds={
                    "save": round(saved - noticed, 3),
                    "upload": round(uploaded - saved, 3),
                    "total": round(uploaded - noticed, 3),
                },
            )
        )
        await self._reap(trainer, deadline)
        return EXIT_INTERRUPTED

    async def _fresh_checkpoint(
        self, trainer: TrainerProcess, known: set[int], budget: float
    ) -> LocalCheckpoint | None:
        """The checkpoint the trainer saves after the SIGTERM, as soon as it is complete (None: not in budget).

        With our callback the marker shows the save is done while the trainer is still shutting down, so the
        upload starts seconds earlier; without it, the trainer's exit is the sign.
        """
        give_up = time.monotonic() + budget
        while time.monotonic() < give_up:
            exited = not trainer.running
            newest = newest_complete(self.output_dir, trainer_exited_cleanly=exited)
            if newest is not None and newest.step not in known:
                return newest
            if exited:
                return None
            await asyncio.sleep(0.05)
        return None

    async def _reap(self, trainer: TrainerProcess, deadline: datetime) -> None:
        """Let the trainer finish exiting on its own, but not past the deadline."""
        remaining = max((deadline - datetime.now(UTC)).total_seconds(), 1.0)
        try:
            await asyncio.wait_for(asyncio.shield(trainer.wait()), remaining)
        except TimeoutError:
            trainer.kill()
            await trainer.wait()

    async def _complete(self) -> int:
        patience = self.options.storage_patience_seconds
        try:
            output_uri = await with_retries(
                "uploading the final output",
                lambda: self.checkpoints.upload_output(self.output_dir),
                patience,
            )
            record = {
                "job_id": self.spec.job_id,
                "attempt": self.spec.attempt,
                "step": self.progress.state.step,
                "output_uri": output_uri,
                "time": datetime.now(UTC).isoformat(),
            }
            await with_retries(
                "writing the completion record",
                lambda: self.checkpoints.mark_completed(json.dumps(record).encode()),
                patience,
            )
        except StorageError as exc:
            self.reporter.emit(
                Failed(
                    **self.ids,
                    reason=f"could not store the final output: {exc}",
                    step=self.progress.state.step,
                )
            )
            return EXIT_FAILED
        self.reporter.emit(
            Completed(
                **self.ids,
                step=self.progress.state.step,
                total_steps=self.progress.state.total_steps,
                output_uri=output_uri,
            )
        )
        await self._release()
        return EXIT_COMPLETED

    async def _already_complete(self, record: bytes) -> int:
        """A scaling group launched one instance too many: say the job is done and give the capacity back."""
        try:
            done = json.loads(record)
        except ValueError:
            done = {}
        self.reporter.emit(
            Completed(
                **self.ids,
                step=done.get("step"),
                output_uri=str(done.get("output_uri") or self.store.uri("output/")),
                already_complete=True,
            )
        )
        await self._release()
        return EXIT_COMPLETED

    async def _release(self) -> None:
        if self.spec.release is None:
            return
        # Reports first: once the capacity is released this process may be gone.
        await self.reporter.drain(timeout=30.0)
        try:
            done = await release_capacity(self.spec.release, self.instance_id)
            log.info("%s", done)
        except Exception as exc:
            self.reporter.emit(RunnerWarning(**self.ids, kind="release-failed", message=str(exc)))

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.sync_seconds)
            await self._sync_newest("periodic")

    async def _sync_newest(self, reason: SyncReason, newest: LocalCheckpoint | None = None) -> None:
        """Commit the newest complete checkpoint if it is newer than the last commit; prune older ones.

        Periodic and rebalance syncs report storage trouble once and try again later; the notice path
        passes ``newest`` explicitly and wants the StorageError to retry it within the deadline.
        """
        async with self._commit_lock:
            checkpoint = newest or newest_complete(self.output_dir)
            if checkpoint is None or (self.committed and checkpoint.step <= self.committed.step):
                return
            try:
                committed = await self.checkpoints.commit(checkpoint.path, checkpoint.step)
                self.committed = committed
                self._storage_failing = False
                self.reporter.emit(
                    CheckpointSaved(
                        **self.ids,
                        step=committed.step,
                        uri=committed.uri,
                        bytes=committed.bytes,
                        seconds=round(committed.seconds, 3),
                        reason=reason,
                    )
                )
                await self.checkpoints.prune(self.spec.keep_checkpoints)
            except StorageError as exc:
                if reason == "notice":
                    raise
                if not self._storage_failing:
                    self._storage_failing = True
                    self.reporter.emit(
                        RunnerWarning(**self.ids, kind="storage", message=f"checkpoint sync failing, will retry: {exc}")
                    )
            except FileNotFoundError as exc:
                log.warning("checkpoint-%d changed under the upload (%s); will retry", checkpoint.step, exc)

    async def _progress_loop(self) -> None:
        while True:
            await asyncio.sleep(min(self.options.progress_seconds, 1.0) or 0.2)
            self._report_progress()

    def _report_progress(self, force: bool = False) -> None:
        """Report a step we have not reported yet, at most once per ``progress_seconds`` unless forced."""
        self.progress.read_new()
        state = self.progress.state
        if state.step is None or state.step == self._last_reported_step:
            return
        now = time.monotonic()
        if force or now - self._last_progress_report >= self.options.progress_seconds:
            self._last_progress_report = now
            self._last_reported_step = state.step
            self.reporter.emit(
                Progress(**self.ids, step=state.step, total_steps=state.total_steps, loss=state.loss, epoch=state.epoch)
            )

    def _outage(self, kind: str) -> Callable[[str], None]:
        """Report the first failure of an outage of one notice source (the watcher calls this once per outage)."""
        return lambda message: self.reporter.emit(RunnerWarning(**self.ids, kind=kind, message=message))

    def _reset_output_dir(self) -> None:
        """The store is the truth: local leftovers of an earlier run on this disk are not resumed from."""
        if self.output_dir.exists():
            log.info("clearing leftovers in %s", self.output_dir)
            shutil.rmtree(self.output_dir)
        self.output_dir.mkdir(parents=True)
        self.progress.path.unlink(missing_ok=True)

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self._stop_requested, signum)

    def _remove_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signum)

    def _stop_requested(self, signum: int) -> None:
        log.warning("received %s: checkpointing and stopping", signal.Signals(signum).name)
        deadline = datetime.now(UTC) + timedelta(seconds=self.options.stop_grace_seconds)
        self.notices.put_nowait(Notice("stop", "signal", deadline))
