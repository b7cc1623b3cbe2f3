"""DingTalk in: the real bot's Stream connection against a local gateway, ``@bot /finetune …`` to the bot's commands.

The gateway is fakes/fake_dingtalk.py over real HTTP and a real websocket; frames are shaped as DingTalk sends
them and the acks are whatever the dingtalk-stream SDK writes back.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.chat.dingtalk.inbound import command_text
from bot.errors import ConfigError
from bot.service import BotService
from bot.settings import Settings
from fakes.bot_harness import SECRET, SLEEPS, quick_recipe, running_dingtalk_bot, wait_job, write_config
from fakes.fake_dingtalk import (
    CARD_TOPIC,
    MESSAGE_TOPIC,
    FakeDingTalk,
    group_message,
    message_frame,
    system_frame,
)
from handlers.jobs import JobState

GROUP = "cidMLteam0001=="


@pytest.fixture
async def dingtalk() -> AsyncIterator[FakeDingTalk]:
    async with FakeDingTalk() as fake:
        yield fake


def test_the_command_is_what_follows_the_mention_and_finetune() -> None:
    assert command_text(" /finetune start tiny lr=1e-4") == "start tiny lr=1e-4"
    assert command_text("@Finetune Bot /FINETUNE status ft-7k2q") == "status ft-7k2q"
    assert command_text("@finetune-bot list") == "list"
    assert command_text("@Finetune Bot resume ft-7k2q on-demand") == "resume ft-7k2q on-demand"
    assert command_text("@finetune-bot frobnicate") == "frobnicate"  # and the usage answer says so
    assert command_text("@finetune-bot") == ""


async def test_a_group_command_starts_a_job_and_the_answer_comes_back_in_markdown(
    tmp_path: Path, dingtalk: FakeDingTalk
) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    async with running_dingtalk_bot(tmp_path / "state", dingtalk, config) as (service, _console):
        [opened] = dingtalk.opens
        assert opened["clientId"] == dingtalk.client_id and opened["clientSecret"] == dingtalk.client_secret
        assert {(s["type"], s["topic"]) for s in opened["subscriptions"]} == {
            ("CALLBACK", MESSAGE_TOPIC),
            ("CALLBACK", CARD_TOPIC),
        }

        ping = system_frame("ping", {"opaque": "c2b9-42"})
        await dingtalk.push(ping)
        pong = await dingtalk.ack(ping["headers"]["messageId"])
        assert pong["code"] == 200 and json.loads(pong["data"]) == {"opaque": "c2b9-42"}

        data = group_message(" /finetune start sleepy", "manager4220", GROUP, dingtalk.session_webhook("s1"))
        frame = message_frame(data)
        await dingtalk.push(frame)
        assert (await dingtalk.ack(frame["headers"]["messageId"]))["code"] == 200
        await dingtalk.wait_until(lambda: len(dingtalk.session_replies) == 1, what="reply")
        [reply] = dingtalk.session_replies
        assert reply["session"] == "s1" and reply["body"]["msgtype"] == "markdown"
        assert reply["body"]["markdown"]["title"] == "微调任务"
        answer = reply["body"]["markdown"]["text"]
        assert answer.startswith("正在启动 ft-") and "sleepy" in answer  # the group's language: zh-CN by default
        [job] = await service.bot.store.list_jobs()
        assert job.requested_by == "dingtalk:manager4220"
        assert job.chat is not None and (job.chat.platform, job.chat.channel) == ("dingtalk", GROUP)
        await wait_job(service, job.id, lambda j: j.state is JobState.RUNNING)

        # DingTalk delivers the same message again (say our ack was lost): acknowledged, not run twice.
        again = message_frame(data)
        await dingtalk.push(again)
        assert (await dingtalk.ack(again["headers"]["messageId"]))["code"] == 200
        assert len(await service.bot.store.list_jobs()) == 1
        assert len(dingtalk.session_replies) == 1

        # The gateway asks for a reconnect; the next message arrives on the new connection.
        bye = await dingtalk.disconnect()
        assert (await dingtalk.ack(bye))["code"] == 200
        await dingtalk.wait_until(lambda: len(dingtalk.opens) == 2, what="second connection")
        asked = group_message(f"@Finetune Bot status {job.id}", "bob", GROUP, dingtalk.session_webhook("s2"))
        status = message_frame(asked)
        await dingtalk.push(status)
        await dingtalk.wait_until(lambda: len(dingtalk.session_replies) == 2, what="status reply")
        text = dingtalk.session_replies[1]["body"]["markdown"]["text"]
        assert job.id in text and "运行中" in text
        assert "\n\n" in text  # one markdown paragraph per line of the card


async def test_expired_session_webhook_answers_through_the_openapi_and_pictures_get_usage(
    tmp_path: Path, dingtalk: FakeDingTalk
) -> None:
    config = write_config(tmp_path / "bot.yaml", dingtalk={"channels": {"cidEnglish==": {"language": "en"}}})
    async with running_dingtalk_bot(tmp_path / "state", dingtalk, config):
        stale = group_message("@bot /finetune list", "ana", GROUP, dingtalk.session_webhook("old"), expires_in=-5)
        await dingtalk.push(message_frame(stale))
        picture = group_message("", "ana", "cidEnglish==", dingtalk.session_webhook("p"), msgtype="picture")
        await dingtalk.push(message_frame(picture))
        await dingtalk.wait_until(lambda: len(dingtalk.group_messages) == 1, what="group message")
        await dingtalk.wait_until(lambda: len(dingtalk.session_replies) == 1, what="picture answer")
    [listed] = dingtalk.group_messages
    assert listed["conversation"] == GROUP and listed["title"] == "微调任务"
    assert listed["text"] == "还没有任务：/finetune start tiny"
    [usage] = dingtalk.session_replies
    assert usage["body"]["markdown"]["title"] == "finetune"  # this group reads English
    assert usage["body"]["markdown"]["text"] == "I only read text commands: `@bot /finetune help`"


async def test_credentials_dingtalk_refuses_are_one_clear_error_at_start(
    tmp_path: Path, dingtalk: FakeDingTalk
) -> None:
    settings = Settings(
        finetune_state_dir=tmp_path / "state",
        finetune_http_port=0,
        finetune_report_secret=SECRET,
        dingtalk_client_id=dingtalk.client_id,
        dingtalk_client_secret="not-the-secret",
        dingtalk_openapi_endpoint=dingtalk.url,
    )
    with pytest.raises(ConfigError, match="DingTalk refused DINGTALK_CLIENT_ID / DINGTALK_CLIENT_SECRET"):
        await BotService(settings).start()
    assert dingtalk.opens == []
    missing = settings.model_copy(update={"dingtalk_client_secret": None})
    with pytest.raises(ConfigError, match="DINGTALK_CLIENT_SECRET is not"):
        await BotService(missing).start()


async def test_markup_in_a_command_comes_back_as_words_not_as_links_images_or_html(
    tmp_path: Path, dingtalk: FakeDingTalk
) -> None:
    config = write_config(tmp_path / "bot.yaml", dingtalk={"channels": {GROUP: {"language": "en"}}})
    async with running_dingtalk_bot(tmp_path / "state", dingtalk, config):
        typed = "@bot /finetune start ![x](https://evil.example/p.png)[click](https://evil.example) <font color=red>"
        await dingtalk.push(message_frame(group_message(typed, "ana", GROUP, dingtalk.session_webhook("m"))))
        await dingtalk.wait_until(lambda: len(dingtalk.session_replies) == 1, what="answer")
    answer = dingtalk.session_replies[0]["body"]["markdown"]["text"]
    assert "evil.example" in answer  # the user's words are echoed…
    assert "](" not in answer.replace("］(", "") and "<font" not in answer  # …as words: no link, image or tag
    assert "!［x］(https://evil.example/p.png)" in answer
