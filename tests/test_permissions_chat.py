"""Who may act on a job, end to end: the real bot (embedded Valkey, local cloud, runner subprocesses) behind its
Slack adapter (HTTP mode, signed requests, fakes/fake_slack.py) and its DingTalk adapter (Stream callbacks,
fakes/fake_dingtalk.py). Alice starts a job in channel A; Mallory in channel B, and Bob in A (not on Alice's
team), are refused everything that is the job's, typed or clicked, and see none of it; a team member and an admin
may stop it; Mallory's ``list`` does not show it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.chat.dingtalk.cards import out_track_id
from bot.chat.slack.blocks import ACTION_INTERRUPT_TEST, ACTION_ON_DEMAND, ACTION_RESUME, ACTION_STOP
from bot.service import BotService
from fakes.bot_harness import (
    SLEEPS,
    quick_recipe,
    running_bot,
    running_dingtalk_bot,
    slack_settings,
    wait_job,
    write_config,
)
from fakes.fake_dingtalk import FakeDingTalk, card_click, click_frame, group_message, message_frame
from fakes.fake_slack import FakeSlack
from handlers.jobs import JobState
from tests.test_slack_http import click, command, started

A, B = "C0TEAMA", "C0OTHERB"
ALICE, TINA, BOB, MALLORY, ADMIN = "U0ALICE", "U0TINA", "U0BOB", "U0MALLORY", "U0ADMIN"
ACTED = ("stop", "interrupt-test", "resume")


def slack_config(tmp_path: Path) -> Path:
    policy = {
        "admins": [f"slack:{ADMIN}"],
        "teams": {"ml": {"members": [f"slack:{ALICE}", f"slack:{TINA}"], "channels": [f"slack:{A}"]}},
    }
    return write_config(tmp_path / "bot.yaml", policy=policy, recipes=[quick_recipe("sleepy", SLEEPS)])


def said(reply: str) -> str:
    return str(json.loads(reply)["text"])


def told(slack: FakeSlack, user: str) -> list[dict[str, Any]]:
    """What was shown to ``user`` alone (the answers to their clicks)."""
    return [entry for entry in slack.ephemeral if entry["user"] == user]


async def history_events(service: BotService, job_id: str) -> list[str]:
    return [str(entry.get("event")) for entry in await service.bot.store.history(job_id)]


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


async def test_in_slack_only_the_owner_the_team_and_the_admins_act_on_a_job_and_other_channels_see_nothing(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with running_bot(tmp_path / "state", slack_config(tmp_path), **slack_settings(slack.api_url)) as (
        service,
        _console,
    ):
        first = started(said((await command(service, "start sleepy", user=ALICE, channel=A))[1]))
        second = started(said((await command(service, "start sleepy", user=ALICE, channel=A))[1]))
        for job_id in (first, second):
            job = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
            assert (job.requested_by, job.team, job.chat and job.chat.channel) == (f"slack:{ALICE}", "ml", A)
        before = await history_events(service, first)

        # Mallory, in channel B: every command on the job, typed, is refused in one sentence.
        not_yours = "⛔ {job} is not yours to {action}: only its owner, its team and the admins may"
        for action in ACTED:
            status, reply = await command(service, f"{action} {first}", user=MALLORY, channel=B)
            assert status == 200 and said(reply) == not_yours.format(job=first, action=action)
        for action in ("logs", "status"):
            _status, reply = await command(service, f"{action} {first}", user=MALLORY, channel=B)
            assert said(reply) == f"⛔ {first} is not a job of this channel; ask in the channel it was started in"
        assert said((await command(service, "list", user=MALLORY, channel=B))[1]) == "no jobs yet: /finetune start tiny"

        # … and so is every button of the card, clicked in channel B.
        for button in (ACTION_STOP, ACTION_INTERRUPT_TEST, ACTION_RESUME, ACTION_ON_DEMAND):
            assert await click(service, button, first, user=MALLORY, channel=B) == 200
        clicked = await slack.wait_for(lambda: len(told(slack, MALLORY)) == 4 and told(slack, MALLORY))
        refused = f"⛔ {first} is not yours to"
        assert all(entry["channel"] == B and entry["text"].startswith(refused) for entry in clicked)

        # Bob, in channel A but not on Alice's team, sees the card but may not act on the job or read its log.
        _status, reply = await command(service, f"stop {first}", user=BOB, channel=A)
        assert said(reply) == not_yours.format(job=first, action="stop")
        _status, reply = await command(service, f"logs {first}", user=BOB, channel=A)
        assert said(reply) == not_yours.format(job=first, action="logs")
        assert first in said((await command(service, f"status {first}", user=BOB, channel=A))[1])

        # Nothing changed: the job runs, its history has no new line, every refusal is recorded apart.
        running = await service.bot.store.get(first)
        assert running is not None and running.state is JobState.RUNNING
        assert await history_events(service, first) == before
        refusals = await service.bot.store.refusal_log()
        assert len(refusals) == 3 + 2 + 4 + 2 and {e["by"] for e in refusals} == {f"slack:{MALLORY}", f"slack:{BOB}"}
        assert all(e["job"] == first for e in refusals)
        mallorys = [e["text"] for e in told(slack, MALLORY)]
        assert not any("created" in text or "progress" in text for text in mallorys)  # no log line reached her

        # A team member and the owner read the log in the job's channel; Tina stops one job, the admin the other
        # (from channel B: an admin sees and acts everywhere).
        history = said((await command(service, f"history {first}", user=TINA, channel=A))[1])
        assert " created " in history and f"slack:{ALICE}" in history
        assert said((await command(service, f"stop {first}", user=TINA, channel=A))[1]).startswith(f"OK: stop {first}")
        assert await click(service, ACTION_STOP, second, user=ADMIN, channel=B) == 200
        done = await slack.wait_for(lambda: told(slack, ADMIN))
        assert done[0]["text"].startswith(f"OK: stop {second}")
        for job_id, by in ((first, TINA), (second, ADMIN)):
            await wait_job(service, job_id, lambda job: job.state is JobState.STOPPED)
            stops = [e for e in await service.bot.store.history(job_id) if e.get("event") == "stop"]
            assert [e["by"] for e in stops] == [f"slack:{by}"]
        listed = said((await command(service, "list", user=ADMIN, channel=B))[1])
        assert first in listed and second in listed
        actions = [(e["event"], e["by"]) for e in await service.bot.store.audit_log()]
        assert actions == [
            ("start", f"slack:{ALICE}"),
            ("start", f"slack:{ALICE}"),
            ("stop", f"slack:{TINA}"),
            ("stop", f"slack:{ADMIN}"),
        ]


GROUP_A, GROUP_B = "cidTeamA0001==", "cidOtherB0001=="


async def ask(dingtalk: FakeDingTalk, text: str, sender: str, group: str) -> str:
    """Send ``@bot /finetune …`` in ``group``; the bot's answer, through the session webhook."""
    before = len(dingtalk.session_replies)
    webhook = dingtalk.session_webhook(group)
    await dingtalk.push(message_frame(group_message(f"/finetune {text}", sender, group, webhook)))
    await dingtalk.wait_until(lambda: len(dingtalk.session_replies) > before, what=f"answer to {text}")
    reply: dict[str, Any] = dingtalk.session_replies[before]["body"]
    return str(reply["markdown"]["text"])


async def ask_privately(dingtalk: FakeDingTalk, text: str, sender: str, group: str) -> str:
    """Send ``@bot /finetune …`` in ``group``; the bot's answer for ``sender`` alone, in the robot's one-to-one chat
    with them (``costs``, ``logs``, an admin's ``list``)."""
    before = len(dingtalk.direct_messages)
    webhook = dingtalk.session_webhook(group)
    await dingtalk.push(message_frame(group_message(f"/finetune {text}", sender, group, webhook)))
    await dingtalk.wait_until(lambda: len(dingtalk.direct_messages) > before, what=f"private answer to {text}")
    message = dingtalk.direct_messages[before]
    assert message["user"] == sender
    return str(message["text"])


async def press(dingtalk: FakeDingTalk, track: str, user: str, action: str, group: str) -> str:
    frame = click_frame(card_click(track, user, action, group))
    await dingtalk.push(frame)
    ack = await dingtalk.ack(frame["headers"]["messageId"])
    return str(json.loads(ack["data"])["response"]["userPrivateData"]["cardParamMap"]["notice"])


async def test_in_dingtalk_another_group_and_another_member_are_refused_and_the_admin_may_stop(
    tmp_path: Path,
) -> None:
    policy = {
        "admins": ["dingtalk:boss"],
        "teams": {"ml": {"members": ["dingtalk:alice", "dingtalk:tina"], "channels": [f"dingtalk:{GROUP_A}"]}},
    }
    config = write_config(
        tmp_path / "bot.yaml",
        policy=policy,
        recipes=[quick_recipe("sleepy", SLEEPS)],
        dingtalk={"card_template_id": "finetune-job.schema", "language": "en"},
    )
    async with FakeDingTalk() as dingtalk, running_dingtalk_bot(tmp_path / "state", dingtalk, config) as (
        service,
        _console,
    ):
        assert (await ask(dingtalk, "start sleepy", "alice", GROUP_A)).startswith("Starting ft-")
        [job] = await service.bot.store.list_jobs()
        await wait_job(service, job.id, lambda j: j.state is JobState.RUNNING)
        track = out_track_id(job)
        await dingtalk.wait_until(lambda: dingtalk.cards.get(track, {}).get("state") == "RUNNING", what="card")

        refusal = f"⛔ {job.id} is not yours to stop: only its owner, its team and the admins may"
        assert await ask(dingtalk, f"stop {job.id}", "mallory", GROUP_B) == refusal
        assert await press(dingtalk, track, "mallory", "stop", GROUP_B) == refusal
        assert await ask(dingtalk, f"stop {job.id}", "bob", GROUP_A) == refusal
        logs = await ask_privately(dingtalk, f"logs {job.id}", "mallory", GROUP_B)
        assert logs.startswith(f"⛔ {job.id} is not a job of")
        assert await ask(dingtalk, "list", "mallory", GROUP_B) == "no jobs yet: /finetune start tiny"
        still = await service.bot.store.get(job.id)
        assert still is not None and still.state is JobState.RUNNING

        assert (await press(dingtalk, track, "boss", "stop", GROUP_A)).startswith(f"OK: stop {job.id}")
        await wait_job(service, job.id, lambda j: j.state is JobState.STOPPED)
        stops = [e["by"] for e in await service.bot.store.history(job.id) if e.get("event") == "stop"]
        assert stops == ["dingtalk:boss"]
        assert [e["by"] for e in await service.bot.store.refusal_log()] == ["dingtalk:mallory"] * 2 + [
            "dingtalk:bob",
            "dingtalk:mallory",
        ]


async def test_dingtalk_messages_and_clicks_of_another_organisation_run_nothing(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "bot.yaml",
        recipes=[quick_recipe("sleepy", SLEEPS)],
        dingtalk={"card_template_id": "finetune-job.schema", "corp_id": "dingcorp"},
    )
    async with FakeDingTalk() as dingtalk, running_dingtalk_bot(tmp_path / "state", dingtalk, config) as (
        service,
        _console,
    ):
        foreign = group_message("/finetune start sleepy", "eve", GROUP_A, dingtalk.session_webhook("x"))
        foreign["senderCorpId"] = "dingOTHERcorp"
        frame = message_frame(foreign)
        await dingtalk.push(frame)
        assert (await dingtalk.ack(frame["headers"]["messageId"]))["code"] == 200  # acknowledged, not run
        assert await service.bot.store.list_jobs() == [] and dingtalk.session_replies == []

        ours = group_message("/finetune start sleepy", "ana", GROUP_A, dingtalk.session_webhook("y"))
        await dingtalk.push(message_frame(ours))
        await dingtalk.wait_until(lambda: len(dingtalk.session_replies) == 1, what="the answer to ana")
        [job] = await service.bot.store.list_jobs()
        click = card_click(out_track_id(job), "ana", "stop", GROUP_A)
        click["corpId"] = "dingOTHERcorp"
        frame = click_frame(click)
        await dingtalk.push(frame)
        answer = json.loads((await dingtalk.ack(frame["headers"]["messageId"]))["data"])["response"]
        assert answer == {}
        assert [e["event"] for e in await service.bot.store.history(job.id)][-1] != "stop"
        assert await service.bot.store.refusal_log() == [] and len(await service.bot.store.audit_log()) == 1
