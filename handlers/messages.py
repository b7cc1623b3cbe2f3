"""What travels on the bot's event bus: things that happened (inputs) and things to do (effects).

Inputs come from the runner (reports), the cloud (spot interruptions, instances gone), the effect executors
(launched, launch failed) and timers. Effects are written by the store in the same transaction as the job change
that caused them, each straight to the queue of its executor (notes to the chat outbox; launch, terminate,
interrupt-test and stop to the cloud executor; timers to the timer set); each carries its own id, so a
redelivered effect is recognised and not carried out twice.

One word, one meaning, here as in runner reports (:mod:`handlers.reports`) and notes (:mod:`handlers.notes`):
``type`` says which model a message is (the union's discriminator: ``{"type": "launch", …}``); ``kind`` says
what sort of thing it reports inside a model (``CloudEvent.kind``: spot-interruption, rebalance or instance-gone,
as ``Notice.kind`` in a report).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from handlers.clock import utcnow
from handlers.ids import new_event_id
from handlers.jobs import ChatRef, Market
from handlers.notes import Note
from handlers.reports import RunnerReport
from handlers.spec import Gang


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str = Field(default_factory=new_event_id)
    at: datetime = Field(default_factory=utcnow)


# -- inputs ----------------------------------------------------------------------------------------------


class ReportReceived(_Message):
    type: Literal["report"] = "report"
    report: RunnerReport


def report_received(report: RunnerReport) -> ReportReceived:
    """The bus message of a runner report, under an id of the report's own namespace: ``report:<job>:<attempt>:<id>``.

    A runner's retry of the same report carries the same id and dedups downstream, while no report, whatever id
    its sender picks, can take the id of a cloud event (those are bare hex digests) or of another job's report.
    """
    return ReportReceived(id=f"report:{report.job_id}:{report.attempt}:{report.id}", report=report)


# The one definition (both clouds). "rebalance" (AWS) and "scheduled-event" (an Alibaba system event: maintenance,
# retirement) are early signals: the instance is at risk, not yet taken.
CloudEventKind = Literal["spot-interruption", "rebalance", "scheduled-event", "instance-gone"]


class CloudEvent(_Message):
    """A cloud's own event about an instance (EventBridge, CloudMonitor, the local cloud): ``kind`` says which.

    ``job_id``: the job the instance runs, added by the bus as it takes the event (the cloud names only the
    instance), so the event runs in the job's lane; the decision still checks it is the job's current instance."""

    type: Literal["cloud"] = "cloud"
    kind: CloudEventKind
    instance_id: str
    job_id: str | None = None
    source: str
    deadline: datetime | None = None
    detail: str = ""


class Launched(_Message):
    type: Literal["launched"] = "launched"
    job_id: str
    attempt: int
    instance_id: str
    instance_type: str | None = None
    zone: str | None = None
    market: Market = "spot"
    price_per_hour: float | None = None
    on_demand_price_per_hour: float | None = None
    egress_price_per_gb: float = Field(default=0.0, ge=0.0)  # per checkpoint GB moved (0: in the bucket's region)
    private_ip: str | None = None  # where a gang's other nodes reach this one (None: the cloud did not say)
    launch_seconds: float | None = None  # the provider's figure of the launch, request to host booted (None: none)
    notice_seconds: float | None = Field(default=None, gt=0)  # the cloud's spot notice to its reclaim (None: unknown)


class LaunchFailed(_Message):
    """``capacity``: every try was refused for capacity (another zone, market or later may have room); ``zone``:
    the zone the launch was pinned to, if it was; ``refused_zones``: every zone whose try was refused for capacity
    (an unpinned launch may have tried several, in several regions)."""

    type: Literal["launch-failed"] = "launch-failed"
    job_id: str
    attempt: int
    reason: str
    capacity: bool = False
    zone: str | None = None
    refused_zones: tuple[str, ...] = ()


class StartDeadline(_Message):
    """Timer: the attempt should have reported ``started`` by now."""

    type: Literal["start-deadline"] = "start-deadline"
    job_id: str
    attempt: int
    due: datetime


class PageStep(_Message):
    """Timer: send escalation step ``step`` of the page opened when ``attempt`` failed to resume."""

    type: Literal["page-step"] = "page-step"
    job_id: str
    attempt: int
    step: int = Field(ge=0)
    due: datetime


class RelaunchDue(_Message):
    """Timer: launch ``attempt`` now; it was held back by the pause after attempts without progress."""

    type: Literal["relaunch-due"] = "relaunch-due"
    job_id: str
    attempt: int
    market: Market = "spot"
    zone: str | None = None
    due: datetime


class PolicyTick(_Message):
    """Timer: ask the job's spot policy again (number ``tick`` of the job's one chain; a stale one is ignored)."""

    type: Literal["policy-tick"] = "policy-tick"
    job_id: str
    tick: int
    due: datetime


class StopDeadline(_Message):
    """Timer: the runner of ``attempt`` should have checkpointed and stopped by now."""

    type: Literal["stop-deadline"] = "stop-deadline"
    job_id: str
    attempt: int
    due: datetime


class GangHoldDue(_Message):
    """Timer: the survivors of a gang have waited the hold time for replacement ``attempt``: wait longer, or move."""

    type: Literal["gang-hold-due"] = "gang-hold-due"
    job_id: str
    attempt: int
    due: datetime


class StopFailed(_Message):
    """The runner could not be asked to stop (its instance is gone, the control object cannot be written)."""

    type: Literal["stop-failed"] = "stop-failed"
    job_id: str
    instance_id: str
    reason: str


# -- effects ---------------------------------------------------------------------------------------------


class Launch(_Message):
    """Launch on ``market`` as the spot authority (:mod:`handlers.spot`) chose: in ``zone`` only, or (None) in the
    zones the cloud orders within the launch. The cloud never changes market: a capacity refusal comes back as
    :class:`LaunchFailed` and the authority chooses again."""

    type: Literal["launch"] = "launch"
    job_id: str
    attempt: int
    market: Market = "spot"
    zone: str | None = None


class Terminate(_Message):
    type: Literal["terminate"] = "terminate"
    job_id: str
    instance_id: str


class InterruptTest(_Message):
    type: Literal["interrupt-test"] = "interrupt-test"
    job_id: str
    instance_id: str
    requested_by: str


class StopRunner(_Message):
    type: Literal["stop-runner"] = "stop-runner"
    job_id: str
    instance_id: str


class SaveRunner(_Message):
    """Ask the runner of ``instance_id`` for a fresh checkpoint without stopping (:class:`~handlers.spec.SaveControl`
    in its control object): an early signal only the bot heard (an Alibaba scheduled system event). ``at``: the
    signal's time, so a second signal is a second request and a redelivery of the same is not."""

    type: Literal["save-runner"] = "save-runner"
    job_id: str
    instance_id: str
    at: datetime


class HandOver(_Message):
    """Tell the runner of ``attempt``, launched ahead of a switch of market, to go: the previous attempt's checkpoint
    is in (or its instance is gone). A state in its control object, like a stop: writing it again changes nothing."""

    type: Literal["hand-over"] = "hand-over"
    job_id: str
    attempt: int


class Regroup(_Message):
    """Write a gang node's regroup: the runner of ``attempt`` stands by in world ``generation`` as ``node_rank``
    and reads its next place (``gang``) from its own control object."""

    type: Literal["regroup"] = "regroup"
    job_id: str
    instance_id: str
    attempt: int
    generation: int
    node_rank: int
    gang: Gang


class ReleaseGang(_Message):
    """The gang job ended: remove what the cloud made to place its nodes together."""

    type: Literal["release-gang"] = "release-gang"
    job_id: str


class CheckNodes(_Message):
    """A gang node's world broke (its runner said ``peer-lost``): look at its peers' instances now, and each one the
    cloud no longer lists live is lost, as of ``lost_at`` (the survivor's word), instead of at the next reconcile."""

    type: Literal["check-nodes"] = "check-nodes"
    job_id: str
    instance_ids: list[str]
    lost_at: datetime


NotifyChannel = Literal["card", "thread", "alert", "page", "pager"]


class Notify(_Message):
    """Tell people: ``card`` refreshes the job card; ``pager`` calls a paging tool (PagerDuty, Opsgenie: the note
    is a :class:`~handlers.notes.PagerCall`); the others post ``note`` (a typed note, worded by the chat side in
    the channel's language)."""

    type: Literal["notify"] = "notify"
    job_id: str
    channel: NotifyChannel
    note: Note

    @property
    def note_type(self) -> str:
        """The note's type, for logs."""
        return self.note.type


class CostsChart(_Message):
    """The bar chart of a ``/finetune costs`` report, posted once in the channel where it was asked, with the
    report's words as its caption. It carries the report's terms, not its numbers: the chat outbox reads the same
    report again (the window ending at ``end``, over ``teams``; None: every team) and draws it when it delivers, as a
    job's chart is drawn, so the queue holds a few fields however many jobs the report covers."""

    type: Literal["costs-chart"] = "costs-chart"
    chat: ChatRef
    window: str
    end: datetime
    teams: tuple[str, ...] | None = None
    by: str

    @property
    def lane(self) -> str:
        """Its lane in the chat outbox: the channel's own, so neither a job's notes nor another channel wait on it."""
        return f"costs:{self.chat.platform}:{self.chat.channel}"


Message = (
    ReportReceived
    | CloudEvent
    | Launched
    | LaunchFailed
    | StartDeadline
    | PageStep
    | RelaunchDue
    | PolicyTick
    | StopDeadline
    | StopFailed
    | GangHoldDue
    | Launch
    | Terminate
    | InterruptTest
    | StopRunner
    | SaveRunner
    | HandOver
    | Regroup
    | ReleaseGang
    | CheckNodes
    | Notify
    | CostsChart
)
"""Any message, as the core makes and reads it (a :class:`~handlers.change.Change`'s outbox holds these)."""
BusMessage = Annotated[Message, Field(discriminator="type")]
MESSAGE_TYPES: frozenset[str] = frozenset(model.model_fields["type"].default for model in get_args(Message))
# The effects the cloud executor carries out (each goes to its queue, see bot/queues.py).
CLOUD_EFFECTS = (
    Launch,
    Terminate,
    InterruptTest,
    StopRunner,
    SaveRunner,
    HandOver,
    Regroup,
    ReleaseGang,
    CheckNodes,
)


# Inputs that are timers: the bot puts one back on the timer queue until its ``due`` time has come.
TIMERS = (StartDeadline, PageStep, RelaunchDue, StopDeadline, PolicyTick, GangHoldDue)

_ADAPTER: TypeAdapter[BusMessage] = TypeAdapter(BusMessage)


def parse_message(raw: Any) -> BusMessage:
    """The message a stored or received dict holds (a malformed one raises ``pydantic.ValidationError``)."""
    return _ADAPTER.validate_python(raw)


def dump_message(message: BusMessage) -> dict[str, Any]:
    return message.model_dump(mode="json")
