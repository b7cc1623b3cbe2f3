"""The caps that ship on, end to end: the real bot (embedded Valkey, local cloud, runner subprocesses) behind its Slack
adapter (signed slash commands, fakes/fake_slack.py, English) and its DingTalk adapter (Stream callbacks,
fakes/fake_dingtalk.py, a group that reads Chinese).

With no cap configured but a price cap: a member's ``start sleepy nodes=64`` is refused (the recipe allows one node),
a sixth concurrent node of the team is refused, and a stopped job's ``resume … on-demand`` (over the price cap) and
``resume`` (past the team's nodes) are refused; each refusal names its limit and who can change it. A person on no
team who starts in the team's channel is not billed to the team. An admin's per-team override lets the same
``nodes=64`` start through, and an admin's stop at once ends it with at most the launch already at the cloud."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bot.chat.slack.blocks import ACTION_ON_DEMAND
from bot.cloud.local.provider import LocalCloud
from bot.service import BotService
from fakes.bot_harness import (
    SLEEPS,
    eventually,
    quick_recipe,
    running_bot,
    running_dingtalk_bot,
    slack_settings,
    wait_job,
    write_config,
)
from fakes.fake_dingtalk import FakeDingTalk
from fakes.fake_slack import FakeSlack
from handlers.jobs import ACTIVE_STATES, JobState
from tests.test_dingtalk_language import ask
from tests.test_slack_http import click, command, started

A, B = "C0TEAMA", "C0OTHERB"
ALICE, TINA, MALLORY, ADMIN = "U0ALICE", "U0TINA", "U0MALLORY", "U0ADMIN"
GROUP = "cidMLteam0001=="


def slack_config(tmp_path: Path, **ml: Any) -> Path:
    """Team ml (Alice, Tina; home: channel A) under the shipped caps and a price cap of $0.50/h (the local cloud's
    spot is $0.30/h, its on-demand $1.00/h); ``ml``: the admin's overrides for the team."""
    policy = {
        "admins": [f"slack:{ADMIN}"],
        "max_hourly_price": 0.50,
        "teams": {"ml": {"members": [f"slack:{ALICE}", f"slack:{TINA}"], "channels": [f"slack:{A}"], **ml}},
    }
    return write_config(tmp_path / "bot.yaml", policy=policy, recipes=[quick_recipe("sleepy", SLEEPS)])


async def say(service: BotService, text: str, user: str, channel: str = A) -> str:
    """A signed slash command; the bot's answer."""
    status, reply = await command(service, text, user=user, channel=channel)
    assert status == 200, reply
    return str(json.loads(reply)["text"])


def job_in(reply: str) -> str:
    """The job a (Chinese) start answer names."""
    found = re.search(r"ft-[0-9a-z]+", reply)
    assert found is not None and reply.startswith("正在启动"), reply
    return found.group(0)


async def events(service: BotService, job_id: str) -> list[str]:
    return [str(entry.get("event")) for entry in await service.bot.store.history(job_id)]


async def test_in_slack_nodes_64_a_sixth_node_and_resumes_past_the_caps_are_refused_saying_who_lifts_them(
    tmp_path: Path,
) -> None:
    async with FakeSlack() as slack, running_bot(
        tmp_path / "state", slack_config(tmp_path), **slack_settings(slack.api_url)
    ) as (service, _console):
        store = service.bot.store
        assert await say(service, "start sleepy nodes=64", ALICE) == (
            "⛔ 64 nodes is more than the 1 a job of sleepy may have in team ml; "
            "an admin can raise policy.teams.ml.max_nodes"
        )
        assert await store.list_jobs() == []

        # A stopped job of the team: on-demand is over the price cap, wherever it was started.
        first = started(await say(service, "start sleepy", ALICE))
        await wait_job(service, first, lambda job: job.state is JobState.RUNNING)
        assert (await say(service, f"stop {first}", ALICE)).startswith(f"OK: stop {first}")
        await wait_job(service, first, lambda job: job.state is JobState.STOPPED)
        dear = (
            "⛔ $1.00/h for 1 node(s) is above team ml's cap of $0.50/h; "
            "an admin can raise policy.teams.ml.max_hourly_price"
        )
        assert await say(service, f"resume {first} on-demand", ALICE) == dear
        # The card's "relaunch on on-demand" button is the same command, with the same checks.
        assert await click(service, ACTION_ON_DEMAND, first, user=ALICE, channel=A) == 200
        answers = await slack.wait_for(lambda: [entry for entry in slack.ephemeral if entry["user"] == ALICE])
        assert [entry["text"] for entry in answers] == [dear]

        # Five nodes running for the team: the sixth is refused, a start and a resume alike.
        five = [started(await say(service, "start sleepy", user)) for user in (ALICE, ALICE, TINA, TINA, TINA)]
        full = (
            "⛔ team ml runs 5 of its 5 concurrent nodes, so 1 more do not fit; stop a job, "
            "or ask an admin to raise policy.teams.ml.max_concurrent_nodes"
        )
        assert await say(service, "start sleepy", TINA) == full
        assert await say(service, f"resume {first}", ALICE) == full
        stopped = await store.get(first)
        assert stopped is not None and stopped.state is JobState.STOPPED
        assert "resume" not in await events(service, first)
        assert sorted(job.id for job in await store.list_jobs(list(ACTIVE_STATES))) == sorted(five)
        refused = [entry["action"] for entry in await store.refusal_log()]
        assert refused == ["start", "resume", "resume", "start", "resume"]  # each kept apart from the actions

        # Mallory, on no team, starts in ml's channel: not billed to ml, and not counted in ml's five.
        outsider = started(await say(service, "start sleepy", MALLORY))
        job = await store.get(outsider)
        assert job is not None and job.team is None and job.requested_by == f"slack:{MALLORY}"

        # A node freed: the resume passes (its own nodes are not counted twice once it is active).
        assert (await say(service, f"stop {five[0]}", ALICE)).startswith(f"OK: stop {five[0]}")
        await wait_job(service, five[0], lambda job: job.state is JobState.STOPPED)
        assert (await say(service, f"resume {first}", ALICE)).startswith(f"OK: resume {first}")
        await wait_job(service, first, lambda job: job.state is JobState.RUNNING)
        assert await say(service, "start sleepy", TINA) == full


async def test_in_a_dingtalk_group_the_same_refusals_come_in_chinese_naming_the_setting(tmp_path: Path) -> None:
    policy = {
        "admins": ["dingtalk:boss"],
        "max_hourly_price": 0.50,
        "teams": {"ml": {"members": ["dingtalk:alice", "dingtalk:tina"], "channels": [f"dingtalk:{GROUP}"]}},
    }
    config = write_config(tmp_path / "bot.yaml", policy=policy, recipes=[quick_recipe("sleepy", SLEEPS)])
    async with FakeDingTalk() as dingtalk, running_dingtalk_bot(tmp_path / "state", dingtalk, config) as (
        service,
        _console,
    ):
        assert await ask(dingtalk, "start sleepy nodes=64", "alice", GROUP) == (
            "⛔ 64 个节点超过了团队 ml 中 sleepy 任务的上限 1 个；管理员可以调高 policy.teams.ml.max_nodes"
        )
        first = job_in(await ask(dingtalk, "start sleepy", "alice", GROUP))
        await wait_job(service, first, lambda job: job.state is JobState.RUNNING)
        await ask(dingtalk, f"stop {first}", "alice", GROUP)
        await wait_job(service, first, lambda job: job.state is JobState.STOPPED)
        assert await ask(dingtalk, f"resume {first} on-demand", "alice", GROUP) == (
            "⛔ 1 个节点每小时 $1.00，超过了团队 ml 的上限 $0.50/小时；管理员可以调高 policy.teams.ml.max_hourly_price"
        )
        for user in ("alice", "alice", "tina", "tina", "tina"):
            assert "⛔" not in await ask(dingtalk, "start sleepy", user, GROUP)
        full = (
            "⛔ 团队 ml 正在运行 5 个节点（同时运行上限 5 个），放不下再加的 1 个；"
            "请先停止一个任务，或请管理员调高 policy.teams.ml.max_concurrent_nodes"
        )
        assert await ask(dingtalk, "start sleepy", "tina", GROUP) == full
        assert await ask(dingtalk, f"resume {first}", "alice", GROUP) == full
        assert len(await service.bot.store.list_jobs(list(ACTIVE_STATES))) == 5


async def test_an_admins_override_for_the_team_lets_nodes_64_through_and_a_stop_at_once_ends_its_launches(
    tmp_path: Path,
) -> None:
    lifted = {"max_nodes": 64, "max_concurrent_nodes": 64, "max_hourly_price": 100.0}
    async with FakeSlack() as slack, running_bot(
        tmp_path / "state", slack_config(tmp_path, **lifted), **slack_settings(slack.api_url)
    ) as (service, _console):
        job_id = started(await say(service, "start sleepy nodes=64", ALICE))
        job = await service.bot.store.get(job_id)
        assert job is not None and job.nodes == 64 and job.team == "ml"
        # Another team's member, or one on none, still gets the shipped caps: the override is ml's alone.
        assert (await say(service, "start sleepy nodes=64", MALLORY, channel=B)).startswith("⛔ 64 nodes is more")

        assert (await say(service, f"stop {job_id}", ADMIN)).startswith(f"OK: stop {job_id}")
        await wait_job(service, job_id, lambda job: job.state is JobState.STOPPED, timeout=300)
        cloud = service.bot.cloud
        assert isinstance(cloud, LocalCloud)

        async def all_gone() -> bool:
            return all(record.state == "gone" for record in await cloud.instances() if record.job_id == job_id)

        await eventually(all_gone, timeout=120)
        # Launches are one at a time per job: at most node 0's and the one at the cloud when the stop came.
        launched = [record for record in await cloud.instances() if record.job_id == job_id]
        assert len(launched) <= 2, [record.instance_id for record in launched]
