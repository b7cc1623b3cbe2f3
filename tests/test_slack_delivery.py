"""Delivery to Slack: coalesced card edits, rate limits, outages, dedup, alerts, pages and their acknowledgement.

Real BotService with the Slack adapter in HTTP mode against fakes/fake_slack.py; jobs started with signed slash
commands; notes either produced by the real handlers or, for the on-call page contract, built here and handed
to the service's chat outbox (the same call the bot makes).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from bot.bus import EVENT_FIELD
from bot.service import BotService
from fakes.bot_harness import (
    FAILS_ON_RESUME,
    SteppedClock,
    drained,
    eventually,
    quick_recipe,
    running_bot,
    slack_settings,
    wait_job,
    write_config,
)
from fakes.fake_slack import FakeSlack, Message
from fakes.notes import notify
from handlers.failures import Failure
from handlers.jobs import Job, JobState
from handlers.messages import ReportReceived, dump_message
from handlers.reports import Progress
from tests.test_slack_http import CHANNEL, buttons, card_of, click, command, field_text, sleepy_config, started

ALERTS = "C0ALERTS"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


async def hold_the_card(service: BotService, job_id: str) -> str:
    """The test as the clock of card edits: take the card's edit throttle, as an edit does for its interval, and
    hold it until the test deletes it (the interval is over). Taken only when free (``NX``, as the refresher takes
    it), so no edit is on its way meanwhile. Returns the throttle's key."""
    assert service.outbox is not None
    cards = service.outbox.cards
    key = cards.throttle_key(job_id)

    async def taken() -> bool:
        return bool(await cards.redis.set(key, "held-by-the-test", nx=True))

    await eventually(taken)
    return key


async def card_owed(service: BotService, job_id: str, marked: bool = True) -> bool:
    """Every card note handled, and the card marked for an edit (``marked``) or not."""
    assert service.outbox is not None
    return await drained(service.outbox.bus) and (job_id in await service.outbox.cards.marked()) is marked


async def running_job(service: BotService, recipe: str = "sleepy") -> Job:
    job_id = started((await command(service, f"start {recipe}"))[1])
    return await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)


def context_text(message: Message) -> str:
    return " ".join(e["text"] for block in message.blocks if block["type"] == "context" for e in block["elements"])


async def test_a_burst_of_progress_reports_costs_few_card_edits_and_the_last_shows_the_latest_step(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with running_bot(tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url)) as (
        service,
        _console,
    ):
        job = await running_job(service)
        card = await slack.wait_for(lambda: (c := card_of(slack, job.id)) and "RUNNING" in field_text(c) and c)
        outbox = service.outbox
        assert outbox is not None
        throttle = await hold_the_card(service, job.id)
        before = len(slack.called("chat.update"))
        for step in range(1, 101):
            report = ReportReceived(
                report=Progress(job_id=job.id, attempt=1, step=step, total_steps=100, loss=1 / step)
            )
            await service.bus.publish(dump_message(report))
        await wait_job(service, job.id, lambda job: job.step == 100)
        await eventually(lambda: card_owed(service, job.id))
        assert slack.called("chat.update")[before:] == []  # 100 card notes, and the card's interval is not over
        await outbox.cards.redis.delete(throttle)  # the interval is over
        await slack.wait_for(lambda: "100/100" in field_text(card))

        async def nothing_owed() -> bool:
            """Every card note handled, no card marked, and the card shows the job's latest version: no edit
            is on its way or still to come."""
            latest, shown = await service.bot.store.get(job.id), await outbox.refs.card(job.id)
            return (
                await drained(outbox.bus)
                and not await outbox.cards.marked()
                and latest is not None
                and shown is not None
                and shown.version >= latest.version
            )

        await eventually(nothing_owed)
        edits = slack.called("chat.update")[before:]
        assert len(edits) == 1, edits  # 100 card notes in one interval: one edit, which shows the latest
        assert all(call.args["ts"] == card.ts for call in edits)
        assert "100/100" in field_text(card) and "loss 0.0100" in field_text(card)
        assert len(slack.called("chat.postMessage")) == 1
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{service.port}/metrics") as response:
            metrics = dict(line.rsplit(" ", 1) for line in (await response.text()).splitlines() if line[:1] != "#")
        assert float(metrics["finetune_chat_card_edits_total"]) == len(slack.called("chat.update"))
        # Every card note handled: delivered (marking the card) or superseded by the next one read with it.
        handled = sum(float(metrics[f"finetune_chat_{name}_total"]) for name in ("delivered", "cards_coalesced"))
        assert handled >= 100 and metrics["finetune_chat_dropped_total"] == "0.0"


async def test_a_rate_limited_post_waits_for_retry_after_then_arrives_once(tmp_path: Path, slack: FakeSlack) -> None:
    async with running_bot(tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url)) as (
        service,
        _console,
    ):
        slack.fail_next(1, status=429, retry_after=1)
        job_id = started((await command(service, "start sleepy"))[1])  # answered in the ack: no Web API call
        card = await slack.wait_for(lambda: card_of(slack, job_id))
        posts = slack.called("chat.postMessage", ok=None)
        assert [call.status for call in posts] == [429, 200]
        assert posts[1].at - posts[0].at >= 0.95  # Retry-After: 1 was honoured
        assert slack.channel_messages(CHANNEL) == [card]


async def test_while_slack_is_down_jobs_still_move_and_every_message_arrives_once_it_is_back(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with running_bot(tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url)) as (
        service,
        _console,
    ):
        slack.go_down()
        job = await running_job(service)  # the slash command needs no Web API call; delivery does
        status, reply = await command(service, f"stop {job.id}")
        assert status == 200 and f"OK: stop {job.id}" in reply
        await wait_job(service, job.id, lambda job: job.state is JobState.STOPPED)
        await slack.wait_for(lambda: len(slack.called("chat.postMessage", ok=None)) >= 2)
        assert slack.messages == {}  # nothing got through while it was down
        assert service.outbox is not None and service.outbox.dropped == 0

        slack.come_back()
        card = await slack.wait_for(lambda: (c := card_of(slack, job.id)) and "STOPPED" in field_text(c) and c)
        outbox = service.outbox
        await eventually(lambda: drained(outbox.bus))  # every note handled: nothing more is coming
        texts = [reply.text for reply in slack.replies(CHANNEL, card.ts)]
        assert any("Stop requested by <@U0ANA>" in text for text in texts)
        assert any(f"{job.id} stopped" in text for text in texts)
        assert len(texts) == len(set(texts)), texts  # each once
        assert slack.channel_messages(CHANNEL) == [card]


async def test_a_redelivered_note_is_posted_once(tmp_path: Path, slack: FakeSlack) -> None:
    async with running_bot(tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url)) as (
        service,
        _console,
    ):
        job = await running_job(service)
        assert service.outbox is not None
        card = await slack.wait_for(lambda: card_of(slack, job.id))
        note = notify(job.id, "thread", "rebalance")
        handled = service.outbox.bus.handled
        for _ in range(3):
            await service.outbox.notify(job, note)
        await slack.wait_for(lambda: service.outbox is not None and service.outbox.bus.handled >= handled + 3)
        rebalance = [m for m in slack.replies(CHANNEL, card.ts) if "Rebalance recommendation" in m.text]
        assert len(rebalance) == 1


NO_SPOT = Failure.of("capacity", error="no spot capacity")


async def test_pages_mention_on_call_and_an_acknowledgement_updates_every_page(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with running_bot(tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url)) as (
        service,
        _console,
    ):
        job = await running_job(service)
        outbox = service.outbox
        assert outbox is not None
        card = await slack.wait_for(lambda: card_of(slack, job.id))
        ana = {"name": "Ana", "slack": "U0ANA", "dingtalk": None, "mobile": None}
        team = {"name": "ML on-call", "slack": "S0ONCALL", "dingtalk": None, "mobile": None}
        bob = {"name": "Bob", "slack": "U0BOB", "dingtalk": "bob", "mobile": None}
        nobody = {"name": "Eve", "slack": "U0EVE> <!channel", "dingtalk": None, "mobile": None}
        steps = [
            {"reason": NO_SPOT, "step": 0, "mention": [ana, team, nobody], "everyone": None},
            {"reason": NO_SPOT, "step": 1, "mention": [ana, bob], "everyone": "here"},
        ]
        for fields in steps:
            await outbox.notify(job, notify(job.id, "page", "resume-failed", **fields))
        pages = await slack.wait_for(
            lambda: len(slack.channel_messages(CHANNEL)) == 3 and slack.channel_messages(CHANNEL)[1:]
        )
        assert pages[0].text.startswith(f"<@U0ANA> <!subteam^S0ONCALL> 🚨 On-call: {job.id} could not resume")
        assert pages[1].text.startswith("<@U0ANA> <@U0BOB> <!here> 🚨")
        assert "<!channel>" not in pages[0].text and "U0EVE" not in pages[0].text
        for page in pages:
            assert page.thread_ts is None  # a new top-level message per step: edits notify no one
            shown = buttons(page)
            assert list(shown) == ["finetune_ack", "finetune_resume", "finetune_ondemand", "finetune_stop"]
            assert {button["value"] for button in shown.values()} == {job.id}
            assert "confirm" in shown["finetune_stop"]

        acked = notify(job.id, "thread", "acked", **{"by": "slack:U0BOB", "at": "2030-01-02T03:04:05+00:00"})
        await outbox.notify(job, acked)
        await slack.wait_for(lambda: all(page.edits == 1 for page in pages))
        for page in pages:
            assert buttons(page) == {}
            assert context_text(page) == "✅ Acknowledged by <@U0BOB> at 03:04 UTC"
            assert "could not resume" in page.blocks[0]["text"]["text"]
            assert "<@U0ANA>" not in page.blocks[0]["text"]["text"]  # an edit does not call anyone again
        thread = await slack.wait_for(lambda: slack.replies(CHANNEL, card.ts))
        assert any(f"<@U0BOB> acknowledged the page for {job.id}" in reply.text for reply in thread)

        # A later incident: its page is acknowledged by someone else; the earlier pages keep who owned them.
        await outbox.notify(job, notify(job.id, "page", "resume-failed", **steps[0]))
        later = await slack.wait_for(
            lambda: len(slack.channel_messages(CHANNEL)) == 4 and slack.channel_messages(CHANNEL)[3]
        )
        fields = {"by": "slack:U0ANA", "at": "2030-01-02T05:06:07+00:00"}
        await outbox.notify(job, notify(job.id, "thread", "acked", **fields))
        await slack.wait_for(lambda: later.edits == 1)
        assert context_text(later) == "✅ Acknowledged by <@U0ANA> at 05:06 UTC"
        await slack.wait_for(lambda: len(slack.replies(CHANNEL, card.ts)) >= 2)
        assert [page.edits for page in pages] == [1, 1] and "<@U0BOB>" in context_text(pages[0])


ONCALL = {
    "people": {"ana": {"slack": "U0ANA"}, "bo": {"slack": "U0BO"}, "leads": {"slack": "S0LEADS"}},
    "rota": [["ana", "bo"]],
    "ladder": [
        {"after_minutes": 0, "notify": ["primary"]},
        {"after_minutes": 5, "notify": ["primary", "secondary"]},
        {"after_minutes": 15, "notify": ["here", "leads"]},
    ],
    "repeat_every_minutes": None,
}


async def test_a_failed_resume_alerts_escalates_and_is_acknowledged_and_resumed_from_the_buttons(
    tmp_path: Path, slack: FakeSlack
) -> None:
    config = write_config(
        tmp_path / "bot.yaml",
        recipes=[quick_recipe("flaky", FAILS_ON_RESUME)],
        slack={"alert_channel": ALERTS},
        oncall=ONCALL,
    )
    clock = SteppedClock()
    async with running_bot(tmp_path / "state", config, clock=clock, **slack_settings(slack.api_url)) as (service, _):
        job = await running_job(service, "flaky")
        # Interrupt-tested once it trains (a step reported): its SIGTERM handler is in place, so it saves
        # checkpoint-<step>.
        await wait_job(service, job.id, lambda job: (job.step or 0) >= 1)
        assert await click(service, "finetune_interrupt_test", job.id) == 200
        asked = await slack.wait_for(lambda: [e for e in slack.ephemeral if "interrupt-test" in e["text"]])
        assert asked[0]["text"].startswith(f"OK: interrupt-test {job.id}") and asked[0]["user"] == "U0ANA"
        await wait_job(service, job.id, lambda job: job.state is JobState.RESUME_FAILED)

        alerts = await slack.wait_for(lambda: slack.channel_messages(ALERTS))
        assert "Spot interruption warning" in alerts[0].text and f"<#{CHANNEL}>" in alerts[0].text
        card = await slack.wait_for(lambda: card_of(slack, job.id))
        first = await slack.wait_for(lambda: [m for m in slack.channel_messages(CHANNEL) if m is not card])
        assert first[0].text.startswith(f"<@U0ANA> 🚨 On-call: {job.id} could not resume")
        assert "finetune_ack" in buttons(first[0])
        thread = " ".join(m.text for m in slack.replies(CHANNEL, card.ts))
        assert "Spot interruption warning" in thread and "Interrupt test" in thread

        clock.advance(5)  # nobody acknowledged: the primary and the secondary, in a new message
        pages = await slack.wait_for(
            lambda: len(slack.channel_messages(CHANNEL)) == 3 and slack.channel_messages(CHANNEL)[1:]
        )
        assert pages[1].text.startswith("<@U0ANA> <@U0BO> 🚨 On-call (escalation 2 of 3")

        assert await click(service, "finetune_ack", job.id, user="U0BO") == 200
        acked = await wait_job(service, job.id, lambda job: job.acked_by == "slack:U0BO")
        assert acked.page is not None and acked.page.acked_at is not None
        await slack.wait_for(lambda: all(page.edits == 1 for page in pages))
        for page in pages:
            assert buttons(page) == {}
            assert context_text(page) == f"✅ Acknowledged by <@U0BO> at {acked.page.acked_at:%H:%M} UTC"
        await slack.wait_for(lambda: "acknowledged by <@U0BO>" in field_text(card))
        acks = [e for e in await service.bot.store.history(job.id) if e.get("event") == "ack"]
        assert [e["by"] for e in acks] == ["slack:U0BO"]

        clock.advance(15)  # the third step falls due, finds the ack, and nobody is called

        async def dropped() -> bool:
            history = await service.bot.store.history(job.id)
            return any(e.get("what") == "page-step" and "acknowledged" in str(e.get("why")) for e in history)

        await eventually(dropped)
        assert len(slack.channel_messages(CHANNEL)) == 3

        assert await click(service, "finetune_ondemand", job.id, user="U0BO") == 200
        again = await wait_job(service, job.id, lambda job: job.state is JobState.RESUME_FAILED and job.attempt == 3)
        assert again.attempts[2].market == "on-demand"
        fresh = await slack.wait_for(
            lambda: len(slack.channel_messages(CHANNEL)) == 4 and slack.channel_messages(CHANNEL)[3]
        )
        assert fresh.text.startswith("<@U0ANA> 🚨 On-call:") and "finetune_ack" in buttons(fresh)  # a new incident
        assert [page.edits for page in pages] == [1, 1]
        card_now = await slack.wait_for(lambda: "RESUME_FAILED" in field_text(card) and card)
        assert "finetune_stop" in buttons(card_now)


async def test_messages_waiting_for_slack_survive_a_restart_of_the_bot(tmp_path: Path, slack: FakeSlack) -> None:
    config = sleepy_config(tmp_path)
    async with running_bot(tmp_path / "state", config, **slack_settings(slack.api_url)) as (service, _console):
        slack.go_down()
        job = await running_job(service)
        await slack.wait_for(lambda: slack.called("chat.postMessage", ok=None))
        first = service.outbox
    assert slack.messages == {}
    assert first is not None and first.bus.released >= 1  # stopped while waiting: handed back, not acknowledged

    slack.come_back()
    async with running_bot(tmp_path / "state", config, **slack_settings(slack.api_url)) as (service, _console):
        card = await slack.wait_for(lambda: card_of(slack, job.id))
        assert service.outbox is not None
        await slack.wait_for(lambda: service.outbox is not None and service.outbox.delivered >= 1)
        assert slack.channel_messages(CHANNEL) == [card]
        assert await service.outbox.bus.parked_events() == []


async def test_a_channel_slack_refuses_for_good_is_logged_and_dropped_not_retried(
    tmp_path: Path, slack: FakeSlack
) -> None:
    slack.unknown_channels.add(CHANNEL)
    async with running_bot(tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url)) as (
        service,
        _console,
    ):
        job = await running_job(service)  # the job runs regardless of its chat
        outbox = service.outbox
        assert outbox is not None

        async def each_note_tried_once() -> bool:
            """Every note in the stream was handled (dropped, as each is refused), and the posts Slack refused are
            exactly one try per note: a card note tries the card; any other note tries the card, then itself.
            Any retry of a refusal adds a post no note accounts for, so this never holds again (a later note
            brings its own tries). Counted, not timed: a note written late under load is simply waited for."""
            entries = await outbox.redis.xrange(outbox.bus.stream)
            notes = [json.loads(fields[EVENT_FIELD])["note"] for _id, fields in entries]
            owed = sum(1 if note["channel"] == "card" else 2 for note in notes)
            refused = len(slack.called("chat.postMessage", ok=False))
            return len(notes) >= 2 and outbox.dropped == len(notes) and refused == owed

        await eventually(each_note_tried_once)
        assert {call.error for call in slack.calls[1:]} == {"channel_not_found"}
        assert job.state is JobState.RUNNING and slack.messages == {}


async def test_two_replicas_post_a_card_once_and_edit_it_at_most_once_per_interval(
    tmp_path: Path, slack: FakeSlack
) -> None:
    config = sleepy_config(tmp_path)
    async with running_bot(tmp_path / "a", config, **slack_settings(slack.api_url)) as (first, _console):
        second_settings = slack_settings(slack.api_url)
        async with running_bot(tmp_path / "b", config, redis_url=first.redis_url, **second_settings) as (second, _):
            job = await running_job(first)
            card = await slack.wait_for(lambda: (c := card_of(slack, job.id)) and "RUNNING" in field_text(c) and c)
            assert first.outbox is not None and second.outbox is not None
            throttle = await hold_the_card(first, job.id)  # one throttle for the card, whichever replica edits
            before = len(slack.called("chat.update"))
            for step in range(1, 201):
                progress = Progress(job_id=job.id, attempt=1, step=step, total_steps=200)
                await first.bus.publish(dump_message(ReportReceived(report=progress)))
            await wait_job(first, job.id, lambda job: job.step == 200)

            async def owed_by_both() -> bool:
                return await card_owed(first, job.id) and await card_owed(second, job.id)

            await eventually(owed_by_both)
            assert first.outbox.bus.handled > 0 and second.outbox.bus.handled > 0  # both replicas delivered
            assert slack.called("chat.update")[before:] == []  # neither replica edits inside the interval
            await first.outbox.cards.redis.delete(throttle)  # the interval is over
            await slack.wait_for(lambda: "200/200" in field_text(card))
            await eventually(lambda: card_owed(first, job.id, marked=False))
            assert len(slack.called("chat.update")[before:]) == 1  # by one replica, once, showing the latest
            assert slack.channel_messages(CHANNEL) == [card] and len(slack.called("chat.postMessage")) == 1
