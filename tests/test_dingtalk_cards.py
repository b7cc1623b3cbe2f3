"""DingTalk job cards: created once in the job's group, updated in place, their buttons running the bot's commands.

The real bot (embedded Valkey, local cloud, runner subprocesses) against fakes/fake_dingtalk.py: the card API
checks what DingTalk checks, and the button clicks arrive as Stream callbacks the SDK acknowledges.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.chat.dingtalk.cards import clicked, out_track_id
from fakes.bot_harness import SLEEPS, quick_recipe, running_dingtalk_bot, wait_job, write_config
from fakes.fake_dingtalk import FakeDingTalk, card_click, click_frame, group_message, message_frame
from handlers.jobs import JobState

GROUP = "cidMLteam0001=="
OWNER = "manager4220"


@pytest.fixture
async def dingtalk() -> AsyncIterator[FakeDingTalk]:
    async with FakeDingTalk() as fake:
        yield fake


async def click(dingtalk: FakeDingTalk, track: str, user: str, action: str) -> str:
    """Press a card button; the bot's answer, as the card shows it privately to the one who pressed."""
    frame = click_frame(card_click(track, user, action, GROUP))
    await dingtalk.push(frame)
    ack = await dingtalk.ack(frame["headers"]["messageId"])
    assert ack["code"] == 200
    response: dict[str, Any] = json.loads(ack["data"])["response"]
    assert response["cardUpdateOptions"] == {"updatePrivateDataByKey": True}
    return str(response["userPrivateData"]["cardParamMap"]["notice"])


async def test_the_card_is_created_once_updated_in_place_and_its_buttons_obey_the_policy(
    tmp_path: Path, dingtalk: FakeDingTalk
) -> None:
    config = write_config(
        tmp_path / "bot.yaml",
        policy={"allow": {"start": ["dingtalk:*"], "stop": [f"dingtalk:{OWNER}"]}},
        recipes=[quick_recipe("sleepy", SLEEPS)],
        dingtalk={"card_template_id": "finetune-job.schema"},
    )
    async with running_dingtalk_bot(tmp_path / "state", dingtalk, config) as (service, _console):
        await dingtalk.push(
            message_frame(group_message("/finetune start sleepy", OWNER, GROUP, dingtalk.session_webhook("s")))
        )
        await dingtalk.wait_until(lambda: len(dingtalk.session_replies) == 1, what="answer")
        [job] = await service.bot.store.list_jobs()
        track = out_track_id(job)
        await wait_job(service, job.id, lambda j: j.state is JobState.RUNNING)
        await dingtalk.wait_until(lambda: dingtalk.cards.get(track, {}).get("state") == "RUNNING", what="running card")

        card = dingtalk.cards[track]
        assert dingtalk.card_spaces[track] == f"dtv1.card//IM_GROUP.{GROUP}"
        assert card["title"] == f"{job.id} · sleepy" and card["status"] == "🟢 运行中"
        assert "**实例**" in card["content"] and "抢占式" in card["content"]
        assert (card["stop_label"], card["ack_label"], card["resume_label"]) == ("停止", "确认", "恢复")
        assert (card["show_stop"], card["show_ack"], card["show_resume"]) == ("true", "false", "false")
        creates = [c for c in dingtalk.calls if c[1].endswith("/createAndDeliver")]
        updates = [c for c in dingtalk.calls if c[0] == "PUT"]
        assert len(creates) == 1 and updates and all(body["outTrackId"] == track for _, _, body in updates)

        # Someone the policy does not allow to stop presses Stop: refused, told so on the card, recorded.
        refused = await click(dingtalk, track, "bob", "stop")
        assert refused == "⛔ 你没有 stop 任务的权限；请管理员把 dingtalk:bob 加入 stop 规则"
        refused = await service.bot.store.refusal_log()
        expected = {"event": "refused", "action": "stop", "by": "dingtalk:bob", "job": job.id}
        assert expected.items() <= refused[-1].items()
        still = await service.bot.store.get(job.id)
        assert still is not None and still.state is JobState.RUNNING

        # The owner presses Stop: the same command as typing it, and the card follows the job to STOPPED.
        stopped = await click(dingtalk, track, OWNER, "stop")
        assert stopped == f"已受理：stop {job.id}（停止中）"
        await wait_job(service, job.id, lambda j: j.state is JobState.STOPPED)
        await dingtalk.wait_until(lambda: dingtalk.cards[track]["state"] == "STOPPED", what="stopped card")
        assert dingtalk.cards[track]["status"] == "⏹️ 已停止" and dingtalk.cards[track]["show_stop"] == "false"
        stop_entries = [e for e in await service.bot.store.history(job.id) if e.get("event") == "stop"]
        assert [e["by"] for e in stop_entries] == [f"dingtalk:{OWNER}"]
        await dingtalk.wait_until(
            lambda: any("已停止" in m["text"] for m in dingtalk.group_messages), what="stopped message"
        )
        said = [m for m in dingtalk.group_messages if m["conversation"] == GROUP]
        assert any(f"dingtalk:{OWNER} 请求停止" in m["text"] for m in said)

        # A second Stop changes nothing; a click on a card that is not the bot's is answered, not run.
        again = await click(dingtalk, track, OWNER, "stop")
        assert again == f"⛔ stop {job.id}：任务当前状态为 已停止"
        stranger = await click(dingtalk, "someone-elses-card", OWNER, "stop")
        assert stranger == "这张卡片不属于本机器人的任务。"
        assert len([c for c in dingtalk.calls if c[1].endswith("/createAndDeliver")]) == 1


def test_a_clicks_action_is_cleaned_where_it_enters() -> None:
    """A click's action is echoed when it names no button: the mention markers and escapes it carried are gone."""
    hostile = "stop\ue000U0EVE\ue001\x1b[31m\nnow"
    assert clicked({"cardPrivateData": {"params": {"action": hostile}}}) == "stopU0EVE now"
    assert clicked({"cardPrivateData": {"actionIds": [hostile]}}) == "stopU0EVE now"
