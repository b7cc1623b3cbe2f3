"""The runner agent: restore, supervise the trainer, sync checkpoints, honour the spot notice, report.

One ``Runner`` runs one attempt of one job on one instance::

    restore newest valid checkpoint ─► start trainer ─┬─► trainer exits 0 ──► upload output, COMPLETED
                                                      ├─► trainer crashes ──► restart from last checkpoint
                                                      └─► notice ──► stop request, commit plan, report, exit 75

While the trainer runs, checkpoints go up in the background as they are written (``runner.sync``) and a
rebalance recommendation commits the newest one early. On a notice ``runner.notice_commit`` keeps what is in
flight, asks for a fresh save only if it can make it, and stops at the cutoff, so that the ``interrupted``
report leaves before the deadline whatever the store does. Storage, metadata and reporting trouble is
reported and retried; it never stops training.
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
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from handlers.failures import Failure
from handlers.reports import (
    CheckpointSaved,
    Completed,
    Failed,
    InstanceNotice,
    Interrupted,
    Progress,
    RunnerWarning,
    Standby,
    StandbyCause,
    Started,
)
from handlers.reports import Notice as NoticeReport
from handlers.spec import Gang, JobSpec, control_key, node_control_key
from runner.checkpoints import OUTPUT_PREFIX, CheckpointStore, Committed, Restored
from runner.errors import ControlUnreadable
from runner.gang_checkpoints import GangCheckpointStore
from runner.local_checkpoints import LocalCheckpoint, newest_complete
from runner.metadata_guard import METADATA_GUARD_ENV, GuardError, MetadataGuard, metadata_guard
from runner.notice_commit import NoticeCommit, NoticeOutcome
from runner.notices.aliyun import AliyunMetadataSource
from runner.notices.aws import AwsImdsSource
from runner.notices.base import NoticeSource
from runner.notices.control import (
    CONTROL_POLL_SECONDS,
    STANDBY_POLL_SECONDS,
    ControlObjectSource,
    gang_control_keys,
    read_go,
    read_regroup,
)
from runner.notices.watch import watch_notices
from runner.progress import ProgressTail
from runner.release import release_capacity
from runner.reports.open import open_target
from runner.reports.reporter import Reporter
from runner.retry import with_retries
from runner.storage.attempt_credentials import AttemptCredentials
from runner.storage.base import ObjectStore, StorageError
from runner.storage.open import open_store
from runner.sync import CheckpointSync, SyncReason
from runner.trainer import TrainerFiles, TrainerProcess, TrainerStartError, cannot_start
from runner.trainer_box import TrainerBox
from runner.trainer_env import TrainerSetup
from runner.trainer_user import TRAINER_USER_ENV, trainer_user

log = logging.getLogger(__name__)

# Exit codes (documented in the README): the bot and systemd units read them.
EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_BAD_SPEC = 2
EXIT_NO_REPORT_KEY = 3  # AWS: no key object for this instance in time; nothing started, nothing reported
EXIT_NO_METADATA_GUARD = 4  # the trainer's user could reach the metadata service: not started, reported failed
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: this attempt ended early on purpose; the job goes on elsewhere


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    work_dir: Path
    stop_grace_seconds: float = 90.0  # a SIGTERM to the runner itself (systemctl stop) has no cloud deadline
    progress_seconds: float = 10.0  # at most one progress report per this many seconds
    sync_seconds: float = 1.0  # how often to look for a newly completed checkpoint
    storage_patience_seconds: float = 300.0  # how long start-up and completion keep retrying storage
    echo_trainer: bool = True
    control_seconds: float = CONTROL_POLL_SECONDS  # how often to look for a stop or interrupt test from the bot
    report_reserve_seconds: float | None = None  # before a deadline, kept for the interrupted report (None: auto)
    settle_seconds: float = 1.0  # a checkpoint file unchanged this long is sent before the trainer's marker
    credentials_check_seconds: float = 30.0  # how often the attempt's storage session (AWS) is looked at
    credentials_wait_seconds: float = 6 * 3600.0  # a finished job's output waits this long for a renewed session
    trainer: TrainerSetup = field(default_factory=TrainerSetup)  # as whom, with what of the runner's environment
    metadata_guard: MetadataGuard | None = None  # the rule that keeps the trainer's user from the metadata service
    collective_timeout_seconds: float = 120.0  # a gang's trainer: how long a collective waits for a lost peer
    gang_wait_seconds: float = 300.0  # a gang node stopping: how long it waits for every node's part of its step

    @classmethod
    def from_env(cls, work_dir: Path) -> RunnerOptions:
        def number(name: str, default: float) -> float:
            raw = os.environ.get(name)
            return float(raw) if raw else default

        user = trainer_user(os.environ.get(TRAINER_USER_ENV))
        return cls(
            work_dir=work_dir,
            stop_grace_seconds=number("FINETUNE_STOP_GRACE_SECONDS", 90.0),
            progress_seconds=number("FINETUNE_PROGRESS_SECONDS", 10.0),
            sync_seconds=number("FINETUNE_SYNC_SECONDS", 1.0),
            storage_patience_seconds=number("FINETUNE_STORAGE_PATIENCE_SECONDS", 300.0),
            echo_trainer=os.environ.get("FINETUNE_TRAINER_ECHO", "1") != "0",
            control_seconds=number("FINETUNE_CONTROL_POLL_SECONDS", CONTROL_POLL_SECONDS),
            report_reserve_seconds=number("FINETUNE_REPORT_RESERVE_SECONDS", 0.0) or None,
            settle_seconds=number("FINETUNE_SETTLE_SECONDS", 1.0),
            credentials_check_seconds=number("FINETUNE_CREDENTIALS_CHECK_SECONDS", 30.0),
            credentials_wait_seconds=number("FINETUNE_CREDENTIALS_WAIT_SECONDS", 6 * 3600.0),
            trainer=TrainerSetup.from_env(os.environ, user),
            metadata_guard=metadata_guard(os.environ.get(METADATA_GUARD_ENV), user),
            collective_timeout_seconds=number("FINETUNE_COLLECTIVE_TIMEOUT_SECONDS", 120.0),
            gang_wait_seconds=number("FINETUNE_GANG_WAIT_SECONDS", 300.0),
        )

    def report_reserve(self, window: float) -> float:
        """Seconds before a deadline that belong to the interrupted report: 5% of the window, 2–5 s."""
        if self.report_reserve_seconds is not None:
            return self.report_reserve_seconds
        return min(max(0.05 * window, 2.0), 5.0)


def notice_source_for(spec: JobSpec) -> NoticeSource | None:
    if spec.notice == "aws":
        return AwsImdsSource()
    if spec.notice == "aliyun":
        return AliyunMetadataSource()
    return None


@dataclass(frozen=True, slots=True)
class Regrouped:
    """A gang node that stood by was given the next generation: train again from ``resume_from``."""

    resume_from: Path | None


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
        bot that stopped renewing it costs little (:meth:`_watch_credentials`)."""
        self.spec = spec
        self.credentials = credentials
        self.options = options
        self.store = store or open_store(spec.checkpoint_uri)
        self.checkpoints = self._checkpoint_store()
        self.notice_source = notice_source if notice_source is not None else notice_source_for(spec)
        self.reporter = Reporter([open_target(target, report_key) for target in spec.report])
        self.files = TrainerFiles.under(options.work_dir)
        self.output_dir = self.files.output_dir
        self.progress = ProgressTail(self.files.progress_file)
        self._box: TrainerBox | None = None  # made when the attempt runs: the runner becomes a subreaper then
        self.notices: asyncio.Queue[InstanceNotice] = asyncio.Queue()
        self.sync = self._checkpoint_sync()
        self.control = ControlObjectSource(self.store, spec.attempt, self._control_keys())
        self._marking: dict[int, asyncio.Task[None]] = {}  # gang node 0: steps waiting for every node's part
        self.instance_id: str | None = None
        self._exit_by: float | None = None  # after a notice: the deadline, which closing down must not pass
        self._last_progress_report = 0.0
        self._last_reported_step: int | None = None

    @property
    def committed(self) -> Committed | None:
        """The newest checkpoint known to be committed in the store (restored, or uploaded by this attempt)."""
        return self.sync.committed

    @property
    def ids(self) -> dict[str, str | int]:
        ids: dict[str, str | int] = {"job_id": self.spec.job_id, "attempt": self.spec.attempt}
        if self.spec.gang is not None:
            ids.update(node_rank=self.spec.gang.node_rank, generation=self.spec.gang.generation)
        return ids

    # -- a gang: parts, the marker, the world ----------------------------------------------------------------

    def _checkpoint_store(self) -> CheckpointStore:
        gang = self.spec.gang
        if gang is None:
            return CheckpointStore(self.store, self.spec.job_id, self.spec.attempt)
        return GangCheckpointStore(
            self.store,
            self.spec.job_id,
            self.spec.attempt,
            nodes=gang.nodes,
            node_rank=gang.node_rank,
            generation=gang.generation,
        )

    def _checkpoint_sync(self) -> CheckpointSync:
        return CheckpointSync(
            self.checkpoints,
            self.output_dir,
            keep=self.spec.keep_checkpoints,
            on_commit=self._report_commit if self.spec.gang is None else self._part_committed,
            on_trouble=self._report_storage_trouble,
            settle_seconds=self.options.settle_seconds,
        )

    def _control_keys(self) -> list[str] | None:
        gang = self.spec.gang
        return None if gang is None else gang_control_keys(self.spec.attempt, gang.generation, gang.node_rank)

    def _trainer_env(self) -> dict[str, str]:
        """The recipe's environment, and a gang's world in torchrun's and ms-swift's names."""
        gang = self.spec.gang
        if gang is None:
            return dict(self.spec.env)
        return {
            **self.spec.env,
            "NNODES": str(gang.nodes),
            "NODE_RANK": str(gang.node_rank),
            "MASTER_ADDR": gang.master_addr,
            "MASTER_PORT": str(gang.master_port),
            "FINETUNE_COLLECTIVE_TIMEOUT_SECONDS": str(int(self.options.collective_timeout_seconds)),
        }

    def _part_committed(self, committed: Committed, reason: SyncReason) -> None:
        """This node's part of a checkpoint is committed. The checkpoint counts once every node's is: node 0's
        runner writes the marker then and reports it; the other nodes only log theirs."""
        log.info("committed node %d's part of checkpoint-%d", self._gang.node_rank, committed.step)
        if self._gang.node_rank == 0 and committed.step not in self._marking:
            task = asyncio.get_running_loop().create_task(self._mark_when_complete(committed, reason))
            self._marking[committed.step] = task

    @property
    def _gang(self) -> Gang:
        assert self.spec.gang is not None
        return self.spec.gang

    async def _mark_when_complete(self, committed: Committed, reason: SyncReason) -> None:
        """Node 0: look for every node's part of ``committed.step`` until it is there, then write the marker and
        report the checkpoint; given up once a newer step is marked (storage trouble is retried)."""
        checkpoints = self.checkpoints
        assert isinstance(checkpoints, GangCheckpointStore)
        marker = await checkpoints.mark_when_complete(committed.step, self._gang_poll_seconds)
        self._report_commit(Committed(committed.step, committed.uri, marker.bytes, committed.seconds), reason)
        for older, task in list(self._marking.items()):
            if older < committed.step:
                task.cancel()

    @property
    def _gang_poll_seconds(self) -> float:
        return min(max(self.options.sync_seconds, 0.1), 1.0)

    async def _newest_marked(self, at_least: int | None, wait: float) -> int | None:
        """The newest step every node's part of which is committed; waits up to ``wait`` seconds for ``at_least``
        (this node's own newest part) to be marked, by node 0's runner (which may be this one)."""
        checkpoints = self.checkpoints
        assert isinstance(checkpoints, GangCheckpointStore)
        return await checkpoints.newest_marked(at_least, wait, self._gang_poll_seconds)

    async def _stand_by(self, cause: StandbyCause, exit_code: int | None, trainer: TrainerProcess) -> int | Regrouped:
        """A gang node whose instance got no notice and whose trainer ended: commit its part, say so, and wait
        for the bot's regroup (the next generation) or stop, keeping the instance (and its storage session)."""
        newest = newest_complete(self.output_dir, trainer_exited_cleanly=cause == "stopped" and not trainer.killed)
        await self._sync_newest("notice" if cause == "stopped" else "periodic", newest)
        own = self.sync.committed_step
        # After a stop every node saves the same step, so its marker comes; a lost peer's part never will.
        wait = self.options.gang_wait_seconds if cause == "stopped" else 0.0
        step = await self._newest_marked(own, wait)
        self.reporter.emit(Standby(**self.ids, step=step, cause=cause, exit_code=exit_code))
        log.warning("standing by for the gang's next generation (checkpoint-%s complete)", step)
        background = []
        if self.credentials is not None:
            background.append(asyncio.create_task(self._watch_credentials(self.credentials), name="credentials"))
        key = node_control_key(self.spec.attempt, self._gang.generation, self._gang.node_rank)
        try:
            while True:
                try:
                    regroup = await read_regroup(self.store, key)
                except ControlUnreadable as exc:
                    log.warning("%s", exc)
                    regroup = None
                if regroup is not None and regroup.gang.generation > self._gang.generation:
                    return await self._regroup(regroup.gang)
                ended = await self._standing_by(step, own)
                if ended is not None:
                    return ended
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    async def _await_handover(self) -> int | None:
        """Launched ahead of a switch of market: say the instance is up (``standby``, cause handover) and wait for the
        bot's go before restoring anything, since the previous attempt trains on until then and commits on this
        word. None to go on; an exit code when a stop or this instance's own interruption comes first (nothing of
        this attempt to commit)."""
        self.reporter.emit(Standby(**self.ids, cause="handover"))
        log.warning("launched ahead of a switch of market: waiting for the previous attempt's checkpoint")
        key = control_key(self.spec.attempt)
        while True:
            try:
                if await read_go(self.store, key):
                    log.info("the previous attempt is done: restoring")
                    return None
            except ControlUnreadable as exc:
                log.warning("%s", exc)
            ended = await self._standing_by(None, None)
            if ended is not None:
                return ended

    async def _standing_by(self, step: int | None, reached: int | None) -> int | None:
        """One poll's wait of a runner standing by (a gang survivor, or one launched ahead): a notice that comes is
        reported, and one that interrupts (a stop, or this instance being taken) ends it, as ``interrupted`` with
        ``step`` committed and ``reached`` trained; there is nothing left to commit. None: wait on."""
        with contextlib.suppress(TimeoutError):
            poll = min(self.options.control_seconds, STANDBY_POLL_SECONDS)
            notice = await asyncio.wait_for(self.notices.get(), poll)
            kind, deadline = notice.kind, notice.deadline
            self.reporter.emit(NoticeReport(**self.ids, kind=kind, source=notice.source, deadline=deadline))
            if notice.interrupts:
                said = Interrupted(**self.ids, reason=kind, step=step, deadline=deadline, reached_step=reached)
                self.reporter.emit(said)
                await self.reporter.drain(timeout=10.0)
                return EXIT_INTERRUPTED
        return None

    async def _regroup(self, gang: Gang) -> Regrouped:
        """Into the next generation: this node's new rank, its parts' new place, the newest complete checkpoint
        (the local copy's files reused where they verify), reported as started again."""
        log.info("regrouping: generation %d, node %d of %d", gang.generation, gang.node_rank, gang.nodes)
        for task in self._marking.values():
            task.cancel()
        self._marking.clear()
        await self.sync.aclose()
        self.spec = self.spec.model_copy(update={"gang": gang})
        self.checkpoints = self._checkpoint_store()
        self.sync = self._checkpoint_sync()
        self.control.keys = self._control_keys() or self.control.keys
        self._reclaim_output_dir()
        checkpoints = self.checkpoints
        assert isinstance(checkpoints, GangCheckpointStore)
        try:
            restored = await with_retries(
                "restoring the newest checkpoint",
                lambda: checkpoints.restore(self.output_dir, reuse=True),
                self.options.storage_patience_seconds,
            )
        except StorageError as exc:
            log.error("restoring for the next generation failed: %s", exc)
            restored = Restored()
        self._keep_only(restored.path)
        self._resumed(restored)
        return Regrouped(restored.path)

    def _keep_only(self, path: Path | None) -> None:
        """The output directory holds the restored checkpoint and nothing else (a newer half-written save, the
        previous generation's leftovers: the store is the truth)."""
        for entry in list(self.output_dir.iterdir()):
            if path is not None and entry == path:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def _resumed(self, restored: Restored) -> None:
        """Record what the trainer starts from and say so (``started``)."""
        if restored.step is not None:
            self.sync.committed = Committed(restored.step, restored.uri or "", restored.bytes, 0.0)
            self.sync.checkpoint_bytes = restored.bytes or None
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

    async def run(self) -> int:
        """Run the attempt to its end; returns the process exit code."""
        self._box = TrainerBox()
        self.reporter.start()
        watchers = [
            asyncio.create_task(
                watch_notices(self.control, self.notices, self._outage("control"), self.options.control_seconds),
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
            await self._end_trainer()
            for watcher in [*watchers, *self._marking.values()]:
                watcher.cancel()
            await asyncio.gather(*watchers, *self._marking.values(), return_exceptions=True)
            if self.notice_source is not None:
                await self.notice_source.close()
            self._remove_signal_handlers()
            await self.sync.aclose()
            await self.reporter.aclose()
            await self._close_store()

    async def _run(self) -> int:
        if self.spec.handover:
            waited = await self._await_handover()
            if waited is not None:
                return waited
        patience = self.options.storage_patience_seconds
        try:
            record = await with_retries(
                "reading the job's completion record", self.checkpoints.completed_record, patience
            )
            if record is not None:
                return await self._already_complete(record)
            missing = cannot_start(self.spec.command, self.spec.env, self.files, self.options.trainer)
            if missing is not None:  # before downloading a checkpoint it could never use
                self._failed(missing)
                return EXIT_FAILED
            if self.options.metadata_guard is not None:  # fail closed: never a trainer with the role in reach
                try:
                    await self.options.metadata_guard.install()
                except GuardError as exc:
                    self._failed(Failure.of("metadata-guard-failed", error=str(exc)))
                    return EXIT_NO_METADATA_GUARD
            self._reset_output_dir()
            restored = await with_retries(
                "restoring the newest checkpoint", lambda: self.checkpoints.restore(self.output_dir), patience
            )
        except StorageError as exc:
            self._failed(Failure.of("storage-unreachable", error=str(exc)))
            return EXIT_FAILED
        self._resumed(restored)
        return await self._supervise(restored.path)

    async def _supervise(self, resume_from: Path | None) -> int:
        restarts = 0
        while True:
            await self._end_trainer()  # an earlier trainer's leftovers must not race this one's hand-over
            try:
                trainer = await TrainerProcess.start(
                    self.spec.command,
                    self._trainer_env(),
                    resume_from,
                    self.files,
                    echo=self.options.echo_trainer,
                    setup=self.options.trainer,
                    box=self._box,
                )
            except TrainerStartError as exc:
                self._failed(exc.failure, step=self.progress.state.step)
                return EXIT_FAILED
            outcome = await self._watch(trainer)
            if isinstance(outcome, InstanceNotice):
                interrupted = await self._interrupt(trainer, outcome)
                await self._end_trainer(trainer)
                return interrupted
            await self._end_trainer(trainer)  # what it left running races nothing of ours from here on
            if self.spec.gang is not None and (outcome != 0 or trainer.stopped_on_request):
                # The gang stopped on a peer's notice, or a peer was lost: one node cannot train on alone.
                cause: StandbyCause = "stopped" if outcome == 0 else "trainer-exited"
                stood_by = await self._stand_by(cause, None if outcome == 0 else outcome, trainer)
                if isinstance(stood_by, int):
                    return stood_by
                resume_from, restarts = stood_by.resume_from, 0
                continue
            if outcome == 0:
                return await self._complete()
            newest = newest_complete(self.output_dir)
            await self._sync_newest("periodic", newest)
            if restarts >= self.spec.max_restarts:
                if trainer.tail:
                    why = Failure.of("trainer-exited", exit_code=outcome, restarts=restarts, line=trainer.tail[-1])
                else:
                    why = Failure.of("trainer-exited-silent", exit_code=outcome, restarts=restarts)
                self._failed(why, step=self.progress.state.step, exit_code=outcome, log_tail=list(trainer.tail))
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

    async def _watch(self, trainer: TrainerProcess) -> int | InstanceNotice:
        """Until the trainer exits (its code) or an interrupting notice arrives (the notice)."""
        background = [
            asyncio.create_task(self._sync_loop(), name="sync"),
            asyncio.create_task(self._progress_loop(), name="progress"),
        ]
        if self.credentials is not None:
            background.append(asyncio.create_task(self._watch_credentials(self.credentials), name="credentials"))
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
                    await self._report_progress(force=True)
                    if exited.result() == 0 and not (self.spec.gang is not None and trainer.stopped_on_request):
                        await self.sync.aclose()  # the job is done: its final output matters, not checkpoints
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

    async def _interrupt(self, trainer: TrainerProcess, notice: InstanceNotice) -> int:
        """Commit what can make it before the deadline, report before the deadline, exit 75.

        The commit runs until the cutoff (the deadline less the report's reserve) at the latest; the report
        then has the reserve to leave, whatever state the store or the trainer is in.
        """
        noticed = time.monotonic()
        deadline = notice.deadline or datetime.now(UTC) + timedelta(seconds=self.options.stop_grace_seconds)
        window = (deadline - datetime.now(UTC)).total_seconds()
        ends_at = noticed + window
        self._exit_by = ends_at
        cutoff = ends_at - self.options.report_reserve(window)
        commit = NoticeCommit(
            self.sync,
            cutoff=cutoff,
            trainer=trainer,
            step_seconds=lambda: self.progress.step_seconds,
            trainer_step=self._trainer_step,
        )
        outcome = await commit.run()
        await self._await_marker(outcome, cutoff)
        await self._report_progress(force=True)
        self.reporter.emit(self._interrupted_report(notice, deadline, noticed, outcome))
        # The report leaves while what is still committing goes on: the machine is there until the deadline.
        finishing = asyncio.create_task(commit.finish(until=ends_at - 0.2))
        delivered = await self.reporter.drain(timeout=max(ends_at - time.monotonic() - 0.2, 0.1))
        if not delivered:
            log.error("the interrupted report may not have left before the deadline")
        await finishing
        await self._await_marker(outcome, ends_at - 0.5)  # not in by the cutoff: the others still commit theirs
        await self.reporter.drain(timeout=max(ends_at - time.monotonic() - 0.1, 0.1))  # a late checkpoint_saved
        if outcome.fresh == "committed" and not trainer.frozen:
            await self._reap(trainer, deadline)  # it is shutting down after its save: let it, until the deadline
        elif trainer.running:
            trainer.kill()  # nothing it does now can be committed any more
            await trainer.wait()
        return EXIT_INTERRUPTED

    async def _end_trainer(self, trainer: TrainerProcess | None = None) -> None:
        """Every process the trainer started is gone (``runner.trainer_box``); its main process, awaited by
        asyncio, is spared the reaping only."""
        if self._box is not None:
            await asyncio.to_thread(self._box.sweep, trainer.process.pid if trainer is not None else None)

    async def _await_marker(self, outcome: NoticeOutcome, until: float) -> None:
        """Gang node 0: wait, until ``until`` (monotonic) at most, for the marker of the step just committed (every
        node's part of it; the others commit theirs side by side). Its ``interrupted`` report waits for it: the bot
        may release every node on that report (a stop, the whole gang lost), and told before, a bot that released
        node 0 at once left the step without a marker, and the resume took an older one. The marking task is
        neither cancelled at the timeout nor lets its own error end the notice path (``asyncio.wait``)."""
        marking = self._marking.get(outcome.committed.step) if outcome.committed is not None else None
        if marking is not None:
            await asyncio.wait([marking], timeout=max(until - time.monotonic(), 0.1))

    async def _trainer_step(self) -> int | None:
        """The step the trainer has reached, from its progress file as it is now."""
        await self.progress.refresh()
        return self.progress.state.step

    def _interrupted_report(
        self, notice: InstanceNotice, deadline: datetime, noticed: float, outcome: NoticeOutcome
    ) -> Interrupted:
        now = time.monotonic()
        # save: notice → the fresh checkpoint complete on disk (none: 0); upload: from then to the commit's end.
        saved = outcome.fresh_complete_at if outcome.fresh_complete_at is not None else noticed
        committed = outcome.committed
        return Interrupted(
            **self.ids,
            reason=notice.kind,
            step=committed.step if committed else None,
            uri=committed.uri if committed else None,
            deadline=deadline,
            saved_in_time=outcome.saved_in_time,
            reached_step=outcome.reached_step,
            committing=outcome.committing,
            note=outcome.note,
            late=outcome.late,
            fresh_save=outcome.fresh,
            given_up=outcome.given_up,
            seconds={
                "save": round(max(saved - noticed, 0.0), 3),
                "upload": round(max(outcome.ended_at - saved, 0.0), 3),
                "total": round(now - noticed, 3),
            },
        )

    async def _store_output(self) -> str:
        """The final output, then the completion record; its URI. StorageError once the retries are spent."""
        patience = self.options.storage_patience_seconds
        output_uri = await with_retries(
            "uploading the final output", lambda: self.checkpoints.upload_output(self.output_dir), patience
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
        return output_uri

    async def _credentials_came_back(self) -> bool:
        """After storing the output failed: when the storage session had ended (the bot down for longer than its
        life), wait for the bot to renew it rather than lose a finished job's output; True once it did."""
        credentials = self.credentials
        if credentials is None or not credentials.ended():
            return False
        wait = self.options.credentials_wait_seconds
        message = (
            f"the job is finished but its storage session ended and the bot has not renewed it: the output stays on "
            f"this instance and is stored once the bot is back (waiting up to {wait / 3600:.1f} h)"
        )
        log.error(message)
        self.reporter.emit(RunnerWarning(**self.ids, kind="storage-credentials", message=message))
        return await credentials.wait_until_usable(wait, self.options.credentials_check_seconds)

    async def _reap(self, trainer: TrainerProcess, deadline: datetime) -> None:
        """Let the trainer finish exiting on its own, but not past the deadline."""
        remaining = max((deadline - datetime.now(UTC)).total_seconds(), 1.0)
        try:
            await asyncio.wait_for(asyncio.shield(trainer.wait()), remaining)
        except TimeoutError:
            trainer.kill()
            await trainer.wait()

    async def _complete(self) -> int:
        if self.spec.gang is not None and self.spec.gang.node_rank != 0:
            # Node 0's trainer writes the final output and its runner stores it; this node's part is done.
            self.reporter.emit(
                Completed(
                    **self.ids,
                    step=self.progress.state.step,
                    total_steps=self.progress.state.total_steps,
                    output_uri=self.store.uri(OUTPUT_PREFIX),
                )
            )
            await self._release()
            return EXIT_COMPLETED
        while True:
            try:
                output_uri = await self._store_output()
                break
            except StorageError as exc:
                if await self._credentials_came_back():
                    continue
                self._failed(Failure.of("output-not-stored", error=str(exc)), step=self.progress.state.step)
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
            self.sync.scan()

    async def _watch_credentials(self, credentials: AttemptCredentials) -> None:
        """Renew the storage session ahead of need (botocore only asks when a request is made); when the bot has not
        renewed it and it ends within ``LOW_SECONDS``, say so loudly and commit the newest complete checkpoint while
        the credentials still work, once per such spell, so a notice after the end loses little."""
        warned = False
        while True:
            await asyncio.sleep(self.options.credentials_check_seconds)
            if await credentials.renew_if_due() or not credentials.running_out():
                warned = False
                continue
            if warned:
                continue
            warned = True
            left = max(credentials.seconds_left(), 0.0)
            message = (
                f"the storage credentials end in {left / 60:.0f} min and the bot has not renewed them: committing "
                "the newest checkpoint now; after they end no checkpoint can be stored until the bot is back"
            )
            log.error(message)
            self.reporter.emit(RunnerWarning(**self.ids, kind="storage-credentials", message=message))
            await self._sync_newest("periodic")

    async def _sync_newest(self, reason: SyncReason, newest: LocalCheckpoint | None = None) -> None:
        """Commit ``newest`` (default: the newest complete checkpoint) now if it is newer than the last commit,
        and wait for it. Storage trouble is reported once per outage and retried later; it never raises."""
        await self.sync.commit_newest(reason, newest)

    def _failed(
        self, failure: Failure, step: int | None = None, exit_code: int | None = None, log_tail: list[str] | None = None
    ) -> None:
        """Report giving up: the code for the bot to word."""
        report = Failed(
            **self.ids,
            failure=failure,
            step=step,
            exit_code=exit_code,
            log_tail=log_tail or [],
        )
        self.reporter.emit(report)

    def _report_commit(self, committed: Committed, reason: SyncReason) -> None:
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

    def _report_storage_trouble(self, message: str) -> None:
        self.reporter.emit(RunnerWarning(**self.ids, kind="storage", message=message))

    async def _close_store(self) -> None:
        """Close the store; after a notice not past the deadline (background aborts may be cut short)."""
        limit = None if self._exit_by is None else max(self._exit_by - time.monotonic(), 0.1)
        try:
            await asyncio.wait_for(self.store.close(), limit)
        except TimeoutError:
            log.warning("closing the store was cut short at the deadline")

    async def _progress_loop(self) -> None:
        while True:
            await asyncio.sleep(min(self.options.progress_seconds, 1.0) or 0.2)
            await self._report_progress()

    async def _report_progress(self, force: bool = False) -> None:
        """Report a step we have not reported yet, at most once per ``progress_seconds`` unless forced."""
        await self.progress.refresh()
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
        self._reclaim_output_dir()
        if any(self.output_dir.iterdir()):
            log.info("clearing leftovers in %s", self.output_dir)
            shutil.rmtree(self.output_dir)  # by descriptors, never into a link (shutil's own guard)
            self.output_dir.mkdir()
        self.progress.path.unlink(missing_ok=True)

    def _reclaim_output_dir(self) -> None:
        """``output/`` is a real directory again before the runner writes into it by name: an earlier trainer
        (all its processes gone by now) owned it and may have left a link to anywhere in its place."""
        if self.output_dir.is_symlink() or (self.output_dir.exists() and not self.output_dir.is_dir()):
            log.warning("%s was not a directory (the trainer left something else there): made anew", self.output_dir)
            self.output_dir.unlink()
        self.output_dir.mkdir(parents=True, exist_ok=True)

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
        self.notices.put_nowait(InstanceNotice(kind="stop", source="signal", deadline=deadline))
