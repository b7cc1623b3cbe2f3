"""Slack in HTTP mode, end to end: signed requests to the running bot's /slack/events, Web API calls to a fake.

The bot is the real BotService (embedded Valkey, local cloud with real runner subprocesses); Slack is
fakes/fake_slack.py over real HTTP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.cloud.local.provider import LocalCloud
from bot.log_limit import BURST
from bot.service import BotService, CloudWiring
from fakes.bot_harness import SLEEPS, quick_recipe, running_bot, slack_settings, wait_job, write_config
from fakes.fake_slack import (
    FakeSlack,
    Message,
    action_body,
    block_action,
    form_body,
    signed_headers,
    slash_command,
)
from handlers.jobs import JobState, Market

CHANNEL = "C0JOBS"
CHINESE_CHANNEL = "C0ZHTEAM"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


async def post(service: BotService, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{service.port}/slack/events"
        async with http.post(url, data=body, headers=headers) as response:
            return response.status, await response.text()


async def command(service: BotService, text: str, user: str = "U0ANA", channel: str = CHANNEL) -> tuple[int, str]:
    body = form_body(slash_command(text, user=user, channel=channel))
    return await post(service, body, signed_headers(body))


async def click(service: BotService, action_id: str, value: str, user: str = "U0ANA", channel: str = CHANNEL) -> int:
    body = action_body(block_action(action_id, value, user=user, channel=channel))
    status, _text = await post(service, body, signed_headers(body))
    return status


def started(reply: str) -> str:
    assert "Starting ft-" in reply, reply
    return reply.split("Starting ", 1)[1].split(":", 1)[0]


def card_of(slack: FakeSlack, job_id: str) -> Message | None:
    for message in slack.channel_messages(CHANNEL):
        header = message.blocks[0] if message.blocks else {}
        if header.get("type") == "header" and header["text"]["text"].startswith(job_id):
            return message
    return None


def field_text(message: Message) -> str:
    return " ".join(
        item["text"] for block in message.blocks if block["type"] == "section" for item in block.get("fields", [])
    )


def buttons(message: Message) -> dict[str, dict[str, Any]]:
    return {
        element["action_id"]: element
        for block in message.blocks
        if block["type"] == "actions"
        for element in block["elements"]
    }


def sleepy_config(tmp_path: Path, **extra: Any) -> Path:
    return write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)], **extra)


async def test_a_slash_command_starts_a_job_whose_card_is_posted_once_then_edited_in_place(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with running_bot(tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url)) as (
        service,
        _console,
    ):
        status, reply = await command(service, "start sleepy")
        assert status == 200
        job_id = started(reply)
        job = await service.bot.store.get(job_id)
        assert job is not None and job.requested_by == "slack:U0ANA"
        assert job.chat is not None and (job.chat.platform, job.chat.channel) == ("slack", CHANNEL)

        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
        card = await slack.wait_for(lambda: (c := card_of(slack, job_id)) and "RUNNING" in field_text(c) and c)
        assert slack.channel_messages(CHANNEL) == [card]
        assert card.edits >= 1  # posted while PENDING, then edited in place
        assert len(slack.called("chat.postMessage")) == 1
        assert all(call.args["ts"] == card.ts for call in slack.called("chat.update"))
        shown = buttons(card)
        assert set(shown) == {"finetune_stop", "finetune_interrupt_test"}
        assert all("confirm" in button and button["value"] == job_id for button in shown.values())

        status, reply = await command(service, f"stop {job_id}")
        assert status == 200 and f"OK: stop {job_id}" in reply
        await wait_job(service, job_id, lambda job: job.state is JobState.STOPPED)
        replies = await slack.wait_for(lambda: slack.replies(CHANNEL, card.ts))
        assert "Stop requested by <@U0ANA>" in replies[0].text
        final = await slack.wait_for(lambda: "STOPPED" in field_text(card) and card)
        assert buttons(final) == {}
        assert slack.channel_messages(CHANNEL) == [card]  # one card; everything else went into its thread
        assert all(reply.thread_ts == card.ts for reply in slack.channel_messages(CHANNEL, top_level=False))


async def test_usage_errors_refusals_and_help_are_answered_in_the_ack_and_change_nothing(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with running_bot(tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url)) as (
        service,
        _console,
    ):
        for text, expected in (
            ("start", "start needs a recipe"),
            ("frobnicate ft-1234", "unknown command 'frobnicate'"),
            ("stop not-a-job", "is not a job id"),
            ("help", "/finetune start &lt;recipe&gt;"),  # escaped, as Slack asks: shown as typed
            ("start deepseek-7b dataset=--push_to_hub", "dataset may not start with '-'"),
            ("start deepseek-7b model=someone/model", "model 'someone/model' is not allowed; it may be: /mnt/"),
            ("start deepseek-7b model=/mnt/oss-data/../../etc", "model may only use"),
            ("", "/finetune start &lt;recipe&gt;"),
        ):
            status, reply = await command(service, text)
            assert status == 200 and expected in reply, (text, reply)
            assert '"response_type":"ephemeral"' in reply.replace(" ", "")
        assert await service.bot.store.list_jobs() == []
        assert [call.method for call in slack.calls] == ["auth.test"]


async def test_bad_signatures_and_old_timestamps_get_401_and_change_nothing(tmp_path: Path, slack: FakeSlack) -> None:
    async with running_bot(tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url)) as (
        service,
        _console,
    ):
        body = form_body(slash_command("start sleepy", channel=CHANNEL))
        old = int(time.time()) - 301
        forged = [
            {"Content-Type": "application/x-www-form-urlencoded"},
            signed_headers(body, secret="not-the-secret"),
            signed_headers(body, timestamp=old),
            signed_headers(body + b"&text=stop"),
        ]
        for headers in forged:
            status, _reply = await post(service, body, headers)
            assert status == 401
        action = action_body(block_action("finetune_stop", "ft-abcd"))
        status, _reply = await post(service, action, signed_headers(action, secret="not-the-secret"))
        assert status == 401
        assert await service.bot.store.list_jobs() == []
        assert await service.bot.store.audit_log() == []
        assert [call.method for call in slack.calls] == ["auth.test"]


async def test_an_unauthorised_stop_button_is_refused_recorded_and_the_job_keeps_running(
    tmp_path: Path, slack: FakeSlack
) -> None:
    # The boss is an admin (the job is not theirs); the allow rules keep even its owner from stopping it.
    policy = {
        "admins": ["slack:U0BOSS"],
        "allow": {"start": ["slack:*"], "stop": ["slack:U0BOSS"], "interrupt-test": ["slack:U0BOSS"]},
    }
    config = sleepy_config(tmp_path, policy=policy)
    async with running_bot(tmp_path / "state", config, **slack_settings(slack.api_url)) as (service, _console):
        job_id = started((await command(service, "start sleepy", user="U0EVE"))[1])
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)

        assert await click(service, "finetune_stop", job_id, user="U0EVE") == 200
        refusal = await slack.wait_for(lambda: [e for e in slack.ephemeral if e["user"] == "U0EVE"])
        assert refusal[0]["text"].startswith("⛔") and "not allowed to stop" in refusal[0]["text"]
        assert refusal[0]["channel"] == CHANNEL
        job = await service.bot.store.get(job_id)
        assert job is not None and job.state is JobState.RUNNING
        refused = await service.bot.store.refusal_log()
        assert [(e["action"], e["by"], e["job"], e["channel"]) for e in refused] == [
            ("stop", "slack:U0EVE", job_id, f"slack:{CHANNEL}")
        ]
        assert not [e for e in await service.bot.store.history(job_id) if e.get("event") == "refused"]

        assert await click(service, "finetune_stop", job_id, user="U0BOSS") == 200
        await wait_job(service, job_id, lambda job: job.state in (JobState.STOPPING, JobState.STOPPED))
        allowed = await slack.wait_for(lambda: [e for e in slack.ephemeral if e["user"] == "U0BOSS"])
        assert allowed[0]["text"].startswith("OK: stop " + job_id)
        stops = [e for e in await service.bot.store.history(job_id) if e.get("event") == "stop"]
        assert [e["by"] for e in stops] == ["slack:U0BOSS"]


async def test_a_channel_configured_in_chinese_is_answered_in_chinese_and_the_others_in_english(
    tmp_path: Path, slack: FakeSlack
) -> None:
    policy = {"admins": ["slack:U0BOSS"], "allow": {"start": ["slack:*"], "stop": ["slack:U0BOSS"]}}
    chinese = {"channels": {CHINESE_CHANNEL: {"language": "zh-CN"}}}
    config = sleepy_config(tmp_path, policy=policy, slack=chinese)
    async with running_bot(tmp_path / "state", config, **slack_settings(slack.api_url)) as (service, _console):
        # A usage error is answered in the ack itself, in the channel's language.
        status, reply = await command(service, "start", channel=CHINESE_CHANNEL)
        assert status == 200 and json.loads(reply) == {
            "text": "start：需要指定配方。用法：/finetune start &lt;配方&gt; [参数=值 …] "
            "[deadline=36h] [budget=120] [nodes=2]",
            "response_type": "ephemeral",
        }
        status, reply = await command(service, "start sleepy", user="U0EVE", channel=CHINESE_CHANNEL)
        answer = json.loads(reply)["text"]
        [job] = await service.bot.store.list_jobs()
        assert status == 200 and answer.startswith(f"正在启动 {job.id}：sleepy（")
        await wait_job(service, job.id, lambda job: job.state is JobState.RUNNING)

        # Eve may not stop: the card's Stop button gets her a Chinese refusal, shown to her only.
        assert await click(service, "finetune_stop", job.id, user="U0EVE", channel=CHINESE_CHANNEL) == 200
        refusal = await slack.wait_for(lambda: [e for e in slack.ephemeral if e["user"] == "U0EVE"])
        assert refusal[0]["channel"] == CHINESE_CHANNEL
        assert refusal[0]["text"] == "⛔ 你没有 stop 任务的权限；请管理员把 slack:U0EVE 加入 stop 规则"
        still = await service.bot.store.get(job.id)
        assert still is not None and still.state is JobState.RUNNING
        refused = await service.bot.store.refusal_log()
        assert [(e["action"], e["by"], e["job"]) for e in refused] == [("stop", "slack:U0EVE", job.id)]

        # The same refusal in a channel with no language set is the English one, word for word.
        assert await click(service, "finetune_stop", job.id, user="U0EVE", channel=CHANNEL) == 200
        english = await slack.wait_for(lambda: [e for e in slack.ephemeral if e["channel"] == CHANNEL])
        assert (
            english[0]["text"]
            == "⛔ you are not allowed to stop jobs; ask an admin to add slack:U0EVE to the stop rule"
        )


class SlowPrices(LocalCloud):
    """The local cloud, with a price lookup slower than Slack's three seconds (a slow pricing API)."""

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        await asyncio.sleep(3.5)
        return await super().hourly_price(instance_types, market)


async def test_a_slow_command_is_acked_at_once_and_answered_ephemerally_when_done(
    tmp_path: Path, slack: FakeSlack
) -> None:
    def cloud(wiring: CloudWiring) -> SlowPrices:
        return SlowPrices(tmp_path / "cloud", wiring.redis.client, wiring.redis.url)

    config = sleepy_config(tmp_path, policy={"max_hourly_price": 5.0})  # a cap makes start ask for the price
    async with running_bot(tmp_path / "state", config, cloud=cloud, **slack_settings(slack.api_url)) as (
        service,
        _console,
    ):
        status, reply = await command(service, "start sleepy")
        assert status == 200 and "Working on it" in reply and "Starting" not in reply
        answer = await slack.wait_for(lambda: slack.ephemeral)
        assert answer[0]["user"] == "U0ANA" and answer[0]["channel"] == CHANNEL
        job_id = started(answer[0]["text"])
        assert await service.bot.store.get(job_id) is not None


class HeldPrices(LocalCloud):
    """The local cloud, whose price lookup waits until the test releases it: a command still running, for sure."""

    release: asyncio.Event

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        await self.release.wait()
        return await super().hourly_price(instance_types, market)


async def test_retries_and_replays_of_a_command_start_one_job_and_post_one_card(
    tmp_path: Path, slack: FakeSlack
) -> None:
    release = asyncio.Event()

    def cloud(wiring: CloudWiring) -> HeldPrices:
        held = HeldPrices(tmp_path / "cloud", wiring.redis.client, wiring.redis.url)
        held.release = release
        return held

    config = sleepy_config(tmp_path, policy={"max_hourly_price": 5.0})  # a cap makes start ask for the price
    async with running_bot(tmp_path / "state", config, cloud=cloud, **slack_settings(slack.api_url)) as (
        service,
        _console,
    ):
        body = form_body(slash_command("start sleepy"))
        headers = signed_headers(body)
        status, reply = await post(service, body, headers)
        assert status == 200 and "Working on it" in reply  # acked; the command itself waits for the price

        # While the first delivery is still running: Slack's three retries (same body, signed anew, as Slack
        # sends them) and a replay of the very same signed request. Each is answered and does nothing.
        for retry in ("1", "2", "3"):
            again = {**signed_headers(body), "X-Slack-Retry-Num": retry, "X-Slack-Retry-Reason": "http_timeout"}
            assert await post(service, body, again) == (200, "")
        assert await post(service, body, headers) == (200, "")

        release.set()
        answer = await slack.wait_for(lambda: slack.ephemeral)
        job_id = started(answer[0]["text"])
        card = await slack.wait_for(lambda: card_of(slack, job_id))
        assert await post(service, body, headers) == (200, "")  # a replay once it is done changes nothing either

        # A different request, answered after all the others: by then they have all been handled.
        status, reply = await command(service, "list")
        assert status == 200 and job_id in reply
        assert [job.id for job in await service.bot.store.list_jobs()] == [job_id]
        assert slack.channel_messages(CHANNEL) == [card]
        assert len(slack.called("chat.postMessage")) == 1
        assert [e["text"] for e in slack.ephemeral] == [answer[0]["text"]]


async def test_a_replayed_or_retried_click_changes_nothing(tmp_path: Path, slack: FakeSlack) -> None:
    policy = {"admins": ["slack:U0BOSS"], "allow": {"start": ["slack:*"], "stop": ["slack:U0BOSS"]}}
    async with running_bot(
        tmp_path / "state", sleepy_config(tmp_path, policy=policy), **slack_settings(slack.api_url)
    ) as (
        service,
        _console,
    ):
        job_id = started((await command(service, "start sleepy", user="U0EVE"))[1])
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)

        body = action_body(block_action("finetune_stop", job_id, user="U0EVE"))
        headers = signed_headers(body)
        assert (await post(service, body, headers))[0] == 200
        await slack.wait_for(lambda: [e for e in slack.ephemeral if e["user"] == "U0EVE"])
        assert await post(service, body, headers) == (200, "")
        assert await post(service, body, {**signed_headers(body), "X-Slack-Retry-Num": "1"}) == (200, "")

        # The boss's click comes after the replays and is handled: the replays were handled before it, and did nothing.
        assert await click(service, "finetune_stop", job_id, user="U0BOSS") == 200
        await slack.wait_for(lambda: [e for e in slack.ephemeral if e["user"] == "U0BOSS"])
        await wait_job(service, job_id, lambda job: job.state in (JobState.STOPPING, JobState.STOPPED))
        assert len([e for e in slack.ephemeral if e["user"] == "U0EVE"]) == 1
        history = await service.bot.store.history(job_id)
        refused = await service.bot.store.refusal_log()
        assert [(e["action"], e["by"]) for e in refused] == [("stop", "slack:U0EVE")]
        assert [e["by"] for e in history if e.get("event") == "stop"] == ["slack:U0BOSS"]


def _resigned(body: bytes, **headers: str) -> tuple[bytes, dict[str, str]]:
    return body, {**signed_headers(body), **headers}


def _bad_requests() -> list[tuple[str, bytes, dict[str, str], int]]:
    """Requests /slack/events must refuse: (what, body, headers, status). All but the first few are signed."""
    command_fields = slash_command("start sleepy")
    body = form_body(command_fields)
    without_user = {k: v for k, v in command_fields.items() if k != "user_id"}
    click_payload = block_action("finetune_stop", "ft-abcd")
    no_user_click = {k: v for k, v in click_payload.items() if k != "user"}
    unknown_button = {**click_payload, "actions": [{**click_payload["actions"][0], "action_id": "delete_all"}]}
    json_body = json.dumps(command_fields).encode()
    cases: list[tuple[str, bytes, dict[str, str]]] = [
        ("a timestamp that is no number", body, {**signed_headers(body), "X-Slack-Request-Timestamp": "abc"}),
        ("an empty timestamp", body, {**signed_headers(body), "X-Slack-Request-Timestamp": ""}),
        ("a signature of another form", body, {**signed_headers(body), "X-Slack-Signature": "v1=abc"}),
        ("a form without user_id", *_resigned(form_body(without_user))),
        ("a form sent as JSON", json_body, {**signed_headers(json_body), "Content-Type": "application/json"}),
        ("a form labelled JSON", body, {**signed_headers(body), "Content-Type": "application/json"}),
        ("a payload that is not JSON", *_resigned(b"payload=%7Bnot+json")),
        ("a payload that is a list", *_resigned(action_body([1, 2]))),  # type: ignore[arg-type]
        ("an interaction of another type", *_resigned(action_body({**click_payload, "type": "view_submission"}))),
        ("a click without its user", *_resigned(action_body(no_user_click))),
        ("a click on no button of ours", *_resigned(action_body(unknown_button))),
        ("a body that is not UTF-8", *_resigned(b"text=\xff\xfe&command=%2Ffinetune")),
        ("a field given twice", *_resigned(body + b"&user_id=U0OTHER")),
        ("another app's command", *_resigned(form_body({**command_fields, "command": "/deploy"}))),
        ("an empty body", *_resigned(b"")),
    ]
    return [(what, raw, headers, 401 if index < 3 else 400) for index, (what, raw, headers) in enumerate(cases)]


async def test_bad_requests_get_a_4xx_and_a_short_line_and_a_flood_of_them_a_bounded_log(
    tmp_path: Path, slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url)) as (
        service,
        _console,
    ):
        caplog.set_level(logging.INFO)
        cases = _bad_requests()
        for what, body, headers, expected in cases:
            caplog.clear()
            status, answer = await post(service, body, headers)
            assert status == expected, (what, status, answer)
            lines = [r for r in caplog.records if r.name == "bot.chat.slack.app"]
            assert len(lines) == 1 and len(lines[0].getMessage()) < 300, (what, [r.getMessage() for r in lines])
            assert all(r.exc_info is None and r.levelno < logging.ERROR for r in caplog.records), what

        # A command whose text says "payload" is a command (bolt's own parser would have taken it for a click).
        status, reply = await command(service, "start sleepy payload=1")
        assert status == 200 and "has no parameter 'payload'" in reply

        caplog.clear()
        flood = form_body(slash_command("start sleepy"))
        for _ in range(200):
            status, _answer = await post(service, flood, {**signed_headers(flood), "X-Slack-Request-Timestamp": "x"})
            assert status == 401
        lines = [r for r in caplog.records if r.name == "bot.chat.slack.app"]
        assert 0 < len(lines) <= BURST  # this window's lines were spent; the rest is counted, not logged
        assert all(r.exc_info is None for r in caplog.records)

        assert await service.bot.store.list_jobs() == []
        assert [call.method for call in slack.calls] == ["auth.test"]
