"""The Alibaba story told in DingTalk: a job started with ``@bot`` in a group, on the local cloud speaking ECS's
metadata dialect; a drill, the reclaim notice, the checkpoint, the relaunch, the resume, and the completion,
with the card and the group's messages in Chinese and the alert through the group's signed robot."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.chat.dingtalk.cards import out_track_id
from handlers.jobs import JobState
from tests.bot_harness import quick_recipe, running_dingtalk_bot, wait_job, write_config
from tests.fake_dingtalk import FakeDingTalk, group_message, message_frame
from tests.test_aliyun_local_scenario import RESUMES

GROUP = "cidMLteam0001=="


@pytest.fixture
async def dingtalk() -> AsyncIterator[FakeDingTalk]:
    async with FakeDingTalk() as fake:
        yield fake


async def test_a_dingtalk_job_survives_an_ecs_reclaim_and_finishes_in_chinese(
    tmp_path: Path, dingtalk: FakeDingTalk
) -> None:
    config = write_config(
        tmp_path / "bot.yaml",
        recipes=[quick_recipe("resumes", RESUMES)],
        dingtalk={
            "robot_webhook": dingtalk.robot_webhook,
            "robot_secret": dingtalk.robot_secret,
            "card_template_id": "finetune-job.schema",
        },
    )
    async with running_dingtalk_bot(
        tmp_path / "state", dingtalk, config, grace=8.0, finetune_local_dialect="aliyun"
    ) as (service, _console):

        async def say(text: str) -> None:
            await dingtalk.push(message_frame(group_message(text, "manager4220", GROUP, dingtalk.session_webhook("s"))))

        await say("@bot /finetune start resumes")
        await dingtalk.wait_until(lambda: len(dingtalk.session_replies) == 1, what="answer")
        [job] = await service.bot.store.list_jobs()
        await wait_job(service, job.id, lambda j: j.state is JobState.RUNNING and (j.step or 0) >= 2)
        await say(f"@bot /finetune interrupt-test {job.id}")
        done = await wait_job(service, job.id, lambda j: j.state is JobState.SUCCEEDED, timeout=180)
        assert done.interruptions == 1 and len(done.attempts) == 2 and done.steps_lost == 0

        history = await service.bot.store.history(job.id)
        assert [e["source"] for e in history if e.get("event") == "spot-warning"] == ["aliyun-metadata"]
        [alert] = dingtalk.robot_messages
        assert "中断预警" in alert["markdown"]["text"] and "aliyun-metadata" in alert["markdown"]["text"]

        track = out_track_id(job)
        await dingtalk.wait_until(lambda: dingtalk.cards[track]["state"] == "SUCCEEDED", what="finished card")
        card = dingtalk.cards[track]
        assert card["status"] == "✅ 已完成" and card["show_stop"] == "false"
        assert "**中断**: 1 次 · 丢失 0 步" in card["content"] and "第 2 次尝试" in card["content"]
        await dingtalk.wait_until(
            lambda: any(m["text"].startswith(f"✅ 任务 {job.id} 已完成") for m in dingtalk.group_messages),
            what="completion message",
        )
        said = "\n".join(m["text"] for m in dingtalk.group_messages)
        assert "🔁 第 2 次尝试已在" in said and "丢失 0 步" in said
        assert dingtalk.refused_robot_calls == []
