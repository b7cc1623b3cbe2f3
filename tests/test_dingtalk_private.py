"""Private answers stay private on DingTalk: ``costs``, ``history`` and an admin's ``list`` asked in a group reach the
asker alone, through the robot's one-to-one message (``/v1.0/robot/oToMessages/batchSend``), and nothing of them
lands in the group; where that cannot be, the group gets one line saying why, in its language, and never the answer.

The real bot (embedded Valkey, its store) behind its DingTalk adapter, against the fake DingTalk
(fakes/fake_dingtalk.py) over real HTTP and a real websocket; the seeded jobs are tests/cost_jobs.py's.
"""

from __future__ import annotations

from pathlib import Path

from fakes.bot_harness import running_dingtalk_bot, settled
from fakes.fake_dingtalk import FakeDingTalk, group_message, message_frame
from handlers.policy_config import PolicyConfig
from handlers.private_answers import answered_privately
from tests.cost_jobs import DINGTALK_GROUP, week_of_jobs
from tests.test_costs_chat import Clock, config, seed
from tests.test_permissions_chat import ask, ask_privately

ENGLISH_GROUP = "cidEnglish0001=="


def test_costs_logs_and_only_an_admins_list_are_answered_privately() -> None:
    policy = PolicyConfig(admins=["dingtalk:boss"])
    for text in ("costs", "costs 30d team=ml", "logs ft-7k2q", "history ft-7k2q"):
        assert answered_privately(policy, "dingtalk:bob", text)
    assert answered_privately(policy, "dingtalk:boss", "list")
    assert answered_privately(policy, "dingtalk:boss", "status")  # without a job: the same list
    assert not answered_privately(policy, "dingtalk:bob", "list")  # a member's list is the group's own jobs
    for text in ("status ft-7k2q", "start tiny", "help", "costs 90d", "frobnicate", ""):
        assert not answered_privately(policy, "dingtalk:boss", text)


async def test_costs_logs_and_an_admins_list_asked_in_a_group_reach_the_asker_alone(tmp_path: Path) -> None:
    seeded = {job.id: job for job in week_of_jobs()}
    bobs = next(job for job in seeded.values() if job.requested_by == "dingtalk:bob")
    async with (
        FakeDingTalk() as dingtalk,
        running_dingtalk_bot(tmp_path / "state", dingtalk, config(tmp_path), clock=Clock()) as (service, _console),
    ):
        await seed(service)
        everyone = await ask_privately(dingtalk, "costs", "boss", DINGTALK_GROUP)  # every user's spend
        assert everyone.splitlines()[0].endswith("全部团队：4 个任务") and "slack:U0ALICE" in everyone
        listed = await ask_privately(dingtalk, "list", "boss", DINGTALK_GROUP)  # every group's jobs
        assert set(seeded) <= {line.split()[0] for line in listed.split("\n\n")}
        logs = await ask_privately(dingtalk, f"history {bobs.id}", "bob", DINGTALK_GROUP)
        assert logs.endswith(" seeded")  # the job's history, with times
        assert [m["user"] for m in dingtalk.direct_messages] == ["boss", "boss", "bob"]
        assert all(call[1] == "/v1.0/robot/oToMessages/batchSend" for call in dingtalk.calls)

        # A member's list is the group's own jobs: it stays in the group. Its answer is the first and only one
        # the group got: none of the private answers above went there, by session webhook or by group message.
        assert await ask(dingtalk, "list", "bob", DINGTALK_GROUP) == "\n\n".join(
            line for line in listed.split("\n\n") if seeded[line.split()[0]].chat == bobs.chat
        )
        assert await settled(service)
        assert len(dingtalk.session_replies) == 1 and dingtalk.group_messages == []
        shown = [dingtalk.session_replies[0]["body"]["markdown"]["text"]]
        assert not any(everyone in said or logs in said for said in shown)


async def test_without_a_staff_id_or_a_one_to_one_message_the_group_is_told_why_in_its_language(
    tmp_path: Path,
) -> None:
    dingtalk_config = {"channels": {ENGLISH_GROUP: {"language": "en"}}}
    async with (
        FakeDingTalk() as dingtalk,
        running_dingtalk_bot(
            tmp_path / "state", dingtalk, config(tmp_path, dingtalk=dingtalk_config), clock=Clock()
        ) as (service, _console),
    ):
        await seed(service)

        async def asked_by_outsider(group: str) -> str:
            """``costs`` from someone DingTalk gives no staff id for (outside the organisation's staff)."""
            before = len(dingtalk.session_replies)
            said = group_message("/finetune costs", "boss", group, dingtalk.session_webhook(group), staff=False)
            await dingtalk.push(message_frame(said))
            await dingtalk.wait_until(lambda: len(dingtalk.session_replies) > before, what="the group's line")
            return str(dingtalk.session_replies[before]["body"]["markdown"]["text"])

        assert await asked_by_outsider(DINGTALK_GROUP) == (
            "这条回答只给你本人看，但钉钉没有给出你的 staffId，无法私聊发给你；请在与机器人的单聊中再问。"
        )
        assert await asked_by_outsider(ENGLISH_GROUP) == (
            "Not answered here: that answer is for you alone, and DingTalk gave no staff id to send it to you "
            "privately; ask the robot in a one-to-one chat."
        )
        assert dingtalk.direct_messages == []
        assert not [c for c in dingtalk.calls if c[1] == "/v1.0/robot/oToMessages/batchSend"]

        # DingTalk does not take the one-to-one message (a staff id it does not know): one line, not the answer.
        dingtalk.unknown_staff.add("boss")
        assert await ask(dingtalk, "costs", "boss", ENGLISH_GROUP) == (
            "That answer is for you alone, and DingTalk did not take it as a one-to-one message; ask the robot in "
            "a one-to-one chat."
        )
        assert dingtalk.direct_messages == []
        [tried] = [c for c in dingtalk.calls if c[1] == "/v1.0/robot/oToMessages/batchSend"]
        assert tried[2]["userIds"] == ["boss"] and tried[2]["robotCode"] == dingtalk.client_id
        assert await settled(service) and dingtalk.group_messages == []

