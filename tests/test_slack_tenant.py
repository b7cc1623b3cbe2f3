"""Tenant pinning in Slack, end to end: the running bot refuses a correctly signed request of another workspace
or app (HTTP mode and Socket Mode), and learns its own workspace from auth.test when it is not configured."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bot.errors import ConfigError
from fakes.bot_harness import running_bot, slack_settings
from fakes.fake_slack import TEAM, FakeSlack, action_body, block_action, form_body, signed_headers, slash_command
from tests.test_slack_http import CHANNEL, post, sleepy_config, started


async def test_a_signed_request_of_another_workspace_or_app_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    async with FakeSlack() as slack, running_bot(
        tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url)
    ) as (service, _console):
        job_id = started((await post(service, *_signed(slash_command("start sleepy"))))[1])
        for fields in (
            slash_command("start sleepy", team="T0OTHER"),
            slash_command("start sleepy", app="A0OTHER"),
            slash_command(f"stop {job_id}", team="T0OTHER"),
        ):
            status, answer = await post(service, *_signed(fields))
            assert status == 403 and "is not this bot's" in json.loads(answer)["error"], (fields, answer)
        for payload in (
            block_action("finetune_stop", job_id, team="T0OTHER"),
            block_action("finetune_stop", job_id, app="A0OTHER"),
        ):
            body = action_body(payload)
            status, _answer = await post(service, body, signed_headers(body))
            assert status == 403
        assert [job.id for job in await service.bot.store.list_jobs()] == [job_id]
        assert not [e for e in await service.bot.store.history(job_id) if e.get("event") == "stop"]
        assert slack.ephemeral == []  # nothing was answered to anyone
        assert await service.bot.store.audit_log() == [
            {"event": "start", "by": "slack:U0ANA", "job": job_id, "channel": f"slack:{CHANNEL}"}
        ]


async def test_a_socket_mode_envelope_of_another_workspace_runs_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with FakeSlack() as slack, running_bot(
        tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url, socket_mode=True)
    ) as (service, _console):
        await slack.connected()
        await slack.send_envelope("slash_commands", slash_command("start sleepy", team="T0OTHER"))

        def refused() -> bool:  # bolt answers a refusal with no ack (Slack gives up after its retries)
            return any("workspace 'T0OTHER' is not this bot's" in r.getMessage() for r in caplog.records)

        await slack.wait_for(refused)
        assert await service.bot.store.list_jobs() == [] and await service.bot.store.audit_log() == []
        ours = await slack.ack_of(await slack.send_envelope("slash_commands", slash_command("start sleepy")))
        assert "Starting ft-" in json.dumps(ours)
        assert len(await service.bot.store.list_jobs()) == 1


async def test_the_workspace_is_learned_from_auth_test_once_slack_answers(tmp_path: Path) -> None:
    async with FakeSlack() as slack:
        slack.go_down()
        async with running_bot(tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url)) as (
            service,
            _console,
        ):
            status, answer = await post(service, *_signed(slash_command("start sleepy")))
            assert status == 403 and "not known yet" in answer  # unknown: refused, not guessed
            slack.come_back()
            status, answer = await post(service, *_signed(slash_command("start sleepy")))
            assert status == 200 and "Starting ft-" in answer
            assert slack.called("auth.test")[-1].ok and len(await service.bot.store.list_jobs()) == 1


async def test_a_configured_workspace_the_token_does_not_belong_to_stops_the_start(tmp_path: Path) -> None:
    async with FakeSlack() as slack:
        config = sleepy_config(tmp_path, slack={"team_id": "T0ELSEWHERE"})
        with pytest.raises(ConfigError, match=f"slack.team_id is T0ELSEWHERE but SLACK_BOT_TOKEN belongs to {TEAM}"):
            async with running_bot(tmp_path / "state", config, **slack_settings(slack.api_url)):
                raise AssertionError("the bot started")


def _signed(fields: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    body = form_body(fields)
    return body, signed_headers(body)
