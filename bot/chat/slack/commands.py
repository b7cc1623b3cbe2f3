"""``/finetune`` in Slack: the same commands as everywhere, answered within Slack's three seconds.

A usage error or ``help`` is answered in the acknowledgement itself. Anything else runs through
:meth:`bot.app.Bot.command` (permissions included) as ``slack:<user id>``; its answer goes in the
acknowledgement when it is ready within ``budget`` seconds, else the acknowledgement says "working on it" and
the answer follows with ``chat.postEphemeral``. Every answer is shown to the caller only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck

from bot.chat.slack.replies import EphemeralReplies
from handlers.commands import HELP, UsageError, parse
from handlers.jobs import ChatRef

log = logging.getLogger(__name__)

CommandRunner = Callable[[str, ChatRef, str], Awaitable[str]]
Spawn = Callable[[Coroutine[Any, Any, str]], "asyncio.Task[str]"]

WORKING = "⏳ Working on it…"
FAILED = "⚠️ That did not work: the bot hit an internal error (it is logged). Try again in a moment."


async def run_guarded(run: CommandRunner, user: str, chat: ChatRef, text: str) -> str:
    """The command's answer; an internal error becomes a short apology (the details go to the log)."""
    try:
        return await run(user, chat, text)
    except Exception:
        log.exception("command %r from %s failed", text[:80], user)
        return FAILED


class SlashCommand:
    def __init__(self, run: CommandRunner, replies: EphemeralReplies, spawn: Spawn, budget: float = 2.0) -> None:
        self.run = run
        self.replies = replies
        self.spawn = spawn
        self.budget = budget

    async def on_command(self, ack: AsyncAck, command: dict[str, Any]) -> None:
        text = str(command.get("text") or "")
        try:
            parsed = parse(text)
        except UsageError as exc:
            await ack(text=str(exc), response_type="ephemeral")
            return
        if parsed.action == "help":
            await ack(text=HELP, response_type="ephemeral")
            return
        user = str(command["user_id"])
        channel = str(command["channel_id"])
        work = self.spawn(run_guarded(self.run, f"slack:{user}", ChatRef(platform="slack", channel=channel), text))
        done, _pending = await asyncio.wait({work}, timeout=self.budget)
        if work in done:
            await ack(text=work.result(), response_type="ephemeral")
            return
        await ack(text=WORKING, response_type="ephemeral")
        await self.replies.send(channel, user, await work)
