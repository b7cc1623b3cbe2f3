"""DingTalk alerts and on-call, end to end: interrupt-test typed in DingTalk, the spot alert through the group's signed
custom robot in Chinese, the failed resume paging on-call by userId and mobile up the ladder, and the
acknowledgement from the card's button.

The real bot (embedded Valkey, local cloud, runner subprocesses, the on-call ladder on a stepped clock) against
fakes/fake_dingtalk.py, whose robot webhook refuses anything not signed with the robot's secret.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.chat.dingtalk.cards import out_track_id
from fakes.bot_harness import (
    FAILS_ON_RESUME,
    SteppedClock,
    quick_recipe,
    running_dingtalk_bot,
    wait_job,
    write_config,
)
from fakes.fake_dingtalk import FakeDingTalk, card_click, click_frame, group_message, message_frame
from handlers.jobs import JobState

GROUP = "cidMLteam0001=="
ANA, BO_MOBILE = "manager4220", "13800000000"


def sent(dingtalk: FakeDingTalk, title: str) -> list[dict[str, Any]]:
    """What the group's custom robot posted under a title starting with ``title``."""
    return [m for m in dingtalk.robot_messages if m["markdown"]["title"].startswith(title)]


@pytest.fixture
async def dingtalk() -> AsyncIterator[FakeDingTalk]:
    async with FakeDingTalk() as fake:
        yield fake


async def test_alert_and_page_reach_the_signed_robot_in_chinese_and_the_card_acknowledges(
    tmp_path: Path, dingtalk: FakeDingTalk
) -> None:
    config = write_config(
        tmp_path / "bot.yaml",
        recipes=[quick_recipe("flaky", FAILS_ON_RESUME)],
        oncall={
            "people": {"ana": {"dingtalk": ANA}, "bo": {"mobile": BO_MOBILE}},
            "rota": [["ana", "bo"]],
            "ladder": [
                {"after_minutes": 0, "notify": ["primary", "secondary"]},
                {"after_minutes": 5, "notify": ["channel"]},
            ],
            "max_repeats": 0,
        },
        dingtalk={
            "robot_webhook": dingtalk.robot_webhook,
            "robot_secret": dingtalk.robot_secret,
            "card_template_id": "finetune-job.schema",
        },
    )
    clock = SteppedClock()
    async with running_dingtalk_bot(tmp_path / "state", dingtalk, config, clock=clock) as (service, _console):

        async def say(text: str) -> None:
            await dingtalk.push(message_frame(group_message(text, ANA, GROUP, dingtalk.session_webhook("s"))))

        await say("@bot /finetune start flaky")
        await dingtalk.wait_until(lambda: len(dingtalk.session_replies) == 1, what="answer")
        [job] = await service.bot.store.list_jobs()
        await wait_job(service, job.id, lambda j: j.state is JobState.RUNNING and (j.step or 0) > 0)
        await say(f"@bot /finetune interrupt-test {job.id}")

        # The spot warning: to the alert group through its custom robot, signed, in Chinese, nobody @-ed.
        await dingtalk.wait_until(lambda: len(sent(dingtalk, "抢占式实例告警")) == 1, what="spot alert")
        [alert] = sent(dingtalk, "抢占式实例告警")
        assert alert["markdown"]["title"] == f"抢占式实例告警 · {job.id}"
        assert f"⚠️ 任务 {job.id} 所在的抢占式实例" in alert["markdown"]["text"]
        assert "中断预警" in alert["markdown"]["text"] and "正在保存检查点" in alert["markdown"]["text"]
        assert alert["at"] == {"atUserIds": [], "atMobiles": [], "isAtAll": False}

        # The resume fails: the first step of the ladder pages the primary by userId and the secondary by mobile.
        await wait_job(service, job.id, lambda j: j.state is JobState.RESUME_FAILED, timeout=180)
        await dingtalk.wait_until(lambda: len(sent(dingtalk, "值班告警")) == 1, what="page", timeout=60)
        [page] = sent(dingtalk, "值班告警")
        assert page["markdown"]["title"] == f"值班告警 · {job.id}"
        assert page["at"] == {"atUserIds": [ANA], "atMobiles": [BO_MOBILE], "isAtAll": False}
        text = page["markdown"]["text"]
        assert text.startswith(f"🚨 值班：任务 {job.id} 无法恢复") and f"@{ANA}" in text and f"@{BO_MOBILE}" in text

        track = out_track_id(job)
        await dingtalk.wait_until(lambda: dingtalk.cards.get(track, {}).get("show_ack") == "true", what="ack button")
        card = dingtalk.cards[track]
        assert card["status"] == "🚨 恢复失败" and card["ack_label"] == "确认"
        assert card["show_resume"] == "true" and "show_retry" not in card

        # Nobody acknowledges in five minutes: the next step calls the whole group (@all).
        clock.advance(minutes=6)
        await dingtalk.wait_until(lambda: len(sent(dingtalk, "值班告警")) == 2, what="second page step", timeout=60)
        second = sent(dingtalk, "值班告警")[1]
        assert second["at"] == {"atUserIds": [], "atMobiles": [], "isAtAll": True}
        assert "（第 2 级升级，共 2 级，尚无人确认）" in second["markdown"]["text"]

        # Ana acknowledges from the card: recorded with who and when, said in the group, shown on the card.
        frame = click_frame(card_click(track, ANA, "ack", GROUP))
        await dingtalk.push(frame)
        ack = await dingtalk.ack(frame["headers"]["messageId"])
        notice = json.loads(ack["data"])["response"]["userPrivateData"]["cardParamMap"]["notice"]
        assert notice == f"已受理：ack {job.id}（恢复失败）"
        acked = await service.bot.store.get(job.id)
        assert acked is not None and acked.page is not None and acked.page.acked_by == f"dingtalk:{ANA}"
        await dingtalk.wait_until(
            lambda: any("确认任务" in m["text"] for m in dingtalk.group_messages), what="acknowledgement message"
        )
        [said] = [m for m in dingtalk.group_messages if "确认任务" in m["text"]]
        assert said["text"].startswith(f"👀 dingtalk:{ANA} 已于") and "升级停止" in said["text"]
        await dingtalk.wait_until(lambda: dingtalk.cards[track]["show_ack"] == "false", what="acknowledged card")
        assert f"**值班**: 已由 dingtalk:{ANA} 于" in dingtalk.cards[track]["content"]
        assert dingtalk.refused_robot_calls == []
