"""Bus messages on the wire: ``type`` tells them apart (as reports and notes), ``kind`` is a cloud event's sort;
a message in the older shape (``kind`` the discriminator), already queued at an upgrade, is read as it was meant.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, get_args

import pytest

from bot.bus import partition_key
from bot.queues import ChatEntry, route
from handlers.jobs import ChatRef
from handlers.messages import (
    MESSAGE_TYPES,
    BusMessage,
    CloudEvent,
    CloudEventKind,
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
    StartDeadline,
    StopDeadline,
    StopFailed,
    StopRunner,
    Terminate,
    dump_message,
    parse_message,
)
from handlers.notes import Rebalance
from handlers.reports import Failed, Notice, parse_report
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
    CostsChart(chat=ChatRef(platform="slack", channel="C0ML"), window="7d", end=DUE, teams=("ml",), by="slack:U1"),
]


def older_shape(message: dict[str, Any]) -> dict[str, Any]:
    """What the previous release wrote for ``message``: ``kind`` the discriminator, a cloud event's sort ``type``."""
    older = {key: value for key, value in message.items() if key not in ("type", "kind")}
    older["kind"] = message["type"]
    if "kind" in message:
        older["type"] = message["kind"]
    return older


def test_the_samples_cover_every_message_type_and_no_cloud_kind_is_a_message_type() -> None:
    assert {sample.type for sample in SAMPLES} == MESSAGE_TYPES
    assert MESSAGE_TYPES.isdisjoint(get_args(CloudEventKind))  # so the older shape is told apart safely


@pytest.mark.parametrize("message", SAMPLES, ids=lambda message: f"{message.type}")
def test_type_is_the_discriminator_and_kind_only_a_cloud_events_sort(message: BusMessage) -> None:
    wire = dump_message(message)
    assert wire["type"] == message.type
    assert ("kind" in wire) == isinstance(message, CloudEvent)
    assert parse_message(json.loads(json.dumps(wire))) == message


@pytest.mark.parametrize("message", SAMPLES, ids=lambda message: f"{message.type}")
def test_a_message_in_the_older_shape_reads_as_it_was_meant(message: BusMessage) -> None:
    """At the one edge every stored message is read through (``parse_message``: the bus, the cloud executor and
    the chat outbox's note alike), and routed from there: to the same queue as today's shape, in today's shape."""
    wire = dump_message(message)
    older = older_shape(wire)
    assert "type" not in older or isinstance(message, CloudEvent)
    assert parse_message(older) == message
    today, before = route(message, "slack"), route(parse_message(older), "slack")
    assert (before.destination, before.due) == (today.destination, today.due)
    assert json.loads(before.payload) == json.loads(today.payload)


def test_a_report_of_a_runner_of_the_previous_release_still_parses() -> None:
    """Reports kept their shape (``type`` the discriminator, ``kind`` a notice's sort); ``failed`` gained
    ``failure``, and one without it (an older runner) is read by its sentence."""
    notice = {
        "type": "notice",
        **JOB,
        "attempt": 1,
        "kind": "spot-interruption",
        "source": "aws-imds",
        "id": "e" * 8,
        "time": DUE.isoformat(),
    }
    assert parse_report(notice) == Notice.model_validate(notice)
    failed = parse_report({"type": "failed", **JOB, "attempt": 2, "reason": "trainer exited with code 3"})
    assert isinstance(failed, Failed) and failed.failure is None and failed.reason == "trainer exited with code 3"
    wrapped = parse_message({"kind": "report", "report": notice})  # as an older bot put it on the stream
    assert isinstance(wrapped, ReportReceived) and wrapped.report == parse_report(notice)


def test_a_launch_written_with_the_old_fallback_flag_still_parses_and_the_flag_is_gone() -> None:
    """Before handlers/spot/ was the one authority, a Launch carried ``fallback`` (the cloud's own move to
    on-demand); a message still queued from then is read as today's Launch, without it."""
    old = {"type": "launch", "job_id": "ft-ab12", "attempt": 2, "market": "spot", "zone": None, "fallback": True}
    message = parse_message(old)
    assert isinstance(message, Launch) and (message.market, message.zone) == ("spot", None)
    assert "fallback" not in dump_message(message)


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
