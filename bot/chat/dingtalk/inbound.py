"""What people do in DingTalk, turned into the bot's commands: ``@bot /finetune …`` and card button clicks.

Both end in ``Bot.command(user, chat, text, lang)``, the one entry every chat uses, so permissions, refusals and
their record in the job's history are the same as anywhere; the answer is in the group's language (zh-CN unless
the config says otherwise). An answer for the asker alone (``costs``, ``logs``, an admin's ``list``: see
:mod:`handlers.private_answers`) asked in a group goes to them through the robot's one-to-one message, and
nothing of it to the group; where that cannot be (DingTalk gave no staff id: someone outside the organisation)
the command does not run and the group is told why in one line, as it is when the one-to-one message fails.
DingTalk redelivers what it thinks was not acknowledged; a message or click is run once (its id is claimed in
Redis first) and a redelivery only acknowledged. A message or click of another organisation than the one served
(``dingtalk.corp_id``, else the robot's own) runs nothing and is not answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from bot.chat.catalog import Lang, text
from bot.chat.dingtalk.cards import BUTTONS, clicked, job_of
from bot.chat.dingtalk.config import DingTalkConfig
from bot.chat.dingtalk.markdown import escape_markdown, reply
from bot.chat.dingtalk.openapi import OpenApi
from bot.chat.dingtalk.webhooks import Markdown, Webhooks
from bot.errors import ChatError
from bot.log_limit import LimitedLog
from handlers.commands import USAGE
from handlers.jobs import ChatRef

log = logging.getLogger(__name__)

CommandFn = Callable[[str, ChatRef, str, Lang], Awaitable[str]]
OnceFn = Callable[[str], Awaitable[bool]]
PrivateFn = Callable[[str, str], bool]  # (user, command) -> whether the answer is for the user alone
GROUP = "2"  # DingTalk's conversationType of a group chat ("1" is one to one)
WEBHOOK_MARGIN_MS = 60_000  # do not answer through a sessionWebhook about to expire
NAME_WORDS = 4  # a command word this early follows the robot's @name


@dataclass(frozen=True, slots=True)
class Incoming:
    """A message to the robot, as far as the bot cares (parsed by the SDK's ``ChatbotMessage``)."""

    message_id: str
    conversation_id: str
    conversation_type: str
    sender: str  # the staff userId when DingTalk gives it, else the sender's id
    text: str | None  # None for pictures, files, …
    session_webhook: str | None = None
    session_webhook_expires_ms: int | None = None
    sender_corp_id: str = ""  # the sender's organisation (senderCorpId)
    robot_corp_id: str = ""  # the robot's own organisation (chatbotCorpId)
    sender_staff_id: str = ""  # senderStaffId: absent for someone outside the organisation (no one-to-one message)


@dataclass(frozen=True, slots=True)
class Click:
    """A card button's callback (parsed by the SDK's ``CardCallbackMessage``)."""

    out_track_id: str
    user_id: str
    space_id: str
    content: dict[str, Any] = field(default_factory=dict)
    corp_id: str = ""  # the organisation of the card's space (corpId)


def command_text(content: str) -> str:
    """The command in ``@bot /finetune start tiny``: what follows ``/finetune`` when it is there, else from the
    first command word near the start (a robot's name may be several words), else what follows the @names."""
    words = content.split()
    lowered = [word.lower() for word in words]
    if "/finetune" in lowered:
        return " ".join(words[lowered.index("/finetune") + 1 :])
    for index, word in enumerate(lowered[:NAME_WORDS]):
        if word in USAGE:
            return " ".join(words[index:])
    while words and words[0].startswith("@"):
        words.pop(0)
    return " ".join(words)


class Inbound:
    def __init__(
        self,
        command: CommandFn,
        private: PrivateFn,
        once: OnceFn,
        api: OpenApi,
        webhooks: Webhooks,
        config: DingTalkConfig,
        robot_code: str,
        clock_ms: Callable[[], float] = lambda: time.time() * 1000,
    ) -> None:
        self.command = command
        self.private = private
        self.once = once
        self.api = api
        self.webhooks = webhooks
        self.config = config
        self.robot_code = robot_code
        self.clock_ms = clock_ms
        self._replies: set[asyncio.Task[None]] = set()
        self.corp: str | None = config.corp_id  # the organisation served: configured, else learned from messages
        self.quiet = LimitedLog(log)
        if config.corp_id is None:
            log.warning(
                "dingtalk: no dingtalk.corp_id; messages must come from the robot's own organisation, and card "
                "clicks are checked only once a message has said which one that is"
            )

    async def message(self, message: Incoming) -> None:
        """Run the command and answer in the background, so the stream acknowledges at once."""
        if not await self.once(f"in:{message.message_id}"):
            log.info("DingTalk message %s delivered again; already handled", message.message_id)
            return
        if message.robot_corp_id and self.corp is None:
            self.corp = message.robot_corp_id  # the robot's organisation, as DingTalk says it on every message
        if not self._ours(message.sender_corp_id, message.robot_corp_id):
            self.quiet.warning(
                "dingtalk-tenant", "refused a DingTalk message from organisation %r", message.sender_corp_id[:40]
            )
            return
        lang = self.config.language_for(message.conversation_id)
        answer: str
        if message.text is None:
            answer = text(lang, "chat.not-text")
        else:
            user, command = f"dingtalk:{message.sender}", command_text(message.text)
            chat = ChatRef(platform="dingtalk", channel=message.conversation_id)
            if message.conversation_type == GROUP and self.private(user, command):
                if not message.sender_staff_id:
                    answer = text(lang, "dingtalk.private-no-staff-id")
                else:
                    answer = await self._run(user, chat, command, lang)
                    self._spawn(self._answer_privately(message, message.sender_staff_id, reply(answer, lang), lang))
                    return
            else:
                answer = await self._run(user, chat, command, lang)
        self._spawn(self._answer(message, reply(answer, lang)))

    async def click(self, frame_id: str, click: Click) -> dict[str, Any]:
        """Run a button's command; the answer is shown on the card to the one who clicked (private data)."""
        lang = self.config.language_for(click.space_id)
        job_id, action = job_of(click.out_track_id), clicked(click.content)
        if not self._ours(click.corp_id, self.corp or ""):
            self.quiet.warning("dingtalk-tenant", "refused a DingTalk click from organisation %r", click.corp_id[:40])
            return {}
        answer: str
        if job_id is None:
            answer = text(lang, "chat.unknown-card")
        elif action not in BUTTONS:
            answer = text(lang, "chat.unknown-button", action=action)
        elif not await self.once(f"in:{frame_id}"):
            log.info("DingTalk click %s delivered again; already handled", frame_id)
            return {}
        else:
            chat = ChatRef(platform="dingtalk", channel=click.space_id)
            answer = await self._run(f"dingtalk:{click.user_id}", chat, BUTTONS[action].format(job=job_id), lang)
        return {
            "cardUpdateOptions": {"updatePrivateDataByKey": True},
            "userPrivateData": {"cardParamMap": {"notice": escape_markdown(answer)}},
        }

    def _ours(self, sender: str, robot: str) -> bool:
        """Whether a message or click of organisation ``sender`` is for this bot: the configured organisation,
        else the robot's own (``robot``; unknown for a click before any message: not checked, said at start)."""
        pinned = self.config.corp_id or robot
        return not pinned or sender == pinned

    async def _run(self, user: str, chat: ChatRef, command: str, lang: Lang) -> str:
        """The bot's answer; a failure on the bot's side is said as such (DingTalk will not deliver it again)."""
        try:
            return await self.command(user, chat, command, lang)
        except Exception:
            log.exception("DingTalk command %r from %s failed", command, user)
            return text(lang, "chat.failed")

    async def close(self) -> None:
        """Let the answers on their way finish."""
        await asyncio.gather(*self._replies, return_exceptions=True)

    async def _answer(self, message: Incoming, answer: Markdown) -> None:
        expires = message.session_webhook_expires_ms or 0
        try:
            if message.session_webhook and expires > self.clock_ms() + WEBHOOK_MARGIN_MS:
                try:
                    await self.webhooks.session_reply(message.session_webhook, answer)
                    return
                except ChatError as exc:
                    if message.conversation_type != GROUP:
                        raise
                    log.warning("DingTalk session webhook failed (%s); answering through the OpenAPI", exc)
            if message.conversation_type == GROUP:
                await self.api.send_group_markdown(message.conversation_id, self.robot_code, answer.title, answer.text)
            else:
                log.warning("DingTalk: no way left to answer %s (session webhook expired)", message.message_id)
        except ChatError as exc:
            log.warning("DingTalk answer to %s not sent: %s", message.message_id, exc)

    async def _answer_privately(self, message: Incoming, staff_id: str, answer: Markdown, lang: Lang) -> None:
        """``answer`` to its asker alone; when DingTalk does not take it, one line in the group says so (never the
        answer itself)."""
        try:
            await self.api.send_user_markdown(staff_id, self.robot_code, answer.title, answer.text)
            return
        except ChatError as exc:
            log.warning("DingTalk one-to-one answer to %s not sent: %s", message.message_id, exc)
        await self._answer(message, reply(text(lang, "dingtalk.private-not-sent"), lang))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)
