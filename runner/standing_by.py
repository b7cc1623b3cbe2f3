"""Waiting for the bot's word with no trainer running: a gang node for its regroup, a runner launched ahead for its go.

A gang node whose trainer ended without a notice of its own (the gang stopped, or a peer was lost) commits its
part, says ``standby`` and keeps its instance until the bot gives it the next generation or stops it. A peer lost:
it says so first (``peer-lost``), and the step its trainer held when the world broke becomes the gang's checkpoint,
the lost nodes' parts rebuilt by rule (``runner.held``). A runner launched ahead of a switch of market
(``JobSpec.handover``), or a gang's replacement launched the moment its node was lost, says ``standby`` (cause
handover) and restores nothing until the checkpoint it must restore is committed and the bot says go. Either way a
notice that interrupts ends the wait (:meth:`runner.notice_path.NoticePath.standing_by`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from handlers.reports import StandbyCause
from handlers.spec import Gang, JobSpec, control_key, node_control_key
from runner.errors import NoticeUnavailable
from runner.held import read_held
from runner.local_checkpoints import newest_complete
from runner.notice_path import NoticePath
from runner.notices.control import read_go, read_regroup
from runner.options import RunnerOptions
from runner.periodic_sync import PeriodicSync
from runner.reports.attempt import AttemptReports
from runner.storage.attempt_credentials import AttemptCredentials
from runner.storage.base import ObjectStore
from runner.supervise import Regrouped
from runner.trainer import TrainerProcess

log = logging.getLogger(__name__)


class StandingBy:
    def __init__(
        self,
        options: RunnerOptions,
        store: ObjectStore,
        reports: AttemptReports,
        periodic_sync: PeriodicSync,
        notice: NoticePath,
        credentials: AttemptCredentials | None,
    ) -> None:
        self.options = options
        self.store = store
        self.reports = reports
        self.periodic_sync = periodic_sync
        self.notice = notice
        self.credentials = credentials

    async def gang(
        self,
        spec: JobSpec,
        cause: StandbyCause,
        exit_code: int | None,
        trainer: TrainerProcess,
        regroup: Callable[[Gang], Awaitable[Regrouped]],
    ) -> int | Regrouped:
        """A gang node whose instance got no notice and whose trainer ended: commit its part, say so, and wait
        for the bot's regroup (the next generation, handed to ``regroup``) or stop, keeping the instance (and its
        storage session)."""
        gang = spec.gang
        assert gang is not None
        if cause == "trainer-exited":  # a peer may be lost: said at once, so the bot looks at it in seconds
            self.reports.standby("peer-lost", exit_code=exit_code)
        newest = newest_complete(
            self.periodic_sync.output_dir, trainer_exited_cleanly=cause == "stopped" and not trainer.killed
        )
        held = read_held(newest.path) if newest is not None and cause == "trainer-exited" else None
        await self.periodic_sync.commit_newest("notice" if cause == "stopped" else "periodic", newest)
        own = self.periodic_sync.sync.committed_step
        rebuilt = None
        if held is not None and own == held.step:  # the step this node held when its world broke: the gang's
            rebuilt = await self.periodic_sync.commit_held(held)
        # After a stop every node saves the same step, so its marker comes; a lost peer's part never will.
        wait = self.options.gang_wait_seconds if cause == "stopped" else 0.0
        step = await self.periodic_sync.newest_marked(own, wait)
        self.reports.standby(cause, step=step, exit_code=exit_code, rebuilt=rebuilt)
        log.warning("standing by for the gang's next generation (checkpoint-%s complete)", step)
        background = []
        if self.credentials is not None:
            background.append(
                asyncio.create_task(self.periodic_sync.watch_credentials(self.credentials), name="credentials")
            )
        key = node_control_key(spec.attempt, gang.generation, gang.node_rank)
        try:
            while True:
                try:
                    word = await read_regroup(self.store, key)
                except NoticeUnavailable as exc:
                    log.warning("%s", exc)
                    word = None
                if word is not None and word.gang.generation > gang.generation:
                    return await regroup(word.gang)
                ended = await self.notice.standing_by(step, own)
                if ended is not None:
                    return ended
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    async def handover(self, spec: JobSpec) -> int | None:
        """Launched ahead of a switch of market: say the instance is up (``standby``, cause handover) and wait for the
        bot's go before restoring anything, since the previous attempt trains on until then and commits on this
        word. None to go on; an exit code when a stop or this instance's own interruption comes first (nothing of
        this attempt to commit)."""
        self.reports.standby("handover")
        log.warning("launched ahead of a switch of market: waiting for the previous attempt's checkpoint")
        key = control_key(spec.attempt)
        while True:
            try:
                if await read_go(self.store, key):
                    log.info("the previous attempt is done: restoring")
                    return None
            except NoticeUnavailable as exc:
                log.warning("%s", exc)
            ended = await self.notice.standing_by(None, None)
            if ended is not None:
                return ended
