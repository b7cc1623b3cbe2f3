"""The chat edges' mapping: whatever slack_sdk or aiohttp raises for a Slack Web API call
(``bot/chat/slack/errors.py``), and whatever a DingTalk call meets (``bot/chat/dingtalk/transport.py``), comes out
as :class:`TransientDeliveryError` (try again) or :class:`PermanentDeliveryError` (give up), both
:class:`bot.errors.ChatError`.

Real servers only: the local fake Slack and DingTalk answering their platforms' errors, a port nothing listens on,
and a server answering the broken ways a proxy or a dying endpoint does (``tests.broken_http``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.delivery import PermanentDeliveryError, TransientDeliveryError
from bot.chat.dingtalk.transport import Rejected
from bot.chat.dingtalk.transport import call as dingtalk_call
from bot.chat.slack.errors import call as slack_call
from bot.errors import ChatError
from fakes.fake_dingtalk import FakeDingTalk
from fakes.fake_slack import BOT_TOKEN, FakeSlack
from fakes.ports import free_port
from tests.broken_http import WAYS, BrokenHttp

# What each broken answer means: a 4xx page is the request's fault, everything else may pass later.
BROKEN = {way: PermanentDeliveryError if way == "html-400" else TransientDeliveryError for way in WAYS}


async def post_to_slack(api_url: str, token: str = BOT_TOKEN) -> None:
    client = AsyncWebClient(token=token, base_url=api_url)
    await slack_call(client.chat_postMessage(channel="C0GENERAL", text="hello"))


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


@pytest.mark.parametrize(
    ("status", "expected", "retry_after"),
    [(429, TransientDeliveryError, 7.0), (500, TransientDeliveryError, None), (503, TransientDeliveryError, None)],
)
async def test_slack_busy_or_failing_is_transient(
    slack: FakeSlack, status: int, expected: type[ChatError], retry_after: float | None
) -> None:
    slack.fail_next(1, status=status, retry_after=retry_after)
    with pytest.raises(ChatError) as caught:
        await post_to_slack(slack.api_url)
    assert type(caught.value) is expected
    assert isinstance(caught.value, TransientDeliveryError) and caught.value.retry_after == retry_after


async def test_slack_refusing_the_request_is_permanent(slack: FakeSlack) -> None:
    with pytest.raises(PermanentDeliveryError, match="invalid_auth"):
        await post_to_slack(slack.api_url, token="xoxb-not-the-token")
    client = AsyncWebClient(token=BOT_TOKEN, base_url=slack.api_url)
    with pytest.raises(PermanentDeliveryError, match="message_not_found"):
        await slack_call(client.chat_update(channel="C0GENERAL", ts="1.000", text="edit"))


async def test_slack_down_or_unreachable_is_transient(slack: FakeSlack) -> None:
    slack.go_down()
    with pytest.raises(TransientDeliveryError):
        await post_to_slack(slack.api_url)
    with pytest.raises(TransientDeliveryError, match="cannot reach Slack"):
        await post_to_slack(f"http://127.0.0.1:{free_port()}/api/")


@pytest.mark.parametrize("how", WAYS)
async def test_slack_broken_answers_are_ours(how: str) -> None:
    server = await BrokenHttp(how).start()
    try:
        with pytest.raises(ChatError) as caught:
            await post_to_slack(f"{server.endpoint}/api/")
        assert type(caught.value) is BROKEN[how]
    finally:
        await server.stop()


@pytest.fixture
async def dingtalk() -> AsyncIterator[tuple[FakeDingTalk, aiohttp.ClientSession]]:
    async with FakeDingTalk() as fake, aiohttp.ClientSession() as session:
        yield fake, session


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        ({"status": 500}, TransientDeliveryError),
        ({"status": 429, "Retry-After": "3"}, TransientDeliveryError),
        ({"status": 403}, TransientDeliveryError),  # the OpenAPI's QPS limit is a 403 with a throttling code
        ({"status": 400, "code": "param.invalid"}, Rejected),
        ({"errcode": -1}, TransientDeliveryError),  # webhook: system busy
        ({"errcode": 130101}, TransientDeliveryError),  # webhook: over 20 messages a minute
        ({"errcode": 310000}, Rejected),  # webhook: a keyword or signature check failed
    ],
    ids=["5xx", "429", "qps-limit", "400", "busy", "rate", "refused"],
)
async def test_dingtalk_failures_are_ours(
    dingtalk: tuple[FakeDingTalk, aiohttp.ClientSession], failure: dict[str, object], expected: type[ChatError]
) -> None:
    fake, session = dingtalk
    fake.fail_next("/robot/send", **failure)  # type: ignore[arg-type]
    with pytest.raises(ChatError) as caught:
        await dingtalk_call(session, "POST", fake.robot_webhook, "robot", {"msgtype": "text", "text": {"content": "x"}})
    assert type(caught.value) is expected
    assert isinstance(caught.value, Rejected) == issubclass(expected, PermanentDeliveryError)


@pytest.mark.parametrize("how", [way for way in WAYS if way != "not-json-200"])
async def test_dingtalk_broken_answers_and_no_answer_are_ours(how: str) -> None:
    server = await BrokenHttp(how).start()
    async with aiohttp.ClientSession() as session:
        try:
            with pytest.raises(ChatError) as caught:
                await dingtalk_call(session, "POST", f"{server.endpoint}/robot/send", "robot", {})
            assert isinstance(caught.value, BROKEN[how])
            with pytest.raises(TransientDeliveryError):
                await dingtalk_call(session, "POST", f"http://127.0.0.1:{free_port()}/robot/send", "robot", {})
        finally:
            await server.stop()


async def test_a_dingtalk_200_it_cannot_read_is_an_empty_answer() -> None:
    """HTTP 200 is DingTalk's "taken" on every path; a body that is not JSON reads as ``{}``, which the callers that
    need a field (the token, the stream ticket) refuse as a PermanentDeliveryError of their own."""
    server = await BrokenHttp("not-json-200").start()
    async with aiohttp.ClientSession() as session:
        try:
            assert await dingtalk_call(session, "POST", f"{server.endpoint}/robot/send", "robot", {}) == {}
        finally:
            await server.stop()
