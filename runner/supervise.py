"""Supervising the trainer: start it, watch it, restart it from the last checkpoint, and hand each exit on.

The trainer runs in a process box (:mod:`runner.trainer_box`): whatever it started is swept before the next one
starts and when the attempt ends. While it runs, periodic sync and progress reports go on in the background and
notices are read: an early signal (a rebalance, the bot's save request) commits a fresh checkpoint without stopping
the trainer (:mod:`runner.early_save`), an interrupting one ends the watch. How the
trainer ended decides what follows, each handed to the part it belongs to (:class:`Exits`): exit 0 completes the
job, an interrupting notice goes to the notice path, a gang's trainer that ended stands by for the next
generation, and a crash is restarted from the newest complete checkpoint up to ``max_restarts`` times. A trainer
that stops stepping without exiting is hung (:mod:`runner.hang_watch`): its stacks recorded and reported, it is
ended and restarted from the newest complete checkpoint; a second hang in the attempt ends the attempt (exit 75),
so the job moves to another instance (a hang can be the host's).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handlers.failures import Failure
from handlers.reports import InstanceNotice, StandbyCause
from handlers.spec import JobSpec
from runner.early_save import commit_fresh
from runner.exit_codes import EXIT_FAILED, EXIT_INTERRUPTED
from runner.hang_watch import HangWatch, Stacks, Stall, dump_stacks
from runner.local_checkpoints import newest_complete
from runner.options import RunnerOptions
from runner.periodic_sync import PeriodicSync
from runner.reports.attempt import AttemptReports
from runner.trainer import TrainerFiles, TrainerProcess, TrainerStartError
from runner.trainer_box import TrainerBox

log = logging.getLogger(__name__)

HANGS_PER_ATTEMPT = 2  # the hang that ends the attempt: the first is restarted in place


@dataclass(frozen=True, slots=True)
class Regrouped:
    """A gang node that stood by was given the next generation: train again from ``resume_from``."""

    resume_from: Path | None


@dataclass(frozen=True, slots=True)
class Restart:
    """One node's hung trainer was ended: start it again from ``resume_from`` (None: from the start)."""

    resume_from: Path | None


@dataclass(frozen=True, slots=True)
class Hang:
    """The trainer was found hung (``stall``), its processes' stacks recorded (``stacks``) while it still ran."""

    stall: Stall
    stacks: Stacks


@dataclass(frozen=True, slots=True)
class Exits:
    """Where each end of the trainer goes: all return the attempt's exit code (``stood_by``: or a regroup)."""

    completed: Callable[[], Awaitable[int]]
    interrupted: Callable[[TrainerProcess, InstanceNotice], Awaitable[int]]
    stood_by: Callable[[StandbyCause, int | None, TrainerProcess], Awaitable[int | Regrouped]]


def trainer_env(spec: JobSpec, options: RunnerOptions) -> dict[str, str]:
    """The recipe's environment, and a gang's world in torchrun's and ms-swift's names."""
    gang = spec.gang
    if gang is None:
        return dict(spec.env)
    return {
        **spec.env,
        "NNODES": str(gang.nodes),
        "NODE_RANK": str(gang.node_rank),
        "MASTER_ADDR": gang.master_addr,
        "MASTER_PORT": str(gang.master_port),
        "FINETUNE_COLLECTIVE_TIMEOUT_SECONDS": str(int(options.collective_timeout_seconds)),
    }


class TrainerSupervisor:
    """``spec`` is the attempt's spec as it is now (a gang's regroup gives it the next generation)."""

    def __init__(
        self,
        spec: JobSpec,
        options: RunnerOptions,
        files: TrainerFiles,
        reports: AttemptReports,
        periodic_sync: PeriodicSync,
        notices: asyncio.Queue[InstanceNotice],
        credentials_watch: Callable[[], Coroutine[Any, Any, None]] | None,
    ) -> None:
        self.spec = spec
        self.options = options
        self.files = files
        self.output_dir = files.output_dir
        self.reports = reports
        self.periodic_sync = periodic_sync
        self.notices = notices
        self.credentials_watch = credentials_watch
        self._box: TrainerBox | None = None  # made when the attempt runs: the runner becomes a subreaper then

    def open_box(self) -> None:
        self._box = TrainerBox()

    async def end_trainer(self, trainer: TrainerProcess | None = None) -> None:
        """Every process the trainer started is gone (``runner.trainer_box``); its main process, awaited by
        asyncio, is spared the reaping only."""
        if self._box is not None:
            await asyncio.to_thread(self._box.sweep, trainer.process.pid if trainer is not None else None)

    async def supervise(self, resume_from: Path | None, exits: Exits) -> int:
        restarts = hangs = 0
        while True:
            await self.end_trainer()  # an earlier trainer's leftovers must not race this one's hand-over
            try:
                trainer = await TrainerProcess.start(
                    self.spec.command,
                    trainer_env(self.spec, self.options),
                    resume_from,
                    self.files,
                    echo=self.options.echo_trainer,
                    setup=self.options.trainer,
                    box=self._box,
                )
            except TrainerStartError as exc:
                self.reports.failed(exc.failure, step=self.reports.progress.state.step)
                return EXIT_FAILED
            outcome = await self._watch(trainer)
            if isinstance(outcome, Hang):
                hangs += 1
                hung = await self._hung(trainer, outcome, hangs >= HANGS_PER_ATTEMPT, exits)
                if isinstance(hung, int):
                    return hung
                if isinstance(hung, Regrouped):
                    resume_from, restarts = hung.resume_from, 0
                else:
                    resume_from = hung.resume_from or resume_from
                continue
            if isinstance(outcome, InstanceNotice):
                interrupted = await exits.interrupted(trainer, outcome)
                await self.end_trainer(trainer)
                return interrupted
            await self.end_trainer(trainer)  # what it left running races nothing of ours from here on
            if self.spec.gang is not None and (outcome != 0 or trainer.stopped_on_request):
                # The gang stopped on a peer's notice, or a peer was lost: one node cannot train on alone.
                cause: StandbyCause = "stopped" if outcome == 0 else "trainer-exited"
                stood_by = await exits.stood_by(cause, None if outcome == 0 else outcome, trainer)
                if isinstance(stood_by, int):
                    return stood_by
                resume_from, restarts = stood_by.resume_from, 0
                continue
            if outcome == 0:
                return await exits.completed()
            newest = newest_complete(self.output_dir)
            await self.periodic_sync.commit_newest("periodic", newest)
            if restarts >= self.spec.max_restarts:
                if trainer.tail:
                    why = Failure.of("trainer-exited", exit_code=outcome, restarts=restarts, line=trainer.tail[-1])
                else:
                    why = Failure.of("trainer-exited-silent", exit_code=outcome, restarts=restarts)
                step = self.reports.progress.state.step
                self.reports.failed(why, step=step, exit_code=outcome, log_tail=list(trainer.tail))
                return EXIT_FAILED
            restarts += 1
            resume_from = newest.path if newest else resume_from
            self.reports.warning(
                "trainer-restart",
                f"trainer exited with code {outcome}; restart {restarts} of {self.spec.max_restarts} "
                f"from step {newest.step if newest else 'scratch'}",
            )

    async def _hung(self, trainer: TrainerProcess, hang: Hang, last: bool, exits: Exits) -> int | Regrouped | Restart:
        """End a hung trainer and say so; what follows: a restart from the newest complete checkpoint (one node), a
        gang node's standing by (as when its trainer exits), or the attempt's exit code (``last``: its second
        hang; the job moves elsewhere)."""
        stall = hang.stall
        log.error(
            "the trainer is hung at step %s: no step for %.0fs (limit %.0fs); its stacks (%s):\n%s",
            stall.step, stall.seconds, stall.limit, hang.stacks.how, hang.stacks.text() or "(none could be taken)",
        )  # fmt: skip
        trainer.kill()
        await self.end_trainer(trainer)
        await trainer.wait()
        newest = newest_complete(self.output_dir)
        await self.periodic_sync.commit_newest("periodic", newest)
        gang = self.spec.gang is not None
        restart_from = None if last or gang or newest is None else newest.step
        self.reports.hung(hang.stall, hang.stacks, restart_from=restart_from, ends_attempt=last and not gang)
        if gang:
            return await exits.stood_by("trainer-exited", trainer.process.returncode, trainer)
        if last:
            return EXIT_INTERRUPTED
        return Restart(newest.path if newest is not None else None)

    async def _watch_hang(self, trainer: TrainerProcess) -> Hang:
        """Until the trainer is hung: then its stacks, taken while it still runs."""
        watch = HangWatch(self.spec.hang, self.reports.progress, self.output_dir)
        stall = await watch.hung()
        pids = self._box.members() if self._box is not None else [trainer.process.pid]
        stacks = await asyncio.to_thread(dump_stacks, pids, self.files.stop_file)
        return Hang(stall, stacks)

    async def _watch(self, trainer: TrainerProcess) -> int | InstanceNotice | Hang:
        """Until the trainer exits (its code), an interrupting notice arrives (the notice) or it hangs (the hang)."""
        background: list[asyncio.Task[Any]] = [
            asyncio.create_task(self.periodic_sync.loop(), name="sync"),
            asyncio.create_task(self.reports.progress_loop(), name="progress"),
        ]
        if self.credentials_watch is not None:
            background.append(asyncio.create_task(self.credentials_watch(), name="credentials"))
        exited = asyncio.create_task(trainer.wait(), name="trainer")
        hung = asyncio.create_task(self._watch_hang(trainer), name="hang-watch")
        background.append(hung)
        early: asyncio.Task[int | None] | None = None
        try:
            while True:
                next_notice = asyncio.create_task(self.notices.get())
                await asyncio.wait({exited, next_notice, hung}, return_when=asyncio.FIRST_COMPLETED)
                if exited.done():
                    # A trainer that finished on its own wins over a notice that raced it.
                    if next_notice.done():
                        self.notices.put_nowait(next_notice.result())
                    next_notice.cancel()
                    await self.reports.report_progress(force=True)
                    if exited.result() == 0 and not (self.spec.gang is not None and trainer.stopped_on_request):
                        await (
                            self.periodic_sync.sync.aclose()
                        )  # the job is done: its final output matters, not checkpoints
                    return exited.result()
                if hung.done() and not next_notice.done():
                    next_notice.cancel()
                    return hung.result()
                notice = next_notice.result()
                self.reports.notice(notice)
                if notice.interrupts:
                    return notice
                if early is None or early.done():  # one fresh save at a time: a second signal joins the first
                    early = asyncio.create_task(self._early_save(trainer), name="early-save")
                    background.append(early)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    async def _early_save(self, trainer: TrainerProcess) -> int | None:
        """An early signal (rebalance, the bot's save request): a fresh checkpoint committed, training goes on."""
        progress = self.reports.progress
        return await commit_fresh(
            trainer, self.periodic_sync, lambda: progress.state.step, self.options.early_save_seconds
        )

    # -- the output directory ---------------------------------------------------------------------------------

    def reset_output_dir(self) -> None:
        """The store is the truth: local leftovers of an earlier run on this disk are not resumed from."""
        self.reclaim_output_dir()
        if any(self.output_dir.iterdir()):
            log.info("clearing leftovers in %s", self.output_dir)
            shutil.rmtree(self.output_dir)  # by descriptors, never into a link (shutil's own guard)
            self.output_dir.mkdir()
        self.files.progress_file.unlink(missing_ok=True)

    def reclaim_output_dir(self) -> None:
        """``output/`` is a real directory again before the runner writes into it by name: an earlier trainer
        (all its processes gone by now) owned it and may have left a link to anywhere in its place."""
        if self.output_dir.is_symlink() or (self.output_dir.exists() and not self.output_dir.is_dir()):
            log.warning("%s was not a directory (the trainer left something else there): made anew", self.output_dir)
            self.output_dir.unlink()
        self.output_dir.mkdir(parents=True, exist_ok=True)

    def keep_only(self, path: Path | None) -> None:
        """The output directory holds the restored checkpoint and nothing else (a newer half-written save, the
        previous generation's leftovers: the store is the truth)."""
        for entry in list(self.output_dir.iterdir()):
            if path is not None and entry == path:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
