"""DingTalk out: the deliverer and its ChatPort against fakes/fake_dingtalk.py and a real Valkey.

What a durable outbox relies on is checked here: a failure DingTalk may recover from is transient (with its
Retry-After), one it will not is permanent; signatures are right, and a wrong secret or an old timestamp is
refused; the ChatPort retries, drops what cannot go, keeps each job's messages in order and only the newest card.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from bot.chat.delivery import PermanentDeliveryError, TransientDeliveryError
from bot.chat.dingtalk.cards import out_track_id
from bot.chat.dingtalk.config import DingTalkConfig, Robot
from bot.chat.dingtalk.deliverer import DingTalkDeliverer
from bot.chat.dingtalk.ledger import StoreLedger
from bot.chat.dingtalk.openapi import OpenApi
from bot.chat.dingtalk.transport import Rejected
from bot.chat.dingtalk.webhooks import Markdown, Mentions, Webhooks
from bot.store import JobStore
from fakes.fake_dingtalk import FakeDingTalk
from fakes.notes import notify
from handlers.clock import utcnow
from handlers.decide import decide
from handlers.failures import Failure
from handlers.jobs import Attempt, ChatRef, Job, JobState
from handlers.messages import CloudEvent, Notify, parse_message
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)

GROUP = "cidMLteam0001=="
ENGLISH_GROUP = "cidGlobal0002=="
GROUP_SEND = "/v1.0/robot/groupMessages/send"


class Parts:
    def __init__(self, dingtalk: FakeDingTalk, session: aiohttp.ClientSession, store: JobStore) -> None:
        self.dingtalk = dingtalk
        self.api = OpenApi(session, dingtalk.client_id, dingtalk.client_secret, dingtalk.url)
        self.webhooks = Webhooks(session)
        self.config = DingTalkConfig.model_validate(
            {
                "card_template_id": "finetune-job.schema",
                "robot_webhook": dingtalk.robot_webhook,
                "robot_secret": dingtalk.robot_secret,
                "channels": {ENGLISH_GROUP: {"language": "en"}},
            }
        )
        self.store = store
        self.deliverer = DingTalkDeliverer(self.api, self.webhooks, self.config, StoreLedger(store), dingtalk.client_id)


@pytest.fixture
async def parts(redis_client: aioredis.Redis, key_prefix: str) -> AsyncIterator[Parts]:
    async with FakeDingTalk() as dingtalk, aiohttp.ClientSession() as session:
        yield Parts(dingtalk, session, JobStore(redis_client, prefix=key_prefix))


# One creation time for every copy of a job the tests build: a card's id is derived from it, so two copies made either
# side of a second boundary would otherwise be two cards.
CREATED = utcnow()


def running_job(channel: str = GROUP, version: int = 1, step: int | None = None, job_id: str = "ft-ab12") -> Job:
    attempt = Attempt(number=1, instance_id="i-bp1abc", instance_type="ecs.gn7i-c8g1.2xlarge", zone="cn-hangzhou-h")
    return Job(
        id=job_id,
        recipe="tiny",
        requested_by="dingtalk:manager4220",
        chat=ChatRef(platform="dingtalk", channel=channel),
        state=JobState.RUNNING,
        attempts=[attempt.model_copy(update={"price_per_hour": 0.42, "started_at": utcnow() - timedelta(minutes=3)})],
        step=step,
        total_steps=100,
        version=version,
        created_at=CREATED,
    )


def note(channel: str, note_type: str, **fields: Any) -> Notify:
    return notify("ft-ab12", channel, note_type, **fields)


async def test_cards_are_in_the_group_language_and_updated_in_place(parts: Parts) -> None:
    zh, en = running_job(GROUP, job_id="ft-zh01"), running_job(ENGLISH_GROUP, job_id="ft-en01")
    for job in (zh, en):
        await parts.deliverer.deliver(job, note("card", "started"))
    assert parts.dingtalk.cards[out_track_id(zh)]["stop_label"] == "停止"
    assert parts.dingtalk.cards[out_track_id(zh)]["status"] == "🟢 运行中"
    assert parts.dingtalk.cards[out_track_id(en)]["stop_label"] == "Stop"
    assert parts.dingtalk.cards[out_track_id(en)]["status"] == "🟢 RUNNING"
    assert "**Instance**: i-bp1abc" in parts.dingtalk.cards[out_track_id(en)]["content"]

    await parts.deliverer.deliver(running_job(GROUP, version=2, step=40, job_id="ft-zh01"), note("card", "progress"))
    await parts.deliverer.deliver(running_job(GROUP, version=2, step=40, job_id="ft-zh01"), note("card", "progress"))
    methods = [(method, body["outTrackId"]) for method, _, body in parts.dingtalk.calls]
    track = out_track_id(zh)
    assert methods.count(("POST", track)) == 1 and methods.count(("PUT", track)) == 1  # the repeat changed nothing
    assert "**步数**: ▰▰▰▰▱▱▱▱▱▱ 40% · 40/100" in parts.dingtalk.cards[track]["content"]

    # Another replica whose ledger has not heard of the card (or a crash before the mark): it updates, too.
    other = DingTalkDeliverer(
        parts.api,
        parts.webhooks,
        parts.config,
        StoreLedger(JobStore(parts.store.redis, prefix=parts.store.prefix + "other:")),
        parts.dingtalk.client_id,
    )
    await other.deliver(running_job(GROUP, version=3, step=50, job_id="ft-zh01"), note("card", "progress"))
    assert [m for m, _, body in parts.dingtalk.calls if body["outTrackId"] == track] == ["POST", "PUT", "PUT"]
    assert "**步数**: ▰▰▰▰▰▱▱▱▱▱ 50% · 50/100" in parts.dingtalk.cards[track]["content"]

    with pytest.raises(PermanentDeliveryError, match="not started from DingTalk"):
        await parts.deliverer.deliver(
            zh.model_copy(update={"chat": ChatRef(platform="slack", channel="C1")}), note("card", "refresh")
        )


async def test_alerts_go_through_the_signed_robot_and_pages_mention_on_call(parts: Parts) -> None:
    job = running_job()
    await parts.deliverer.deliver(
        job, note("alert", "interruption-warning", instance="i-bp1abc", source="aliyun-metadata", deadline=None)
    )
    people = [
        {"name": "ana", "slack": None, "dingtalk": "manager4220", "mobile": "13900000000"},
        {"name": "bo", "slack": "U024BE7LH", "dingtalk": None, "mobile": "13800000000"},
        {"name": "cy", "slack": "U0CY", "dingtalk": None, "mobile": None},
    ]
    no_room = Failure.of("launch-failed", error="no capacity")
    page = note("page", "resume-failed", reason=no_room, step=1, steps=3, mention=people, everyone=None)
    await parts.deliverer.deliver(job, page)
    await parts.deliverer.deliver(
        job, note("page", "resume-failed", reason=no_room, step=2, steps=3, mention=[], everyone="channel")
    )
    assert parts.dingtalk.refused_robot_calls == []
    alert, first, last = parts.dingtalk.robot_messages
    assert alert["markdown"]["title"] == "抢占式实例告警 · ft-ab12"
    assert "中断预警" in alert["markdown"]["text"] and "aliyun-metadata" in alert["markdown"]["text"]
    assert alert["at"] == {"atUserIds": [], "atMobiles": [], "isAtAll": False}
    assert first["at"] == {"atUserIds": ["manager4220"], "atMobiles": ["13800000000"], "isAtAll": False}
    text = first["markdown"]["text"]
    assert "@manager4220" in text and "@13800000000" in text and "@cy" in text and "@13900000000" not in text
    assert "值班（第 2 级升级，共 3 级，尚无人确认）" in text
    assert last["at"] == {"atUserIds": [], "atMobiles": [], "isAtAll": True}
    # The card was refreshed with each of them (created once), and nothing went to the group as an app message.
    assert [m for m, *_ in parts.dingtalk.calls].count("POST") == 1 and parts.dingtalk.group_messages == []


@pytest.mark.parametrize("robot", [True, False], ids=["custom-robot", "app-robot-only"])
async def test_an_interruption_warning_reaches_the_group_once(parts: Parts, robot: bool) -> None:
    """The core tells a warning twice (the alert, and the job's thread); DingTalk has no threads, so the group gets
    the alert alone: through its custom robot when it has one, else as the app robot's message."""
    job = running_job()
    warned = decide(job, CloudEvent(kind="spot-interruption", instance_id="i-bp1abc", source="aliyun.ecs"), utcnow())
    notes = [message for message in map(parse_message, warned.outbox) if isinstance(message, Notify)]
    assert sorted(told.channel for told in notes) == ["alert", "thread"]  # both are told…
    config = parts.config if robot else parts.config.model_copy(update={"robot_webhook": None, "robot_secret": None})
    deliverer = DingTalkDeliverer(parts.api, parts.webhooks, config, StoreLedger(parts.store), parts.dingtalk.client_id)
    for told in notes:
        await deliverer.deliver(warned.job, told)
    sent = [m["markdown"]["text"] for m in parts.dingtalk.robot_messages] + [
        m["text"] for m in parts.dingtalk.group_messages
    ]
    assert len(sent) == 1 and "中断预警" in sent[0], sent  # …and the group reads it once
    assert len(parts.dingtalk.robot_messages) == (1 if robot else 0)
    assert parts.dingtalk.cards[out_track_id(job)]["status"] == "⚠️ 已中断"  # the thread copy still refreshed the card

    # Any other thread note is still posted to the group.
    await deliverer.deliver(warned.job, note("thread", "rebalance"))
    assert len(parts.dingtalk.group_messages) == (1 if robot else 2)


async def test_a_wrong_secret_or_an_old_timestamp_is_refused_and_permanent(parts: Parts) -> None:
    message = Markdown("t", "告警")
    async with aiohttp.ClientSession() as session:
        with pytest.raises(Rejected, match="310000"):
            await Webhooks(session).robot(Robot(parts.dingtalk.robot_webhook, "SEC-wrong"), message)
        with pytest.raises(Rejected, match="310000"):
            late = Webhooks(session, clock=lambda: time.time() - 2 * 3600)
            await late.robot(Robot(parts.dingtalk.robot_webhook, parts.dingtalk.robot_secret), message)
        await Webhooks(session).robot(Robot(parts.dingtalk.robot_webhook, parts.dingtalk.robot_secret), message)
    assert parts.dingtalk.refused_robot_calls == ["signature does not match", "timestamp more than an hour away"]
    assert len(parts.dingtalk.robot_messages) == 1


async def test_failures_are_transient_or_permanent_as_dingtalk_means_them(parts: Parts) -> None:
    job, thread = running_job(), note("thread", "rebalance")
    fake = parts.dingtalk
    fake.fail_next(GROUP_SEND, 503)
    with pytest.raises(TransientDeliveryError) as down:
        await parts.deliverer.deliver(job, thread)
    assert down.value.retry_after is None
    fake.fail_next(GROUP_SEND, 429, **{"Retry-After": "7"})
    with pytest.raises(TransientDeliveryError) as limited:
        await parts.deliverer.deliver(job, thread)
    assert limited.value.retry_after == 7.0
    fake.fail_next(GROUP_SEND, 403)  # the OpenAPI's QPS limit is a 403 with its own code
    with pytest.raises(TransientDeliveryError, match="QpsLimit"):
        await parts.deliverer.deliver(job, thread)
    fake.fail_next(GROUP_SEND, 400)
    with pytest.raises(PermanentDeliveryError):
        await parts.deliverer.deliver(job, thread)
    fake.fail_next("/robot/send", errcode=130101)  # over the custom robot's 20 messages a minute
    with pytest.raises(TransientDeliveryError) as robot_limited:
        await parts.deliverer.deliver(job, note("alert", "rebalance"))
    assert robot_limited.value.retry_after == 60.0
    assert fake.group_messages == [] and fake.robot_messages == []

    fake.revoke_tokens()  # a token DingTalk no longer accepts is renewed once, and the call goes through
    await parts.deliverer.deliver(job, thread)
    assert fake.token_requests == 2 and len(fake.group_messages) == 1

    async with aiohttp.ClientSession() as session:
        nowhere = OpenApi(session, fake.client_id, fake.client_secret, "http://127.0.0.1:9")
        with pytest.raises(TransientDeliveryError):
            await nowhere.send_group_markdown(GROUP, fake.client_id, "t", "x")


async def test_mentions_need_both_the_at_list_and_the_words() -> None:
    mentions = Mentions(["manager4220"], ["13800000000"])
    body = Markdown("t", "值班", mentions).body()
    assert body["at"] == {"atUserIds": ["manager4220"], "atMobiles": ["13800000000"], "isAtAll": False}
    assert body["markdown"] == {"title": "t", "text": "值班\n\n@manager4220 @13800000000"}


async def test_a_token_dingtalk_refuses_is_renewed_however_dingtalk_says_so(parts: Parts) -> None:
    fake, api = parts.dingtalk, parts.api
    await api.access_token()
    fake.revoke_tokens()  # DingTalk's own answer to a token it no longer takes: HTTP 400 InvalidAuthentication
    await api.send_group_markdown(GROUP, fake.client_id, "t", "after a rotation")
    assert fake.token_requests == 2
    refusals: list[dict[str, Any]] = [
        {"status": 401},
        {"status": 400, "code": "InvalidAuthentication"},
        {"errcode": 40014},  # the older style: 不合法的access_token
        {"errcode": 42001},  # the older style: the token expired
    ]
    for refusal in refusals:
        fake.fail_next(GROUP_SEND, **refusal)
        await api.send_group_markdown(GROUP, fake.client_id, "t", f"after {refusal}")
    assert fake.token_requests == 2 + len(refusals)
    assert len(fake.group_messages) == 1 + len(refusals)

    # A token refused again right after its renewal: one renewal per call, then the refusal stands.
    fake.fail_next(GROUP_SEND, 400, times=2, code="InvalidAuthentication")
    with pytest.raises(Rejected, match="InvalidAuthentication"):
        await api.send_group_markdown(GROUP, fake.client_id, "t", "refused twice")
    # A missing permission is no token problem: no renewal, a permanent refusal that says which.
    denied = "Forbidden.AccessDenied.AccessTokenPermissionDenied"
    fake.fail_next(GROUP_SEND, 403, code=denied)
    with pytest.raises(Rejected, match=denied):
        await api.send_group_markdown(GROUP, fake.client_id, "t", "not allowed")
    assert fake.token_requests == 3 + len(refusals)
    assert len(fake.group_messages) == 1 + len(refusals)
