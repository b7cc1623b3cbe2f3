"""DingTalk's two message webhooks: a group's custom robot (signed with its secret) and a sessionWebhook.

Both take the same markdown message. A mention only notifies when the person is listed in ``at`` *and* the
text carries ``@userId`` or ``@mobile``, so :class:`Mentions` produces both from one list.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from bot.chat.dingtalk.config import Robot
from bot.chat.dingtalk.signing import signed_url
from bot.chat.dingtalk.transport import call


@dataclass(frozen=True, slots=True)
class Mentions:
    user_ids: list[str] = field(default_factory=list)
    mobiles: list[str] = field(default_factory=list)
    everyone: bool = False

    def __bool__(self) -> bool:
        return bool(self.user_ids or self.mobiles or self.everyone)

    def words(self) -> str:
        """The ``@…`` words DingTalk looks for in the text (``@all`` is implied by ``isAtAll``)."""
        return " ".join(f"@{who}" for who in (*self.user_ids, *self.mobiles))

    def at(self) -> dict[str, object]:
        return {"atUserIds": self.user_ids, "atMobiles": self.mobiles, "isAtAll": self.everyone}


@dataclass(frozen=True, slots=True)
class Markdown:
    """One markdown message: ``title`` is what the notification preview shows."""

    title: str
    text: str
    mentions: Mentions = field(default_factory=Mentions)

    @property
    def full_text(self) -> str:
        """The text with the mentions' ``@…`` words at the end, as DingTalk requires for them to notify."""
        words = self.mentions.words()
        return f"{self.text}\n\n{words}" if words else self.text

    def body(self) -> dict[str, object]:
        return {
            "msgtype": "markdown",
            "markdown": {"title": self.title, "text": self.full_text},
            "at": self.mentions.at(),
        }


class Webhooks:
    def __init__(self, session: aiohttp.ClientSession, clock: Callable[[], float] = time.time) -> None:
        self.session = session
        self.clock = clock

    async def robot(self, robot: Robot, message: Markdown) -> None:
        """Post through a custom robot; signed at the moment of sending when it has a secret."""
        url = signed_url(robot.webhook, robot.secret, self.clock()) if robot.secret else robot.webhook
        await call(self.session, "POST", url, "custom robot webhook", message.body())

    async def session_reply(self, webhook: str, message: Markdown) -> None:
        """Answer a message through the sessionWebhook it came with (valid for a while after it)."""
        await call(self.session, "POST", webhook, "session webhook", message.body())
