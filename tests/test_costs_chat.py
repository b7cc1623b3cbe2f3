"""``/finetune costs`` end to end: the real bot (embedded Valkey, its store and indexes) behind its Slack adapter
(signed HTTP requests, fakes/fake_slack.py), in English, and its DingTalk adapter (Stream callbacks,
fakes/fake_dingtalk.py), in Chinese, over jobs of two teams written across a week of injected clock
(tests/cost_jobs.py). A member sees their team, an admin every team, anyone else a one-sentence refusal (recorded)."""

from __future__ import annotations

import json
import struct
import zlib
from datetime import datetime, timedelta
from pathlib import Path

from bot.chat.costs_chart import ON_DEMAND_COLOUR, PAID_COLOUR, costs_png
from bot.service import BotService
from fakes.bot_harness import running_bot, running_dingtalk_bot, slack_settings, write_config
from fakes.fake_dingtalk import FakeDingTalk
from fakes.fake_slack import FakeSlack
from handlers.cost_report import cost_report
from tests.cost_jobs import ADMIN, ALICE, DINGTALK_GROUP, NOW, SLACK_CHANNEL, TINA, week_of_jobs
from tests.test_permissions_chat import ask
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
        week = lines(await ask(dingtalk, "costs", "bob", DINGTALK_GROUP))
        assert week[:4] == [
            "💰 最近 7 天的费用（2026-11-23 12:00 → 2026-11-30 12:00 UTC），团队 vision：1 个任务",
            "合计：实付 $1.53 · 按量付费需 $5.10 · 节省 $3.57（70%） · 1 个任务 · 丢失 0 步 · 重启耗时 0.0 小时",
            "按团队：",
            "vision：实付 $1.53 · 按量付费需 $5.10 · 节省 $3.57（70%） · 1 个任务 · 丢失 0 步 · 重启耗时 0.0 小时",
        ]
        month = lines(await ask(dingtalk, "costs 30d", "bob", DINGTALK_GROUP))
        assert month[0].endswith("团队 vision：2 个任务")
        assert lines(await ask(dingtalk, "costs", "boss", DINGTALK_GROUP))[0].endswith("全部团队：4 个任务")
        assert await ask(dingtalk, "costs team=ml", "bob", DINGTALK_GROUP) == "⛔ ml 的费用只对其成员和管理员开放"


def lines(markdown: str) -> list[str]:
    """The lines of a DingTalk markdown answer (each line its own paragraph there, without its indent)."""
    return [line for line in markdown.splitlines() if line]


def png_pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the rows (RGBA, unfiltered) of an 8-bit RGBA PNG as matplotlib's Agg writes it."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks = 8, {}
    data = b""
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind = png[at + 4 : at + 8]
        body = png[at + 8 : at + 8 + length]
        if kind == b"IDAT":
            data += body
        else:
            chunks[kind] = body
        at += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour) == (8, 6)
    raw = zlib.decompress(data)
    stride = width * 4
    rows: list[bytes] = []
    previous = bytes(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - 4] if x >= 4 else 0
            up, corner = previous[x], previous[x - 4] if x >= 4 else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(line))
        previous = bytes(line)
    return width, height, rows


def test_the_chart_has_a_paid_and_an_on_demand_bar_for_each_team() -> None:
    report = cost_report(week_of_jobs(), "7d", NOW)
    width, height, rows = png_pixels(costs_png(report))
    assert (width, height) == (800, 400)

    def rgb(colour: str) -> bytes:
        return bytes.fromhex(colour[1:]) + b"\xff"

    paid, on_demand = rgb(PAID_COLOUR), rgb(ON_DEMAND_COLOUR)
    # Every bar stands on the axis: the lowest row with a paid bar in it crosses every bar (the legend is higher).
    base = max(y for y, row in enumerate(rows) if _runs(row, paid))
    assert _runs(rows[base], paid) == 3  # ml, vision, and the jobs of no team
    assert _runs(rows[base], on_demand) == 2  # the jobs of no team have no on-demand counterfactual


def _runs(row: bytes, colour: bytes) -> int:
    pixels = [row[x : x + 4] == colour for x in range(0, len(row), 4)]
    return sum(1 for x, on in enumerate(pixels) if on and (x == 0 or not pixels[x - 1]))
