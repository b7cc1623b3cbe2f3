"""Slack's startup checks: a setup that cannot work is one clear error at start; an unreachable Slack is not."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from bot.errors import ConfigError
from fakes.bot_harness import running_bot, slack_settings, wait_job
from fakes.fake_slack import SIGNING_SECRET, TEAM, FakeSlack
from handlers.jobs import JobState
from tests.test_bot_cli import bot_env
from tests.test_slack_http import CHANNEL, card_of, command, field_text, sleepy_config, started


@pytest.mark.parametrize(
    ("override", "message", "calls"),
    [
        ({"slack_bot_token": "xoxb-revoked"}, "SLACK_BOT_TOKEN was refused by Slack: invalid_auth", ["auth.test"]),
        ({"slack_signing_secret": None}, "neither SLACK_SIGNING_SECRET (HTTP mode", []),
        ({"slack_bot_token": None}, "SLACK_SIGNING_SECRET set but SLACK_BOT_TOKEN is not", []),
        ({"slack_app_token": "xoxb-not-an-app-token"}, "SLACK_APP_TOKEN must be an app-level token (xapp-…)", []),
        (
            {"slack_app_token": "xapp-1-revoked"},
            "SLACK_APP_TOKEN was refused by Slack: invalid_auth",
            ["auth.test", "apps.connections.open"],
        ),
    ],
)
async def test_a_setup_that_cannot_work_is_one_clear_error_and_nothing_starts(
    tmp_path: Path, override: dict[str, str | None], message: str, calls: list[str]
) -> None:
    async with FakeSlack() as slack:
        settings = slack_settings(slack.api_url, **override)
        with pytest.raises(ConfigError) as refused:
            async with running_bot(tmp_path / "state", **settings):
                raise AssertionError("the bot started")
        assert message in str(refused.value)
        assert [call.method for call in slack.calls] == calls
    assert not (tmp_path / "state" / "redis").exists()  # refused before the embedded Redis was started


async def test_serve_with_a_refused_token_exits_with_one_line(tmp_path: Path) -> None:
    async with FakeSlack() as slack:
        env = bot_env(
            tmp_path,
            FINETUNE_HTTP_PORT="0",
            SLACK_BOT_TOKEN="xoxb-wrong",
            SLACK_SIGNING_SECRET=SIGNING_SECRET,
            SLACK_API_URL=slack.api_url,
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot.cli",
            "serve",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 2, (out, err)
    errors = err.decode().strip().splitlines()
    assert errors[-1] == "finetune-bot: SLACK_BOT_TOKEN was refused by Slack: invalid_auth"
    assert "Traceback" not in err.decode() and "xoxb-wrong" not in err.decode() + out.decode()


async def test_an_unreachable_slack_at_start_does_not_stop_the_bot(tmp_path: Path) -> None:
    # The workspace is configured: auth.test cannot say it while Slack is down (tests/test_slack_tenant.py).
    config = sleepy_config(tmp_path, slack={"team_id": TEAM})
    async with FakeSlack() as slack:
        slack.go_down()
        async with running_bot(tmp_path / "state", config, **slack_settings(slack.api_url)) as (service, _console):
            assert slack.called("auth.test", ok=None)[0].status == 500
            job_id = started((await command(service, "start sleepy"))[1])
            await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
            slack.come_back()
            await slack.wait_for(lambda: (c := card_of(slack, job_id)) and "RUNNING" in field_text(c))
            assert [m.channel for m in slack.messages.values()] == [CHANNEL]
