"""Queued facts are never lost to their age, through the real bot: its SQS consumer on moto (SNS → SQS), its
report gate, its store, and a real local runner whose attempt key signs the reports.

A runner's ``completed`` read ten minutes after it was signed (the bot's clock moved on: every bot was down for an
upgrade) is applied once; the same SNS delivery read again later changes nothing; a report the bot refuses (a
forged signature; a copy published again long after it was signed) lands in the dead-letter queue with its reason.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from bot.cloud.local.provider import LocalCloud
from bot.sources.sqs import REASON_ATTRIBUTE
from fakes.bot_harness import SLEEPS, eventually, quick_recipe, running_bot, settled, start_job, wait_job, write_config
from handlers.jobs import JobState
from handlers.messages import report_received
from handlers.report_freshness import MAX_QUEUED_SECONDS
from handlers.reports import REPORT_ATTRIBUTE, SIGNATURE_ATTRIBUTE, TIMESTAMP_ATTRIBUTE, Completed, dump_report
from handlers.signing import sign
from runner.reports.reporter import Reporter
from runner.reports.sns import SnsTarget
from tests.sns_queues import Aws

TEN_MINUTES = 600


def runner_key(pid: int) -> str:
    """The report key the runner process holds (what its attempt was given, however the bot derived it)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = dict(entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return pairs[b"FINETUNE_REPORT_SECRET"].decode()


async def publish_as_the_runner(topic: str, report: Completed, key: str) -> None:
    """runner/reports/sns.py: signed with the attempt's key, at the runner's clock, published to the report topic."""
    reporter = Reporter([SnsTarget("sns:" + topic, key)])
    reporter.start()
    reporter.emit(report)
    assert await reporter.drain(30)
    await reporter.aclose()


def publish_signed_at(cloud: Aws, topic: str, line: str, key: str, at: int) -> None:
    """What a runner publishes, but signed at ``at``: a captured report sent again, or a forged key."""
    attributes = {
        REPORT_ATTRIBUTE: "completed",
        TIMESTAMP_ATTRIBUTE: str(at),
        SIGNATURE_ATTRIBUTE: sign(key, at, line.encode()),
    }
    cloud.sns.publish(
        TopicArn=topic,
        Message=line,
        MessageAttributes={name: {"DataType": "String", "StringValue": value} for name, value in attributes.items()},
    )


async def receive_all(cloud: Aws, queue: str, count: int) -> list[dict[str, Any]]:
    """``count`` messages from ``queue``, received off the event loop (the bot runs on it meanwhile)."""
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while len(found) < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} messages in {queue}"
        reply = await asyncio.to_thread(
            cloud.sqs.receive_message,
            QueueUrl=queue,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageAttributeNames=["All"],
        )
        found += reply.get("Messages", [])
    return found


async def test_a_report_read_ten_minutes_after_signing_is_applied_once_and_refusals_are_dead_lettered(
    tmp_path: Path, aws: str
) -> None:
    cloud = Aws(aws)
    dlq = cloud.queue("finetune-events-dlq")
    # As deploy/aws/finetune.yaml sets it: the redrive policy alone would move a message after five receives.
    queue = cloud.queue("finetune-events", dlq_arn=cloud.arn(dlq), max_receives=5, visibility=60)
    tap = cloud.queue("finetune-reports-tap")  # a second subscriber: a copy of what SNS delivered, to replay
    topic = cloud.sns.create_topic(Name="finetune-reports")["TopicArn"]
    cloud.subscribe(topic, queue)
    cloud.subscribe(topic, tap)

    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    settings = {"finetune_sqs_queue_url": queue, "finetune_report_topics": topic}
    async with running_bot(tmp_path / "state", config, **settings) as (service, _chat):
        job_id = await start_job(service, "console:ana", "start sleepy")
        running = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and bool(job.instance_ids))
        assert running.current is not None
        local = service.bot.cloud
        assert isinstance(local, LocalCloud)
        [record] = await local.instances()
        key = runner_key(record.runner_pid)

        # The runner signs and publishes now; the bot reads it ten minutes on (its clock, injected, says so).
        service.reports.clock = lambda: time.time() + TEN_MINUTES
        output = local.checkpoint_uri(job_id) + "output/"
        done = Completed(job_id=job_id, attempt=running.current.number, step=7, output_uri=output)
        await publish_as_the_runner(topic, done, key)
        finished = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED)
        assert finished.output_uri == output and finished.step == 7

        # The very delivery SNS made, read again twenty minutes later (a redelivery, a redrive): still fresh by
        # its queue time, so only the remembered report id and attempt stop it.
        [delivered] = await receive_all(cloud, tap, 1)
        assert json.loads(delivered["Body"])["Message"] == dump_report(done)
        service.reports.clock = lambda: time.time() + 2 * TEN_MINUTES
        cloud.sqs.send_message(QueueUrl=queue, MessageBody=delivered["Body"])
        await eventually(lambda: _true(cloud.depth(queue) == 0))  # deleted once on the bus
        await eventually(lambda: settled(service))  # and handled there

        history = await service.bot.store.history(job_id)
        about_it = [entry for entry in history if "completed" in json.dumps(entry)]
        assert [entry.get("event") for entry in about_it] == ["completed"], about_it
        # The mark that stops it outlives anything a queue still holds.
        store = service.bot.store
        seen = store.keys.job_dedup(job_id, store.keys.input_seen(report_received(done).id))
        assert await store.redis.ttl(seen) > MAX_QUEUED_SECONDS

        # Refused: a completed signed with a key that is no attempt's, and the runner's own report published again
        # ten minutes after it was signed (a captured copy: the queue received it too late).
        line = dump_report(Completed(job_id=job_id, attempt=running.current.number, step=9, output_uri=output))
        publish_signed_at(cloud, topic, line, "a key that is no attempt's", int(time.time()))
        publish_signed_at(cloud, topic, line, key, int(time.time()) - TEN_MINUTES)
        dead = await receive_all(cloud, dlq, 2)
        reasons = sorted(message["MessageAttributes"][REASON_ATTRIBUTE]["StringValue"] for message in dead)
        assert reasons[0].startswith("refused a runner report (sqs): not signed with the key of")
        assert reasons[1].startswith("refused a runner report (sqs): signed 6")  # 600 s, give or take a second
        assert reasons[1].endswith("s before the queue received it (the window is 300 s)")
        assert {json.loads(message["Body"])["Message"] for message in dead} == {line}
        assert service.reports.refused["sqs"] == 2  # (the local runner's own HTTP reports are late by the clock now)
        await eventually(lambda: _true(cloud.depth(queue) == 0))  # nothing deleted unseen, nothing left behind
        await eventually(lambda: settled(service))
        after = await service.bot.store.get(job_id)
        assert after is not None and after.step == 7 and after.output_uri == output


async def _true(value: bool) -> bool:
    return value
