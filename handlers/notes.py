"""What the bot tells people about a job, as typed data: one model per kind of note, told apart by ``type``.

The handlers (and the cloud executor) write a note; the chat side renders it in the channel's language from the
catalogue (``bot/chat/render.py`` dispatches on the type). A note carries values and codes, never a sentence, so
every word people read comes from the catalogue, and a note and its wording cannot drift apart unnoticed: the
catalogue test renders a sample of every type in :data:`Note` in every language.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from handlers.failures import Failure
from handlers.jobs import Market
from handlers.policy_reasons import POLICY_REASONS
from handlers.reports import Late, StackFrame


class _Note(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- the card -----------------------------------------------------------------------------------------------

CardCause = Literal[
    "launch",
    "launched",
    "started",
    "progress",
    "checkpoint",
    "acked",
    "resume-failed",
    "refresh",
    "policy",
]


class CardRefresh(_Note):
    """Refresh the job's card (it is drawn from the job itself); ``cause`` only says why, for the logs."""

    type: Literal["card"] = "card"
    cause: CardCause


# -- interruptions --------------------------------------------------------------------------------------------


class InterruptionWarning(_Note):
    """The spot interruption notice of one attempt (the alert, and the same in the job's thread)."""

    type: Literal["interruption-warning"] = "interruption-warning"
    instance: str | None
    source: str
    deadline: datetime | None = None


class InterruptedNote(_Note):
    """The attempt ended on its notice: what was committed (``step`` None: no checkpoint yet), how long it took,
    and, when the newest work did not make it, why (``late``, codes)."""

    type: Literal["interrupted"] = "interrupted"
    step: int | None = None
    seconds: dict[str, float] = Field(default_factory=dict)
    saved_in_time: bool = True
    late: Late | None = None
    reached: int | None = None  # the step the trainer had reached (None: the runner could not see it)
    lost: int | None = None  # reached - step: trained, not committed (None: unknown, never 0)


class Resumed(_Note):
    """A later attempt started (``step`` None: from the start, no checkpoint yet)."""

    type: Literal["resumed"] = "resumed"
    attempt: int
    zone: str | None = None
    step: int | None = None
    lost: int | None = 0  # None: unknown (the interrupted trainer's step was never seen)
    downtime: float = 0.0
    skipped: int = Field(default=0, ge=0)  # invalid checkpoints restore passed over


EarlySignalKind = Literal["rebalance", "scheduled-event"]
EarlyAction = Literal["commit", "ahead", "short"]


class Rebalance(_Note):
    """An early signal for the current instance (an AWS rebalance recommendation, an Alibaba scheduled system event
    ``event`` due ``due``): a fresh checkpoint is committed without stopping, and what the spot authority did about
    it (``action``): only that (``commit``), a replacement launched ahead (``ahead``), or staying because too little
    work is left to pay for a move (``short``), with the minutes it weighed."""

    type: Literal["rebalance"] = "rebalance"
    signal: EarlySignalKind = "rebalance"
    event: str | None = None
    due: datetime | None = None
    action: EarlyAction = "commit"
    left_minutes: float | None = None
    restart_minutes: float | None = None


class WarnedBeforeStart(_Note):
    """A spot warning for an instance whose runner had not started: it will not live to train, so it is released
    and the job relaunched at once."""

    type: Literal["warned-before-start"] = "warned-before-start"
    instance: str
    source: str


class RebalanceCheckpoint(_Note):
    type: Literal["rebalance-checkpoint"] = "rebalance-checkpoint"
    step: int
    seconds: float = 0.0


class NoticeBudgetNote(_Note):
    """A notice-driven commit of the job's checkpoint would take longer than the cloud's notice
    (:mod:`handlers.notice_budget`): a ``save_seconds`` save, then ``bytes`` at ``bytes_per_second``; said once."""

    type: Literal["notice-budget"] = "notice-budget"
    commit_seconds: float
    notice_seconds: float
    save_seconds: float = 0.0
    bytes: int = 0
    bytes_per_second: float | None = None


class InstanceGone(_Note):
    type: Literal["instance-gone"] = "instance-gone"
    instance: str


class HeldStep(_Note):
    """A gang node was lost without notice and the survivors committed the step they held (``node``: the survivor
    that said so): each lost node's part rebuilt by a rule (``rebuilt``: "node-<k>" -> "seed-step-rank", or
    "checkpoint-<s>", its last committed part)."""

    type: Literal["held-step"] = "held-step"
    node: int
    step: int
    rebuilt: dict[str, str]


class RelaunchPaused(_Note):
    type: Literal["relaunch-paused"] = "relaunch-paused"
    attempt: int
    count: int
    limit: int
    seconds: float


class HungNote(_Note):
    """The trainer hung (the runner's watchdog): at ``step``, no step for ``seconds`` (its limit ``limit``), the top
    of its stack (``frames``, most recent first), and what follows: restarted in place from ``restart_from`` (None:
    from the start), a relaunch on another instance (its second hang in the attempt), or a gang's regroup."""

    type: Literal["hung"] = "hung"
    step: int | None = None
    seconds: float = 0.0
    limit: float = 0.0
    frames: list[StackFrame] = Field(default_factory=list)
    then: Literal["restart", "relaunch", "regroup"] = "restart"
    restart_from: int | None = None


# -- the spot policy (handlers/spot/) ----------------------------------------------------------------

class SpotPolicyNote(_Note):
    """Why the spot policy moved a job (off spot, to waiting, back to spot, a stop for the budget): its reason as
    a catalogue key (``spot-policy.*``) and the values that fill it in, so the thread reads it in its language."""

    type: Literal["spot-policy"] = "spot-policy"
    reason: str
    values: dict[str, str | float] = Field(default_factory=dict)

    @field_validator("reason")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in POLICY_REASONS:
            raise ValueError(f"not a reason of the spot policy: {value!r}")
        return value


# -- reconciliation (handlers/reconcile.py) ----------------------------------------------------------------

# Why the bot released what the cloud lists (``reconcile.<code>`` in the catalogue; ``values`` fill it in).
ReconcileCode = Literal["not-listed", "listed-as", "job-unknown", "job-over", "moved-on", "moved-on-untagged", "silent"]


class InstanceReleased(_Note):
    type: Literal["instance-released"] = "instance-released"
    instance: str
    why: ReconcileCode
    values: dict[str, str | int] = Field(default_factory=dict)


class GroupReleased(_Note):
    type: Literal["group-released"] = "group-released"
    group: str
    why: ReconcileCode
    values: dict[str, str | int] = Field(default_factory=dict)


class NoReports(_Note):
    """A RUNNING job silent for ``minutes`` while the cloud lists its instance live."""

    type: Literal["no-reports"] = "no-reports"
    instance: str
    minutes: int


# -- the end of a job -------------------------------------------------------------------------------------


class CompletedNote(_Note):
    type: Literal["completed"] = "completed"
    output_uri: str


class FailedNote(_Note):
    type: Literal["failed"] = "failed"
    reason: Failure
    log_tail: list[str] = Field(default_factory=list)
    exit_code: int | None = None


class ChartNote(_Note):
    """The job's chart, as an image in its thread: drawn when it is delivered, from the points the bot kept and the
    job as stored then. ``occasion``: the job ended (``completed``, ``failed``) or someone asked (``asked``, ``by``)."""

    type: Literal["chart"] = "chart"
    occasion: Literal["completed", "failed", "asked"]
    by: str | None = None


class Stopped(_Note):
    """The job stopped; ``step``: the checkpoint it keeps (None: none committed)."""

    type: Literal["stopped"] = "stopped"
    step: int | None = None


# -- on-call ------------------------------------------------------------------------------------------------


class Paged(BaseModel):
    """One person a page step calls, with the ids each platform mentions them by."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    slack: str | None = None
    dingtalk: str | None = None
    mobile: str | None = None


class ResumeFailedPage(_Note):
    """Step ``step`` (0: the first) of ``steps`` of the on-call ladder: who it calls, and why."""

    type: Literal["resume-failed"] = "resume-failed"
    reason: Failure
    step: int = Field(default=0, ge=0)
    steps: int = 1
    mention: list[Paged] = Field(default_factory=list)
    everyone: Literal["channel", "here"] | None = None
    log_tail: list[str] = Field(default_factory=list)
    exit_code: int | None = None


class Acked(_Note):
    """Someone owns the page now; ``via``: the paging tool they acknowledged it in (None: in chat)."""

    type: Literal["acked"] = "acked"
    by: str
    at: datetime
    via: Literal["pagerduty", "opsgenie"] | None = None


class PagerCall(_Note):
    """A call to a paging tool about one page (``key``: PagerDuty's dedup_key, Opsgenie's alias): open it (with
    what failed), acknowledge it (``by`` whom), or resolve it. Sent by the outbox's pager, not posted in chat; its
    words are the tool's incident summary."""

    type: Literal["pager-call"] = "pager-call"
    tool: Literal["pagerduty", "opsgenie"]
    action: Literal["trigger", "acknowledge", "resolve"]
    key: str = Field(min_length=1, max_length=200)
    reason: Failure | None = None
    by: str | None = None


# -- what people asked for -------------------------------------------------------------------------------


class StopRequested(_Note):
    type: Literal["stop-requested"] = "stop-requested"
    by: str


class ResumeRequested(_Note):
    type: Literal["resume-requested"] = "resume-requested"
    by: str
    market: Market


class InterruptTestStarted(_Note):
    type: Literal["interrupt-test-started"] = "interrupt-test-started"
    instance: str
    by: str


class InterruptTestResult(BaseModel):
    """What a cloud did for an interrupt-test, as data (each cloud's port returns one).

    ``fis``: an AWS FIS experiment (``reference``) that sends the spot notice and interrupts the instance
    ``after_seconds`` later; ``notice``: a notice injected on the instance (``reference``: where, if anywhere) and
    the instance reclaimed at ``reclaim_at``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    instance_id: str
    way: Literal["fis", "notice"]
    reference: str | None = None
    reclaim_at: datetime | None = None
    after_seconds: float | None = None


class InterruptTestDone(_Note):
    type: Literal["interrupt-test-done"] = "interrupt-test-done"
    result: InterruptTestResult


class InterruptTestFailed(_Note):
    """The cloud refused or failed the interrupt-test; ``error``: its answer, as it gave it."""

    type: Literal["interrupt-test-failed"] = "interrupt-test-failed"
    error: str


Note = Annotated[
    CardRefresh
    | InterruptionWarning
    | InterruptedNote
    | Resumed
    | Rebalance
    | WarnedBeforeStart
    | RebalanceCheckpoint
    | NoticeBudgetNote
    | InstanceGone
    | HeldStep
    | SpotPolicyNote
    | InstanceReleased
    | GroupReleased
    | NoReports
    | RelaunchPaused
    | HungNote
    | CompletedNote
    | FailedNote
    | ChartNote
    | Stopped
    | ResumeFailedPage
    | Acked
    | PagerCall
    | StopRequested
    | ResumeRequested
    | InterruptTestStarted
    | InterruptTestDone
    | InterruptTestFailed,
    Field(discriminator="type"),
]
