"""Slack in Socket Mode: the bot opens the websocket that apps.connections.open names and answers envelopes on it.

fakes/fake_slack.py plays both halves of Slack: the Web API (``apps.connections.open`` returns the ws:// URL of
its own ``/socket``) and the Socket Mode server (``hello``, then the envelopes a test sends).
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from fakes.bot_harness import running_bot, slack_settings, wait_job
from fakes.fake_slack import FakeSlack, block_action, slash_command
from handlers.jobs import JobState
from tests.test_slack_http import CHANNEL, card_of, field_text, sleepy_config


async def test_a_slash_command_over_socket_mode_is_acked_on_the_socket_and_starts_the_job(tmp_path: Path) -> None:
    async with (
        FakeSlack() as slack,
        running_bot(tmp_path / "state", sleepy_config(tmp_path), **slack_settings(slack.api_url, socket_mode=True)) as (
            service,
            _console,
        ),
    ):
        await slack.connected()
        assert [call.method for call in slack.calls] == ["auth.test", "apps.connections.open"]
        assert slack.calls[1].token == "xapp-1-test-app-token"
        url = f"http://127.0.0.1:{service.port}/slack/events"
        async with aiohttp.ClientSession() as http, http.post(url, data=b"x") as response:
            assert response.status == 404  # no HTTP endpoint for Slack in Socket Mode

        start = slash_command("start sleepy", channel=CHANNEL)
        envelope = await slack.send_envelope("slash_commands", start)
        ack = await slack.ack_of(envelope)
        assert ack["payload"]["response_type"] == "ephemeral"
        text = ack["payload"]["text"]
        assert text.startswith("Starting ft-"), text
        job_id = text.split()[1].rstrip(":")
        job = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
        assert job.requested_by == "slack:U0ANA" and job.chat is not None and job.chat.platform == "slack"
        await slack.wait_for(lambda: (c := card_of(slack, job_id)) and "RUNNING" in field_text(c))
        # Slack delivers the same command again in a new envelope (it thought the ack lost): acked, nothing runs.
        assert (await slack.ack_of(await slack.send_envelope("slash_commands", start))).get("payload") in (None, {})

        usage = await slack.ack_of(await slack.send_envelope("slash_commands", slash_command("stop everything")))
        assert "is not a job id" in usage["payload"]["text"]

        click = await slack.send_envelope("interactive", block_action("finetune_stop", job_id, channel=CHANNEL))
        assert (await slack.ack_of(click)).get("payload") in (None, {})
        await wait_job(service, job_id, lambda job: job.state in (JobState.STOPPING, JobState.STOPPED))
        await slack.wait_for(lambda: [e for e in slack.ephemeral if e["text"].startswith(f"OK: stop {job_id}")])
        assert [job.id for job in await service.bot.store.list_jobs()] == [job_id]
