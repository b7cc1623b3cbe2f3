"""From the notice to the cutoff: commit the best checkpoint that can make it, and know what was given up.

The cutoff is the deadline less the time reserved for the ``interrupted`` report. Every ``tick`` the output
directory is looked at, the situation handed to :func:`runner.commit_plan.plan`, its drops applied and, once,
its fresh-save decision carried out (``ask_to_save``: SIGTERM to the trainer). Uploads in flight when the
notice came are kept going, fresh checkpoints go up as they are written. It ends as soon as nothing is left
that could still commit, or at the cutoff, when whatever is still uploading is cancelled (every store call
on this path is a task cancelled then, not a call the clock is checked after). The caller reports.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from handlers.events import GivenUp, Late
from runner.checkpoints import Committed
from runner.commit_plan import MiB, Plan, Situation, plan
from runner.local_checkpoints import complete_checkpoints, list_checkpoint_dirs
from runner.sync import CheckpointSync

log = logging.getLogger(__name__)

TrainerState = Literal["running", "exited-cleanly", "exited"]
FreshOutcome = Literal["committed", "not-asked", "not-saved", "not-uploaded"]
CANCEL_WAIT_SECONDS = 0.5  # what cancelled uploads get to wind down before the report goes regardless


@dataclass(slots=True)
class NoticeOutcome:
    committed: Committed | None
    fresh: FreshOutcome
    fresh_step: int | None = None
    asked_at: float | None = None
    fresh_complete_at: float | None = None
    ended_at: float = 0.0
    saved_in_time: bool = False
    given_up: list[GivenUp] = field(default_factory=list)
    note: str | None = None  # ``late`` in English, for the log and the job's history
    late: Late | None = None


class NoticeCommit:
    def __init__(
        self,
        sync: CheckpointSync,
        *,
        cutoff: float,
        ask_to_save: Callable[[], None],
        trainer_state: Callable[[], TrainerState],
        step_seconds: Callable[[], float | None] = lambda: None,
        trainer_step: Callable[[], int | None] = lambda: None,
        tick: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sync = sync
        self.cutoff = cutoff
        self.ask_to_save = ask_to_save
        self.trainer_state = trainer_state
        self.step_seconds = step_seconds
        self.trainer_step = trainer_step
        self.tick = tick
        self.clock = clock
        self._started = clock()

    async def run(self) -> NoticeOutcome:
        sync = self.sync
        self._started = self.clock()
        sync.enter_notice_mode()
        output_dir = sync.output_dir
        complete_at_notice = {checkpoint.step for checkpoint in complete_checkpoints(output_dir)}
        committed_at_notice = sync.committed_step
        decision: Literal["pending", "asked", "not-asked"] = "pending"
        why = ""
        reasoning: Plan | None = None  # the plan the fresh decision was made on
        exited_first = False
        newest_known = -1  # newest checkpoint directory when the trainer was asked: anything newer is the fresh one
        asked_at: float | None = None
        fresh_step: int | None = None
        trainer_gone_without_saving = False
        while self.clock() < self.cutoff:
            state = self.trainer_state()
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
                )
            )
            for step, reason in decided.drop:
                sync.give_up(step, reason)
            if decision == "pending":
                why, reasoning = decided.why, decided
            if decision == "pending" and decided.fresh != "wait":
                if decided.fresh == "ask" and state != "running":
                    why, exited_first = "the trainer had already exited", True
                if decided.fresh == "ask" and state == "running":
                    newest_known = max((c.step for c in list_checkpoint_dirs(output_dir)), default=-1)
                    log.warning("asking the trainer for a fresh checkpoint: %s", why)
                    self.ask_to_save()
                    decision, asked_at = "asked", self.clock()
                else:
                    log.warning("not asking the trainer for a fresh checkpoint: %s", why)
                    decision = "not-asked"
            if decision == "asked":
                newer = [c.step for c in list_checkpoint_dirs(output_dir) if c.step > newest_known]
                fresh_step = max(newer, default=fresh_step)
                if fresh_step is None and state != "running":
                    trainer_gone_without_saving = True
            committed = sync.committed_step
            if fresh_step is not None and committed is not None and committed >= fresh_step:
                break
            fresh_settled = (
                decision == "not-asked"
                or trainer_gone_without_saving
                or (fresh_step is not None and fresh_step in sync.given_up)
            )
            if fresh_settled and not sync.situation():
                break  # nothing left that could still commit
            await sync.wait_any(min(self.tick, max(self.cutoff - self.clock(), 0.0)))

        ended = self.clock()
        outcome = NoticeOutcome(committed=sync.committed, fresh="not-asked", fresh_step=fresh_step, asked_at=asked_at)
        outcome.ended_at = ended
        if decision == "asked":
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
        await self._give_up_the_rest(ended)
        outcome.given_up = self._given_up_list(outcome, why, trainer_gone_without_saving)
        committed_step = outcome.committed.step if outcome.committed else None
        reached = self.trainer_step()
        outcome.saved_in_time = (
            committed_step is not None
            and committed_step not in complete_at_notice
            and (committed_at_notice is None or committed_step > committed_at_notice)
            and (reached is None or committed_step >= reached)
        )
        outcome.note = self._note(outcome, why, trainer_gone_without_saving)
        outcome.late = self._late(outcome, reasoning, exited_first, trainer_gone_without_saving)
        return outcome

    async def _give_up_the_rest(self, ended: float) -> None:
        """Cancel what is still uploading; cancellation is prompt (aborts of parts go on in the background)."""
        sync = self.sync
        late = ended >= self.cutoff
        tasks = []
        for step, flight in list(sync.flights.items()):
            up, total = flight.upload.bytes_uploaded, flight.upload.bytes_on_disk
            progress = f"{up / MiB:.0f} of {total / MiB:.0f} MiB up"
            reason = "did not finish uploading before the deadline" if late else "not needed"
            tasks.append(flight.task)
            sync.give_up(step, f"{reason} ({progress})")
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

    @staticmethod
    def _not_saved(gone: bool) -> str:
        if gone:
            return "the trainer exited without saving a checkpoint"
        return "the trainer did not save a checkpoint in time"

    def _late(self, outcome: NoticeOutcome, reasoning: Plan | None, exited_first: bool, gone: bool) -> Late | None:
        """What :meth:`_note` says, as codes and values (the bot words it in the channel's language)."""
        if outcome.fresh == "committed":
            return None
        committed = outcome.committed
        newer = [step for step in sorted(self.sync.failures) if committed is None or step > committed.step]
        trouble = str(self.sync.failures[newer[-1]]) if newer else self._store_trouble()
        if trouble is not None:
            return Late(cause="upload-failed", error=trouble)
        if outcome.fresh == "not-asked":
            if exited_first or reasoning is None:
                return Late(cause="not-asked", why="trainer-exited" if exited_first else "no-rate")
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
        newer = [step for step in sorted(self.sync.failures) if committed is None or step > committed.step]
        trouble = str(self.sync.failures[newer[-1]]) if newer else self._store_trouble()
        if trouble is not None:
            return f"upload failed before the deadline: {trouble}; {kept}"
        if outcome.fresh == "not-asked":
            return f"no fresh save asked for: {why}; {kept}"
        if outcome.fresh == "not-saved":
            return f"{self._not_saved(gone)}; {kept}, the newest complete one"
        return f"the fresh checkpoint-{outcome.fresh_step} did not finish uploading before the deadline; {kept}"
