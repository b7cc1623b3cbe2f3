"""The Alibaba story told in DingTalk: a job started with ``@bot`` in a group, on the local cloud speaking ECS's
metadata dialect with its checkpoints in an S3-API bucket through the runner's ``oss://`` store; ECS reclaims the
instance (CloudMonitor's preemption event to the bot's webhook, then the termination time on the metadata
service), the checkpoint, the relaunch, the resume and the completion, with the card and the group's messages in
Chinese and the alert through the group's signed robot."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import aiohttp
import boto3
import pytest

from bot.chat.dingtalk.cards import out_track_id
from bot.cloud.local.provider import LocalCloud
from bot.sources.aliyun_http import CLOUDMONITOR_PATH
from fakes.bot_harness import INTERRUPTIBLE, quick_recipe, running_dingtalk_bot, wait_job, write_config
from fakes.fake_dingtalk import FakeDingTalk, group_message, message_frame
from handlers.jobs import JobState
from tests.aliyun_payloads import INTERRUPTION, interruption_content, notification

GROUP = "cidMLteam0001=="
TOKEN = "cloudmonitor-push-token-0123"
BUCKET = "finetune-ckpt"


@pytest.fixture
async def dingtalk() -> AsyncIterator[FakeDingTalk]:
    async with FakeDingTalk() as fake:
        yield fake


async def test_a_dingtalk_job_survives_an_ecs_reclaim_and_finishes_in_chinese(
    tmp_path: Path, dingtalk: FakeDingTalk, aws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    boto3.client("s3").create_bucket(Bucket=BUCKET)  # moto plays OSS's S3-compatible API
    for name, value in {
        "OSS_ENDPOINT": aws,
        "ALIBABA_CLOUD_ACCESS_KEY_ID": "testing",
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "testing",
        "FINETUNE_S3_ADDRESSING": "path",  # OSS wants virtual hosting; a bucket on 127.0.0.1 has no DNS name
    }.items():
        monkeypatch.setenv(name, value)
    config = write_config(
        tmp_path / "bot.yaml",
        recipes=[quick_recipe("resumes", INTERRUPTIBLE)],
        dingtalk={
            "robot_webhook": dingtalk.robot_webhook,
            "robot_secret": dingtalk.robot_secret,
            "card_template_id": "finetune-job.schema",
        },
    )
    async with running_dingtalk_bot(
        tmp_path / "state",
        dingtalk,
        config,
        grace=8.0,
        finetune_local_dialect="aliyun",
        finetune_local_checkpoints=f"oss://{BUCKET}/team",
        finetune_aliyun_webhook_token=TOKEN,
    ) as (service, _console):

        async def say(text: str) -> None:
            await dingtalk.push(message_frame(group_message(text, "manager4220", GROUP, dingtalk.session_webhook("s"))))

        await say("@bot /finetune start resumes")
        await dingtalk.wait_until(lambda: len(dingtalk.session_replies) == 1, what="answer")
        [job] = await service.bot.store.list_jobs()
        await wait_job(service, job.id, lambda j: j.state is JobState.RUNNING and (j.step or 0) >= 2)
        running = await service.bot.store.get(job.id)
        assert running is not None and running.current is not None and running.current.instance_id
        instance_id = running.current.instance_id

        # ECS reclaims the instance: CloudMonitor pushes the preemption event, the metadata shows the time.
        now = datetime.now(timezone(timedelta(hours=8)))
        event = notification(
            INTERRUPTION, interruption_content(instance_id), instance_id, event_time=now.strftime("%Y%m%dT%H%M%S.000%z")
        )
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{service.port}{CLOUDMONITOR_PATH}"
            behind_tls = {"X-Finetune-Token": TOKEN, "X-Forwarded-Proto": "https"}  # as the load balancer forwards it
            async with http.post(url, json=event, headers=behind_tls) as response:
                assert response.status == 200, await response.text()
        await wait_job(service, job.id, lambda j: j.state is JobState.INTERRUPTED)
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)
        await cloud.post_notice(instance_id, seconds=300)

        done = await wait_job(service, job.id, lambda j: j.state is JobState.SUCCEEDED, timeout=180)
        assert done.interruptions == 1 and len(done.attempts) == 2 and done.steps_lost == 0
        assert done.checkpoint is not None and done.checkpoint.uri.startswith(f"oss://{BUCKET}/team/jobs/{job.id}/")
        keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=BUCKET)["Contents"]]
        assert f"team/jobs/{job.id}/checkpoint-{done.checkpoint.step}/MANIFEST.json" in keys

        history = await service.bot.store.history(job.id)
        warnings = [e for e in history if e.get("event") == "spot-interruption"]
        # CloudMonitor's warning moved the job; the runner's own notice of the same interruption (it checkpointed on
        # it, above) decided nothing and wrote nothing: no second history line, no second alert.
        assert [e["source"] for e in warnings] == ["acs.ecs"]
        [alert] = dingtalk.robot_messages
        assert "中断预警" in alert["markdown"]["text"]

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
