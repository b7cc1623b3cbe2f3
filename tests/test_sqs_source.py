"""The SQS consumer against moto: every delivery route, dead letters for poison, redelivery after a failed publish."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiobotocore.session import get_session

from bot.report_gate import ReportGate
from bot.sources.aws_intake import AwsIntake
from bot.sources.sqs import REASON_ATTRIBUTE, SqsSource
from handlers.aws_events import event_message_id
from handlers.ids import new_job_id
from handlers.messages import CloudEvent, ReportReceived, parse_message
from handlers.report_keys import derive_report_key
from handlers.reports import REPORT_ATTRIBUTE, SIGNATURE_ATTRIBUTE, TIMESTAMP_ATTRIBUTE, Progress, dump_report
from handlers.signing import sign
from runner.reports.reporter import Reporter
from runner.reports.sns import SnsTarget
from tests.sns_payloads import progress_report, rebalance, spot_warning
from tests.sns_queues import Aws, RecordingBus, until

SPOT_EVENT = "0b1c2d3e-0000-4000-8000-000000000001"
REBALANCE_EVENT = "0b1c2d3e-0000-4000-8000-000000000002"


@asynccontextmanager
async def consuming(source: SqsSource) -> AsyncIterator[asyncio.Event]:
    """Run ``source`` in the background; on exit, stop it and wait for it to return."""
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


def kinds(bus: RecordingBus) -> list[tuple[str, str]]:
    """``(type, instance or job)`` of each published message, sorted (SQS standard queues do not keep order)."""
    result: list[tuple[str, str]] = []
    for event in bus.events:
        message = parse_message(event)
        if isinstance(message, CloudEvent):
            result.append((message.kind, message.instance_id))
        elif isinstance(message, ReportReceived):
            result.append((message.report.type, message.report.job_id))
    return sorted(result)


def ec2_detail(detail_type: str, detail: dict[str, Any]) -> dict[str, Any]:
    return {
        "Source": "aws.ec2",
        "DetailType": detail_type,
        "Detail": json.dumps(detail),
        "Resources": [f"arn:aws:ec2:us-east-1:123456789012:instance/{detail['instance-id']}"],
    }


async def test_events_reach_the_bus_by_every_route_and_leave_the_queue(aws: str) -> None:
    cloud = Aws(aws)
    queue = cloud.queue("finetune-events")
    raw_queue = cloud.queue("finetune-events-raw")
    topic = cloud.sns.create_topic(Name="finetune-events")["TopicArn"]
    cloud.subscribe(topic, queue)
    cloud.subscribe(topic, raw_queue, raw=True)
    cloud.route_ec2_events(queue)

    # EventBridge → SNS → SQS (envelope, and raw), and a runner report published to SNS as the runner does.
    cloud.sns.publish(TopicArn=topic, Message=spot_warning("i-0spot", event_id=SPOT_EVENT))
    report, line = progress_report()
    cloud.sns.publish(
        TopicArn=topic,
        Message=line,
        MessageAttributes={"finetune_report": {"DataType": "String", "StringValue": "progress"}},
    )
    # EventBridge → SQS directly: the body is the event itself.
    cloud.sqs.send_message(QueueUrl=queue, MessageBody=rebalance("i-0rebal", event_id=REBALANCE_EVENT))
    # A real EventBridge rule on moto: put_events → rule → SQS target.
    entries = [
        ec2_detail("EC2 Instance State-change Notification", {"instance-id": "i-0gone", "state": "terminated"}),
        ec2_detail("EC2 Instance State-change Notification", {"instance-id": "i-0new", "state": "running"}),
        ec2_detail("EC2 Fleet Error", {"instance-id": "i-0other"}),  # the rule's pattern does not match it
    ]
    assert cloud.events.put_events(Entries=entries)["FailedEntryCount"] == 0

    bus, raw_bus = RecordingBus(), RecordingBus()
    source = SqsSource(queue, bus.publish, wait_seconds=1)
    raw_source = SqsSource(raw_queue, raw_bus.publish, wait_seconds=1)
    async with consuming(source), consuming(raw_source):
        await until(lambda: len(bus.events) == 4 and source.stats.ignored == 1, what="the envelope queue's events")
        await until(lambda: len(raw_bus.events) == 2, what="the raw queue's events")

    assert kinds(bus) == [
        ("instance-gone", "i-0gone"),
        ("progress", report.job_id),
        ("rebalance", "i-0rebal"),
        ("spot-interruption", "i-0spot"),
    ]
    assert kinds(raw_bus) == [("progress", report.job_id), ("spot-interruption", "i-0spot")]
    # The same event through two routes carries one id, so the bus dedups it.
    ids = {event["id"] for event in bus.events} & {event["id"] for event in raw_bus.events}
    assert ids == {event_message_id(SPOT_EVENT), f"report:{report.job_id}:{report.attempt}:{report.id}"}
    assert (source.stats.deleted, source.stats.unrecognised, source.stats.publish_failures) == (5, 0, 0)
    assert source.redrive_policy is None  # these queues have none (the consumer warned)
    assert cloud.depth(queue) == cloud.depth(raw_queue) == 0


async def test_the_consumer_finds_its_region_in_AWS_REGION_alone(aws: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As on ECS, where only AWS_REGION is set: botocore alone reads AWS_DEFAULT_REGION, and a client made without a
    region ended the consumer (and the bot) with NoRegionError."""
    cloud = Aws(aws)
    queue = cloud.queue("finetune-events")
    cloud.sqs.send_message(QueueUrl=queue, MessageBody=rebalance("i-0region"))
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_REGION", "us-east-1")

    bus = RecordingBus()
    source = SqsSource(queue, bus.publish, wait_seconds=1)
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    try:
        await until(lambda: len(bus.events) == 1 or task.done(), what="the message, or the consumer's end")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 60)
    assert not task.cancelled() and task.exception() is None, task.exception()
    assert kinds(bus) == [("rebalance", "i-0region")] and cloud.depth(queue) == 0


async def test_a_poison_message_ends_in_the_dead_letter_queue_while_good_ones_flow(aws: str) -> None:
    cloud = Aws(aws)
    dlq = cloud.queue("finetune-events-dlq")
    queue = cloud.queue("finetune-events", dlq_arn=cloud.arn(dlq), max_receives=2, visibility=1)
    cloud.sqs.send_message(QueueUrl=queue, MessageBody="this is not an event")
    cloud.sqs.send_message(QueueUrl=queue, MessageBody=rebalance("i-0first"))

    bus = RecordingBus()
    source = SqsSource(queue, bus.publish, wait_seconds=1)
    async with consuming(source):
        await until(lambda: len(bus.events) == 1, what="the good message")
        await until(lambda: cloud.depth(dlq) == 1, what="the poison message in the dead-letter queue")
        cloud.sqs.send_message(QueueUrl=queue, MessageBody=rebalance("i-0second"))
        await until(lambda: len(bus.events) == 2, what="a good message after the poison one")

    assert kinds(bus) == [("rebalance", "i-0first"), ("rebalance", "i-0second")]
    assert source.stats.unrecognised == 2  # received twice (maxReceiveCount), never deleted
    assert source.redrive_policy is not None
    assert cloud.depth(queue) == 0
    [dead] = cloud.sqs.receive_message(QueueUrl=dlq)["Messages"]
    assert dead["Body"] == "this is not an event"  # the evidence is kept


async def test_a_failed_publish_leaves_the_message_for_redelivery(aws: str) -> None:
    cloud = Aws(aws)
    dlq = cloud.queue("finetune-events-dlq")
    queue = cloud.queue("finetune-events", dlq_arn=cloud.arn(dlq), max_receives=3, visibility=1)
    cloud.sqs.send_message(QueueUrl=queue, MessageBody=spot_warning("i-0spot", event_id=SPOT_EVENT))

    bus = RecordingBus()
    bus.fail_next = 1
    source = SqsSource(queue, bus.publish, wait_seconds=1)
    async with consuming(source):
        await until(lambda: len(bus.events) == 1, what="the redelivered message")
        await until(lambda: cloud.depth(queue) == 0, what="the delete")

    assert bus.events[0]["id"] == event_message_id(SPOT_EVENT)
    assert (source.stats.publish_failures, source.stats.received, source.stats.deleted) == (1, 2, 1)
    assert cloud.depth(dlq) == 0


async def test_stop_finishes_the_batch_in_hand(aws: str) -> None:
    cloud = Aws(aws)
    queue = cloud.queue("finetune-events", visibility=30)
    for index in range(5):
        cloud.sqs.send_message(QueueUrl=queue, MessageBody=rebalance(f"i-0{index}"))
    stop = asyncio.Event()
    bus = RecordingBus()

    async def publish_then_stop(event: dict[str, Any]) -> str:
        stop.set()  # stop arrives while the first message of the batch is being handled
        return await bus.publish(event)

    source = SqsSource(queue, publish_then_stop, wait_seconds=1)
    await asyncio.wait_for(source.run(stop), 60)

    assert source.stats.received >= 1
    assert len(bus.events) == source.stats.deleted == source.stats.received
    assert cloud.depth(queue) == 5 - source.stats.received


class CountingSqs:
    """The real SQS client (against moto), counting the long polls it starts and the ones SQS answered."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.polling = asyncio.Event()  # set once a long poll is on its way to SQS
        self.polls = 0
        self.answered = 0

    async def receive_message(self, **request: Any) -> Any:
        self.polls += 1
        self.polling.set()
        answer = await self._client.receive_message(**request)
        self.answered += 1
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


async def test_stop_abandons_a_long_poll(aws: str) -> None:
    """Stopped during a 20 s long poll on an empty queue, the consumer returns without SQS having answered it:
    the poll was abandoned, not waited out (no clock: moto only answers an empty 20 s poll after 20 s)."""
    cloud = Aws(aws)
    queue = cloud.queue("finetune-events")
    counting: list[CountingSqs] = []

    @asynccontextmanager
    async def client() -> AsyncIterator[CountingSqs]:
        async with get_session().create_client("sqs") as real:
            counting.append(CountingSqs(real))
            yield counting[-1]

    source = SqsSource(queue, RecordingBus().publish, wait_seconds=20, client_factory=client)
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    await until(lambda: bool(counting) and counting[0].polling.is_set(), what="the long poll on its way")
    stop.set()
    await asyncio.wait_for(task, 120)  # a generous bound only turns a hang into a failure
    [sqs] = counting
    assert sqs.polls == 1 and sqs.answered == 0


async def test_errors_back_off_and_never_stop_the_consumer(aws: str) -> None:
    cloud = Aws(aws)
    queue_url = f"{aws}/123456789012/created-late"
    bus = RecordingBus()
    source = SqsSource(queue_url, bus.publish, wait_seconds=1, max_backoff=0.2)
    async with consuming(source):
        await until(lambda: source.stats.errors >= 3, what="receive errors on a missing queue")
        assert cloud.queue("created-late") == queue_url
        cloud.sqs.send_message(QueueUrl=queue_url, MessageBody=rebalance("i-0late"))
        await until(lambda: len(bus.events) == 1, what="the message once the queue exists")
    assert kinds(bus) == [("rebalance", "i-0late")]


SALT = "5a" * 16  # the key salt of every attempt the gates below look up


def any_attempts_gate(master: str, clock: Callable[[], float] = time.time) -> ReportGate:
    """A gate whose store holds every attempt, each with :data:`SALT`, every job's prefix under one bucket."""

    async def salts(job_id: str, attempt: int) -> str | None:
        return SALT

    return ReportGate(master, salts, lambda job_id: f"s3://bucket/jobs/{job_id}/", clock=clock)


def forged_report(cloud: Aws, topic: str) -> tuple[str, dict[str, str]]:
    """A runner report published as the runner does, but signed with a key that is no attempt's; its line and the
    attributes it went with."""
    job_id = new_job_id()
    line = dump_report(Progress(job_id=job_id, attempt=1, step=3))
    now = int(time.time())
    attributes = {
        REPORT_ATTRIBUTE: "progress",
        TIMESTAMP_ATTRIBUTE: str(now),
        SIGNATURE_ATTRIBUTE: sign("a key that is no attempt's", now, line.encode()),
    }
    cloud.sns.publish(
        TopicArn=topic,
        Message=line,
        MessageAttributes={name: {"DataType": "String", "StringValue": value} for name, value in attributes.items()},
    )
    return line, attributes


def dead_letters(cloud: Aws, dlq: str, count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while len(found) < count:
        reply = cloud.sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10, MessageAttributeNames=["All"])
        found += reply.get("Messages", [])
    return found


async def test_a_refused_report_moves_to_the_dead_letter_queue_at_once_with_its_reason(aws: str) -> None:
    cloud = Aws(aws)
    dlq = cloud.queue("finetune-events-dlq")
    # The redrive policy alone would move a message only after five receives, thirty seconds apart.
    queue = cloud.queue("finetune-events", dlq_arn=cloud.arn(dlq), max_receives=5, visibility=30)
    raw_queue = cloud.queue("finetune-events-raw", dlq_arn=cloud.arn(dlq), max_receives=5, visibility=30)
    topic = cloud.sns.create_topic(Name="finetune-reports")["TopicArn"]
    cloud.subscribe(topic, queue)
    cloud.subscribe(topic, raw_queue, raw=True)
    line, attributes = forged_report(cloud, topic)

    intake = AwsIntake(any_attempts_gate("the-master-report-secret"), report_topics=[topic])
    bus = RecordingBus()
    source = SqsSource(queue, bus.publish, wait_seconds=1, parse=intake.parse)
    raw_source = SqsSource(raw_queue, bus.publish, wait_seconds=1, parse=intake.parse)
    async with consuming(source), consuming(raw_source):
        await until(lambda: source.stats.dead_lettered == raw_source.stats.dead_lettered == 1, what="both moved")

    assert bus.events == [] and cloud.depth(queue) == cloud.depth(raw_queue) == 0
    assert source.stats.received == raw_source.stats.received == 1  # moved on the first receive
    assert source.dead_letter_url == dlq
    enveloped, raw = sorted(dead_letters(cloud, dlq, 2), key=lambda dead: dead["Body"] == line)
    job_id = json.loads(line)["job_id"]
    for dead in (enveloped, raw):
        reason = dead["MessageAttributes"][REASON_ATTRIBUTE]["StringValue"]
        assert reason == f"refused a runner report (sqs): not signed with the key of {job_id} attempt 1"
    # Kept as it came: the envelope as SNS delivered it; under raw delivery, the line and the runner's attributes.
    assert json.loads(enveloped["Body"])["Message"] == line and json.loads(enveloped["Body"])["TopicArn"] == topic
    kept = {name: value["StringValue"] for name, value in raw["MessageAttributes"].items() if name != REASON_ATTRIBUTE}
    assert raw["Body"] == line and kept == attributes


async def test_a_raw_delivered_report_read_ten_minutes_late_is_judged_by_its_sent_time(aws: str) -> None:
    """Raw delivery has no envelope: the SQS message's SentTimestamp, asked for on every receive, is the queue's
    time. Read ten minutes after it was signed (the gate's clock says so), the report is taken."""
    cloud = Aws(aws)
    queue = cloud.queue("finetune-events-raw", visibility=30)
    topic = cloud.sns.create_topic(Name="finetune-reports")["TopicArn"]
    cloud.subscribe(topic, queue, raw=True)
    master = "the-master-report-secret"
    report = Progress(job_id=new_job_id(), attempt=1, step=3)
    reporter = Reporter([SnsTarget("sns:" + topic, derive_report_key(master, report.job_id, 1, SALT))])
    reporter.start()
    reporter.emit(report)
    assert await reporter.drain(30)
    await reporter.aclose()

    gate = any_attempts_gate(master, clock=lambda: time.time() + 600)
    bus = RecordingBus()
    source = SqsSource(queue, bus.publish, wait_seconds=1, parse=AwsIntake(gate, report_topics=[topic]).parse)
    async with consuming(source):
        await until(lambda: source.stats.deleted == 1, what="the report handled")
    [taken] = (parse_message(event) for event in bus.events)
    assert isinstance(taken, ReportReceived) and taken.report == report
    assert gate.refused == {}


async def test_a_refused_message_stays_when_the_dead_letter_queue_cannot_take_it(aws: str) -> None:
    cloud = Aws(aws)
    dlq = cloud.queue("finetune-events-dlq")
    queue = cloud.queue("finetune-events", dlq_arn=cloud.arn(dlq), max_receives=5, visibility=30)
    topic = cloud.sns.create_topic(Name="finetune-reports")["TopicArn"]
    cloud.subscribe(topic, queue)
    intake = AwsIntake(any_attempts_gate("the-master-report-secret"), report_topics=[topic])
    source = SqsSource(queue, RecordingBus().publish, wait_seconds=1, parse=intake.parse)
    async with consuming(source):
        await until(lambda: source.dead_letter_url == dlq, what="the dead-letter queue found")
        cloud.sqs.delete_queue(QueueUrl=dlq)
        forged_report(cloud, topic)
        await until(lambda: source.stats.refused == 1 and source.stats.errors == 1, what="the failed move")
    assert (source.stats.dead_lettered, source.stats.deleted) == (0, 0)
    assert cloud.depth(queue) == 1  # still there: it comes back after the visibility timeout


async def test_without_a_redrive_policy_a_refused_message_stays(aws: str) -> None:
    cloud = Aws(aws)
    queue = cloud.queue("finetune-events", visibility=30)
    topic = cloud.sns.create_topic(Name="finetune-reports")["TopicArn"]
    cloud.subscribe(topic, queue)
    forged_report(cloud, topic)
    intake = AwsIntake(any_attempts_gate("the-master-report-secret"), report_topics=[topic])
    source = SqsSource(queue, RecordingBus().publish, wait_seconds=1, parse=intake.parse)
    async with consuming(source):
        await until(lambda: source.stats.refused == 1, what="the refusal")
    assert source.dead_letter_url is None and (source.stats.dead_lettered, source.stats.deleted) == (0, 0)
    assert cloud.depth(queue) == 1


def test_argument_checks() -> None:
    bad: list[Callable[[], SqsSource]] = [
        lambda: SqsSource("q", RecordingBus().publish, wait_seconds=21),
        lambda: SqsSource("q", RecordingBus().publish, max_messages=11),
    ]
    for make in bad:
        with pytest.raises(ValueError):
            make()
