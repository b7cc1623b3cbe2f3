"""Bus messages on the wire: ``type`` tells them apart (as reports and notes), ``kind`` is a cloud event's sort;
anything else (a field no model has, ``kind`` as the discriminator) is refused.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from bot.bus import partition_key
from bot.queues import ChatEntry, route
from handlers.jobs import ChatRef
from handlers.messages import (
    MESSAGE_TYPES,
    BusMessage,
    CheckNodes,
    CloudEvent,
    CostsChart,
    GangHoldDue,
    HandOver,
    InterruptTest,
    Launch,
    Launched,
    LaunchFailed,
    Notify,
    PageStep,
    PolicyTick,
    Regroup,
    RelaunchDue,
    ReleaseGang,
    ReportReceived,
    SaveRunner,
    StartDeadline,
    StopDeadline,
    StopFailed,
    StopRunner,
    Terminate,
    dump_message,
    parse_message,
)
from handlers.notes import Rebalance
from handlers.reports import Notice
from handlers.spec import Gang

DUE = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)
JOB = {"job_id": "ft-ab12"}
NOTICE = Notice(**JOB, attempt=1, kind="spot-interruption", source="aws-imds", deadline=DUE)
SAMPLES: list[BusMessage] = [
    ReportReceived(report=NOTICE),
    CloudEvent(kind="rebalance", instance_id="i-1", source="aws.ec2"),
    CloudEvent(kind="spot-interruption", instance_id="i-1", source="aliyun.ecs", deadline=DUE, detail="x"),
    Launched(**JOB, attempt=1, instance_id="i-1", zone="us-east-1a"),
    LaunchFailed(**JOB, attempt=1, reason="InsufficientInstanceCapacity"),
    LaunchFailed(**JOB, attempt=2, reason="InsufficientInstanceCapacity", capacity=True, zone="us-east-1b"),
    StartDeadline(**JOB, attempt=1, due=DUE),
    PageStep(**JOB, attempt=2, step=1, due=DUE),
    RelaunchDue(**JOB, attempt=2, market="on-demand", due=DUE),
    RelaunchDue(**JOB, attempt=3, zone="us-east-1b", due=DUE),
    PolicyTick(**JOB, tick=3, due=DUE),
    StopDeadline(**JOB, attempt=1, due=DUE),
    StopFailed(**JOB, instance_id="i-1", reason="gone"),
    Launch(**JOB, attempt=1),
    Launch(**JOB, attempt=2, zone="us-east-1b"),
    Terminate(**JOB, instance_id="i-1"),
    InterruptTest(**JOB, instance_id="i-1", requested_by="slack:U1"),
    StopRunner(**JOB, instance_id="i-1"),
    SaveRunner(**JOB, instance_id="i-1", at=datetime(2026, 12, 7, 12, tzinfo=UTC)),
    HandOver(**JOB, attempt=2),
    Notify(**JOB, channel="thread", note=Rebalance()),
    GangHoldDue(**JOB, attempt=3, due=DUE),
    Regroup(
        **JOB,
        instance_id="i-1",
        attempt=1,
        generation=2,
        node_rank=0,
        gang=Gang(nodes=2, node_rank=0, generation=2, master_addr="10.0.0.5", master_port=12345),
    ),
    ReleaseGang(**JOB),
    CheckNodes(**JOB, instance_ids=["i-1"], lost_at=DUE),
    CostsChart(chat=ChatRef(platform="slack", channel="C0ML"), window="7d", end=DUE, teams=("ml",), by="slack:U1"),
]


def test_the_samples_cover_every_message_type() -> None:
    assert {sample.type for sample in SAMPLES} == MESSAGE_TYPES


@pytest.mark.parametrize("message", SAMPLES, ids=lambda message: f"{message.type}")
def test_type_is_the_discriminator_and_kind_only_a_cloud_events_sort(message: BusMessage) -> None:
    wire = dump_message(message)
    assert wire["type"] == message.type
    assert ("kind" in wire) == isinstance(message, CloudEvent)
    assert parse_message(json.loads(json.dumps(wire))) == message


@pytest.mark.parametrize(
    "raw",
    [
        {"kind": "launch", "job_id": "ft-ab12", "attempt": 2},  # ``kind`` as the discriminator
        {"kind": "cloud", "type": "spot-interruption", "instance_id": "i-1", "source": "aws.ec2"},
        {"type": "launch", "job_id": "ft-ab12", "attempt": 2, "fallback": True},  # a field no model has
        {"type": "interrupt-test", "job_id": "ft-ab12", "instance_id": "i-1", "requested_by": "slack:U1", "x": 1},
    ],
)
def test_a_message_in_any_other_shape_is_refused(raw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        parse_message(raw)


@pytest.mark.parametrize("platform", ["slack", "", 'a "quoted" name'])
def test_a_note_is_routed_to_the_chat_stream_as_a_chat_entry(platform: str) -> None:
    """The chat entry's JSON is put together around the note's (no entry model built): it reads as the entry."""
    note = Notify(job_id="ft-ab12", channel="alert", note=Rebalance())
    routed = route(note, platform)
    assert routed.destination == "chat"
    assert ChatEntry.model_validate_json(routed.payload) == ChatEntry(
        id=note.id, job_id="ft-ab12", platform=platform, note=note
    )
    # A job's note keeps the entry shape every release has read: no ``lane`` (that is a costs chart's).
    assert json.loads(routed.payload) == ChatEntry(
        id=note.id, job_id="ft-ab12", platform=platform, note=note
    ).model_dump(mode="json", exclude={"lane"})


def test_a_costs_chart_is_routed_to_the_chat_stream_in_its_channels_lane() -> None:
    """No job's: its entry names no job, and its lane is the channel's (a retried upload holds up no job's notes)."""
    chart = CostsChart(chat=ChatRef(platform="dingtalk", channel="cid1=="), window="30d", end=DUE, by="dingtalk:bob")
    routed = route(chart, "dingtalk")
    assert routed.destination == "chat"
    entry = json.loads(routed.payload)
    assert entry == ChatEntry(id=chart.id, lane="costs:dingtalk:cid1==", platform="dingtalk", note=chart).model_dump(
        mode="json"
    )
    assert partition_key(entry) == "lane:costs:dingtalk:cid1=="
    assert partition_key(json.loads(route(Notify(**JOB, channel="alert", note=Rebalance()), "").payload)) == (
        "job:ft-ab12"
    )
    assert parse_message(entry["note"]) == chart
