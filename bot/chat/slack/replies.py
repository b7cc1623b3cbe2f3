"""Answers meant for one person (a slow command's result, what a button did): ``chat.postEphemeral``.

They are not job notes, so they do not go through the durable outbox: the person is looking at Slack right
now, and an answer that arrives after a long outage would be stale. A few retries (honouring ``Retry-After``)
cover a rate limit or a blip.
"""

from __future__ import annotations

import asyncio
import logging

from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.delivery import PermanentDeliveryError, TransientDeliveryError
from bot.chat.slack.blocks import reply_text
from bot.chat.slack.errors import call
from handlers.backoff import backoff

log = logging.getLogger(__name__)

MAX_WAIT = 30.0


class EphemeralReplies:
    def __init__(self, client: AsyncWebClient, tries: int = 4) -> None:
        self.client = client
        self.tries = tries

    async def send(self, channel: str, user: str, text: str) -> bool:
        """Show ``text`` to ``user`` in ``channel`` (escaped: it may echo their words or a log); False if it could
        not be delivered."""
        shown = reply_text(text)
        for attempt in range(1, self.tries + 1):
            try:
                await call(self.client.chat_postEphemeral(channel=channel, user=user, text=shown))
                return True
            except PermanentDeliveryError as exc:
                log.warning("reply to %s in %s not delivered: %s", user, channel, exc)
                return False
            except TransientDeliveryError as exc:
                if attempt == self.tries:
                    log.warning("reply to %s in %s not delivered after %d tries: %s", user, channel, attempt, exc)
                    return False
                await asyncio.sleep(min(exc.retry_after if exc.retry_after is not None else backoff(attempt), MAX_WAIT))
        return False
