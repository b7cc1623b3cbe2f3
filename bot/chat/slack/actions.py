"""The buttons of cards and pages: each one runs the very command a person could type, as that person.

So a button is allowed exactly when the command is (one permission check, in :meth:`bot.core.Bot.command`), and
a refusal is recorded in the job's history the same way. Slack gets its acknowledgement at once; the outcome
("OK: stop ft-7k2q (STOPPING)", "⛔ you are not allowed…") is shown to whoever clicked, with
``chat.postEphemeral``, in the channel's language.
"""

from __future__ import annotations

import re
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck

from bot.chat.catalog import text
from bot.chat.slack.blocks import ACTION_ACK, ACTION_INTERRUPT_TEST, ACTION_ON_DEMAND, ACTION_RESUME, ACTION_STOP
from bot.chat.slack.commands import CommandRunner, LanguageFor, Spawn, run_guarded
from bot.chat.slack.replies import EphemeralReplies
from handlers.ids import JOB_ID_PATTERN
from handlers.jobs import ChatRef

COMMANDS = {
    ACTION_STOP: "stop {job}",
    ACTION_INTERRUPT_TEST: "interrupt-test {job}",
    ACTION_ACK: "ack {job}",
    ACTION_RESUME: "resume {job}",
    ACTION_ON_DEMAND: "resume {job} on-demand",
}
ACTION_IDS = re.compile("^(" + "|".join(COMMANDS) + ")$")
_JOB_ID = re.compile(JOB_ID_PATTERN)


class ButtonActions:
    def __init__(self, run: CommandRunner, replies: EphemeralReplies, spawn: Spawn, language_for: LanguageFor) -> None:
        self.run = run
        self.replies = replies
        self.spawn = spawn
        self.language_for = language_for

    async def on_action(self, ack: AsyncAck, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        user = str((body.get("user") or {}).get("id") or "")
        channel = str((body.get("channel") or {}).get("id") or (body.get("container") or {}).get("channel_id") or "")
        job_id = str(action.get("value") or "")
        if not user or not channel:
            return
        lang = self.language_for(channel)
        if not _JOB_ID.fullmatch(job_id):
            await self.replies.send(channel, user, text(lang, "slack.bad-button", value=job_id[:40]))
            return
        command = COMMANDS[str(action["action_id"])].format(job=job_id)
        chat = ChatRef(platform="slack", channel=channel)
        reply = await self.spawn(run_guarded(self.run, f"slack:{user}", chat, command, lang))
        await self.replies.send(channel, user, reply)

