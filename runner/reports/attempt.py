"""What one attempt says to the bot: every report the runner sends, built here with the attempt's ids.

The parts of the runner (the supervisor, the notice path, periodic sync, the completion) say what happened in
their own words (``failed``, ``checkpoint_saved``, ``interrupted`` …); this builds the report and hands it to the
:class:`~runner.reports.reporter.Reporter`, which delivers it in the background. Progress is read from the
trainer's progress file and reported at most once per ``progress_seconds`` unless forced.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime

from handlers.failures import Failure
from handlers.reports import (
    CheckpointSaved,
    Completed,
    Failed,
    Hung,
    InstanceNotice,
    Interrupted,
    Progress,
    RunnerReport,
    RunnerWarning,
    Standby,
    StandbyCause,
    Started,
)
from handlers.reports import Notice as NoticeReport
from handlers.spec import JobSpec
from runner.checkpoint_sync import SyncReason
from runner.checkpoints import Committed, Restored
from runner.hang_watch import Stacks, Stall
from runner.notice_commit import NoticeOutcome
from runner.progress import ProgressTail
from runner.reports.reporter import Reporter


class AttemptReports:
    """The attempt's reports. ``spec`` is the attempt's spec as it is now (a gang's regroup changes the ids)."""

    def __init__(self, spec: JobSpec, reporter: Reporter, progress: ProgressTail, progress_seconds: float) -> None:
        self.spec = spec
        self.reporter = reporter
        self.progress = progress
        self.progress_seconds = progress_seconds
        self._last_progress_report = 0.0
        self._last_reported_step: int | None = None

    @property
    def ids(self) -> dict[str, str | int]:
        ids: dict[str, str | int] = {"job_id": self.spec.job_id, "attempt": self.spec.attempt}
        if self.spec.gang is not None:
            ids.update(node_rank=self.spec.gang.node_rank, generation=self.spec.gang.generation)
        return ids

    def emit(self, report: RunnerReport) -> None:
        self.reporter.emit(report)

    async def drain(self, timeout: float) -> bool:
        return await self.reporter.drain(timeout)

    # -- the attempt's course ---------------------------------------------------------------------------------

    def started(self, restored: Restored, instance_id: str | None) -> None:
        self.emit(
            Started(
                **self.ids,
                resumed_from_step=restored.step,
                restored_uri=restored.uri,
                restore_seconds=round(restored.seconds, 3),
                restored_bytes=restored.fetched_bytes,
                skipped=restored.skipped,
                instance_id=instance_id,
            )
        )

    def failed(
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
        self.emit(report)

    def completed(
        self, output_uri: str, step: int | None, total_steps: int | None = None, already_complete: bool = False
    ) -> None:
        self.emit(
            Completed(
                **self.ids,
                step=step,
                total_steps=total_steps,
                output_uri=output_uri,
                already_complete=already_complete,
            )
        )

    def standby(
        self,
        cause: StandbyCause,
        step: int | None = None,
        exit_code: int | None = None,
        rebuilt: dict[str, str] | None = None,
    ) -> None:
        self.emit(Standby(**self.ids, step=step, cause=cause, exit_code=exit_code, rebuilt=rebuilt))

    def warning(self, kind: str, message: str) -> None:
        self.emit(RunnerWarning(**self.ids, kind=kind, message=message))

    def hung(self, stall: Stall, stacks: Stacks, restart_from: int | None, ends_attempt: bool) -> None:
        """The trainer was found hung and ended: where it hung, for how long, the top of its stack."""
        self.emit(
            Hung(
                **self.ids,
                step=stall.step,
                seconds=round(stall.seconds, 1),
                limit_seconds=round(stall.limit, 1),
                frames=stacks.frames,
                ranks=len(stacks.dumps),
                restart_from=restart_from,
                ends_attempt=ends_attempt,
            )
        )

    def outage(self, kind: str) -> Callable[[str], None]:
        """Report the first failure of an outage of one notice source (the watcher calls this once per outage)."""
        return lambda message: self.warning(kind, message)

    # -- checkpoints ------------------------------------------------------------------------------------------

    def checkpoint_saved(self, committed: Committed, reason: SyncReason) -> None:
        self.emit(
            CheckpointSaved(
                **self.ids,
                step=committed.step,
                uri=committed.uri,
                bytes=committed.bytes,
                seconds=round(committed.seconds, 3),
                reason=reason,
                save_seconds=round(committed.save_seconds, 3) if committed.save_seconds is not None else None,
                upload_bytes_per_second=committed.upload_bytes_per_second,
            )
        )

    def storage_trouble(self, message: str) -> None:
        self.warning("storage", message)

    # -- notices ----------------------------------------------------------------------------------------------

    def notice(self, notice: InstanceNotice) -> None:
        self.emit(NoticeReport(**self.ids, kind=notice.kind, source=notice.source, deadline=notice.deadline))

    def interrupted_standing_by(self, notice: InstanceNotice, step: int | None, reached: int | None) -> None:
        """Interrupted while standing by: ``step`` committed, ``reached`` trained, nothing left to commit."""
        self.emit(
            Interrupted(**self.ids, reason=notice.kind, step=step, deadline=notice.deadline, reached_step=reached)
        )

    def interrupted(self, notice: InstanceNotice, deadline: datetime, noticed: float, outcome: NoticeOutcome) -> None:
        now = time.monotonic()
        # save: notice → the fresh checkpoint complete on disk (none: 0); upload: from then to the commit's end.
        saved = outcome.fresh_complete_at if outcome.fresh_complete_at is not None else noticed
        committed = outcome.committed
        self.emit(
            Interrupted(
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
        )

    # -- progress ---------------------------------------------------------------------------------------------

    async def progress_loop(self) -> None:
        while True:
            await asyncio.sleep(min(self.progress_seconds, 1.0) or 0.2)
            await self.report_progress()

    async def report_progress(self, force: bool = False) -> None:
        """Report a step we have not reported yet, at most once per ``progress_seconds`` unless forced."""
        await self.progress.refresh()
        state = self.progress.state
        if state.step is None or state.step == self._last_reported_step:
            return
        now = time.monotonic()
        if force or now - self._last_progress_report >= self.progress_seconds:
            self._last_progress_report = now
            self._last_reported_step = state.step
            self.emit(
                Progress(**self.ids, step=state.step, total_steps=state.total_steps, loss=state.loss, epoch=state.epoch)
            )

