"""The chart in Slack: the upload flow's three calls on a fake Slack that checks them, a finished job with one
interruption getting exactly one image in its thread (decoded: the interruption's colour at its step's pixel), and
``/finetune chart`` answered where the job's status would be, refused where it would not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.charts.render import AXES_BOX, x_pixel, x_range
from bot.charts.series import Point
from bot.chat.delivery import PermanentDeliveryError
from bot.chat.slack.errors import call
from bot.chat.slack.upload import upload_to_thread
from fakes.bot_harness import (
    INTERRUPTIBLE,
    eventually,
    quick_recipe,
    running_bot,
    settled,
    slack_settings,
    wait_job,
    write_config,
)
from fakes.fake_slack import BOT_TOKEN, FakeSlack
from handlers.jobs import Job, JobState
from tests.chart_pixels import colour_rows, decoded
from tests.test_slack_http import CHANNEL, card_of, command, started

# INTERRUPTIBLE, with a loss in each progress line.
WITH_LOSS = INTERRUPTIBLE.replace(
    "{'step': step, 'total_steps': 1000}", "{'step': step, 'total_steps': 60, 'loss': 3.0 / step}"
)


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


async def test_the_upload_flow_checks_the_token_the_length_the_single_use_and_the_thread(slack: FakeSlack) -> None:
    client = AsyncWebClient(token=BOT_TOKEN, base_url=slack.api_url)
    parent = await client.chat_postMessage(channel="C0JOBS", text="the card")
    shared = await upload_to_thread(
        client,
        channel="C0JOBS",
        thread_ts=parent["ts"],
        content=b"\x89PNG-bytes",
        filename="n1.png",
        title="t",
        comment="the chart",
        alt_text="t",
    )
    [upload] = slack.shared_files("C0JOBS", parent["ts"])
    assert (upload.content, upload.filename, shared["id"]) == (b"\x89PNG-bytes", "n1.png", upload.file_id)
    [message] = [m for m in slack.replies("C0JOBS", parent["ts"]) if m.files]
    assert message.text == "the chart" and message.files[0]["name"] == "n1.png"
    [asked] = slack.called("files.getUploadURLExternal")
    assert asked.token == BOT_TOKEN and int(asked.args["length"]) == len(b"\x89PNG-bytes")
    [completed] = slack.called("files.completeUploadExternal")
    assert completed.args["channel_id"] == "C0JOBS" and completed.args["thread_ts"] == parent["ts"]

    async with aiohttp.ClientSession() as http:  # the upload URL is good once, for the announced length only
        url = f"http://127.0.0.1:{slack.port}/upload/{upload.file_id}"
        async with http.post(url, data=b"again") as again:
            assert again.status == 400 and upload.refused == ["used already"]
        fresh = await client.files_getUploadURLExternal(filename="n2.png", length=10)
        async with http.post(fresh["upload_url"], data=b"short") as short:
            assert short.status == 400 and slack.uploads[fresh["file_id"]].refused == ["wrong length"]
    with pytest.raises(PermanentDeliveryError, match="file_not_found"):  # its bytes never arrived whole
        await call(client.files_completeUploadExternal(files=[{"id": fresh["file_id"]}], channel_id="C0JOBS"))
    with pytest.raises(PermanentDeliveryError, match="invalid_auth"):
        await upload_to_thread(
            AsyncWebClient(token="xoxb-wrong", base_url=slack.api_url),
            channel="C0JOBS",
            thread_ts=None,
            content=b"x",
            filename="n3.png",
            title="t",
            comment="c",
            alt_text="t",
        )
    with pytest.raises(PermanentDeliveryError, match="invalid_thread_ts"):
        await upload_to_thread(
            client,
            channel="C0JOBS",
            thread_ts="1.000000",
            content=b"x",
            filename="n4.png",
            title="t",
            comment="c",
            alt_text="t",
        )
    assert len(slack.shared_files("C0JOBS")) == 1


async def test_a_finished_job_with_one_interruption_gets_one_chart_in_its_thread_with_the_line_at_its_step(
    tmp_path: Path, slack: FakeSlack
) -> None:
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("resumes", WITH_LOSS)])
    async with running_bot(
        tmp_path / "state",
        config,
        grace=8.0,
        finetune_local_checkpoints=(tmp_path / "bucket").resolve().as_uri() + "/",
        **slack_settings(slack.api_url),
    ) as (service, _console):
        job_id = started((await command(service, "start resumes"))[1])
        await wait_job(service, job_id, lambda job: (job.step or 0) >= 5)
        status, reply = await command(service, f"interrupt-test {job_id}")
        assert status == 200 and "OK" in reply, reply
        done = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED, timeout=180)
        assert done.interruptions == 1 and len(done.attempts) == 2
        card = card_of(slack, job_id)
        assert card is not None

        async def posted() -> bool:
            return await settled(service) and bool(slack.shared_files(CHANNEL, card.ts))

        await eventually(posted, timeout=120)
        [chart] = slack.shared_files(CHANNEL, card.ts)  # exactly one image, in the card's thread
        assert chart.filename == f"{job_id}.2.chart.png" and chart.content is not None
        points = await service.bot.series.points(job_id)
        assert WITH_LOSS != INTERRUPTIBLE and all(p.loss is not None for p in points)
        assert {p.attempt for p in points} == {1, 2}  # the runner reports progress every few seconds
        assert_interruption_drawn(chart.content, done, points)

        # Asked for: refused to someone in another channel (as its status is), posted again for the channel.
        status, refused = await command(service, f"chart {job_id}", user="U0EVE", channel="C0OTHER")
        assert status == 200 and "not a job of this channel" in refused, refused
        status, asked = await command(service, f"chart {job_id}", user="U0BOB")
        assert status == 200 and "on its way" in asked, asked

        async def twice() -> bool:
            return len(slack.shared_files(CHANNEL, card.ts)) == 2 and await settled(service)

        await eventually(twice)
        assert slack.shared_files("C0OTHER") == [] and len(slack.shared_files(CHANNEL)) == 2


def assert_interruption_drawn(png: bytes, job: Job, points: list[Point]) -> None:
    """The interruption's colour down the plot at the step the first attempt reached, and not elsewhere."""
    interrupted_at = job.attempts[0].reached_step
    assert interrupted_at is not None
    pixels = decoded(png)
    height, width, _ = pixels.shape
    steps = x_range(job, points)
    assert colour_rows(pixels, x_pixel(interrupted_at, steps, width)) >= 0.9 * AXES_BOX[3] * height
    far = interrupted_at + (steps[1] - interrupted_at) / 2
    assert colour_rows(pixels, x_pixel(far, steps, width), slack=3) < 20  # (the legend's sample at most)
