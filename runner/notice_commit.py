"""From the notice to the machine's end: commit the best checkpoint that can make it, never let the trainer train a
step that will not be committed, and know what was given up.

The cutoff is the deadline less the time reserved for the ``interrupted`` report. Every ``tick`` the output
directory is looked at, the situation handed to :func:`runner.commit_plan.plan` and its drops applied; until the
trainer has been asked for its fresh save, the plan's decision is carried out anew each time: ``ask`` (the stop
request), or ``halt`` / ``wait`` (the trainer is held where it is, frozen, as soon as no save is being written; a
later look that finds a save fits thaws it and asks). Uploads in flight when the notice came are kept going, fresh
checkpoints go up as they are written. :meth:`NoticeCommit.run` ends as soon as nothing is left that could still
commit, or at the cutoff; the caller then reports, and :meth:`NoticeCommit.finish` keeps what is still committing
going until the machine is taken (a commit that lands then is reported as ``checkpoint_saved``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from handlers.reports import GivenUp, Late
from runner.checkpoint_sync import CheckpointSync
from runner.checkpoints import Committed
from runner.commit_plan import MiB, Plan, Situation, plan
from runner.local_checkpoints import complete_checkpoints, list_checkpoint_dirs, stack_step
from runner.trainer import TrainerState

log = logging.getLogger(__name__)

FreshOutcome = Literal["committed", "not-asked", "not-saved", "not-uploaded"]
Decision = Literal["pending", "asked", "held", "exited"]
CANCEL_WAIT_SECONDS = 0.5  # what cancelled uploads get to wind down before the runner exits regardless


class NoticeTrainer(Protocol):
    """What the notice path does to the trainer: ask it to save and stop, or hold it where it is (frozen)."""

    @property
    def watches_stop_file(self) -> bool: ...

    def state(self) -> TrainerState: ...

    def request_stop(self) -> None: ...

    def freeze(self) -> None: ...

    def thaw(self) -> None: ...


@dataclass(slots=True)
class NoticeOutcome:
    committed: Committed | None
    fresh: FreshOutcome
    fresh_step: int | None = None
    asked_at: float | None = None
    fresh_complete_at: float | None = None
    ended_at: float = 0.0
    saved_in_time: bool = False
    reached_step: int | None = None  # the trainer's step when it stopped (exited, held, or at the report)
    committing: list[int] = field(default_factory=list)  # still going up when the report left
    held: bool = False  # the trainer is frozen: nothing it does from here on can be committed
    given_up: list[GivenUp] = field(default_factory=list)
    note: str | None = None  # ``late`` in English, for the log and the job's history
    late: Late | None = None


class NoticeCommit:
    def __init__(
        self,
        sync: CheckpointSync,
        *,
        cutoff: float,
        trainer: NoticeTrainer,
        step_seconds: Callable[[], float | None] = lambda: None,
        trainer_step: Callable[[], Awaitable[int | None]] | None = None,
        tick: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sync = sync
        self.cutoff = cutoff
        self.trainer = trainer
        self.step_seconds = step_seconds
        self.trainer_step = trainer_step
        self.tick = tick
        self.clock = clock
        self.decision: Decision = "pending"
        self._started = clock()

    async def run(self) -> NoticeOutcome:
        sync, trainer = self.sync, self.trainer
        self._started = self.clock()
        sync.enter_notice_mode()
        output_dir = sync.output_dir
        complete_at_notice = {checkpoint.step for checkpoint in complete_checkpoints(output_dir)}
        committed_at_notice = sync.committed_step
        why = ""
        reasoning: Plan | None = None  # the plan the last decision was made on
        complete_when_asked = -1  # newest complete checkpoint when the trainer was asked: the fresh one is newer
        asked_at: float | None = None
        fresh_step: int | None = None
        gone_without_saving = False
        while self.clock() < self.cutoff:
            state = trainer.state()
            sync.scan(exited_cleanly=state == "exited-cleanly")
            if state == "exited":  # killed or crashed: what it was writing will never be complete
                for candidate in sync.situation():
                    if not candidate.complete:
                        sync.give_up(candidate.step, "the trainer exited before finishing it")
            decided = plan(
                Situation(
                    seconds_left=self.cutoff - self.clock(),
                    candidates=tuple(sync.situation()),
                    rate=sync.checkpoints.meter.rate,
                    save_seconds=sync.save_seconds,
                    step_seconds=self.step_seconds(),
                    checkpoint_bytes=sync.checkpoint_bytes,
                    watches_stop_file=trainer.watches_stop_file,
                )
            )
            for step, reason in decided.drop:
                sync.give_up(step, reason)
            writing = any(not candidate.complete for candidate in sync.situation())
            if self.decision in ("pending", "held"):
                why, reasoning = decided.why, decided
                if state != "running":
                    if self.decision == "pending":
                        why, self.decision = "the trainer had already exited", "exited"
                elif decided.fresh == "ask":
                    if self.decision == "held":
                        trainer.thaw()
                    complete_when_asked = max((c.step for c in complete_checkpoints(output_dir)), default=-1)
                    log.warning("asking the trainer for a fresh checkpoint: %s", why)
                    trainer.request_stop()
                    self.decision, asked_at = "asked", self.clock()
                elif self.decision == "pending" and not writing:
                    log.warning("holding the trainer where it is, no fresh checkpoint asked for: %s", why)
                    trainer.freeze()
                    self.decision = "held"
            if self.decision == "asked":
                newer = [c.step for c in list_checkpoint_dirs(output_dir) if c.step > complete_when_asked]
                fresh_step = max(newer, default=fresh_step)
                gone_without_saving = fresh_step is None and state != "running"
            if self._settled(state, fresh_step, gone_without_saving):
                break
            await sync.wait_any(min(self.tick, max(self.cutoff - self.clock(), 0.0)))

        outcome = NoticeOutcome(committed=sync.committed, fresh="not-asked", fresh_step=fresh_step, asked_at=asked_at)
        outcome.ended_at = self.clock()
        outcome.held = self.decision == "held"
        if self.decision == "asked":
            if fresh_step is not None and outcome.committed is not None and outcome.committed.step >= fresh_step:
                outcome.fresh = "committed"
            elif fresh_step is not None and (
                sync.complete_time(fresh_step) is not None
                or fresh_step in {c.step for c in complete_checkpoints(output_dir)}
            ):
                outcome.fresh = "not-uploaded"
            else:
                outcome.fresh = "not-saved"
        if fresh_step is not None:
            outcome.fresh_complete_at = sync.complete_time(fresh_step)
        outcome.committing = sorted(sync.flights)
        outcome.given_up = self._given_up_list(outcome, why, gone_without_saving)
        committed_step = outcome.committed.step if outcome.committed else None
        outcome.reached_step = await self.trainer_step() if self.trainer_step is not None else None
        if outcome.reached_step is None and fresh_step is not None:
            outcome.reached_step = self._saved_at(fresh_step)
        if outcome.reached_step is not None:
            outcome.saved_in_time = committed_step is not None and committed_step >= outcome.reached_step
        else:  # a trainer that writes no progress: only a commit made after the notice counts
            outcome.saved_in_time = (
                committed_step is not None
                and committed_step not in complete_at_notice
                and (committed_at_notice is None or committed_step > committed_at_notice)
            )
        outcome.note = self._note(outcome, why, gone_without_saving)
        outcome.late = self._late(outcome, reasoning, gone_without_saving)
        return outcome

    def _saved_at(self, fresh_step: int) -> int | None:
        """A trainer that writes no progress: the step its fresh save holds, once complete (a trainer asked to stop
        saves the step it is at and trains no further; Hugging Face's ``global_step`` where it says so)."""
        for checkpoint in complete_checkpoints(self.sync.output_dir):
            if checkpoint.step == fresh_step:
                return stack_step(checkpoint.path) or fresh_step
        return None

    def _settled(self, state: TrainerState, fresh_step: int | None, gone: bool) -> bool:
        """Whether anything more could still be committed before the cutoff."""
        left = self.sync.situation()
        committed = self.sync.committed_step
        if self.decision == "asked":
            if state != "running":
                return not left or gone  # the trainer is done: once what it left is committed (or given up)
            # A trainer that watches the stop file trains no further after its fresh save; one that only handles
            # SIGTERM may still be about to save the step after it: wait for it to exit.
            return (
                self.trainer.watches_stop_file
                and fresh_step is not None
                and committed is not None
                and committed >= fresh_step
            )
        return self.decision in ("held", "exited") and not left

    async def finish(self, until: float) -> None:
        """After the report: keep committing what is still in flight (and a fresh save still being written) until
        ``until`` (the machine is taken then); give up what is left at that point."""
        sync = self.sync
        while self.clock() < until:
            state = self.trainer.state()
            sync.scan(exited_cleanly=state == "exited-cleanly")
            saving = self.decision == "asked" and state == "running"  # its fresh save may be yet to come
            if not sync.situation() and not saving:
                break
            await sync.wait_any(min(self.tick, max(until - self.clock(), 0.0)))
        tasks = []
        for step, flight in list(sync.flights.items()):
            up, total = flight.upload.bytes_uploaded, flight.upload.bytes_on_disk
            tasks.append(flight.task)
            progress = f"{up / MiB:.0f} of {total / MiB:.0f} MiB up"
            sync.give_up(step, f"did not finish uploading before the deadline ({progress})")
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_WAIT_SECONDS)

    def _given_up_list(self, outcome: NoticeOutcome, why: str, gone: bool) -> list[GivenUp]:
        sync = self.sync
        committed = outcome.committed.step if outcome.committed else None
        found = [
            GivenUp(step=step, reason=self._with_failure(step, reason))
            for step, reason in sorted(sync.given_up.items())
            if committed is None or step > committed
        ]
        if outcome.fresh == "not-asked":
            found.append(GivenUp(reason=f"no fresh save asked for: {why}"))
        elif outcome.fresh == "not-saved":
            found.append(GivenUp(reason=self._not_saved(gone)))
        return found

    def _with_failure(self, step: int, reason: str) -> str:
        failure = self.sync.failures.get(step) or self._store_trouble()
        return f"{reason}; last upload error: {failure}" if failure is not None else reason

    def _store_trouble(self) -> str | None:
        """What the store answered to failed requests since the notice (its SDK retries them out of sight)."""
        last = self.sync.checkpoints.store.last_error
        return last[1] if last is not None and last[0] >= self._started else None

    def _trouble(self, committed: Committed | None) -> str | None:
        newer = [step for step in sorted(self.sync.failures) if committed is None or step > committed.step]
        return str(self.sync.failures[newer[-1]]) if newer else self._store_trouble()

    @staticmethod
    def _not_saved(gone: bool) -> str:
        if gone:
            return "the trainer exited without saving a checkpoint"
        return "the trainer did not save a checkpoint in time"

    def _late(self, outcome: NoticeOutcome, reasoning: Plan | None, gone: bool) -> Late | None:
        """What :meth:`_note` says, as codes and values (the bot words it in the channel's language)."""
        if outcome.fresh == "committed":
            return None
        trouble = self._trouble(outcome.committed)
        if trouble is not None:
            return Late(cause="upload-failed", error=trouble)
        if outcome.fresh == "not-asked":
            if self.decision == "exited" or reasoning is None:
                return Late(cause="not-asked", why="trainer-exited" if self.decision == "exited" else "no-rate")
            return Late(
                cause="not-asked",
                why=reasoning.because or "no-rate",
                step=reasoning.saving,
                need_seconds=reasoning.need_seconds,
                left_seconds=reasoning.left_seconds,
            )
        if outcome.fresh == "not-saved":
            return Late(cause="trainer-gone" if gone else "not-saved")
        return Late(cause="not-uploaded", step=outcome.fresh_step)

    def _note(self, outcome: NoticeOutcome, why: str, gone: bool) -> str | None:
        if outcome.fresh == "committed":
            return None
        committed = outcome.committed
        kept = f"committed checkpoint-{committed.step}" if committed else "nothing is committed"
        if outcome.committing:
            kept += f", still committing checkpoint-{outcome.committing[-1]}"
        trouble = self._trouble(committed)
        if trouble is not None:
            return f"upload failed before the deadline: {trouble}; {kept}"
        if outcome.fresh == "not-asked":
            return f"no fresh save asked for: {why}; {kept}"
        if outcome.fresh == "not-saved":
            return f"{self._not_saved(gone)}; {kept}, the newest complete one"
        return f"the fresh checkpoint-{outcome.fresh_step} was not uploaded by the report; {kept}"
