"""The notice: watching for it, and from an interrupting one to exit 75 before the deadline.

Notices come from the cloud's metadata service (``runner.notices.aws`` / ``aliyun``), from the bot's control
object (a stop, an interrupt test) and from a SIGTERM to the runner itself; all land in one queue. On an
interrupting notice :meth:`NoticePath.interrupt` runs :class:`runner.notice_commit.NoticeCommit` until the cutoff
(the deadline less the report's reserve), sends the ``interrupted`` report, keeps what is still committing going
until the deadline, and ends the trainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from datetime import UTC, datetime, timedelta

from handlers.reports import InstanceNotice
from handlers.spec import JobSpec
from runner.exit_codes import EXIT_INTERRUPTED
from runner.notice_commit import NoticeCommit
from runner.notices.aliyun import AliyunMetadataSource
from runner.notices.aws import AwsImdsSource
from runner.notices.base import NoticeSource
from runner.notices.control import STANDBY_POLL_SECONDS, ControlObjectSource, gang_control_keys
from runner.notices.watch import watch_notices
from runner.options import RunnerOptions
from runner.periodic_sync import PeriodicSync
from runner.progress import ProgressTail
from runner.reports.attempt import AttemptReports
from runner.storage.base import ObjectStore
from runner.trainer import TrainerProcess

log = logging.getLogger(__name__)


def notice_source_for(spec: JobSpec) -> NoticeSource | None:
    if spec.notice == "aws":
        return AwsImdsSource()
    if spec.notice == "aliyun":
        return AliyunMetadataSource()
    return None


def control_keys(spec: JobSpec) -> list[str] | None:
    """A gang node's control objects (its own and the gang's); None: the attempt's one."""
    gang = spec.gang
    return None if gang is None else gang_control_keys(spec.attempt, gang.generation, gang.node_rank)


class NoticePath:
    def __init__(
        self,
        spec: JobSpec,
        options: RunnerOptions,
        store: ObjectStore,
        notice_source: NoticeSource | None,
        reports: AttemptReports,
        periodic_sync: PeriodicSync,
        progress: ProgressTail,
    ) -> None:
        self.options = options
        self.notice_source = notice_source
        self.reports = reports
        self.periodic_sync = periodic_sync
        self.progress = progress
        self.notices: asyncio.Queue[InstanceNotice] = asyncio.Queue()
        self.control = ControlObjectSource(store, spec.attempt, control_keys(spec))
        self.exit_by: float | None = None  # after a notice: the deadline, which closing down must not pass

    def regroup(self, spec: JobSpec) -> None:
        self.control.keys = control_keys(spec) or self.control.keys

    # -- watching ---------------------------------------------------------------------------------------------

    def watch_control(self) -> asyncio.Task[None]:
        return asyncio.create_task(
            watch_notices(self.control, self.notices, self.reports.outage("control"), self.options.control_seconds),
            name="control",
        )

    def watch_metadata(self, source: NoticeSource) -> asyncio.Task[None]:
        return asyncio.create_task(watch_notices(source, self.notices, self.reports.outage("metadata")), name="notices")

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self._stop_requested, signum)

    def remove_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signum)

    def _stop_requested(self, signum: int) -> None:
        log.warning("received %s: checkpointing and stopping", signal.Signals(signum).name)
        deadline = datetime.now(UTC) + timedelta(seconds=self.options.stop_grace_seconds)
        self.notices.put_nowait(InstanceNotice(kind="stop", source="signal", deadline=deadline))

    async def standing_by(self, step: int | None, reached: int | None) -> int | None:
        """One poll's wait of a runner standing by (a gang survivor, or one launched ahead): a notice that comes is
        reported, and one that interrupts (a stop, or this instance being taken) ends it, as ``interrupted`` with
        ``step`` committed and ``reached`` trained; there is nothing left to commit. None: wait on."""
        with contextlib.suppress(TimeoutError):
            poll = min(self.options.control_seconds, STANDBY_POLL_SECONDS)
            notice = await asyncio.wait_for(self.notices.get(), poll)
            self.reports.notice(notice)
            if notice.interrupts:
                self.reports.interrupted_standing_by(notice, step, reached)
                await self.reports.drain(timeout=10.0)
                return EXIT_INTERRUPTED
        return None

    # -- an interrupting notice -------------------------------------------------------------------------------

    async def interrupt(self, trainer: TrainerProcess, notice: InstanceNotice) -> int:
        """Commit what can make it before the deadline, report before the deadline, exit 75.

        The commit runs until the cutoff (the deadline less the report's reserve) at the latest; the report
        then has the reserve to leave, whatever state the store or the trainer is in.
        """
        noticed = time.monotonic()
        deadline = notice.deadline or datetime.now(UTC) + timedelta(seconds=self.options.stop_grace_seconds)
        window = (deadline - datetime.now(UTC)).total_seconds()
        ends_at = noticed + window
        self.exit_by = ends_at
        cutoff = ends_at - self.options.report_reserve(window)
        commit = NoticeCommit(
            self.periodic_sync.sync,
            cutoff=cutoff,
            trainer=trainer,
            step_seconds=lambda: self.progress.step_seconds,
            trainer_step=self._trainer_step,
        )
        outcome = await commit.run()
        await self.periodic_sync.await_marker(outcome.committed, cutoff)
        await self.reports.report_progress(force=True)
        self.reports.interrupted(notice, deadline, noticed, outcome)
        # The report leaves while what is still committing goes on: the machine is there until the deadline.
        finishing = asyncio.create_task(commit.finish(until=ends_at - 0.2))
        delivered = await self.reports.drain(timeout=max(ends_at - time.monotonic() - 0.2, 0.1))
        if not delivered:
            log.error("the interrupted report may not have left before the deadline")
        await finishing
        # Not in by the cutoff: the others still commit theirs.
        await self.periodic_sync.await_marker(outcome.committed, ends_at - 0.5)
        await self.reports.drain(timeout=max(ends_at - time.monotonic() - 0.1, 0.1))  # a late checkpoint_saved
        if outcome.fresh == "committed" and not trainer.frozen:
            await self._reap(trainer, deadline)  # it is shutting down after its save: let it, until the deadline
        elif trainer.running:
            trainer.kill()  # nothing it does now can be committed any more
            await trainer.wait()
        return EXIT_INTERRUPTED

    async def _trainer_step(self) -> int | None:
        """The step the trainer has reached, from its progress file as it is now."""
        await self.progress.refresh()
        return self.progress.state.step

    @staticmethod
    async def _reap(trainer: TrainerProcess, deadline: datetime) -> None:
        """Let the trainer finish exiting on its own, but not past the deadline."""
        remaining = max((deadline - datetime.now(UTC)).total_seconds(), 1.0)
        try:
            await asyncio.wait_for(asyncio.shield(trainer.wait()), remaining)
        except TimeoutError:
            trainer.kill()
            await trainer.wait()
