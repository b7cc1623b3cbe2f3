"""The runner agent: restore, supervise the trainer, sync checkpoints, honour the spot notice, report.

One ``Runner`` runs one attempt of one job on one instance::

    restore newest valid checkpoint ─► start trainer ─┬─► trainer exits 0 ──► upload output, COMPLETED
                                                      ├─► trainer crashes ──► restart from last checkpoint
                                                      └─► notice ──► stop request, commit plan, report, exit 75

Each duty is a module of its own, which this one wires together and runs the attempt with:
``runner.supervise`` (the trainer: start, restarts, the process box, how it ended), ``runner.periodic_sync``
(checkpoints go up in the background as they are written; a rebalance recommendation commits the newest one
early), ``runner.notice_path`` (watching for the notice; on one, ``runner.notice_commit`` keeps what is in flight,
asks for a fresh save only if it can make it, and stops at the cutoff, so that the ``interrupted`` report leaves
before the deadline whatever the store does), ``runner.reports.attempt`` (every report), ``runner.completion``
(the final output) and ``runner.standing_by`` (a gang node between generations, a runner launched ahead).
Storage, metadata and reporting trouble is reported and retried; it never stops training.
"""

from __future__ import annotations

import asyncio
import logging
import time

from handlers.failures import Failure
from handlers.reports import StandbyCause
from handlers.spec import Gang, JobSpec
from runner.checkpoints import Committed, Restored
from runner.completion import Completion
from runner.exit_codes import EXIT_FAILED, EXIT_NO_METADATA_GUARD
from runner.metadata_guard import GuardError
from runner.notice_path import NoticePath, notice_source_for
from runner.notices.base import NoticeSource
from runner.options import RunnerOptions
from runner.periodic_sync import PeriodicSync
from runner.progress import ProgressTail
from runner.reports.attempt import AttemptReports
from runner.reports.open import open_target
from runner.reports.reporter import Reporter
from runner.retry import with_retries
from runner.standing_by import StandingBy
from runner.storage.attempt_credentials import AttemptCredentials
from runner.storage.base import ObjectStore, StorageError
from runner.storage.open import open_store
from runner.supervise import Exits, Regrouped, TrainerSupervisor
from runner.trainer import TrainerFiles, TrainerProcess, cannot_start

log = logging.getLogger(__name__)


class Runner:
    def __init__(
        self,
        spec: JobSpec,
        options: RunnerOptions,
        store: ObjectStore | None = None,
        notice_source: NoticeSource | None = None,
        report_key: str | None = None,
        credentials: AttemptCredentials | None = None,
    ) -> None:
        """``report_key``: the attempt's key when it was fetched (AWS); else the runner's FINETUNE_REPORT_SECRET.
        ``credentials``: the attempt's storage session (AWS with a storage role), watched while training so that a
        bot that stopped renewing it costs little (:meth:`PeriodicSync.watch_credentials`)."""
        self.spec = spec
        self.options = options
        self.store = store or open_store(spec.checkpoint_uri)
        self.files = TrainerFiles.under(options.work_dir)
        self.output_dir = self.files.output_dir
        self.progress = ProgressTail(self.files.progress_file)
        reporter = Reporter([open_target(target, report_key) for target in spec.report])
        self.reports = AttemptReports(spec, reporter, self.progress, options.progress_seconds)
        self.periodic_sync = PeriodicSync(spec, options, self.store, self.output_dir, self.reports)
        source = notice_source if notice_source is not None else notice_source_for(spec)
        self.notice = NoticePath(spec, options, self.store, source, self.reports, self.periodic_sync, self.progress)
        watch = None if credentials is None else (lambda: self.periodic_sync.watch_credentials(credentials))
        self.supervisor = TrainerSupervisor(
            spec, options, self.files, self.reports, self.periodic_sync, self.notice.notices, watch
        )
        self.completion = Completion(options, self.store, self.files, self.progress, self.reports, credentials)
        self.standing_by = StandingBy(options, self.store, self.reports, self.periodic_sync, self.notice, credentials)
        self.instance_id: str | None = None

    @property
    def committed(self) -> Committed | None:
        """The newest checkpoint known to be committed in the store (restored, or uploaded by this attempt)."""
        return self.periodic_sync.committed

    async def run(self) -> int:
        """Run the attempt to its end; returns the process exit code."""
        self.supervisor.open_box()
        self.reports.reporter.start()
        watchers = [self.notice.watch_control()]
        source = self.notice.notice_source
        try:
            if source is not None:
                self.instance_id = await source.instance_id()
                watchers.append(self.notice.watch_metadata(source))
            self.notice.install_signal_handlers()
            return await self._run()
        finally:
            await self.supervisor.end_trainer()
            marking = self.periodic_sync.marking()
            for watcher in [*watchers, *marking]:
                watcher.cancel()
            await asyncio.gather(*watchers, *marking, return_exceptions=True)
            if source is not None:
                await source.close()
            self.notice.remove_signal_handlers()
            await self.periodic_sync.sync.aclose()
            await self.reports.reporter.aclose()
            await self._close_store()

    async def _run(self) -> int:
        if self.spec.handover:
            waited = await self.standing_by.handover(self.spec)
            if waited is not None:
                return waited
        patience = self.options.storage_patience_seconds
        checkpoints = self.periodic_sync.checkpoints
        try:
            record = await with_retries("reading the job's completion record", checkpoints.completed_record, patience)
            if record is not None:
                return await self.completion.already_complete(self.spec, record, self.instance_id)
            missing = cannot_start(self.spec.command, self.spec.env, self.files, self.options.trainer)
            if missing is not None:  # before downloading a checkpoint it could never use
                self.reports.failed(missing)
                return EXIT_FAILED
            if self.options.metadata_guard is not None:  # fail closed: never a trainer with the role in reach
                try:
                    await self.options.metadata_guard.install()
                except GuardError as exc:
                    self.reports.failed(Failure.of("metadata-guard-failed", error=str(exc)))
                    return EXIT_NO_METADATA_GUARD
            self.supervisor.reset_output_dir()
            restored = await with_retries(
                "restoring the newest checkpoint", lambda: checkpoints.restore(self.output_dir), patience
            )
        except StorageError as exc:
            self.reports.failed(Failure.of("storage-unreachable", error=str(exc)))
            return EXIT_FAILED
        self._resumed(restored)
        exits = Exits(completed=self._complete, interrupted=self.notice.interrupt, stood_by=self._stand_by)
        return await self.supervisor.supervise(restored.path, exits)

    async def _complete(self) -> int:
        return await self.completion.complete(self.spec, self.periodic_sync.checkpoints, self.instance_id)

    async def _stand_by(self, cause: StandbyCause, exit_code: int | None, trainer: TrainerProcess) -> int | Regrouped:
        return await self.standing_by.gang(self.spec, cause, exit_code, trainer, self._regroup)

    async def _regroup(self, gang: Gang) -> Regrouped:
        """Into the next generation: this node's new rank, its parts' new place, the newest complete checkpoint
        (the local copy's files reused where they verify), reported as started again."""
        log.info("regrouping: generation %d, node %d of %d", gang.generation, gang.node_rank, gang.nodes)
        self.spec = self.spec.model_copy(update={"gang": gang})
        await self.periodic_sync.regroup(self.spec)
        self.reports.spec = self.supervisor.spec = self.spec
        self.notice.regroup(self.spec)
        self.supervisor.reclaim_output_dir()
        restored = await self.periodic_sync.restore_generation()
        self.supervisor.keep_only(restored.path)
        self._resumed(restored)
        return Regrouped(restored.path)

    def _resumed(self, restored: Restored) -> None:
        """Record what the trainer starts from and say so (``started``)."""
        self.periodic_sync.resumed(restored)
        self.reports.started(restored, self.instance_id)

    async def _close_store(self) -> None:
        """Close the store; after a notice not past the deadline (background aborts may be cut short)."""
        exit_by = self.notice.exit_by
        limit = None if exit_by is None else max(exit_by - time.monotonic(), 0.1)
        try:
            await asyncio.wait_for(self.store.close(), limit)
        except TimeoutError:
            log.warning("closing the store was cut short at the deadline")
