"""The pure Alibaba event parser: every documented shape, the mapping to bus messages, and clear refusals."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from handlers.aliyun_events import (
    ECS_SOURCE,
    MAX_AGE,
    NOTICE_LEAD,
    event_message_id,
    parse_cloudmonitor,
    parse_eventbridge,
    staleness,
)
from handlers.errors import UnrecognisedMessage
from tests.aliyun_payloads import (
    INTERRUPTION,
    STATE_CHANGE,
    cloudevent,
    interruption_content,
    notification,
    resource,
    state_content,
    subscription,
    system_event_content,
)

INSTANCE = "i-bp1ecr0000005go2go"
RECEIVED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
EVENT_AT = datetime(2019, 4, 9, 4, 18, 26, 922000, tzinfo=UTC)  # 20190409T121826.922+0800


def cloudmonitor(document: Any) -> list[Any]:
    return parse_cloudmonitor(json.dumps(document), RECEIVED)


def eventbridge(document: Any) -> list[Any]:
    return parse_eventbridge(json.dumps(document).encode(), RECEIVED)


def test_an_interruption_notification_is_a_spot_warning_five_minutes_ahead() -> None:
    (event,) = cloudmonitor(notification(INTERRUPTION, interruption_content(INSTANCE), INSTANCE))
    assert (event.kind, event.instance_id, event.source) == ("spot-interruption", INSTANCE, ECS_SOURCE)
    assert event.at == EVENT_AT  # the UTC+8 basic-format eventTime, read as the instant it is
    assert event.deadline == EVENT_AT + timedelta(minutes=5)
    assert event.detail == "action delete"


def test_every_shape_of_one_interruption_carries_the_same_message_id() -> None:
    content = interruption_content(INSTANCE)
    shapes = [
        cloudmonitor(notification(INTERRUPTION, content, INSTANCE)),
        cloudmonitor(subscription(INTERRUPTION, content, INSTANCE)),
        eventbridge(cloudevent(INTERRUPTION, content, INSTANCE)),
        eventbridge(cloudevent(INTERRUPTION, json.dumps(content), INSTANCE)),  # data as a JSON string
        eventbridge(cloudevent(INTERRUPTION, notification(INTERRUPTION, content, INSTANCE), INSTANCE)),
    ]
    ids = {event.id for (event,) in shapes}
    assert ids == {event_message_id("spot-interruption", INSTANCE)}
    assert all(event.kind == "spot-interruption" and event.instance_id == INSTANCE for (event,) in shapes)


def test_without_an_event_time_the_receipt_time_counts() -> None:
    (event,) = cloudmonitor(subscription(INTERRUPTION, interruption_content(INSTANCE), INSTANCE))
    assert (event.at, event.deadline) == (RECEIVED, RECEIVED + NOTICE_LEAD)
    (bridged,) = eventbridge(cloudevent(INTERRUPTION, interruption_content(INSTANCE), INSTANCE))
    assert bridged.at == EVENT_AT  # the CloudEvent's own time


def test_a_warning_without_the_expected_action_is_still_a_warning() -> None:
    (event,) = cloudmonitor(notification(INTERRUPTION, {"instanceId": INSTANCE}, INSTANCE))
    assert (event.kind, event.detail) == ("spot-interruption", "action unknown")


def test_the_instance_id_falls_back_to_the_resource_name() -> None:
    document = notification(INTERRUPTION, {"action": "delete"}, INSTANCE)
    assert cloudmonitor(document)[0].instance_id == INSTANCE
    bridged = cloudevent(INTERRUPTION, {"action": "delete"}, INSTANCE)
    assert eventbridge(bridged)[0].instance_id == INSTANCE
    assert resource(INSTANCE).endswith(f"instance/{INSTANCE}")


@pytest.mark.parametrize("state", ["Stopping", "Stopped", "Deleted", "Released", "stopped", "PendingRelease"])
def test_states_on_the_way_out_mean_the_instance_is_gone(state: str) -> None:
    for events in (
        cloudmonitor(notification(STATE_CHANGE, state_content(INSTANCE, state), INSTANCE, level="INFO")),
        cloudmonitor(subscription(STATE_CHANGE, state_content(INSTANCE, state), INSTANCE)),
        eventbridge(cloudevent(STATE_CHANGE, state_content(INSTANCE, state), INSTANCE)),
    ):
        (event,) = events
        assert (event.kind, event.instance_id, event.deadline) == ("instance-gone", INSTANCE, None)
        assert event.id == event_message_id("instance-gone", INSTANCE, state)
        assert event.detail == f"state {state}"


def test_each_state_is_its_own_event_but_case_does_not_matter() -> None:
    (stopped,) = cloudmonitor(notification(STATE_CHANGE, state_content(INSTANCE, "Stopped"), INSTANCE))
    (deleted,) = cloudmonitor(notification(STATE_CHANGE, state_content(INSTANCE, "Deleted"), INSTANCE))
    (lower,) = cloudmonitor(notification(STATE_CHANGE, state_content(INSTANCE, "stopped"), INSTANCE))
    assert stopped.id != deleted.id
    assert stopped.id == lower.id


@pytest.mark.parametrize("state", ["Pending", "Starting", "Running", "Created"])
def test_live_states_are_understood_and_ignored(state: str) -> None:
    assert cloudmonitor(notification(STATE_CHANGE, state_content(INSTANCE, state), INSTANCE)) == []
    assert eventbridge(cloudevent(STATE_CHANGE, state_content(INSTANCE, state), INSTANCE)) == []


def test_a_status_suffix_on_the_name_is_read_past() -> None:
    (event,) = cloudmonitor(notification(f"{INTERRUPTION}:Executing", interruption_content(INSTANCE), INSTANCE))
    assert event.kind == "spot-interruption"


def test_a_batch_is_every_event_in_it() -> None:
    other = "i-bp2other000000000x"
    batch = [
        notification(INTERRUPTION, interruption_content(INSTANCE), INSTANCE),
        notification(STATE_CHANGE, state_content(other, "Running"), other),
        notification(STATE_CHANGE, state_content(other, "Deleted"), other),
    ]
    assert [(e.kind, e.instance_id) for e in cloudmonitor(batch)] == [
        ("spot-interruption", INSTANCE),
        ("instance-gone", other),
    ]
    bridged = [cloudevent(INTERRUPTION, interruption_content(INSTANCE), INSTANCE)] * 2
    assert len(eventbridge(bridged)) == 2  # the same event twice: two messages with one id (deduplicated later)


def _without(document: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != key}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("not json at all", "not JSON"),
        ("[]", "empty array"),
        ('"a string"', "not an object"),
        ("[1, 2]", "item 0 of the array is JSON but not an object"),
        (json.dumps(_without(notification(INTERRUPTION, {}, INSTANCE), "content")), "content"),
        (json.dumps(_without(notification(INTERRUPTION, {}, INSTANCE), "name")), "name"),
        (json.dumps({**notification(INTERRUPTION, {}, INSTANCE), "product": "RDS"}), "not an ECS event"),
        (json.dumps(notification("Disk:Stalled:Executing", {"diskId": "d-1"}, INSTANCE)), "not one this bot handles"),
        (json.dumps(notification(STATE_CHANGE, {"resourceId": INSTANCE}, INSTANCE)), "no content.state"),
        (json.dumps(notification(STATE_CHANGE, state_content(INSTANCE, "Melting"), INSTANCE)), "unknown state"),
        (json.dumps(notification(INTERRUPTION, {"instanceId": "vm-1; rm -rf /"}, INSTANCE)), "no valid instance"),
        (
            json.dumps({**notification(INTERRUPTION, interruption_content(INSTANCE), INSTANCE), "eventTime": "soon"}),
            "unreadable eventTime",
        ),
        (json.dumps(cloudevent(INTERRUPTION, interruption_content(INSTANCE), INSTANCE)), "EventBridge"),
    ],
)
def test_cloudmonitor_refusals_say_why(body: str, reason: str) -> None:
    with pytest.raises(UnrecognisedMessage, match=reason) as refused:
        parse_cloudmonitor(body, RECEIVED)
    assert refused.value.reason == str(refused.value)


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        (notification(INTERRUPTION, interruption_content(INSTANCE), INSTANCE), "no specversion"),
        ({**cloudevent(INTERRUPTION, interruption_content(INSTANCE), INSTANCE), "specversion": "0.3"}, "specversion"),
        (_without(cloudevent(INTERRUPTION, interruption_content(INSTANCE), INSTANCE), "id"), "id"),
        ({**cloudevent(INTERRUPTION, interruption_content(INSTANCE), INSTANCE), "source": "acs.oss"}, "not an ECS"),
        (cloudevent(INTERRUPTION, "{not json", INSTANCE), "data is a string but not JSON"),
        (cloudevent(INTERRUPTION, "[1]", INSTANCE), "data is not a JSON object"),
        (cloudevent("Disk:ErrorDetected", {"instanceId": INSTANCE}, INSTANCE), "not one this bot handles"),
    ],
)
def test_eventbridge_refusals_say_why(document: dict[str, Any], reason: str) -> None:
    with pytest.raises(UnrecognisedMessage, match=reason):
        eventbridge(document)


def test_staleness_dates_a_push_by_its_event_time_else_by_its_receipt() -> None:
    dated = cloudmonitor(notification(INTERRUPTION, interruption_content(INSTANCE), INSTANCE))  # from 2019
    reason = staleness(dated, RECEIVED)
    assert reason is not None and "a replay" in reason
    assert staleness(dated, EVENT_AT + MAX_AGE) is None
    undated = cloudmonitor(subscription(INTERRUPTION, interruption_content(INSTANCE), INSTANCE))
    assert staleness(undated, RECEIVED) is None  # a subscription push has no time: its receipt dates it
    ahead = staleness(dated, EVENT_AT - timedelta(minutes=6))
    assert ahead is not None and "in the future" in ahead


# -- scheduled O&M events: early signals ------------------------------------------------------------------------

MAINTENANCE = "Instance:SystemMaintenance.Reboot"
NOT_BEFORE = datetime(2019, 4, 12, 1, 1, 1, tzinfo=UTC)


def test_a_scheduled_maintenance_is_an_early_signal_due_at_its_not_before() -> None:
    content = system_event_content(INSTANCE)
    (event,) = cloudmonitor(notification(f"{MAINTENANCE}:Scheduled", content, INSTANCE, level="CRITICAL"))
    assert (event.kind, event.instance_id, event.source) == ("scheduled-event", INSTANCE, ECS_SOURCE)
    assert event.deadline == NOT_BEFORE and event.detail == "SystemMaintenance.Reboot"
    assert event.at == EVENT_AT


def test_one_scheduled_event_is_one_message_whatever_its_status_shape_or_route() -> None:
    """Scheduled, then Executing; CloudMonitor and EventBridge: the bot acts on the event once."""
    scheduled = system_event_content(INSTANCE)
    executing = system_event_content(INSTANCE, status="Executing")
    shapes = [
        cloudmonitor(notification(f"{MAINTENANCE}:Scheduled", scheduled, INSTANCE)),
        cloudmonitor(notification(f"{MAINTENANCE}:Executing", executing, INSTANCE)),
        cloudmonitor(subscription(f"{MAINTENANCE}:Inquiring", {**scheduled, "eventStatus": "Inquiring"}, INSTANCE)),
        eventbridge(cloudevent(f"{MAINTENANCE}:Scheduled", scheduled, INSTANCE)),
    ]
    assert {event.id for (event,) in shapes} == {
        event_message_id("scheduled-event", INSTANCE, "SystemMaintenance.Reboot/e-bp11trd0000000pqum2")
    }
    other = cloudmonitor(
        notification(f"{MAINTENANCE}:Scheduled", system_event_content(INSTANCE, event_id="e-2"), INSTANCE)
    )
    assert other[0].id not in {event.id for (event,) in shapes}  # another event of the same kind acts again


@pytest.mark.parametrize("event_type", ["SystemFailure.Reboot", "SystemMaintenance.Stop", "SystemFailure.Redeploy"])
def test_host_failure_and_other_maintenance_events_are_early_signals_too(event_type: str) -> None:
    content = system_event_content(INSTANCE, event_type)
    (event,) = cloudmonitor(notification(f"Instance:{event_type}:Scheduled", content, INSTANCE))
    assert event.kind == "scheduled-event" and event.detail == event_type


@pytest.mark.parametrize("status", ["Executed", "Avoided", "Canceled", "Failed"])
def test_a_scheduled_event_that_is_over_is_understood_and_dropped(status: str) -> None:
    content = system_event_content(INSTANCE, status=status)
    assert cloudmonitor(notification(f"{MAINTENANCE}:{status}", content, INSTANCE)) == []


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ({**system_event_content(INSTANCE), "eventStatus": "Pondering"}, "unknown status 'Pondering'"),
        ({**system_event_content(INSTANCE), "notBefore": "soon"}, "unreadable notBefore 'soon'"),
        ({**system_event_content("not-an-instance"), "instanceId": "not-an-instance"}, "names no valid instance id"),
    ],
)
def test_malformed_scheduled_events_are_refused_and_say_why(content: dict[str, Any], reason: str) -> None:
    document = notification(f"{MAINTENANCE}:Scheduled", content, INSTANCE)
    document["resourceId"] = "acs:ecs:cn-hangzhou:1:disk/d-1"  # no instance to fall back to
    with pytest.raises(UnrecognisedMessage, match=reason):
        cloudmonitor(document)
