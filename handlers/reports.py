"""Runner reports: the wire schema both the runner (writer) and the bot (reader) import.

Every report is one JSON object with ``id``, ``type``, ``job_id``, ``attempt`` and ``time`` plus the fields of
its type. ``id`` is unique per event so the bot can drop redeliveries; ``(job_id, attempt)`` fences reports
from an older attempt. A field no report has is refused, as is any other malformed report: one spelling per idea.

``type`` says which report it is (the union's discriminator, as in bus messages and notes); ``kind`` is the sort
of thing inside one (a notice's: spot-interruption, rebalance…; a warning's).

Every string and list a runner sends has a cap (:data:`URI_CHARS`, :data:`TEXT_CHARS`…): a report read from the
wire (:func:`parse_report`) beyond one is refused, so no runner can fill the bot's Redis; a report made in the
runner's own code is clipped to the caps instead (an exception's text can be long), so the runner never fails to
report because of one.

Every string a report carries is outside text (a trainer's log line, an exception's message): each is cleaned where
it is read (:mod:`handlers.outside_text`: escape sequences, control characters and the chat's mention markers out;
a log line is one line, free text keeps its line breaks), so nothing past this parser holds one. A URI is not
cleaned but refused when it holds one: changed, it would name another object.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationInfo,
    field_validator,
)

from handlers.clock import utcnow
from handlers.failures import Failure
from handlers.ids import JOB_ID_PATTERN, new_event_id
from handlers.outside_text import clean_line, clean_text

# The SNS message attributes a runner sets on a report it publishes (runner/reports/sns.py; the bot reads them in
# handlers/aws_events.py): which report it is, its signature of the message and the time it signed
# (handlers/signing.py's scheme, the attempt's key).
REPORT_ATTRIBUTE = "finetune_report"
SIGNATURE_ATTRIBUTE = "finetune_signature"
TIMESTAMP_ATTRIBUTE = "finetune_timestamp"

WIRE = "wire"  # the validation context key of a report read from the wire: caps refuse instead of clipping
ID_CHARS = 64  # instance ids, kinds, sources
URI_CHARS = 2048  # checkpoint and output URIs
TEXT_CHARS = 2048  # reasons, messages, notes, one log line (the runner keeps 2 KiB of a trainer's line)
LIST_ITEMS = 64  # skipped checkpoints, uploads in flight, given-up items, timings
LOG_TAIL_LINES = 50  # the runner sends its last 40


def _clipper(limit: int) -> Callable[[Any, ValidationInfo], Any]:
    def clip(value: Any, info: ValidationInfo) -> Any:
        if (info.context or {}).get(WIRE) or not isinstance(value, str | list):
            return value
        return value[-limit:] if isinstance(value, list) else value[:limit]  # a list keeps its newest items

    return clip


def _plain_uri(value: str) -> str:
    if clean_line(value) != value:
        raise ValueError("a URI holding a control character, an escape sequence or a private-use character")
    return value


# A cap: refused beyond its limit on the wire, clipped to it when the runner builds the report; then cleaned.
ShortText = Annotated[str, BeforeValidator(_clipper(ID_CHARS)), Field(max_length=ID_CHARS), AfterValidator(clean_line)]
Uri = Annotated[str, BeforeValidator(_clipper(URI_CHARS)), Field(max_length=URI_CHARS), AfterValidator(_plain_uri)]
Text = Annotated[str, BeforeValidator(_clipper(TEXT_CHARS)), Field(max_length=TEXT_CHARS), AfterValidator(clean_text)]
LogLine = Annotated[Text, AfterValidator(clean_line)]  # one line of a trainer's output
_T = TypeVar("_T")
Few = Annotated[list[_T], BeforeValidator(_clipper(LIST_ITEMS)), Field(max_length=LIST_ITEMS)]
LogTail = Annotated[list[LogLine], BeforeValidator(_clipper(LOG_TAIL_LINES)), Field(max_length=LOG_TAIL_LINES)]


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(default_factory=new_event_id, min_length=8, max_length=64)
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    attempt: int = Field(ge=1)
    time: datetime = Field(default_factory=utcnow)
    # A node of a gang (spec.gang): which node says it, in which generation of the world. None: a one-node job.
    node_rank: int | None = Field(default=None, ge=0, le=63)
    generation: int | None = Field(default=None, ge=1)


SkipKind = Literal["no-manifest", "bad-manifest", "missing", "partial", "checksum"]


class SkippedCheckpoint(BaseModel):
    """A checkpoint restore refused to load, and why (missing manifest, partial, checksum mismatch…).

    Only proof that the stored data is unusable skips a checkpoint (``kind``); a network fault never does.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    step: int
    uri: Uri
    reason: Text
    kind: SkipKind


class Started(_Report):
    type: Literal["started"] = "started"
    resumed_from_step: int | None = None
    restored_uri: Uri | None = None
    restore_seconds: float = 0.0
    restored_bytes: int = Field(default=0, ge=0)  # fetched from the store (the job's cost counts them across regions)
    skipped: Few[SkippedCheckpoint] = Field(default_factory=list)
    instance_id: ShortText | None = None
    restarts: int = 0


class Progress(_Report):
    type: Literal["progress"] = "progress"
    step: int
    total_steps: int | None = None
    loss: float | None = None
    epoch: float | None = None


class CheckpointSaved(_Report):
    """A checkpoint committed. ``seconds``: from complete on disk to its manifest stored. The runner's measured
    rates, for the bot's notice budget (:mod:`handlers.notice_budget`), where it has them: ``save_seconds``, the
    trainer's last observed save (first sight of its directory to complete), and ``upload_bytes_per_second``, this
    run's upload rate (bytes per second of the time an upload was in flight)."""

    type: Literal["checkpoint_saved"] = "checkpoint_saved"
    step: int
    uri: Uri
    bytes: int
    seconds: float
    reason: Literal["periodic", "rebalance", "notice", "final"] = "periodic"
    save_seconds: float | None = Field(default=None, ge=0)
    upload_bytes_per_second: float | None = Field(default=None, gt=0)


# "rebalance": the cloud's early signal the runner saw itself; "save": the bot's save request, after an early signal
# only the bot heard (an Alibaba scheduled system event). Both ask for a fresh checkpoint and stop nothing.
NoticeKind = Literal["spot-interruption", "rebalance", "stop", "save"]


class InstanceNotice(BaseModel):
    """The cloud (or an operator) wants this instance back: what a runner's notice watcher sees, and what its
    :class:`Notice` report says. ``deadline``: when the machine goes away (``None``: no fixed time, e.g. rebalance).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: NoticeKind
    source: ShortText
    deadline: datetime | None = None

    @property
    def interrupts(self) -> bool:
        """An early signal (rebalance, save) only advises; every other kind ends this attempt."""
        return self.kind not in ("rebalance", "save")


class Notice(_Report, InstanceNotice):
    """The runner's report of an :class:`InstanceNotice`: a spot interruption, a rebalance recommendation or a
    stop request."""

    type: Literal["notice"] = "notice"


class GivenUp(BaseModel):
    """Something the notice path did not commit before the deadline, and why (``step`` None: a save never made)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    step: int | None = None
    reason: Text


LateCause = Literal["upload-failed", "not-asked", "not-saved", "trainer-gone", "not-uploaded"]
# Why no fresh save was asked for: the trainer was writing one already, no upload rate was known by the cutoff, the
# save and its upload would not fit before the deadline, or the trainer had exited.
NotAskedWhy = Literal["already-saving", "no-rate", "too-slow", "trainer-exited"]


class Late(BaseModel):
    """Why the newest work of an interrupted attempt was not committed before the deadline, as codes and values
    (the bot words it in the channel's language): ``step`` is the fresh checkpoint concerned (the one being
    written, or not uploaded), ``error`` the store's last answer, ``need_seconds``/``left_seconds`` the numbers
    of a save that did not fit."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    cause: LateCause
    why: NotAskedWhy | None = None
    step: int | None = None
    error: Text | None = None
    need_seconds: float | None = None
    left_seconds: float | None = None


class Interrupted(_Report):
    """The attempt ended on a notice. ``step`` / ``uri``: the newest checkpoint committed in the store when the
    report left (from this attempt or before); ``reached_step``: the step the trainer had trained when it stopped
    (None: it writes no progress), so ``reached_step - step`` steps are lost unless a commit still lands;
    ``committing``: checkpoints still going up when the report left (a ``checkpoint_saved`` follows if one lands
    before the machine goes); ``given_up``: what was not committed, and why. ``saved_in_time``: the committed step
    is the step the trainer stopped at."""

    type: Literal["interrupted"] = "interrupted"
    reason: Text
    step: int | None = None
    uri: Uri | None = None
    reached_step: int | None = None
    committing: Few[int] = Field(default_factory=list)
    deadline: datetime | None = None
    saved_in_time: bool = True
    note: Text | None = None  # the same as ``late``, in English, for the runner's log and the job's history
    late: Late | None = None
    seconds: Annotated[dict[ShortText, float], Field(max_length=LIST_ITEMS)] = Field(default_factory=dict)
    fresh_save: Literal["committed", "not-asked", "not-saved", "not-uploaded"] | None = None
    given_up: Few[GivenUp] = Field(default_factory=list)


class Completed(_Report):
    type: Literal["completed"] = "completed"
    step: int | None = None
    total_steps: int | None = None
    output_uri: Uri
    already_complete: bool = False


class Failed(_Report):
    """The runner gave up. ``failure``: why, as a code and values (the bot words it; ``failure.english`` for logs)."""

    type: Literal["failed"] = "failed"
    failure: Failure
    step: int | None = None
    exit_code: int | None = None
    log_tail: LogTail = Field(default_factory=list)

    @field_validator("failure", mode="before")
    @classmethod
    def _failure_capped(cls, value: Any, info: ValidationInfo) -> Any:
        """A failure's values are text too: each within :data:`TEXT_CHARS` (refused on the wire, else clipped), then
        cleaned as :data:`Text` is."""
        return _clean_failure(_cap_failure(value, bool((info.context or {}).get(WIRE))))


class RunnerWarning(_Report):
    """Something degraded that does not stop training (metadata down, storage errors); sent once per outage."""

    type: Literal["warning"] = "warning"
    kind: ShortText
    message: Text


StandbyCause = Literal["stopped", "trainer-exited", "handover", "peer-lost"]


class Standby(_Report):
    """A gang node whose own instance got no notice and whose trainer ended (the gang stopped at a committed step,
    or a peer was lost: a collective failed or timed out) keeps its instance and waits for the bot's regroup (the
    next generation) or stop. ``step``: the newest checkpoint every node's part of which is committed (None: none
    yet); ``cause``: why its trainer ended; ``exit_code``: the trainer's, when it failed.

    ``cause`` "peer-lost": the trainer's world broke (a peer gone, no notice of its own): said at once, before the
commit and the ``standby`` with the step that follows it.

``cause`` "handover": a runner launched ahead of a switch of market (``JobSpec.handover``) is up and waits for
    the bot's go, before it restores anything; the job's previous attempt commits and stops on that word."""

    type: Literal["standby"] = "standby"
    step: int | None = None
    cause: StandbyCause
    exit_code: int | None = None
    # The survivors held ``step`` when a peer was lost without notice: each lost node's part, rebuilt by which rule
    # ("seed-step-rank", or "checkpoint-<s>": that node's last committed part). Cause "peer-lost": sent at once,
    # before anything is committed, so the bot looks at the peers' instances in seconds.
    rebuilt: dict[ShortText, ShortText] | None = Field(default=None, max_length=64)


class StackFrame(BaseModel):
    """One frame of a hung trainer's stack: the function and where it is (the file as the trainer's process named
    it, the line)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    function: LogLine
    file: LogLine
    line: int = Field(ge=0)


class Hung(_Report):
    """The trainer stopped stepping without exiting (the runner's watchdog, ``runner/hang_watch.py``): it hung at
    ``step`` (None: before a step of this run), with no step for ``seconds`` against its limit ``limit_seconds``.
    ``frames``: the top of the hanging thread's stack, most recent first, from ``ranks`` processes' dumps. The
    trainer was ended; ``restart_from`` is the committed step it was started again from (None: from the start).
    ``ends_attempt``: a second hang in this attempt: the runner exits and the job moves to another instance."""

    type: Literal["hung"] = "hung"
    step: int | None = None
    seconds: float = Field(ge=0)
    limit_seconds: float = Field(ge=0)
    frames: Few[StackFrame] = Field(default_factory=list)
    ranks: int = Field(default=0, ge=0, le=4096)
    restart_from: int | None = None
    ends_attempt: bool = False


def _cap_failure(value: Any, wire: bool) -> Any:
    """``value`` (a Failure, or its dict from the wire) with every string value within :data:`TEXT_CHARS`."""
    if isinstance(value, Failure):
        if wire:
            return value
        values = {
            name: _cap_failure(item, wire) if isinstance(item, Failure) else _clip(item)
            for name, item in value.values.items()
        }
        return value.model_copy(update={"values": values})
    if isinstance(value, dict) and isinstance(value.get("values"), dict):
        for item in value["values"].values():
            if isinstance(item, str) and len(item) > TEXT_CHARS and wire:
                raise ValueError(f"a failure value is longer than {TEXT_CHARS} characters")
            if isinstance(item, dict):
                _cap_failure(item, wire)
        if not wire:
            return {**value, "values": {name: _clip(item) for name, item in value["values"].items()}}
    return value


def _clean_failure(value: Any) -> Any:
    """``value`` (a Failure, its dict from the wire, or one of its values) with every string in it cleaned."""
    if isinstance(value, Failure):
        return value.model_copy(update={"values": {name: _clean_failure(v) for name, v in value.values.items()}})
    if isinstance(value, dict) and isinstance(value.get("values"), dict):
        return {**value, "values": {name: _clean_failure(item) for name, item in value["values"].items()}}
    return clean_text(value) if isinstance(value, str) else value


def _clip(item: Any) -> Any:
    return item[:TEXT_CHARS] if isinstance(item, str) else item


RunnerReport = Annotated[
    Started | Progress | CheckpointSaved | Notice | Interrupted | Completed | Failed | RunnerWarning | Standby | Hung,
    Field(discriminator="type"),
]
_REPORT_ADAPTER: TypeAdapter[RunnerReport] = TypeAdapter(RunnerReport)
REPORT_TYPES = (
    "started",
    "progress",
    "checkpoint_saved",
    "notice",
    "interrupted",
    "completed",
    "failed",
    "warning",
    "standby",
    "hung",
)


def parse_report(raw: str | bytes | dict[str, Any]) -> RunnerReport:
    """Validate one report from the wire (raises ``pydantic.ValidationError`` on a malformed one)."""
    if isinstance(raw, dict):
        return _REPORT_ADAPTER.validate_python(raw, context={WIRE: True})
    return _REPORT_ADAPTER.validate_json(raw, context={WIRE: True})


def dump_report(report: RunnerReport) -> str:
    """One compact JSON line, the form every report target carries."""
    return report.model_dump_json()
