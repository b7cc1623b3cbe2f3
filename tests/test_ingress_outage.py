"""Every HTTP route of the running bot while its Redis is down: 503 and a short line, never a 500 and a traceback.

The outage is real: the bot's Valkey server is stopped, then started again on the same port (its data kept). A
request refused with 503 started nothing, so the retry its sender makes once Redis is back runs it, once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.log_limit import BURST
from bot.service import BotService
from bot.sources.aliyun_http import CLOUDMONITOR_PATH, EVENTBRIDGE_PATH
from fakes.bot_harness import (
    SECRET,
    SLEEPS,
    attempt_salt,
    quick_recipe,
    report_headers,
    running_bot,
    running_dingtalk_bot,
    slack_settings,
    write_config,
)
from fakes.fake_dingtalk import FakeDingTalk, group_message, message_frame
from fakes.fake_slack import FakeSlack, action_body, block_action, form_body, signed_headers, slash_command
from fakes.restartable_valkey import RestartableValkey
from handlers.jobs import Attempt, Job
from handlers.reports import Progress, dump_report
from handlers.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from tests.aliyun_payloads import INTERRUPTION, cloudevent, interruption_content, notification

TOKEN = "a-long-shared-secret-token-0123"
INSTANCE = "i-bp1ecr0000005go2go"
# The loggers of the HTTP edge: none of them may log a traceback for a request, however bad or badly timed.
EDGE_LOGGERS = ("bot.http", "bot.chat.slack", "bot.chat.dingtalk", "bot.sources", "aiohttp")
GROUP = "cidMLteam0001=="


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


@pytest.fixture
async def valkey(tmp_path: Path) -> AsyncIterator[RestartableValkey]:
    server = RestartableValkey(tmp_path / "redis")
    await server.start()
    yield server
    await server.stop()


async def send(
    service: BotService, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"http://127.0.0.1:{service.port}{path}", data=body, headers=headers or {}) as response,
    ):
        return response.status, await response.text()


def signed_report(job_id: str = "ft-abcd", salt: str = "0" * 32) -> tuple[bytes, dict[str, str]]:
    """A progress report of the job's attempt 1, signed with the key of that attempt whose salt is ``salt``."""
    body = dump_report(Progress(job_id=job_id, attempt=1, step=3, total_steps=10, loss=1.0)).encode()
    now = int(time.time())
    return body, report_headers(body, now, salt=salt)


async def seeded_job(service: BotService, job_id: str = "ft-abcd") -> str:
    """A job with one planned attempt in the bot's store; the salt its report key is derived from."""
    job = Job(id=job_id, recipe="tiny", requested_by="console:ana", attempts=[Attempt(number=1)])
    assert await service.bot.store.create(job, {"event": "seeded"})
    return job.attempts[0].key_salt


def aliyun_pushes() -> list[tuple[str, bytes]]:
    now = datetime.now(UTC)
    warning = notification(
        INTERRUPTION, interruption_content(INSTANCE), INSTANCE, event_time=now.strftime("%Y%m%dT%H%M%S.000%z")
    )
    bridged = cloudevent(INTERRUPTION, interruption_content(INSTANCE), INSTANCE, time=now.isoformat())
    return [(CLOUDMONITOR_PATH, json.dumps(warning).encode()), (EVENTBRIDGE_PATH, json.dumps(bridged).encode())]


def edge_tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.name.startswith(EDGE_LOGGERS) and (r.exc_info is not None or r.levelno >= logging.ERROR)
    ]


async def test_while_redis_is_down_every_route_answers_503_and_the_retries_run_once_it_is_back(
    tmp_path: Path, slack: FakeSlack, valkey: RestartableValkey, caplog: pytest.LogCaptureFixture
) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    settings: dict[str, Any] = {"finetune_aliyun_webhook_token": TOKEN, **slack_settings(slack.api_url)}
    settings["finetune_costs_token"] = TOKEN
    async with running_bot(tmp_path / "state", config, redis_url=valkey.url, **settings) as (service, _console):
        caplog.set_level(logging.INFO)
        start = form_body(slash_command("start sleepy"))
        click = action_body(block_action("finetune_stop", "ft-abcd"))
        report, report_headers = signed_report()  # its salt cannot be looked up while Redis is down: 503 too

        await valkey.stop()
        answers = {
            "report": await send(service, "POST", "/runner/reports", report, report_headers),
            "healthz": await send(service, "GET", "/healthz"),
            "costs": await send(service, "GET", "/costs", headers={"Authorization": f"Bearer {TOKEN}"}),
            "command": await send(service, "POST", "/slack/events", start, signed_headers(start)),
            "click": await send(service, "POST", "/slack/events", click, signed_headers(click)),
        }
        for path, push in aliyun_pushes():
            json_headers = {"Content-Type": "application/json", "X-Finetune-Token": TOKEN, "X-Forwarded-Proto": "https"}
            answers[path] = await send(service, "POST", path, push, json_headers)
        assert {what: status for what, (status, _text) in answers.items()} == dict.fromkeys(answers, 503), answers
        # /metrics alone still answers: the bot's own counters, and that Redis is unavailable (the alert's input).
        status, metrics = await send(service, "GET", "/metrics")
        assert status == 200 and "\nfinetune_redis_up 0\n" in metrics and "finetune_jobs{" not in metrics
        assert "finetune_events_handled_total" in metrics
        assert edge_tracebacks(caplog) == []
        outage_lines = [r for r in caplog.records if r.name.startswith(EDGE_LOGGERS) and "503" in r.getMessage()]
        assert outage_lines and all(len(r.getMessage()) < 300 for r in outage_lines)

        await valkey.start()
        # Slack retries a command it got no 200 for (same body, signed anew): now it runs, and only once.
        retry = {**signed_headers(start), "X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_error"}
        status, reply = await send(service, "POST", "/slack/events", start, retry)
        assert status == 200 and "Starting ft-" in reply, reply
        again = {**signed_headers(start), "X-Slack-Retry-Num": "2", "X-Slack-Retry-Reason": "http_error"}
        assert await send(service, "POST", "/slack/events", start, again) == (200, "")
        [job] = await service.bot.store.list_jobs()
        report, report_headers = signed_report(job.id, await attempt_salt(service, job.id, 1))
        assert (await send(service, "POST", "/runner/reports", report, report_headers))[0] == 202
        assert (await send(service, "GET", "/healthz"))[0] == 200
        assert "\nfinetune_redis_up 1\n" in (await send(service, "GET", "/metrics"))[1]
        assert len(await service.bot.store.list_jobs()) == 1
        assert edge_tracebacks(caplog) == []


async def raw_http(service: BotService, request: bytes) -> bytes:
    """Send bytes that are not quite HTTP; the status line of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
    try:
        writer.write(request)
        await writer.drain()
        return (await reader.readline()).strip()
    finally:
        writer.close()


MALFORMED_HTTP = [
    b"POST /runner/reports HTTP/1.1\r\nHost: bot\r\nNot a header\r\n\r\n",
    b"POST /runner/reports HTTP/1.1\r\nHost: bot\r\nContent-Length: abc\r\n\r\n",
    b"POST /slack/events HTTP/1.1\r\nHost: bot\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
]


async def test_bad_runner_reports_and_malformed_http_get_a_4xx_and_a_bounded_log(
    tmp_path: Path, valkey: RestartableValkey, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path / "state", redis_url=valkey.url) as (service, _console):
        caplog.set_level(logging.INFO)
        report, headers = signed_report(salt=await seeded_job(service))
        now = int(time.time())
        garbage = b'{"type": "progress", "job_id": "nope"}'
        signed_garbage = b'{"type": "progress", "job_id": "ft-abcd", "attempt": 1}'
        bad = [
            (report, {**headers, TIMESTAMP_HEADER: "abc"}, 401),
            (report, {**headers, SIGNATURE_HEADER: "v1=" + "0" * 64}, 401),
            (report, {}, 401),
            # No job and attempt to take a key from: nothing can be verified.
            (
                b"\xff\xfe not json",
                {TIMESTAMP_HEADER: str(now), SIGNATURE_HEADER: sign(SECRET, now, b"\xff\xfe not json")},
                401,
            ),
            (garbage, {TIMESTAMP_HEADER: str(now), SIGNATURE_HEADER: sign(SECRET, now, garbage)}, 401),
            # its attempt's key, but no report
            (signed_garbage, report_headers(signed_garbage, now, salt=await attempt_salt(service, "ft-abcd", 1)), 400),
        ]
        for body, sent, expected in bad:
            assert (await send(service, "POST", "/runner/reports", body, sent))[0] == expected
        for _ in range(100):
            assert (await send(service, "POST", "/runner/reports", report, {**headers, TIMESTAMP_HEADER: "x"}))[
                0
            ] == 401
        lines = [r for r in caplog.records if r.name in ("bot.http", "bot.report_gate")]
        assert 0 < len(lines) <= BURST and all(len(r.getMessage()) < 300 for r in lines)

        for request in MALFORMED_HTTP:
            caplog.clear()
            assert (await raw_http(service, request)).startswith(b"HTTP/1.0 400"), request
            [line] = [r for r in caplog.records if r.name.startswith(("aiohttp", "bot.http"))]
            assert line.getMessage().startswith("refused a malformed HTTP request from 127.0.0.1")
        for _ in range(60):
            assert (await raw_http(service, MALFORMED_HTTP[0])).startswith(b"HTTP/1.0 400")
        assert len([r for r in caplog.records if r.name == "bot.http.server"]) <= BURST
        assert edge_tracebacks(caplog) == []


async def eventually(done: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.05)


async def test_a_dingtalk_message_in_an_outage_is_left_unacked_and_runs_once_when_delivered_again(
    tmp_path: Path, valkey: RestartableValkey, caplog: pytest.LogCaptureFixture
) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    async with (
        FakeDingTalk() as dingtalk,
        running_dingtalk_bot(tmp_path / "state", dingtalk, config, redis_url=valkey.url) as (service, _console),
    ):
        caplog.set_level(logging.INFO)
        data = group_message(" /finetune start sleepy", "manager4220", GROUP, dingtalk.session_webhook("s1"))
        frame = message_frame(data)
        frame_id = frame["headers"]["messageId"]

        await valkey.stop()
        await dingtalk.push(frame)

        def said_unavailable() -> bool:
            return any(
                r.name == "bot.chat.dingtalk.stream" and "Redis is unavailable" in r.getMessage()
                for r in caplog.records
            )

        await eventually(said_unavailable)  # logged once the frame's handling has ended, without an ack
        assert frame_id not in dingtalk.acks

        await valkey.start()
        await dingtalk.push(frame)  # DingTalk delivers what was not acknowledged again
        assert (await dingtalk.ack(frame_id))["code"] == 200
        await dingtalk.wait_until(lambda: len(dingtalk.session_replies) == 1, what="reply")
        assert dingtalk.session_replies[0]["body"]["markdown"]["text"].startswith("正在启动 ft-")
        again = message_frame(data)  # and once more, the ack having been lost: acknowledged, not run
        await dingtalk.push(again)
        assert (await dingtalk.ack(again["headers"]["messageId"]))["code"] == 200
        assert len(await service.bot.store.list_jobs()) == 1
        assert len(dingtalk.session_replies) == 1
        assert edge_tracebacks(caplog) == []
