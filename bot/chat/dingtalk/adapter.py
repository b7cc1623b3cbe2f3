"""DingTalk wired for the service: the stream in, the deliverer out, and the ChatPort the bot talks to.

``BotService`` builds one when ``DINGTALK_CLIENT_ID`` is set: ``check()`` at start (wrong credentials are one
clear error, not a stack trace per message), ``deliverer`` for the durable chat outbox (bot/chat/outbox.py),
``listen(bot.command)`` once the bot exists, ``close()`` at stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp

from bot.chat.delivery import PermanentDeliveryError, TransientDeliveryError
from bot.chat.dingtalk.config import DingTalkConfig
from bot.chat.dingtalk.deliverer import DingTalkDeliverer
from bot.chat.dingtalk.inbound import CommandFn, Inbound, PrivateFn
from bot.chat.dingtalk.ledger import StoreLedger
from bot.chat.dingtalk.openapi import DEFAULT_OAPI_ENDPOINT, OpenApi
from bot.chat.dingtalk.stream import DingTalkStream
from bot.chat.dingtalk.webhooks import Webhooks
from bot.errors import ConfigError
from bot.keys import Keys
from bot.store import JobStore

log = logging.getLogger(__name__)


class DingTalk:
    def __init__(
        self,
        client_id: str,
        client_secret: str | None,
        endpoint: str,
        config: DingTalkConfig,
        store: JobStore,
        oapi_endpoint: str = DEFAULT_OAPI_ENDPOINT,
    ) -> None:
        if not client_secret:
            raise ConfigError("DINGTALK_CLIENT_ID is set but DINGTALK_CLIENT_SECRET is not")
        self.client_id = client_id
        self.client_secret = client_secret
        self.endpoint = endpoint
        self.config = config
        self.store = store
        self.robot_code = config.robot_code or client_id
        self.session = aiohttp.ClientSession()
        self.api = OpenApi(self.session, client_id, client_secret, endpoint, oapi_endpoint=oapi_endpoint)
        self.webhooks = Webhooks(self.session)
        self.deliverer = DingTalkDeliverer(self.api, self.webhooks, config, StoreLedger(store), self.robot_code)
        self.stream: DingTalkStream | None = None
        self._inbound: Inbound | None = None
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> None:
        """Fetch an access token now: DingTalk refusing the app's credentials stops the start with one message."""
        try:
            await self.api.access_token()
        except PermanentDeliveryError as exc:
            await self.session.close()
            raise ConfigError(f"DingTalk refused DINGTALK_CLIENT_ID / DINGTALK_CLIENT_SECRET: {exc}") from None
        except TransientDeliveryError as exc:
            log.warning("DingTalk unreachable at start (%s); the bot keeps trying", exc)

    def listen(self, command: CommandFn, private: PrivateFn) -> None:
        """Start the stream; messages and clicks run ``command`` (``Bot.command``); a group's command whose answer
        is for the asker alone (``private``: ``Bot.answers_privately``) is answered to them one to one."""
        self._inbound = Inbound(
            command, private, self._first_time, self.api, self.webhooks, self.config, self.robot_code
        )
        self.stream = DingTalkStream(self.client_id, self.client_secret, self.endpoint, self.session, self._inbound)
        self._task = asyncio.create_task(self.stream.run(), name="dingtalk-stream")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._inbound is not None:
            await self._inbound.close()
        await self.session.close()

    async def _first_time(self, key: str) -> bool:
        return await self.store.claim_once(Keys.dingtalk(key))
