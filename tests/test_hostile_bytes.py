"""What a stranger can send to the running bot's HTTP routes: every hostile byte gets a 4xx, never a 500 or a
traceback, and the bot stays healthy.

The bot runs for real with every public route mounted (runner reports, Slack's HTTP mode, the SNS endpoint, both
Alibaba webhooks) on a real Valkey; the requests are the ones the security review found: a JSON body nested
200,000 deep, a signature header that is not ASCII, a body of 20 MiB, and ids with a trailing newline.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.cloud.user_data import runner_boot_script
from bot.service import BotService
from bot.sources.aliyun_http import CLOUDMONITOR_PATH, EVENTBRIDGE_PATH
from bot.sources.sns_http import SNS_PATH
from fakes.bot_harness import SECRET, running_bot, slack_settings
from fakes.fake_slack import FakeSlack, form_body, signed_headers, slash_command
from handlers import safe_json
from handlers.report_keys import claimed_sender, derive_report_key
from handlers.reports import Progress, dump_report
from handlers.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

TOKEN = "a-long-shared-secret-token-0123"
TOPIC = "arn:aws:sns:us-east-1:123456789012:finetune-events"
EDGE_LOGGERS = ("bot.http", "bot.chat.slack", "bot.sources", "bot.report_gate", "aiohttp", "slack_bolt")
ROUTES = ("/runner/reports", "/slack/events", SNS_PATH, CLOUDMONITOR_PATH, EVENTBRIDGE_PATH)


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[BotService]:
    async with FakeSlack() as slack:
        settings: dict[str, Any] = {
            "finetune_aliyun_webhook_token": TOKEN,
            "finetune_sns_topics": TOPIC,
            **slack_settings(slack.api_url),
        }
        async with running_bot(tmp_path / "state", **settings) as (service, _console):
            yield service


async def send(service: BotService, path: str, body: bytes, headers: dict[str, str] | None = None) -> int:
    url = f"http://127.0.0.1:{service.port}{path}"
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers or {}) as response:
        await response.read()
        return response.status


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        f"{r.name}: {r.getMessage()[:200]}"
        for r in caplog.records
        if r.name.startswith(EDGE_LOGGERS) and (r.exc_info is not None or r.levelno >= logging.ERROR)
    ]


def headers_for(path: str, body: bytes) -> dict[str, str]:
    """What a route's real sender would put beside ``body`` (a signature, a token), so the body itself is tested."""
    if path == "/runner/reports":  # well-formed signature headers (a body that names no attempt has no key)
        return {TIMESTAMP_HEADER: str(int(time.time())), SIGNATURE_HEADER: "v1=" + "0" * 64}
    if path == "/slack/events":
        return signed_headers(body)
    if path == SNS_PATH:
        return {"Content-Type": "text/plain; charset=UTF-8", "x-amz-sns-message-type": "Notification"}
    return {"Content-Type": "application/json", "X-Finetune-Token": TOKEN, "X-Forwarded-Proto": "https"}


async def test_a_body_nested_without_end_is_a_4xx_on_every_route(
    bot: BotService, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    deep = b"[" * 200_000
    for path in ROUTES:
        status = await send(bot, path, deep, headers_for(path, deep))
        assert 400 <= status < 500, (path, status)
    assert tracebacks(caplog) == []
    assert await send(bot, "/healthz", b"") in (200, 405)


async def test_a_signature_header_that_is_not_ascii_is_a_4xx(bot: BotService, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    report = dump_report(Progress(job_id="ft-abcd", attempt=1, step=3)).encode()
    bad = {TIMESTAMP_HEADER: str(int(time.time())), SIGNATURE_HEADER: "v1=" + "é" * 64}
    assert await send(bot, "/runner/reports", report, bad) == 401
    command = form_body(slash_command("list"))
    slack = {**signed_headers(command), "X-Slack-Signature": "v0=" + "é" * 64}
    assert await send(bot, "/slack/events", command, slack) == 401
    aliyun = {"Content-Type": "application/json", "X-Finetune-Token": "é" * 40, "X-Forwarded-Proto": "https"}
    assert await send(bot, CLOUDMONITOR_PATH, b"{}", aliyun) == 401
    assert tracebacks(caplog) == []


async def test_a_body_of_twenty_mebibytes_is_refused_with_413_on_every_route(
    bot: BotService, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    huge = b"x" * (20 * 1024 * 1024)
    for path in ROUTES:
        assert await send(bot, path, huge, headers_for(path, b"")) == 413, path
    assert tracebacks(caplog) == []


async def test_ids_with_a_trailing_newline_are_refused(bot: BotService, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    report = json.loads(dump_report(Progress(job_id="ft-abcd", attempt=1, step=3)))
    report["job_id"] = "ft-abcd\n"
    body = json.dumps(report).encode()
    now = int(time.time())
    key = derive_report_key(SECRET, "ft-abcd\n", 1, "0" * 32)
    signed = {TIMESTAMP_HEADER: str(now), SIGNATURE_HEADER: sign(key, now, body)}
    assert await send(bot, "/runner/reports", body, signed) == 401  # names no attempt a key was ever made for
    # A command naming a job with a newline after it is a usage error, not that job.
    command = form_body(slash_command("stop ft-abcd\n"))
    assert await send(bot, "/slack/events", command, signed_headers(command)) == 200
    assert await bot.bot.store.list_jobs() == []
    assert tracebacks(caplog) == []


def test_a_pattern_that_guards_a_value_takes_the_whole_value() -> None:
    # "$" matches before a trailing newline; every guard takes the whole value, so the newline is refused.
    with pytest.raises(ValueError, match="ENV"):
        runner_boot_script({"ENV": "s3://bucket/spec.json\nEOF"}, "/opt/finetune")
    with pytest.raises(ValueError, match="ENV"):
        runner_boot_script({"ENV": "value\n"}, "/opt/finetune")
    with pytest.raises(ValueError, match="runner path"):
        runner_boot_script({}, "/opt/finetune\n")
    assert claimed_sender(b'{"job_id": "ft-abcd\\n", "attempt": 1}') is None
    assert claimed_sender(b'{"job_id": "ft-abcd", "attempt": 1}') is not None


def test_json_from_outside_is_read_within_a_size_and_a_depth() -> None:
    assert safe_json.loads(b'{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}
    for hostile in (b"[" * 200_000, b"[" * 40 + b"]" * 40, b"x" * (2 * 1024 * 1024), b"\xff\xfe", b"{"):
        with pytest.raises(safe_json.UnsafeJson):
            safe_json.loads(hostile)
