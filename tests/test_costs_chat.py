"""``/finetune costs`` end to end: the real bot (embedded Valkey, its store and indexes) behind its Slack adapter
(signed HTTP requests, fakes/fake_slack.py), in English, and its DingTalk adapter (Stream callbacks,
fakes/fake_dingtalk.py), in Chinese, over jobs of two teams written across a week of injected clock
(tests/cost_jobs.py). A member sees their team, an admin every team, anyone else a one-sentence refusal (recorded)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

from redis.asyncio import Redis
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.catalog import Lang
from bot.chat.costs import ON_DEMAND_COLOUR, PAID_COLOUR, costs_png
from bot.chat.delivery import Picture
from bot.chat.refs import ChatRefs
from bot.chat.slack.deliverer import SlackDeliverer
from bot.service import BotService
from fakes.bot_harness import (
    eventually,
    running_bot,
    running_dingtalk_bot,
    settled,
    slack_settings,
    write_config,
)
from fakes.fake_dingtalk import FakeDingTalk
from fakes.fake_slack import BOT_TOKEN, FakeSlack
from handlers.cost_report import cost_report
from handlers.jobs import ChatRef
from tests.chart_pixels import bars, decoded, lowest_row
from tests.cost_jobs import ADMIN, ALICE, DINGTALK_GROUP, NOW, SLACK_CHANNEL, TINA, week_of_jobs
from tests.test_permissions_chat import ask_privately
from tests.test_slack_http import command


class Clock:
    """The bot's clock: NOW until the test moves it."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


def config(tmp_path: Path, **extra: object) -> Path:
    policy = {
        "admins": [ADMIN, "dingtalk:boss"],
        "teams": {
            "ml": {"members": [ALICE, TINA], "channels": [f"slack:{SLACK_CHANNEL}"]},
            "vision": {"members": ["dingtalk:bob"], "channels": [f"dingtalk:{DINGTALK_GROUP}"]},
        },
    }
    return write_config(tmp_path / "bot.yaml", policy=policy, **extra)


async def seed(service: BotService) -> None:
    for job in week_of_jobs():
        assert await service.bot.store.create(job, {"event": "seeded"})


async def slack_says(service: BotService, text: str, user: str) -> str:
    status, body = await command(service, text, user=user.removeprefix("slack:"), channel=SLACK_CHANNEL)
    assert status == 200, body
    return str(json.loads(body)["text"])


ML_WEEK = (
    "💰 Costs of the last 7 days (2026-11-23 12:00 → 2026-11-30 12:00 UTC), team ml: 2 jobs\n"
    "Total: $5.08 paid · $16.90 on-demand · saved $11.82 (70%) · 2 jobs · 20 steps lost · 0.5 h restarts\n"
    "By team:\n"
    "  ml: $5.08 paid · $16.90 on-demand · saved $11.82 (70%) · 2 jobs · 20 steps lost · 0.5 h restarts\n"
    "By user:\n"
    "  slack:U0ALICE: $3.03 paid · $10.10 on-demand · saved $7.07 (70%) · 1 jobs · 0 steps lost · 0.0 h restarts\n"
    "  slack:U0TINA: $2.05 paid · $6.80 on-demand · saved $4.75 (70%) · 1 jobs · 20 steps lost · 0.5 h restarts\n"
    "By recipe:\n"
    "  tiny: $3.03 paid · $10.10 on-demand · saved $7.07 (70%) · 1 jobs · 0 steps lost · 0.0 h restarts\n"
    "  deepseek-7b: $2.05 paid · $6.80 on-demand · saved $4.75 (70%) · 1 jobs · 20 steps lost · 0.5 h restarts"
)


async def test_in_slack_a_member_gets_their_teams_week_in_english_and_it_moves_with_the_clock(tmp_path: Path) -> None:
    clock = Clock()
    async with (
        FakeSlack() as slack,
        running_bot(tmp_path / "state", config(tmp_path), clock=clock, **slack_settings(slack.api_url)) as (
            service,
            _console,
        ),
    ):
        await seed(service)
        assert await slack_says(service, "costs", ALICE) == ML_WEEK
        assert await slack_says(service, "costs 7d team=ml", TINA) == ML_WEEK

        everyone = await slack_says(service, "costs", ADMIN)
        assert "every team: 4 jobs" in everyone.splitlines()[0]
        assert everyone.splitlines()[1].startswith("Total: $6.91 paid · $22.00 on-demand · saved $15.39 (70%) · 4 jobs")
        assert "  (no team): $0.30 paid · $0.00 on-demand · saved n/a · 1 jobs" in everyone
        assert "team vision: 2 jobs" in (await slack_says(service, "costs 30d team=vision", ADMIN)).splitlines()[0]

        clock.now = NOW + timedelta(days=4)  # alice's job ended 5.6 days ago: out of the week now
        later = await slack_says(service, "costs", ALICE)
        assert later.splitlines()[0].endswith("team ml: 1 jobs") and "slack:U0ALICE" not in later

        refused = await slack_says(service, "costs team=vision", ALICE)
        assert refused == "⛔ the costs of vision are shown to its members and the admins only"
        assert await slack_says(service, "costs", "slack:U0STRANGER") == (
            "⛔ costs are shown to a team's members and the admins; you are on no team"
        )
        assert await slack_says(service, "costs 90d", ALICE) == (
            "costs takes a window (7d or 30d) and a team=name, each at most once. "
            "Usage: /finetune costs [7d|30d] [team=name]"
        )
        refusals = await service.bot.store.refusal_log()
        assert [(entry["by"], entry["action"]) for entry in refusals] == [
            (ALICE, "costs"),
            ("slack:U0STRANGER", "costs"),
        ]


async def test_in_dingtalk_a_member_gets_their_teams_week_in_chinese_and_another_team_is_refused(
    tmp_path: Path,
) -> None:
    clock = Clock()
    async with (
        FakeDingTalk() as dingtalk,
        running_dingtalk_bot(tmp_path / "state", dingtalk, config(tmp_path), clock=clock) as (service, _console),
    ):
        await seed(service)
        week = lines(await ask_privately(dingtalk, "costs", "bob", DINGTALK_GROUP))
        assert week[:4] == [
            "💰 最近 7 天的费用（2026-11-23 12:00 → 2026-11-30 12:00 UTC），团队 vision：1 个任务",
            "合计：实付 $1.53 · 按量付费需 $5.10 · 节省 $3.57（70%） · 1 个任务 · 丢失 0 步 · 重启耗时 0.0 小时",
            "按团队：",
            "vision：实付 $1.53 · 按量付费需 $5.10 · 节省 $3.57（70%） · 1 个任务 · 丢失 0 步 · 重启耗时 0.0 小时",
        ]
        month = lines(await ask_privately(dingtalk, "costs 30d", "bob", DINGTALK_GROUP))
        assert month[0].endswith("团队 vision：2 个任务")
        assert lines(await ask_privately(dingtalk, "costs", "boss", DINGTALK_GROUP))[0].endswith("全部团队：4 个任务")
        refused = await ask_privately(dingtalk, "costs team=ml", "bob", DINGTALK_GROUP)
        assert refused == "⛔ ml 的费用只对其成员和管理员开放"


async def test_in_slack_costs_puts_one_bar_chart_in_the_channel_under_its_words_and_a_refusal_none(
    tmp_path: Path,
) -> None:
    async with (
        FakeSlack() as slack,
        running_bot(tmp_path / "state", config(tmp_path), clock=Clock(), **slack_settings(slack.api_url)) as (
            service,
            _console,
        ),
    ):
        await seed(service)
        assert (await slack_says(service, "costs", "slack:U0STRANGER")).startswith("⛔")
        assert (await slack_says(service, "costs team=vision", ALICE)).startswith("⛔")
        # An admin's report of every team, or of a team whose home is elsewhere: words to the admin, no chart here.
        assert "every team: 4 jobs" in await slack_says(service, "costs", ADMIN)
        assert "team vision: 2 jobs" in await slack_says(service, "costs 30d team=vision", ADMIN)
        assert await settled(service) and slack.shared_files(SLACK_CHANNEL) == [] and slack.uploads == {}

        words = await slack_says(service, "costs", ALICE)
        assert words == ML_WEEK

        async def shared() -> bool:
            return await settled(service) and bool(slack.shared_files(SLACK_CHANNEL))

        await eventually(shared)
        [chart] = slack.shared_files(SLACK_CHANNEL)  # one image, in the channel (a slash command has no thread)
        assert chart.thread_ts is None and chart.content is not None and chart.filename.endswith(".png")
        assert chart.title == chart.alt_text == "Costs of the last 7 days by team: paid and on-demand"
        [asked] = slack.called("files.getUploadURLExternal")  # the upload flow's three steps, each checked
        assert int(asked.args["length"]) == len(chart.content) and chart.refused == []
        [completed] = slack.called("files.completeUploadExternal")
        assert completed.args["channel_id"] == SLACK_CHANNEL and not completed.args.get("thread_ts")
        [message] = [m for m in slack.channel_messages(SLACK_CHANNEL) if m.files]
        assert message.text == words  # the report's words are its caption
        pixels = decoded(chart.content)
        base = lowest_row(pixels, PAID_COLOUR)
        assert (bars(pixels, PAID_COLOUR, base), bars(pixels, ON_DEMAND_COLOUR, base)) == (1, 1)  # team ml only


async def test_a_costs_chart_asked_while_slack_is_down_arrives_once_it_is_back(tmp_path: Path) -> None:
    async with (
        FakeSlack() as slack,
        running_bot(tmp_path / "state", config(tmp_path), clock=Clock(), **slack_settings(slack.api_url)) as (
            service,
            _console,
        ),
    ):
        await seed(service)
        slack.go_down()
        assert await slack_says(service, "costs", TINA) == ML_WEEK  # the words do not wait for Slack's Web API
        await slack.wait_for(lambda: slack.called("files.getUploadURLExternal", ok=False))
        slack.come_back()

        async def shared() -> bool:
            return await settled(service) and bool(slack.shared_files(SLACK_CHANNEL))

        await eventually(shared)
        assert len(slack.shared_files(SLACK_CHANNEL)) == 1
        # A 500 may have posted it all the same: the channel was searched for it before it was uploaded again.
        assert slack.called("conversations.history")


async def test_a_costs_chart_in_doubt_that_is_in_the_channel_already_is_not_posted_again() -> None:
    async with FakeSlack() as slack:
        client = AsyncWebClient(token=BOT_TOKEN, base_url=slack.api_url)
        deliverer = SlackDeliverer(client, ChatRefs(Redis()))  # (a chart is no job's: the refs are not read)
        chat = ChatRef(platform="slack", channel=SLACK_CHANNEL)
        drawn: list[str] = []

        async def draw(lang: Lang) -> Picture:
            drawn.append(lang)
            return Picture(b"\x89PNG-costs", "title", "the words")

        await deliverer.post_channel_image(chat, "c1.png", NOW, draw, in_doubt=False)
        await deliverer.post_channel_image(chat, "c1.png", NOW, draw, in_doubt=True)  # its first try was heard
        assert [upload.filename for upload in slack.shared_files(SLACK_CHANNEL)] == ["c1.png"] and drawn == ["en"]
        await deliverer.post_channel_image(chat, "c2.png", NOW, draw, in_doubt=True)  # in doubt, and not there
        assert [upload.filename for upload in slack.shared_files(SLACK_CHANNEL)] == ["c1.png", "c2.png"]


async def test_in_dingtalk_costs_puts_one_bar_chart_in_the_group_under_its_words_and_a_refusal_none(
    tmp_path: Path,
) -> None:
    async with (
        FakeDingTalk() as dingtalk,
        running_dingtalk_bot(tmp_path / "state", dingtalk, config(tmp_path), clock=Clock()) as (service, _console),
    ):
        await seed(service)
        assert (await ask_privately(dingtalk, "costs team=ml", "bob", DINGTALK_GROUP)).startswith("⛔")
        assert (await ask_privately(dingtalk, "costs", "eve", DINGTALK_GROUP)).startswith("⛔")
        assert await settled(service) and dingtalk.media == {}

        words = await ask_privately(dingtalk, "costs", "bob", DINGTALK_GROUP)

        async def shown() -> bool:
            return await settled(service) and bool(dingtalk.media)

        await eventually(shown)
        [(media_id, png)] = dingtalk.media.items()  # one image, uploaded through the media API
        [message] = [m for m in dingtalk.group_messages if media_id in m["text"]]
        title = "最近 7 天各团队的费用：实付与按量付费"
        assert message["conversation"] == DINGTALK_GROUP and message["title"] == title
        assert message["text"] == f"{words}\n\n![{title}]({media_id})"  # under the report's words
        pixels = decoded(png)
        base = lowest_row(pixels, PAID_COLOUR)
        assert (bars(pixels, PAID_COLOUR, base), bars(pixels, ON_DEMAND_COLOUR, base)) == (1, 1)  # team vision only


async def test_on_the_console_costs_is_words_only(tmp_path: Path) -> None:
    console_home = {"teams": {"ml": {"members": [ALICE], "channels": ["console:console"]}}}
    async with running_bot(
        tmp_path / "state", write_config(tmp_path / "bot.yaml", policy=console_home), clock=Clock()
    ) as (service, console):
        await seed(service)
        words = await service.bot.command(ALICE, ChatRef(platform="console", channel="console"), "costs")
        assert words.splitlines()[0].endswith("team ml: 2 jobs")
        assert await settled(service) and console.transcript == []  # the chart's entry was taken; nothing printed


def lines(markdown: str) -> list[str]:
    """The lines of a DingTalk markdown answer (each line its own paragraph there, without its indent)."""
    return [line for line in markdown.splitlines() if line]


def test_the_chart_has_a_paid_and_an_on_demand_bar_for_each_team() -> None:
    pixels = decoded(costs_png(cost_report(week_of_jobs(), "7d", NOW)))
    assert pixels.shape[:2] == (400, 800)
    base = lowest_row(pixels, PAID_COLOUR)  # every team paid something: each paid bar crosses the row above the axis
    assert bars(pixels, PAID_COLOUR, base) == 3  # ml, vision, and the jobs of no team
    assert bars(pixels, ON_DEMAND_COLOUR, base) == 2  # the jobs of no team have no on-demand counterfactual
