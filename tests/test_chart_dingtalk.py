"""The chart in DingTalk: a finished job with one interruption gets one image in its group, uploaded through the
oapi's media upload and shown by a markdown message (decoded: the interruption's colour at its step's pixel);
``chart`` asked from another group is refused; a token DingTalk stopped accepting is renewed for the upload."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from bot.chat.dingtalk.openapi import OpenApi
from fakes.bot_harness import eventually, quick_recipe, running_dingtalk_bot, settled, wait_job, write_config
from fakes.fake_dingtalk import FakeDingTalk
from handlers.jobs import ChatRef, JobState
from tests.test_chart_slack import WITH_LOSS, assert_interruption_drawn

GROUP = "cidMLteam0001=="
OWNER = "dingtalk:manager0001"
IMAGE = re.compile(r"!\[[^\]]*\]\((@lAD[0-9a-f]+)\)")


@pytest.fixture
async def dingtalk() -> AsyncIterator[FakeDingTalk]:
    async with FakeDingTalk() as fake:
        yield fake


def images(dingtalk: FakeDingTalk) -> list[str]:
    """The media ids the group's markdown messages show."""
    return [m for message in dingtalk.group_messages for m in IMAGE.findall(message["text"])]


async def test_a_finished_job_with_one_interruption_gets_one_chart_in_its_group(
    tmp_path: Path, dingtalk: FakeDingTalk
) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("resumes", WITH_LOSS)])
    async with running_dingtalk_bot(
        tmp_path / "state",
        dingtalk,
        config,
        grace=8.0,
        finetune_local_checkpoints=(tmp_path / "bucket").resolve().as_uri() + "/",
    ) as (service, _console):
        group = ChatRef(platform="dingtalk", channel=GROUP)
        reply = await service.bot.command(OWNER, group, "start resumes", "zh-CN")
        job_id = reply.split("正在启动 ", 1)[1].split("：", 1)[0]
        await wait_job(service, job_id, lambda job: (job.step or 0) >= 5)
        assert "已受理" in await service.bot.command(OWNER, group, f"interrupt-test {job_id}", "zh-CN")
        done = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED, timeout=180)
        assert done.interruptions == 1 and len(done.attempts) == 2

        async def shown() -> bool:
            return await settled(service) and bool(images(dingtalk))

        await eventually(shown, timeout=120)
        [media_id] = images(dingtalk)  # one image, in the job's group
        [message] = [m for m in dingtalk.group_messages if media_id in m["text"]]
        assert message["conversation"] == GROUP and "损失与费用" in message["text"]
        assert list(dingtalk.media) == [media_id]
        assert_interruption_drawn(dingtalk.media[media_id], done, await service.bot.series.points(job_id))

        elsewhere = ChatRef(platform="dingtalk", channel="cidOther0003==")
        refused = await service.bot.command("dingtalk:eve", elsewhere, f"chart {job_id}", "zh-CN")
        assert refused.startswith("⛔") and job_id in refused
        assert await settled(service) and len(dingtalk.media) == 1  # nothing drawn for the refusal


async def test_the_upload_renews_a_token_dingtalk_stopped_accepting(dingtalk: FakeDingTalk) -> None:
    async with aiohttp.ClientSession() as session:
        api = OpenApi(session, dingtalk.client_id, dingtalk.client_secret, dingtalk.url, oapi_endpoint=dingtalk.url)
        first = await api.upload_image(b"\x89PNG\r\n\x1a\nfirst", "a.png")
        dingtalk.revoke_tokens()
        second = await api.upload_image(b"\x89PNG\r\n\x1a\nsecond", "b.png")
        assert dingtalk.media == {first: b"\x89PNG\r\n\x1a\nfirst", second: b"\x89PNG\r\n\x1a\nsecond"}
        assert dingtalk.token_requests == 2
