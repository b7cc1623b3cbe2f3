"""Alibaba Cloud ECS events → bus messages: the parser behind the CloudMonitor webhook and the EventBridge intake.

Accepted shapes, each as Alibaba documents it:

- a **CloudMonitor system event** as an event notification delivers it (webhook, MNS, Function Compute):
  ``{"ver": "1.0", "id", "product": "ECS", "resourceId": "acs:ecs:<region>:<account>:instance/<id>", "level",
  "name", "userId", "eventTime": "20190409T121826.922+0800", "regionId", "content": {...}}``;
- the same as a CloudMonitor **event subscription** pushes it (and as its "debug event subscription" sends it),
  which has ``status`` and ``instanceName`` but neither ``id`` nor ``eventTime``;
- an **EventBridge CloudEvent** (CloudEvents 1.0: ``specversion``, ``id``, ``source: acs.ecs``,
  ``type: ecs:<name>``, ``time``, ``subject``, the ``aliyun*`` extensions), whose ``data`` is the event's
  ``content`` (or, through some targets, the whole system event with its ``content``); ``data`` may also arrive
  as a JSON string;
- a JSON array of any of these (a batched push).

The ``name`` may carry a status suffix (``<resource>:<event>:<status>``); only the first two parts count.

Events map as follows:

- ``Instance:PreemptibleInstanceInterruption`` (``content.action`` = ``delete``) → ``spot-interruption``. CloudMonitor
  sends it five minutes before the instance is released, so the deadline is the event time + 5 min (the receipt
  time when the shape has no time). A warning with another or no action is still a warning: losing one costs far
  more than a loose deadline.
- ``Instance:StateChange`` with ``content.state`` Stopping, Stopped, Deleted, Released (or the other spellings of
  "on its way out") → ``instance-gone``; Pending, Starting, Running and Created are understood and ignored.

Bus message ids derive from what happened (kind, instance, state), not from the delivery, so the same event
arriving twice, or through CloudMonitor *and* EventBridge, or in two shapes, carries one id and is deduplicated
downstream.

Freshness (:func:`staleness`): a push whose event time is more than :data:`MAX_AGE` ago (or more than
:data:`MAX_CLOCK_SKEW` ahead) is refused. Alibaba redelivers a push for at most a day (EventBridge's exponential
decay retry: 176 tries over one day; its default backoff retry gives up after three), so nothing genuine is
older; and the window is far shorter than the 7-day dedup of event ids, so a captured push is either caught by
the dedup or too old, never accepted twice. A shape without a time (a CloudMonitor subscription push) is dated
by its receipt and cannot be checked.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from handlers import safe_json
from handlers.errors import UnrecognisedMessage
from handlers.messages import CloudEvent, CloudEventKind

ECS_SOURCE = "acs.ecs"
INTERRUPTION = "Instance:PreemptibleInstanceInterruption"
STATE_CHANGE = "Instance:StateChange"
NOTICE_LEAD = timedelta(minutes=5)  # CloudMonitor: "five minutes before a preemptible instance is released"
MAX_AGE = timedelta(hours=25)  # Alibaba retries a push for a day at most; an hour's margin
MAX_CLOCK_SKEW = timedelta(minutes=5)
GONE_STATES = frozenset({"stopping", "stopped", "deleted", "released", "releasing", "pendingrelease", "expired"})
LIVE_STATES = frozenset({"pending", "starting", "running", "created"})
_INSTANCE_ID = re.compile(r"^i-[0-9a-z]{4,64}$")
_ID_NAMESPACE = uuid.UUID("8f0d2a5e-53c1-4c2e-9b7e-2f4a6c1d9e30")



class _SystemEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1)
    content: dict[str, Any]
    product: str | None = None
    id: str | None = None
    event_time: str | None = Field(default=None, alias="eventTime")
    resource_id: str | None = Field(default=None, alias="resourceId")


class _CloudEventEnvelope(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    specversion: Literal["1.0"]
    id: str = Field(min_length=1)
    source: str
    type: str
    time: datetime | None = None
    subject: str | None = None
    data: dict[str, Any] | str


def parse_cloudmonitor(body: str | bytes, received_at: datetime) -> list[CloudEvent]:
    """The bus messages in a CloudMonitor push (one system event, or an array of them); raises
    :class:`UnrecognisedMessage`. ``received_at`` stands in for the event time when the shape has none."""
    return _each(body, "CloudMonitor system event", lambda item: _from_system_event(item, received_at))


def parse_eventbridge(body: str | bytes, received_at: datetime) -> list[CloudEvent]:
    """The bus messages in an EventBridge push (one CloudEvent, or an array of them); raises
    :class:`UnrecognisedMessage`."""
    return _each(body, "EventBridge CloudEvent", lambda item: _from_cloudevent(item, received_at))


def staleness(events: list[CloudEvent], received_at: datetime, max_age: timedelta = MAX_AGE) -> str | None:
    """Why a push holding ``events`` must be refused for its age (see the module docstring), or None."""
    for event in events:
        if received_at - event.at > max_age:
            return f"event {event.id} happened at {event.at.isoformat()}, more than {max_age} ago: a replay"
        if event.at - received_at > MAX_CLOCK_SKEW:
            return f"event {event.id} is dated {event.at.isoformat()}, in the future"
    return None


def event_message_id(kind: str, instance_id: str, state: str = "") -> str:
    """The bus message id of an event about ``instance_id``: the same on every delivery, route and shape."""
    return uuid.uuid5(_ID_NAMESPACE, f"{ECS_SOURCE}/{kind}/{instance_id}/{state.lower()}").hex


def _each(body: str | bytes, what: str, parse: Callable[[Mapping[str, Any]], list[CloudEvent]]) -> list[CloudEvent]:
    try:
        document = safe_json.loads(body)
    except ValueError as exc:
        raise UnrecognisedMessage(f"the body is not JSON: {exc}") from exc
    items = document if isinstance(document, list) else [document]
    if not items:
        raise UnrecognisedMessage(f"the body is an empty array: no {what} in it")
    messages: list[CloudEvent] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            where = f"item {index} of the array" if isinstance(document, list) else "the body"
            raise UnrecognisedMessage(f"{where} is JSON but not an object ({type(item).__name__})")
        messages += parse(item)
    return messages


def _from_system_event(document: Mapping[str, Any], received_at: datetime) -> list[CloudEvent]:
    if "specversion" in document:
        raise UnrecognisedMessage("this is an EventBridge CloudEvent: post it to the EventBridge endpoint")
    try:
        event = _SystemEvent.model_validate(document)
    except ValidationError as exc:
        raise UnrecognisedMessage(f"malformed CloudMonitor system event: {_summary(exc)}") from exc
    if event.product is not None and event.product.upper() != "ECS":
        raise UnrecognisedMessage(f"system event {event.name!r} of product {event.product!r} is not an ECS event")
    at = _event_time(event.event_time, received_at)
    return _from_content(_event_name(event.name), event.content, event.resource_id, at)


def _from_cloudevent(document: Mapping[str, Any], received_at: datetime) -> list[CloudEvent]:
    if "specversion" not in document:
        raise UnrecognisedMessage("no specversion: not a CloudEvent (a CloudMonitor event goes to its own endpoint)")
    try:
        envelope = _CloudEventEnvelope.model_validate(document)
    except ValidationError as exc:
        raise UnrecognisedMessage(f"malformed CloudEvent: {_summary(exc)}") from exc
    if envelope.source != ECS_SOURCE or not envelope.type.startswith("ecs:"):
        raise UnrecognisedMessage(
            f"CloudEvent {envelope.id} ({envelope.source!r}, {envelope.type!r}) is not an ECS event this bot handles"
        )
    data: Any = envelope.data
    if isinstance(data, str):
        try:
            data = safe_json.loads(data)
        except ValueError as exc:
            raise UnrecognisedMessage(f"CloudEvent {envelope.id}: data is a string but not JSON") from exc
        if not isinstance(data, dict):
            raise UnrecognisedMessage(f"CloudEvent {envelope.id}: data is not a JSON object")
    at = envelope.time if envelope.time is not None else received_at
    at = at if at.tzinfo else at.replace(tzinfo=UTC)
    resource = envelope.subject
    content = data
    if isinstance(data.get("content"), dict):  # the whole system event rather than its content
        content = data["content"]
        resource = data.get("resourceId") or resource
        if data.get("eventTime"):
            at = _event_time(str(data["eventTime"]), at)
    return _from_content(_event_name(envelope.type.removeprefix("ecs:")), content, resource, at)


def _from_content(name: str, content: Mapping[str, Any], resource: str | None, at: datetime) -> list[CloudEvent]:
    if name == INTERRUPTION:
        instance_id = _instance_id(content.get("instanceId"), resource, name)
        action = str(content.get("action") or "unknown")
        message_id = event_message_id("spot-interruption", instance_id)
        return [_cloud_event("spot-interruption", message_id, at, instance_id, f"action {action}", at + NOTICE_LEAD)]
    if name == STATE_CHANGE:
        instance_id = _instance_id(content.get("resourceId") or content.get("instanceId"), resource, name)
        state = content.get("state")
        if not isinstance(state, str) or not state:
            raise UnrecognisedMessage(f"{name} for {instance_id} has no content.state")
        key = state.lower()
        if key in LIVE_STATES:
            return []
        if key in GONE_STATES:
            message_id = event_message_id("instance-gone", instance_id, key)
            return [_cloud_event("instance-gone", message_id, at, instance_id, f"state {state}")]
        raise UnrecognisedMessage(f"{name} for {instance_id} has an unknown state {state!r}")
    raise UnrecognisedMessage(f"event {name!r} is not one this bot handles ({INTERRUPTION}, {STATE_CHANGE})")


def _event_name(name: str) -> str:
    """``Instance:StateChange`` from ``Instance:StateChange`` or ``Instance:SystemMaintenance.Reboot:Executed``."""
    return ":".join(name.split(":")[:2])


def _instance_id(value: object, resource: str | None, name: str) -> str:
    """The instance id from the content, else from the resource ARN (``acs:ecs:…:instance/i-…``)."""
    if not isinstance(value, str) or not value:
        value = resource.rsplit("instance/", 1)[1] if resource and "instance/" in resource else None
    if not isinstance(value, str) or not _INSTANCE_ID.fullmatch(value):
        raise UnrecognisedMessage(f"{name} names no valid instance id (got {value!r})")
    return value


def _event_time(value: str | None, fallback: datetime) -> datetime:
    """CloudMonitor writes ``20190409T121826.922+0800`` (basic ISO 8601, UTC+8); accept extended ISO too."""
    if not value:
        return fallback
    for pattern in ("%Y%m%dT%H%M%S.%f%z", "%Y%m%dT%H%M%S%z"):
        try:
            return datetime.strptime(value, pattern)
        except ValueError:
            continue
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise UnrecognisedMessage(f"unreadable eventTime {value!r}") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _cloud_event(
    kind: CloudEventKind, message_id: str, at: datetime, instance_id: str, detail: str, deadline: datetime | None = None
) -> CloudEvent:
    return CloudEvent(
        id=message_id, at=at, kind=kind, instance_id=instance_id, source=ECS_SOURCE, deadline=deadline, detail=detail
    )


def _summary(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or '(root)'}: {error['msg']}" for error in exc.errors()[:5]
    )
