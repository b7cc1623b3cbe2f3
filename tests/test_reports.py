"""Report delivery: signed HTTP to a real local server, SNS → SQS on moto, retries that never block training."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from aiohttp import web

from handlers.reports import Completed, Progress, parse_report
from handlers.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from runner.reports.file import FileTarget
from runner.reports.http import HttpTarget
from runner.reports.open import open_target
from runner.reports.reporter import Reporter
from runner.reports.sns import SnsTarget

SECRET = "s3cr3t-report-key"


class BotEndpoint:
    """A stand-in for the bot's report endpoint that verifies signatures the way the bot does."""

    def __init__(self) -> None:
        self.accepted: list[dict[str, Any]] = []
        self.refused = 0
        self.fail_next = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.fail_next:
            self.fail_next -= 1
            return web.Response(status=503)
        ok = verify(
            SECRET, request.headers.get(TIMESTAMP_HEADER), body, request.headers.get(SIGNATURE_HEADER), time.time()
        )
        if not ok:
            self.refused += 1
            return web.Response(status=401, text="bad signature")
        self.accepted.append(json.loads(body))
        return web.Response(status=202)


@pytest.fixture
async def bot() -> AsyncIterator[BotEndpoint]:
    endpoint = BotEndpoint()
    app = web.Application()
    app.router.add_post("/runner/reports", endpoint.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    endpoint.url = f"http://127.0.0.1:{runner.addresses[0][1]}/runner/reports"
    yield endpoint
    await runner.cleanup()


def progress(step: int) -> Progress:
    return Progress(job_id="ft-abc1", attempt=1, step=step, total_steps=10, loss=1.5)


async def test_http_reports_are_signed_and_retried_until_the_bot_answers(bot: BotEndpoint) -> None:
    bot.fail_next = 2  # the bot is restarting
    reporter = Reporter([HttpTarget(bot.url, secret=SECRET)], first_backoff=0.05)
    reporter.start()
    for step in range(3):
        reporter.emit(progress(step))
    # emit only queues: nothing reached the bot (it answers on this loop, which has not run since), so nothing
    # was waited for; a report sent from emit itself would have hung here.
    assert bot.fail_next == 2 and bot.accepted == []
    assert await reporter.drain(10)
    await reporter.aclose()
    assert [report["step"] for report in bot.accepted] == [0, 1, 2]  # in order, each once
    assert parse_report(json.dumps(bot.accepted[0])).job_id == "ft-abc1"


async def test_a_wrongly_signed_report_is_refused_and_not_retried_forever(bot: BotEndpoint) -> None:
    reporter = Reporter([HttpTarget(bot.url, secret="not-the-secret")], first_backoff=0.05)
    reporter.start()
    reporter.emit(progress(1))
    assert await reporter.drain(5)  # dropped as permanently refused, not retried
    await reporter.aclose()
    assert bot.refused == 1 and bot.accepted == []


def test_http_target_requires_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FINETUNE_REPORT_SECRET", raising=False)
    with pytest.raises(ValueError, match="FINETUNE_REPORT_SECRET"):
        HttpTarget("https://bot.example/runner/reports")


async def test_a_dead_target_delays_neither_the_others_nor_the_caller(tmp_path: Path) -> None:
    dead = HttpTarget("http://127.0.0.1:9/nothing-listens-here", secret=SECRET)
    log = tmp_path / "reports.jsonl"
    reporter = Reporter([dead, FileTarget(f"file://{log}")], first_backoff=0.05)
    reporter.start()
    reporter.emit(progress(1))
    reporter.emit(Completed(job_id="ft-abc1", attempt=1, output_uri="s3://b/o/"))
    for _ in range(100):
        if log.exists() and len(log.read_text().splitlines()) == 2:
            break
        await asyncio.sleep(0.02)
    assert [json.loads(line)["type"] for line in log.read_text().splitlines()] == ["progress", "completed"]
    # The dead target retries for ever: that aclose returns at all shows it gives up instead of holding the
    # instance (the generous bound only turns a hang into a failure).
    await asyncio.wait_for(reporter.aclose(timeout=0.3), 60)


async def test_sns_reports_reach_an_sqs_subscriber(aws: str) -> None:
    sns = boto3.client("sns", endpoint_url=aws)
    sqs = boto3.client("sqs", endpoint_url=aws)
    topic = sns.create_topic(Name="finetune-reports")["TopicArn"]
    queue_url = sqs.create_queue(QueueName="finetune-events")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)

    reporter = Reporter([SnsTarget("sns:" + topic, SECRET)])
    reporter.start()
    reporter.emit(progress(7))
    assert await reporter.drain(10)
    await reporter.aclose()

    [message] = sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=2)["Messages"]
    envelope = json.loads(message["Body"])
    assert envelope["TopicArn"] == topic
    assert envelope["MessageAttributes"]["finetune_report"]["Value"] == "progress"
    report = parse_report(envelope["Message"])
    assert report.type == "progress" and report.step == 7
    # Signed as the HTTP path signs, over exactly the published message: the bot checks it with the attempt's key.
    attributes = envelope["MessageAttributes"]
    stamp, signature = attributes["finetune_timestamp"]["Value"], attributes["finetune_signature"]["Value"]
    assert verify(SECRET, stamp, envelope["Message"].encode(), signature, time.time())
    assert not verify("another-attempts-key", stamp, envelope["Message"].encode(), signature, time.time())


def test_a_report_target_never_starts_without_the_attempts_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FINETUNE_REPORT_SECRET", raising=False)
    with pytest.raises(ValueError, match="report key"):
        open_target("sns:arn:aws:sns:us-east-1:123456789012:finetune-reports")
    spec_key = "ab" * 32
    assert isinstance(target := open_target("sns:arn:aws:sns:us-east-1:123456789012:r", spec_key), SnsTarget)
    assert target.secret == spec_key  # the key the spec carries (AWS) wins
    monkeypatch.setenv("FINETUNE_REPORT_SECRET", "from-the-environment")
    assert isinstance(target := open_target("https://bot.example/runner/reports"), HttpTarget)
    assert target.secret == "from-the-environment"
