"""``GET /costs``: the same report as ``/finetune costs``, as JSON for a finance sheet, from the real bot (embedded
Valkey, its store and indexes) over jobs of two teams written across a week of injected clock (tests/cost_jobs.py);
only with the bearer token, never from a URL, and not there at all unless a token is configured."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.errors import ConfigError
from bot.service import BotService
from fakes.bot_harness import running_bot
from handlers.cost_report import cost_report, report_json
from tests.cost_jobs import BOB, NOW, week_of_jobs
from tests.test_costs_chat import Clock, config, seed

TOKEN = "finance-sheet-token-0123"


async def get(service: BotService, query: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{service.port}/costs{query}"
        async with http.get(url, headers=headers or {}) as response:
            return response.status, await response.json(content_type=None)


BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def test_the_finance_sheet_gets_the_weeks_and_the_months_report_with_its_token(tmp_path: Path) -> None:
    clock = Clock()
    async with running_bot(tmp_path / "state", config(tmp_path), clock=clock, finetune_costs_token=TOKEN) as (
        service,
        _console,
    ):
        await seed(service)
        status, week = await get(service, "", BEARER)
        assert status == 200 and week == report_json(cost_report(week_of_jobs(), "7d", NOW))
        assert (week["window"], week["start"], week["teams"]) == ("7d", "2026-11-23T12:00:00+00:00", None)
        assert week["total"]["paid"] == 6.91 and week["total"]["on_demand"] == 22.0 and week["total"]["saved"] == 15.39
        assert week["by_team"]["ml"] == {
            "jobs": 2,
            "paid": 5.08,
            "on_demand": 16.9,
            "compared_paid": 5.08,
            "saved": 11.82,
            "savings": 0.6994,
            "steps_lost": 20,
            "lost_hours": 0.2,
            "restarts": 1,
            "restart_hours": 0.5,
            "egress": 0.0,
        }
        assert [row["job"] for row in week["jobs"]] == ["ft-aaaa", "ft-bbbb", "ft-cccc", "ft-eeee"]

        status, vision = await get(service, "?window=30d&team=vision", BEARER)
        assert status == 200 and vision["teams"] == ["vision"]
        assert [(row["job"], row["user"]) for row in vision["jobs"]] == [("ft-dddd", BOB), ("ft-cccc", BOB)]

        clock.now = NOW + timedelta(days=4)
        status, later = await get(service, "?window=7d", BEARER)
        assert status == 200 and [row["job"] for row in later["jobs"]] == ["ft-bbbb", "ft-cccc", "ft-eeee"]


async def test_without_the_token_or_with_bad_parameters_it_answers_nothing_of_the_report(tmp_path: Path) -> None:
    async with running_bot(tmp_path / "state", config(tmp_path), clock=Clock(), finetune_costs_token=TOKEN) as (
        service,
        _console,
    ):
        await seed(service)
        assert await get(service, "") == (401, {"error": "missing or wrong token"})
        assert await get(service, "", {"Authorization": f"Bearer {TOKEN[:-1]}x"}) == (
            401,
            {"error": "missing or wrong token"},
        )
        assert await get(service, "", {"Authorization": TOKEN}) == (401, {"error": "missing or wrong token"})
        status, body = await get(service, f"?token={TOKEN}", BEARER)
        assert status == 400 and "token in the URL" in body["error"]
        assert await get(service, "?window=90d", BEARER) == (400, {"error": "window must be one of 7d, 30d"})
        assert await get(service, "?team=nope", BEARER) == (400, {"error": "no such team"})


async def test_without_a_configured_token_there_is_no_costs_route(tmp_path: Path) -> None:
    async with (
        running_bot(tmp_path / "state", config(tmp_path), clock=Clock()) as (service, _console),
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{service.port}/costs", headers=BEARER) as response,
    ):
        assert response.status == 404


async def test_a_token_too_short_to_stand_alone_stops_the_bot_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="FINETUNE_COSTS_TOKEN must be at least 16 characters"):
        async with running_bot(tmp_path / "state", config(tmp_path), finetune_costs_token="short"):
            pass
