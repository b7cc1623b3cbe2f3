"""AWS deliveries → bus messages: the one parser the SQS consumer and the SNS HTTPS endpoint share.

Accepted shapes, each as AWS documents it:

- an EventBridge event as an SQS target receives it (the body is the event JSON);
- an SNS notification envelope (``Type=Notification``; ``Message`` holds the EventBridge event, or a runner report
  line the runner published to SNS), as SNS delivers it to SQS or POSTs it to an HTTPS endpoint;
- the same through SNS raw message delivery (the body is the inner message itself, SNS message attributes become
  SQS message attributes).

Three outcomes: bus messages; an empty list for an event that is understood and deliberately not acted on (an
instance became ``running``), which the consumer may delete; or :class:`UnrecognisedMessage` with the reason, which
the consumer keeps as evidence (the SQS consumer leaves it for the dead-letter queue).

EC2 events map as follows:

- ``EC2 Spot Instance Interruption Warning`` → ``spot-interruption``. The event's ``time`` is when the notice was issued
  and AWS issues it two minutes before the interruption, so the deadline is ``time + 2 min``; for
  ``instance-action: hibernate`` hibernation starts at once (no two-minute warning), so the deadline is ``time``.
  A warning whose action is missing or new is still a warning: losing one costs far more than a loose deadline.
- ``EC2 Instance Rebalance Recommendation`` → ``rebalance``.
- ``EC2 Instance State-change Notification``: ``shutting-down``, ``terminated``, ``stopping`` and ``stopped`` →
  ``instance-gone``. A stopped instance runs no trainer either (spot ``stop``/``hibernate`` interruptions and
  manual stops alike), so the job must move on; if the instance comes back later, its runner's reports carry an
  old attempt and are fenced. Both events of a pair (``shutting-down`` then ``terminated``) are published; the
  second finds the instance no longer current and is ignored by the state machine. ``pending`` and ``running``
  are understood and ignored (the runner's ``started`` report is what counts), so a broad rule does not fill the
  dead-letter queue.

Bus message ids derive from the EventBridge event ``id`` (a UUID5), so a redelivery — or the same event reaching
the bot through two routes — carries the same id and is deduplicated downstream. A runner report keeps its own id,
in the reports' namespace (:func:`handlers.messages.report_received`), so it can never take a cloud event's.

Who may say what is the bot's to check (``bot/sources/aws_intake.py``), on the :class:`Delivery` that
:func:`unwrap` makes of a message: which topic it came on, and a report's exact bytes and signature attributes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from handlers import safe_json
from handlers.errors import UnrecognisedMessage
from handlers.messages import CloudEvent, CloudEventKind, ReportReceived, report_received
from handlers.reports import REPORT_ATTRIBUTE, REPORT_TYPES, parse_report

EC2_SOURCE = "aws.ec2"
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
STATE_CHANGE = "EC2 Instance State-change Notification"
SPOT_NOTICE_LEAD = timedelta(minutes=2)
GONE_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})
LIVE_STATES = frozenset({"pending", "running"})
SNS_TYPES = frozenset({"Notification", "SubscriptionConfirmation", "UnsubscribeConfirmation"})

_ID_NAMESPACE = uuid.UUID("6b0c3f43-2f3e-4b8e-9a55-3c1f0e0a7d21")

AwsMessage = CloudEvent | ReportReceived


class _EventBridgeEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    id: str = Field(min_length=1)
    detail_type: str = Field(alias="detail-type")
    source: str
    time: datetime
    detail: dict[str, Any]


class _SnsAttribute(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    Type: str
    Value: str


class _SnsNotification(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    Type: str
    MessageId: str
    TopicArn: str
    Message: str
    Timestamp: datetime | None = None  # when SNS received the publish
    MessageAttributes: dict[str, _SnsAttribute] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message as it arrived: ``topic`` is the SNS envelope's ``TopicArn`` (None: no envelope, an EventBridge
    target or raw delivery), ``message`` the inner message exactly as sent (what a runner signed), ``document``
    its JSON, ``attributes`` the string attributes that came with it (the envelope's, or the SQS message's),
    ``queued_at`` when the first queue received it (seconds since the epoch: the envelope's ``Timestamp``, when
    SNS took the publish, else the SQS message's sent time; None when neither is known)."""

    topic: str | None
    message: str
    document: Mapping[str, Any]
    attributes: Mapping[str, str]
    queued_at: float | None = None

    @property
    def is_report(self) -> bool:
        """Says it is a runner report (by its shape or the runner's attribute), whoever sent it."""
        looks_like_report = self.document.get("type") in REPORT_TYPES and "job_id" in self.document
        return looks_like_report or REPORT_ATTRIBUTE in self.attributes


def parse_aws_message(
    body: str | bytes, attributes: Mapping[str, str] | None = None, sent_at: float | None = None
) -> list[AwsMessage]:
    """The bus messages in one delivery (see the module docstring); raises :class:`UnrecognisedMessage`.

    ``attributes`` are the string message attributes that came with it (SQS message attributes, which carry the
    SNS ones under raw delivery); only ``finetune_report`` is looked at, to say clearly when a report is malformed.
    ``sent_at``: the SQS message's sent time (not needed to parse; the bot judges a report's freshness by it).
    """
    return parse_delivery(unwrap(body, attributes, sent_at))


def unwrap(body: str | bytes, attributes: Mapping[str, str] | None = None, sent_at: float | None = None) -> Delivery:
    """The message inside one delivery (an SNS envelope's, or the body itself); raises :class:`UnrecognisedMessage`.

    ``sent_at`` is when SQS received the message (its ``SentTimestamp``, in seconds), None off SQS. The delivery's
    ``queued_at`` is the envelope's ``Timestamp`` where there is one (SNS took the publish then; SQS may have
    received it later, if SNS had to retry), else ``sent_at``."""
    document = _json_object(body, "the message body")
    if not is_sns_envelope(document):
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        return Delivery(None, text, document, dict(attributes or {}), sent_at)
    kind = document["Type"]
    if kind != "Notification":
        raise UnrecognisedMessage(
            f"SNS {kind} for {document.get('TopicArn')}: a subscription delivered here must be confirmed (or was "
            "removed) out of band; it carries no event"
        )
    try:
        envelope = _SnsNotification.model_validate(document)
    except ValidationError as exc:
        raise UnrecognisedMessage(f"malformed SNS notification: {_summary(exc)}") from exc
    inner = _json_object(envelope.Message, f"the Message of SNS notification {envelope.MessageId}")
    attributes = {name: attribute.Value for name, attribute in envelope.MessageAttributes.items()}
    published = envelope.Timestamp
    if published is not None and published.tzinfo is None:
        published = published.replace(tzinfo=UTC)
    queued_at = published.timestamp() if published is not None else sent_at
    return Delivery(envelope.TopicArn, envelope.Message, inner, attributes, queued_at)


def parse_delivery(delivery: Delivery) -> list[AwsMessage]:
    """The bus messages of one unwrapped delivery; raises :class:`UnrecognisedMessage`."""
    document = delivery.document
    if "detail-type" in document:
        return _from_eventbridge(document)
    if delivery.is_report:
        try:
            report = parse_report(dict(document))
        except ValidationError as exc:
            raise UnrecognisedMessage(f"malformed runner report: {_summary(exc)}") from exc
        # The report's own id, in the reports' namespace, as on the HTTP route: a redelivery dedups downstream.
        return [report_received(report)]
    keys = ", ".join(sorted(str(key) for key in document)[:10])
    raise UnrecognisedMessage(f"neither an EventBridge event nor a runner report (keys: {keys})")


def is_sns_envelope(document: Mapping[str, Any]) -> bool:
    """True for an SNS JSON envelope (notification or (un)subscription confirmation)."""
    return document.get("Type") in SNS_TYPES and "TopicArn" in document and "MessageId" in document


def event_message_id(event_id: str) -> str:
    """The bus message id of the EventBridge event ``event_id``: the same on every delivery of it."""
    return uuid.uuid5(_ID_NAMESPACE, f"aws.events/{event_id}").hex


def _from_eventbridge(document: Mapping[str, Any]) -> list[AwsMessage]:
    try:
        event = _EventBridgeEvent.model_validate(document)
    except ValidationError as exc:
        raise UnrecognisedMessage(f"malformed EventBridge event: {_summary(exc)}") from exc
    if event.source != EC2_SOURCE or event.detail_type not in (SPOT_WARNING, REBALANCE, STATE_CHANGE):
        raise UnrecognisedMessage(
            f"EventBridge event {event.id} ({event.source!r}, {event.detail_type!r}) is not one this bot handles"
        )
    instance_id = event.detail.get("instance-id")
    if not isinstance(instance_id, str) or not instance_id:
        raise UnrecognisedMessage(f"{event.detail_type} {event.id} has no detail.instance-id")
    at = event.time if event.time.tzinfo else event.time.replace(tzinfo=UTC)
    message_id = event_message_id(event.id)
    if event.detail_type == SPOT_WARNING:
        action = event.detail.get("instance-action") or "unknown"
        deadline = at if action == "hibernate" else at + SPOT_NOTICE_LEAD
        return [_cloud_event("spot-interruption", message_id, at, instance_id, f"instance-action {action}", deadline)]
    if event.detail_type == REBALANCE:
        return [_cloud_event("rebalance", message_id, at, instance_id, "rebalance recommendation")]
    state = event.detail.get("state")
    if state in LIVE_STATES:
        return []
    if state in GONE_STATES:
        return [_cloud_event("instance-gone", message_id, at, instance_id, f"state {state}")]
    raise UnrecognisedMessage(f"{event.detail_type} {event.id} has an unknown state {state!r}")


def _cloud_event(
    kind: CloudEventKind, message_id: str, at: datetime, instance_id: str, detail: str, deadline: datetime | None = None
) -> CloudEvent:
    return CloudEvent(
        id=message_id, at=at, kind=kind, instance_id=instance_id, source=EC2_SOURCE, deadline=deadline, detail=detail
    )


def _json_object(raw: str | bytes, what: str) -> dict[str, Any]:
    try:
        document = safe_json.loads(raw)
    except ValueError as exc:
        raise UnrecognisedMessage(f"{what} is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise UnrecognisedMessage(f"{what} is JSON but not an object ({type(document).__name__})")
    return document


def _summary(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or '(root)'}: {error['msg']}" for error in exc.errors()[:5]
    )
