"""Pages in PagerDuty and Opsgenie, in the running bot against local servers that speak both tools' APIs: a failed
resume opens the page once in each tool the ladder names, however often steps run or notes are redelivered; an
ack in chat acknowledges it there; a resume resolves it; a signed PagerDuty webhook or an authenticated Opsgenie
one acknowledges it in chat, once; a forged or stale one is refused and changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest

from bot.chat.console import ConsoleChat
from bot.errors import ConfigError
from bot.service import BotService
from fakes.bot_harness import (
    CHANNEL,
    FAILS_ON_RESUME,
    SteppedClock,
    eventually,
    quick_recipe,
    running_bot,
    settled,
    slack_settings,
    wait_job,
    write_config,
)
from fakes.fake_pagers import (
    GENIE_KEY,
    OPSGENIE_WEBHOOK_TOKEN,
    PAGERDUTY_WEBHOOK_SECRET,
    ROUTING_KEY,
    FakePagers,
    dumps,
    opsgenie_ack,
    pagerduty_ack,
    pagerduty_signed,
)
from fakes.fake_slack import FakeSlack
from handlers.jobs import JobState
from handlers.pagers import page_key
from tests.test_oncall_ladder import fail_a_resume, pages
from tests.test_slack_delivery import running_job
from tests.test_slack_http import click

pytestmark = pytest.mark.scenario

ONCALL = {
    "people": {"ana": {"slack": "U0ANA", "console": "ana"}, "bo": {"slack": "U0BO", "console": "bo"}},
    "rota": [["ana", "bo"]],
    "ladder": [
        {"after_minutes": 0, "notify": ["primary", "pagerduty", "opsgenie"]},
        {"after_minutes": 5, "notify": ["primary", "secondary", "pagerduty"]},  # named again: opens nothing more
    ],
    "repeat_every_minutes": None,
}


@asynccontextmanager
async def paging_bot(tmp_path: Path, clock: SteppedClock) -> AsyncIterator[tuple[BotService, ConsoleChat, FakePagers]]:
    fake = await FakePagers().start()
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("flaky", FAILS_ON_RESUME)], oncall=ONCALL)
    try:
        async with running_bot(
            tmp_path / "state",
            config,
            clock=clock,
            pagerduty_routing_key=ROUTING_KEY,
            pagerduty_events_url=fake.url,
            pagerduty_webhook_secret=PAGERDUTY_WEBHOOK_SECRET,
            opsgenie_api_key=GENIE_KEY,
            opsgenie_api_url=fake.url,
            opsgenie_webhook_token=OPSGENIE_WEBHOOK_TOKEN,
        ) as (service, chat):
            yield service, chat, fake
    finally:
        await fake.close()


def acks(chat: ConsoleChat) -> list[str]:
    return [text for _, channel, text in chat.transcript if channel == "thread" and "acknowledged the page" in text]


async def opened(service: BotService, fake: FakePagers) -> str:
    """A failed resume, its page open in both tools (once each); the page's key."""
    job_id = await fail_a_resume(service)
    job = await service.bot.store.get(job_id)
    assert job is not None and job.page is not None and job.page.attempt == 2
    await fake.wait_for("pagerduty", "trigger")
    await fake.wait_for("opsgenie", "trigger")
    return job_id


async def post(service: BotService, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{service.port}{path}"
        async with session.post(url, data=body, headers=headers) as response:
            return response.status, await response.json()


async def test_a_failed_resume_pages_once_an_ack_in_chat_acknowledges_and_a_resume_resolves(tmp_path: Path) -> None:
    clock = SteppedClock()
    async with paging_bot(tmp_path, clock) as (service, chat, fake):
        job_id = await opened(service, fake)
        key = page_key(job_id, 2)
        trigger = fake.calls_of("pagerduty", "trigger")[0]
        assert trigger.key == key and "could not resume" in trigger.body["payload"]["summary"]
        assert fake.calls_of("opsgenie", "trigger")[0].key == key

        clock.advance(5)  # the next step names PagerDuty again: a chat page, no second trigger
        await eventually(lambda: _true(len(pages(chat)) >= 2))
        # A replica redelivering every note of the chat stream (pager calls included) sends nothing again.
        store = service.bot.store
        for _id, fields in await store.redis.xrange(store.keys.chat):
            await store.redis.xadd(store.keys.chat, fields)
        await eventually(lambda: settled(service))
        assert [len(fake.calls_of(tool, "trigger")) for tool in ("pagerduty", "opsgenie")] == [1, 1]
        assert len(pages(chat)) == 2 and not fake.refused

        assert (await service.bot.command("console:bo", CHANNEL, f"ack {job_id}")).startswith("OK: ack")
        await fake.wait_for("pagerduty", "acknowledge")
        await fake.wait_for("opsgenie", "acknowledge")
        assert {call.key for call in fake.calls_of("opsgenie")} == {key}

        assert (await service.bot.command("console:bo", CHANNEL, f"resume {job_id}")).startswith("OK: resume")
        await fake.wait_for("pagerduty", "resolve")
        await fake.wait_for("opsgenie", "resolve")
        await eventually(lambda: settled(service))
        counts = [
            len(fake.calls_of(tool, action))
            for tool in ("pagerduty", "opsgenie")
            for action in ("trigger", "acknowledge", "resolve")
        ]
        assert counts == [1, 1, 1, 1, 1, 1] and not fake.refused


async def test_a_signed_pagerduty_ack_acknowledges_in_chat_once_and_a_forged_or_stale_one_is_refused(
    tmp_path: Path,
) -> None:
    clock = SteppedClock()
    async with paging_bot(tmp_path, clock) as (service, chat, fake):
        job_id = await opened(service, fake)
        key = page_key(job_id, 2)
        body = dumps(pagerduty_ack(key, "Ana Lee", clock()))

        forged = {**pagerduty_signed(body, "not-the-secret")}
        assert (await post(service, "/pagerduty/webhook", body, forged))[0] == 401
        stale_body = dumps(pagerduty_ack(key, "Ana Lee", clock() - timedelta(hours=2)))
        assert (await post(service, "/pagerduty/webhook", stale_body, pagerduty_signed(stale_body)))[0] == 400
        job = await service.bot.store.get(job_id)
        assert job is not None and job.page is not None and job.page.acked_by is None

        # Signed with the new secret, beside an old one (PagerDuty sends both while a secret rotates).
        signed = pagerduty_signed(body, PAGERDUTY_WEBHOOK_SECRET, "the-old-secret")
        assert await post(service, "/pagerduty/webhook", body, signed) == (200, {"outcome": "acked"})
        assert (await post(service, "/pagerduty/webhook", body, signed))[1] == {"outcome": "duplicate"}
        again = dumps(pagerduty_ack(key, "Ana Lee", clock()))  # the same ack, told again under a new event id
        assert (await post(service, "/pagerduty/webhook", again, pagerduty_signed(again)))[1] == {
            "outcome": "nothing-to-ack"
        }
        await fake.wait_for("opsgenie", "acknowledge")  # the other tool hears; PagerDuty, where it happened, not
        await eventually(lambda: settled(service))
        assert (
            acks(chat) == [acks(chat)[0]] and "pagerduty:Ana Lee" in acks(chat)[0] and "in PagerDuty" in acks(chat)[0]
        )
        assert not fake.calls_of("pagerduty", "acknowledge")
        job = await service.bot.store.get(job_id)
        assert job is not None and job.page is not None
        assert (job.page.acked_by, job.page.acked_via) == ("pagerduty:Ana Lee", "pagerduty")


async def test_an_authenticated_opsgenie_ack_acknowledges_in_chat_once_and_a_forged_one_is_refused(
    tmp_path: Path,
) -> None:
    clock = SteppedClock()
    async with paging_bot(tmp_path, clock) as (service, chat, fake):
        job_id = await opened(service, fake)
        body = dumps(opsgenie_ack(page_key(job_id, 2), "ana@example.com"))
        json_type = {"Content-Type": "application/json"}
        assert (await post(service, "/opsgenie/webhook", body, json_type))[0] == 401
        wrong = {**json_type, "X-Finetune-Token": "guessed"}
        assert (await post(service, "/opsgenie/webhook", body, wrong))[0] == 401
        job = await service.bot.store.get(job_id)
        assert job is not None and job.page is not None and job.page.acked_by is None

        good = {**json_type, "X-Finetune-Token": OPSGENIE_WEBHOOK_TOKEN}
        assert await post(service, "/opsgenie/webhook", body, good) == (200, {"outcome": "acked"})
        assert (await post(service, "/opsgenie/webhook", body, good))[1] == {"outcome": "duplicate"}
        await fake.wait_for("pagerduty", "acknowledge")
        await eventually(lambda: settled(service))
        assert len(acks(chat)) == 1 and "in Opsgenie" in acks(chat)[0]
        assert not fake.calls_of("opsgenie", "acknowledge")


async def test_a_ladder_naming_a_tool_without_its_key_is_refused_at_start(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", oncall=ONCALL)
    with pytest.raises(ConfigError, match="PAGERDUTY_ROUTING_KEY, OPSGENIE_API_KEY"):
        async with running_bot(tmp_path / "state", config):
            pass


async def test_a_short_webhook_token_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="OPSGENIE_WEBHOOK_TOKEN must be at least 24 characters"):
        async with running_bot(tmp_path / "state", opsgenie_webhook_token="guessable"):
            pass


async def _true(value: bool) -> bool:
    return value


SLACK_ONCALL = {
    "people": {"ana": {"slack": "U0ANA"}, "bo": {"slack": "U0BO"}},
    "rota": [["ana", "bo"]],
    "ladder": [{"after_minutes": 0, "notify": ["primary", "pagerduty", "opsgenie"]}],
    "repeat_every_minutes": None,
}


async def test_an_ack_from_slacks_button_acknowledges_in_both_tools(tmp_path: Path) -> None:
    fake = await FakePagers().start()
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("flaky", FAILS_ON_RESUME)], oncall=SLACK_ONCALL)
    tools = {
        "pagerduty_routing_key": ROUTING_KEY,
        "pagerduty_events_url": fake.url,
        "opsgenie_api_key": GENIE_KEY,
        "opsgenie_api_url": fake.url,
    }
    try:
        async with (
            FakeSlack() as slack,
            running_bot(tmp_path / "state", config, **slack_settings(slack.api_url), **tools) as (service, _),
        ):
            job = await running_job(service, "flaky")
            await wait_job(service, job.id, lambda job: (job.step or 0) >= 1)
            assert await click(service, "finetune_interrupt_test", job.id) == 200
            await wait_job(service, job.id, lambda job: job.state is JobState.RESUME_FAILED)
            await fake.wait_for("pagerduty", "trigger")
            await fake.wait_for("opsgenie", "trigger")

            assert await click(service, "finetune_ack", job.id, user="U0BO") == 200
            await fake.wait_for("pagerduty", "acknowledge")
            await fake.wait_for("opsgenie", "acknowledge")
            key = page_key(job.id, 2)
            assert [call.key for call in fake.calls_of("pagerduty")] == [key, key]
            assert fake.calls_of("opsgenie", "acknowledge")[0].body["note"].endswith("acknowledged by slack:U0BO")
            assert not fake.refused
    finally:
        await fake.close()
