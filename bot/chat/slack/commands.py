"""``/finetune`` in Slack: the same commands as everywhere, answered within Slack's three seconds.

A usage error or ``help`` is answered in the acknowledgement itself. Anything else runs through
:meth:`bot.core.Bot.command` (permissions included) as ``slack:<user id>``; its answer goes in the
acknowledgement when it is ready within ``budget`` seconds, else the acknowledgement says "working on it" and
the answer follows with ``chat.postEphemeral``. Every answer is shown to the caller only, in the language of the
channel it was typed in (``slack: channels: {C…: {language: zh-CN}}``; English by default).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck

from bot.chat.catalog import Lang, say, text
from bot.chat.slack.blocks import reply_text
from bot.chat.slack.replies import EphemeralReplies
from handlers.commands import HELP_REASON, parse
from handlers.errors import ReasonError
from handlers.jobs import ChatRef

log = logging.getLogger(__name__)

CommandRunner = Callable[[str, ChatRef, str, Lang], Awaitable[str]]
Spawn = Callable[[Coroutine[Any, Any, str]], "asyncio.Task[str]"]
LanguageFor = Callable[[str | None], Lang]


async def run_guarded(run: CommandRunner, user: str, chat: ChatRef, command: str, lang: Lang) -> str:
    """The command's answer; an internal error becomes a short apology (the details go to the log)."""
    try:
        return await run(user, chat, command, lang)
    except Exception:
        log.exception("command %r from %s failed", command[:80], user)
        return text(lang, "slack.failed")


class SlashCommand:
    def __init__(
        self,
        run: CommandRunner,
        replies: EphemeralReplies,
        spawn: Spawn,
        language_for: LanguageFor,
        budget: float = 2.0,
    ) -> None:
        self.run = run
        self.replies = replies
        self.spawn = spawn
        self.language_for = language_for
        self.budget = budget

    async def on_command(self, ack: AsyncAck, command: dict[str, Any]) -> None:
        typed = str(command.get("text") or "")
        lang = self.language_for(command.get("channel_id"))
        try:
            parsed = parse(typed)
        except ReasonError as exc:
            await ack(text=reply_text(say(lang, exc.reason)), response_type="ephemeral")
            return
        if parsed.action == "help":
            await ack(text=reply_text(say(lang, HELP_REASON)), response_type="ephemeral")
            return
        user = str(command.get("user_id") or "")
        channel = str(command.get("channel_id") or "")
        if not user or not channel:  # HTTP mode refuses these at the gate; Slack itself always sends both
            await ack(text=text(lang, "slack.failed"), response_type="ephemeral")
            return
        chat = ChatRef(platform="slack", channel=channel)
        work = self.spawn(run_guarded(self.run, f"slack:{user}", chat, typed, lang))
        done, _pending = await asyncio.wait({work}, timeout=self.budget)
        if work in done:
            await ack(text=reply_text(work.result()), response_type="ephemeral")
            return
        await ack(text=text(lang, "slack.working"), response_type="ephemeral")
        await self.replies.send(channel, user, await work)
