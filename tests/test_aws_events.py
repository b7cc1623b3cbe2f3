"""AWS deliveries → bus messages, in every shape AWS documents, and clear refusals for everything else."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from handlers.aliyun_events import event_message_id as aliyun_event_id
from handlers.aws_events import event_message_id, parse_aws_message
from handlers.errors import UnrecognisedMessage
from handlers.messages import CloudEvent, ReportReceived, dump_message, parse_message
from handlers.reports import Progress
from tests.sns_payloads import (
    ISSUED,
    TOPIC_ARN,
    ec2_event,
    progress_report,
    rebalance,
    sns_envelope,
    spot_warning,
    state_change,
)

EVENT_ID = "12345678-1234-1234-1234-123456789012"


def only(body: str | bytes, attributes: dict[str, str] | None = None) -> CloudEvent | ReportReceived:
    [message] = parse_aws_message(body, attributes)
    return message


def test_spot_warning_from_eventbridge_has_a_two_minute_deadline_and_a_stable_id() -> None:
    message = only(spot_warning("i-0abc", event_id=EVENT_ID))
    assert isinstance(message, CloudEvent)
    assert message.kind == "spot-interruption"
    assert message.instance_id == "i-0abc"
    assert message.source == "aws.ec2"
    assert message.at == ISSUED
    assert message.deadline == ISSUED + timedelta(minutes=2)
    assert message.detail == "instance-action terminate"
    # Redeliveries carry the same EventBridge id, so the same bus id; another event gets another one.
    assert message.id == event_message_id(EVENT_ID) == only(spot_warning("i-0abc", event_id=EVENT_ID)).id
    assert only(spot_warning("i-0abc")).id != message.id


def test_hibernation_starts_at_once_so_its_deadline_is_the_notice_time() -> None:
    message = only(spot_warning("i-0abc", action="hibernate"))
    assert isinstance(message, CloudEvent)
    assert message.deadline == ISSUED


def test_a_spot_warning_without_an_action_is_still_a_warning() -> None:
    message = only(spot_warning("i-0abc", action=None))
    assert isinstance(message, CloudEvent)
    assert (message.kind, message.deadline) == ("spot-interruption", ISSUED + timedelta(minutes=2))
    assert message.detail == "instance-action unknown"


def test_rebalance_recommendation() -> None:
    message = only(rebalance("i-0abc"))
    assert isinstance(message, CloudEvent)
    assert (message.kind, message.instance_id, message.deadline) == ("rebalance", "i-0abc", None)


@pytest.mark.parametrize("state", ["shutting-down", "terminated", "stopping", "stopped"])
def test_an_instance_that_stops_running_is_gone(state: str) -> None:
    message = only(state_change("i-0abc", state))
    assert isinstance(message, CloudEvent)
    assert (message.kind, message.instance_id, message.detail) == ("instance-gone", "i-0abc", f"state {state}")


@pytest.mark.parametrize("state", ["pending", "running"])
def test_an_instance_coming_up_is_understood_and_ignored(state: str) -> None:
    assert parse_aws_message(state_change("i-0abc", state)) == []


def test_an_sns_envelope_yields_what_the_event_inside_it_does() -> None:
    direct = only(spot_warning("i-0abc", event_id=EVENT_ID))
    via_sns = only(sns_envelope(spot_warning("i-0abc", event_id=EVENT_ID)))
    assert via_sns == direct  # same id too: one event reaching the bot by two routes dedups


def test_raw_sns_delivery_is_the_event_itself() -> None:
    assert only(spot_warning("i-0abc", event_id=EVENT_ID), {"anything": "x"}) == only(
        spot_warning("i-0abc", event_id=EVENT_ID)
    )


def test_a_runner_report_through_sns_keeps_its_own_id() -> None:
    report, line = progress_report()
    enveloped = only(sns_envelope(line, attributes={"finetune_report": "progress"}))
    raw = only(line, {"finetune_report": "progress"})
    bare = only(line.encode())
    for message in (enveloped, raw, bare):
        assert isinstance(message, ReportReceived)
        assert message.id == f"report:{report.job_id}:{report.attempt}:{report.id}"  # the reports' namespace
        assert message.report == report


def test_no_report_id_can_take_a_cloud_events_id() -> None:
    """A runner picks its report ids; an Alibaba event's id is predictable: the bus ids never meet."""
    predictable = aliyun_event_id("spot-interruption", "i-bp1abc")
    report = Progress(id=predictable, job_id="ft-7k2q", attempt=1, step=3)
    [message] = parse_aws_message(report.model_dump_json())
    assert message.id != predictable and message.id == f"report:ft-7k2q:1:{predictable}"


def test_bus_messages_round_trip_through_the_bus_schema() -> None:
    for body in (
        spot_warning("i-0abc"),
        rebalance("i-0abc"),
        state_change("i-0abc", "terminated"),
        progress_report()[1],
    ):
        message = only(body)
        assert parse_message(dump_message(message)) == message


@pytest.mark.parametrize(
    ("body", "attributes", "reason"),
    [
        ("not json", None, "the message body is not JSON"),
        ("[1, 2]", None, "not an object (list)"),
        (json.dumps({"hello": "world"}), None, "neither an EventBridge event nor a runner report (keys: hello)"),
        (ec2_event("EC2 Fleet Error", {"instance-id": "i-1"}), None, "is not one this bot handles"),
        (
            json.dumps({**json.loads(spot_warning("i-1")), "source": "my.app"}),
            None,
            "('my.app', 'EC2 Spot Instance Interruption Warning') is not one this bot handles",
        ),
        (
            ec2_event("EC2 Spot Instance Interruption Warning", {"instance-action": "stop"}),
            None,
            "no detail.instance-id",
        ),
        (state_change("i-1", "exploded"), None, "unknown state 'exploded'"),
        (
            json.dumps({k: v for k, v in json.loads(rebalance("i-1")).items() if k != "time"}),
            None,
            "time: Field required",
        ),
        (sns_envelope("plain text"), None, "the Message of SNS notification"),
        (sns_envelope("{}", kind="SubscriptionConfirmation"), None, "must be confirmed"),
        (json.dumps({"type": "progress", "job_id": "ft-7k2q"}), None, "malformed runner report"),
        (json.dumps({"step": 3}), {"finetune_report": "progress"}, "malformed runner report"),
    ],
)
def test_anything_else_is_refused_with_a_reason(body: str, attributes: dict[str, str] | None, reason: str) -> None:
    with pytest.raises(UnrecognisedMessage) as caught:
        parse_aws_message(body, attributes)
    assert reason in caught.value.reason
    assert str(caught.value) == caught.value.reason


def test_the_envelope_attributes_flag_a_report_too() -> None:
    with pytest.raises(UnrecognisedMessage, match="malformed runner report"):
        parse_aws_message(sns_envelope(json.dumps({"step": 3}), attributes={"finetune_report": "progress"}))


def test_the_topic_is_not_this_parsers_business() -> None:
    """Which topics to trust is the endpoint's decision (an allowlist); the parser reads any envelope."""
    message = only(sns_envelope(rebalance("i-0abc"), topic_arn=TOPIC_ARN.replace("finetune", "other")))
    assert isinstance(message, CloudEvent)
