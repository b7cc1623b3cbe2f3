"""A chart is posted once: a redelivered chart note posts nothing, and one whose upload may have gone through
unheard (marked *sending*, then the replica died) is looked for in the thread by its file name first."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from slack_sdk.web.async_client import AsyncWebClient

from bot.charts.series import Point
from bot.chat.delivery import Platform
from bot.chat.outbox import ChatOutbox
from bot.chat.slack.deliverer import SlackDeliverer, chart_filename
from bot.chat.slack.upload import upload_to_thread
from bot.keys import Keys
from bot.store import JobStore
from fakes.fake_slack import BOT_TOKEN, FakeSlack
from handlers.clock import utcnow
from handlers.jobs import Attempt, ChatRef, Job, JobState
from handlers.messages import Notify, dump_message
from handlers.notes import ChartNote
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)

CHANNEL = "C0JOBS"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


def entry(note: Notify) -> dict[str, Any]:
    """A chat stream entry as the store writes it."""
    return {"note": dump_message(note), "platform": "slack"}


async def test_a_chart_note_is_uploaded_once_however_often_it_is_handled(
    redis_client: aioredis.Redis, key_prefix: str, slack: FakeSlack
) -> None:
    store = JobStore(redis_client, Keys(key_prefix))
    now = utcnow()
    job = Job(
        id="ft-once1",
        recipe="tiny",
        requested_by="slack:U0ANA",
        chat=ChatRef(platform="slack", channel=CHANNEL),
        state=JobState.SUCCEEDED,
        step=20,
        total_steps=20,
        attempts=[Attempt(number=1, instance_id="i-1", launched_at=now, started_at=now, ended_at=now)],
    )
    await store.create(job, {"event": "created"})
    client = AsyncWebClient(token=BOT_TOKEN, base_url=slack.api_url)
    outbox = ChatOutbox(redis_client, store, {}, consumer="c1")
    outbox.platforms["slack"] = Platform(SlackDeliverer(client, outbox.refs))
    await outbox.series.add(job.id, Point(10, 1.5, now, 1))

    chart = Notify(id=f"{job.id}.1.chart", job_id=job.id, channel="thread", note=ChartNote(occasion="completed"))
    await outbox.handle(entry(chart))
    await outbox.handle(entry(chart))  # redelivered
    card = await outbox.refs.card(job.id)
    assert card is not None
    [first] = slack.shared_files(CHANNEL, card.message.ts)
    assert first.filename == chart_filename(chart) and first.content and first.content.startswith(b"\x89PNG")

    # A replica uploaded the next one and died before recording it: the next replica finds it in the thread.
    asked = Notify(job_id=job.id, channel="thread", note=ChartNote(occasion="asked", by="slack:U0BOB"))
    await upload_to_thread(
        client,
        channel=CHANNEL,
        thread_ts=card.message.ts,
        content=b"\x89PNG..",
        filename=chart_filename(asked),
        title="t",
        comment="c",
        alt_text="t",
    )
    await redis_client.set(outbox.keys.sending(asked.id), "c0")
    await outbox.handle(entry(asked))
    assert [u.filename for u in slack.shared_files(CHANNEL, card.message.ts)] == [
        chart_filename(chart),
        chart_filename(asked),
    ]
    assert len(slack.called("files.completeUploadExternal")) == 2
