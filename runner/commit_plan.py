"""What to commit before the machine goes, and what the trainer does meanwhile: a pure decision, taken again at
every look while the notice runs (a save completes, the rate is measured: the answer may change).

Inputs are what the runner knows at that moment: the seconds left until the ``interrupted`` report must
leave, the upload rate this run measured, the trainer's save time and checkpoint size as seen so far, every
local checkpoint newer than the last commit (complete or being written, how much of it is up), and whether
the trainer watches the stop file. Rules:

* The newest complete checkpoint is always kept, and so is every older complete one already in flight: an
  upload under way is never abandoned for something newer that might not make it (the commit of a newer one
  ends it). Older complete ones not yet started are dropped (superseded).
* A checkpoint the trainer is writing is kept too (it goes up as it is written, behind the complete ones),
  unless even its bytes alone could not go up in the time left.
* The trainer never trains a step that will not be committed. It is asked for a fresh save (``ask``) only if
  the save and the upload of everything ahead of it and of the fresh checkpoint fit in the time left with
  margin; otherwise it is held where it is (``halt``: frozen, no save started that cannot finish). Before this
  run has measured an upload rate, it is held while an upload in flight measures the link (``wait``: a part or
  two), and where nothing is going up that could, the save is judged at a modest assumed rate
  (:data:`ASSUMED_UPLOAD_RATE`): asked if it fits even so, else held too; without a size to judge by, held.
  With nothing to protect and nothing to judge by, it is asked. What is complete goes up first either way (older
  steps first on the wire): asking never delays it. A hold is undone when a later look finds that a save fits.
* A save in flight when the notice comes is let finish. A trainer that watches the stop file stops right after
  it (the callback ends training at the save): asking costs no extra save, so it is always asked. A trainer
  that only handles SIGTERM would train one more step and save that: it is asked at once if that second save
  fits behind the first, else held as soon as the first is complete.

Everything still to upload shares one link, so the fresh checkpoint is committed after about
``max(save, (bytes ahead + its size) / rate)``: its bytes go up as they are written, and what is ahead of it
(older checkpoints get the transfer slots first) finishes within that time too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from handlers.reports import NotAskedWhy

MiB = 1024 * 1024
MARGIN_FACTOR = 1.25  # estimates from a handful of measurements: a quarter on top …
MARGIN_SECONDS = 2.0  # … and a fixed reserve for the manifest, the last part and a busy machine
ASSUMED_SAVE_RATE = 200 * MiB  # bytes/s a trainer writes a checkpoint at, when this run never saw it save
ASSUMED_SAVE_SECONDS = 1.0  # … plus this much to get going
ASSUMED_UPLOAD_RATE = 25 * MiB  # bytes/s an upload is judged at before this run measured one (200 Mbit/s)

# ask: a fresh save now (the stop request); halt: no save, the trainer held where it is (frozen) once no save is
# being written; wait: held too, decided again at the next look (no rate measured yet).
FreshDecision = Literal["ask", "halt", "wait"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A local checkpoint newer than the newest committed one."""

    step: int
    complete: bool
    bytes_total: int  # on disk now (final once complete)
    bytes_uploaded: int
    in_flight: bool

    @property
    def bytes_left(self) -> int:
        return max(self.bytes_total - self.bytes_uploaded, 0)


@dataclass(frozen=True, slots=True)
class Situation:
    seconds_left: float  # until the interrupted report must leave
    candidates: tuple[Candidate, ...]
    rate: float | None  # bytes/s of this run's uploads; None: nothing measured yet
    save_seconds: float | None = None  # the trainer's last observed save (first sight of its dir → complete)
    step_seconds: float | None = None  # one training step: a save requested now waits for the step's end
    checkpoint_bytes: int | None = None  # this run's last checkpoint: a fresh one will be about as big
    watches_stop_file: bool = False  # the trainer stops right after a save in flight when asked (the callback)


@dataclass(frozen=True, slots=True)
class Plan:
    keep: tuple[int, ...]  # steps to keep uploading, first on the wire first
    drop: tuple[tuple[int, str], ...]  # steps to stop uploading, and why
    fresh: FreshDecision
    why: str  # for the fresh decision, in words for the runner's log
    because: NotAskedWhy | None = None  # the same as a code, when the decision is not to ask (yet)
    need_seconds: float | None = None  # a fresh save and its upload, as estimated
    left_seconds: float | None = None
    saving: int | None = None  # the checkpoint the trainer was writing when this was decided


def fits(seconds: float, seconds_left: float) -> bool:
    return seconds * MARGIN_FACTOR + MARGIN_SECONDS <= seconds_left


def plan(situation: Situation) -> Plan:
    rate = situation.rate
    left = situation.seconds_left
    complete = sorted((c for c in situation.candidates if c.complete), key=lambda c: c.step, reverse=True)
    writing = sorted((c for c in situation.candidates if not c.complete), key=lambda c: c.step)

    keep: list[Candidate] = []
    drop: list[tuple[int, str]] = []
    if complete:
        newest = complete[0]
        for older in complete[1:]:
            if older.in_flight:
                keep.append(older)  # never abandoned for a newer one that might not make it; a commit ends it
            else:
                drop.append((older.step, f"superseded by checkpoint-{newest.step}"))
        keep = [*sorted(keep, key=lambda c: c.step), newest]
    if rate:
        ahead = sum(c.bytes_left for c in keep)
        for candidate in list(writing):
            expected = max(candidate.bytes_total, situation.checkpoint_bytes or 0) - candidate.bytes_uploaded
            if (ahead + expected) / rate > left:  # cannot finish even with no save time left and no margin
                writing.remove(candidate)
                drop.append((candidate.step, f"cannot finish uploading before the deadline at {rate / MiB:.1f} MiB/s"))
            else:
                ahead += expected
    steps = tuple(c.step for c in [*keep, *writing])
    drops = tuple(drop)

    size = situation.checkpoint_bytes or (keep[-1].bytes_total if keep else None)
    saving = writing[-1] if writing else None
    if saving is not None and situation.watches_stop_file:
        why = f"the trainer is saving checkpoint-{saving.step} and stops right after it"
        return Plan(steps, drops, "ask", why, saving=saving.step)
    unprotected = not keep and saving is None
    if size is None:
        if unprotected:
            return Plan(steps, drops, "ask", "nothing newer than the committed checkpoint to protect")
        return Plan(steps, drops, "wait", "no checkpoint size seen yet", "no-rate", saving=_step(saving))
    if rate is None and any(c.in_flight and c.bytes_left for c in (*keep, *writing)):
        # An upload under way measures the link within a part or two: decided again then.
        return Plan(steps, drops, "wait", "no upload rate measured yet", "no-rate", saving=_step(saving))
    assumed = rate is None
    rate = ASSUMED_UPLOAD_RATE if rate is None else rate
    save = situation.save_seconds
    if save is None:
        save = ASSUMED_SAVE_SECONDS + size / ASSUMED_SAVE_RATE
    step = situation.step_seconds or 0.0
    ahead = sum(c.bytes_left for c in keep)
    finishing = 0.0
    if saving is not None:  # a SIGTERM-only trainer finishes this save, trains a step, then saves again
        expected = max(saving.bytes_total, size)
        ahead += expected - saving.bytes_uploaded
        finishing = save * max(1.0 - saving.bytes_total / expected, 0.0) if expected else save
    need = max(finishing + step + save, (ahead + size) / rate)
    behind = f" after checkpoint-{saving.step}" if saving is not None else ""
    at = f"an assumed {rate / MiB:.1f} MiB/s (none measured yet)" if assumed else f"{rate / MiB:.1f} MiB/s"
    numbers = (
        f"a fresh save of ~{size / MiB:.0f} MiB{behind} needs ~{need:.0f}s (save ~{save:.0f}s, "
        f"{(ahead + size) / MiB:.0f} MiB to upload at {at}); {left:.0f}s left"
    )
    if fits(need, left):
        return Plan(steps, drops, "ask", numbers, need_seconds=need, left_seconds=left, saving=_step(saving))
    if assumed and unprotected:
        return Plan(steps, drops, "ask", "nothing newer than the committed checkpoint to protect")
    if assumed:  # decided again once the upload in flight has measured the link
        return Plan(steps, drops, "wait", f"no upload rate measured yet: {numbers}", "no-rate", saving=_step(saving))
    return Plan(steps, drops, "halt", numbers, "too-slow", need_seconds=need, left_seconds=left, saving=_step(saving))


def _step(candidate: Candidate | None) -> int | None:
    return candidate.step if candidate is not None else None
