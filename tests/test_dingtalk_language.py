"""A DingTalk group reads Chinese by default: every answer to a command comes back in zh-CN, through the real path.

The fake DingTalk (fakes/fake_dingtalk.py) pushes ``@bot …`` messages over a real websocket to the real
BotService; the answers come back on the session webhook. A group configured ``language: en`` gets English, and
the job's history (the operators' record) stays English whatever the group reads.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fakes.bot_harness import SLEEPS, quick_recipe, running_dingtalk_bot, wait_job, write_config
from fakes.fake_dingtalk import FakeDingTalk, group_message, message_frame
from handlers.commands import USAGE
from handlers.jobs import JobState
from tests.test_permissions_chat import ask_privately

GROUP = "cidMLteam0001=="
ENGLISH_GROUP = "cidEnglish=="
OWNER = "manager4220"
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture
async def dingtalk() -> AsyncIterator[FakeDingTalk]:
    async with FakeDingTalk() as fake:
        yield fake


async def ask(dingtalk: FakeDingTalk, text: str, sender: str = OWNER, group: str = GROUP) -> str:
    """Say ``@bot text`` in ``group``; the bot's answer as the session webhook received it."""
    session = f"s{uuid.uuid4().hex[:8]}"
    said = group_message(f"@Finetune Bot {text}", sender, group, dingtalk.session_webhook(session))
    await dingtalk.push(message_frame(said))

    def answers() -> list[dict[str, Any]]:
        return [reply["body"] for reply in dingtalk.session_replies if reply["session"] == session]

    await dingtalk.wait_until(lambda: bool(answers()), what=f"answer to {text!r}")
    [reply] = answers()
    assert reply["msgtype"] == "markdown"
    return str(reply["markdown"]["text"])


async def test_a_group_gets_every_answer_in_chinese_and_an_english_group_in_english(
    tmp_path: Path, dingtalk: FakeDingTalk
) -> None:
    config = write_config(
        tmp_path / "bot.yaml",
        # The manager is an admin: bob's job is theirs to stop; the allow rule keeps bob himself from stopping it.
        policy={"admins": [f"dingtalk:{OWNER}"], "allow": {"start": ["dingtalk:*"], "stop": [f"dingtalk:{OWNER}"]}},
        recipes=[quick_recipe("sleepy", SLEEPS)],
        dingtalk={"channels": {ENGLISH_GROUP: {"language": "en"}}},
    )
    async with running_dingtalk_bot(tmp_path / "state", dingtalk, config) as (service, _console):
        assert await ask(dingtalk, "list", sender="bob") == "还没有任务：/finetune start tiny"  # a member's: here

        # A usage error: what was wrong and the usage line, both in Chinese; the words to type stay as they are (the
        # brackets in their full-width forms: DingTalk markdown would take <配方> for HTML and […](…) for a link).
        usage = await ask(dingtalk, "start")
        assert usage == (
            "start：需要指定配方。用法：/finetune start ＜配方＞ ［参数=值 …］ "
            "［deadline=36h］ ［budget=120］ ［nodes=2］"
        )
        not_a_job = await ask(dingtalk, "stop job;rm")
        assert not_a_job == "stop：'job;rm' 不是任务编号（任务编号形如 ft-7k2q）。用法：/finetune stop ＜任务＞"
        help_lines = (await ask(dingtalk, "help")).split("\n\n")  # a markdown paragraph per line
        assert help_lines[0] == (
            "/finetune start ＜配方＞ ［参数=值 …］ ［deadline=36h］ ［budget=120］ ［nodes=2］ "
            "—— 按配方启动微调任务（配方见下），可设截止时间与预算"
        )
        commands = len(USAGE)  # each command, one line saying what it does, then the recipes
        assert all(CJK.search(line) for line in help_lines[:commands])
        assert help_lines[commands].startswith("配方") and any(line.strip().startswith("sleepy") for line in help_lines)

        unknown = await ask(dingtalk, "start llama-70b")
        assert unknown.startswith("⛔ 未知配方 'llama-70b'；可用的配方：") and "sleepy" in unknown
        out_of_range = await ask(dingtalk, "start tiny lr=9")
        assert out_of_range == "⛔ lr=9.0 超过最大值 1"
        assert await service.bot.store.list_jobs() == []

        started = await ask(dingtalk, "start sleepy", sender="bob")
        [job] = await service.bot.store.list_jobs()
        assert started.startswith(f"正在启动 {job.id}：sleepy（") and started.endswith("）")
        assert job.requested_by == "dingtalk:bob"
        await wait_job(service, job.id, lambda j: j.state is JobState.RUNNING)

        # The policy lets only the owner stop: bob is told why in Chinese, and nothing happens to the job.
        refused = await ask(dingtalk, f"stop {job.id}", sender="bob")
        assert refused == "⛔ 你没有 stop 任务的权限；请管理员把 dingtalk:bob 加入 stop 规则"
        still = await service.bot.store.get(job.id)
        assert still is not None and still.state is JobState.RUNNING

        listed = await ask_privately(dingtalk, "list", OWNER, GROUP)  # an admin's (every group's): to them alone
        assert listed == f"{job.id}  运行中  sleepy  第 {still.step or 0}/{still.total_steps or '?'} 步"
        assert await ask(dingtalk, "status ft-zz99") == "找不到任务 ft-zz99"

        assert await ask(dingtalk, f"stop {job.id}") == f"已受理：stop {job.id}（停止中）"
        await wait_job(service, job.id, lambda j: j.state is JobState.STOPPED)
        assert await ask(dingtalk, f"stop {job.id}") == f"⛔ stop {job.id}：任务当前状态为 已停止"

        # The history and the refusals are for operators: English, whichever language the group reads.
        history = await service.bot.store.history(job.id)
        refused = await service.bot.store.refusal_log()
        assert {"event": "refused", "action": "stop", "by": "dingtalk:bob", "job": job.id} in [
            {k: e.get(k) for k in ("event", "action", "by", "job")} for e in refused
        ]
        why = "you are not allowed to stop jobs; ask an admin to add dingtalk:bob to the stop rule"
        assert refused[-1]["why"] == why
        ignored = [e for e in history if e.get("event") == "ignored" and e.get("what") == "stop"]
        assert [e["why"] for e in ignored] == ["the job is STOPPED"]

        # The same commands in a group configured to read English are answered word for word as before.
        english = await ask(dingtalk, "start", group=ENGLISH_GROUP)
        usage = "/finetune start ＜recipe＞ ［key=value …］ ［deadline=36h］ ［budget=120］ ［nodes=2］"
        assert english == f"start needs a recipe. Usage: {usage}"
        assert await ask(dingtalk, f"stop {job.id}", sender="bob", group=ENGLISH_GROUP) == (
            "⛔ you are not allowed to stop jobs; ask an admin to add dingtalk:bob to the stop rule"
        )
        assert await ask(dingtalk, f"stop {job.id}", group=ENGLISH_GROUP) == f"⛔ stop {job.id}: the job is STOPPED"
