"""The Slack adapter as the bot service sees it: check at start, serve requests, deliver messages, stop.

``connect`` runs the startup checks (see :mod:`bot.chat.slack.startup`) before anything else of the bot
starts; ``mount`` puts ``/slack/events`` on the bot's HTTP server (HTTP mode); ``deliverer`` is what the shared
chat outbox delivers through; ``start`` hands requests to the bot's command entry, with the claim that makes each
request run once (:mod:`bot.chat.slack.once`), and opens the Socket Mode connection in Socket Mode; ``close``
undoes all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.catalog import Lang, text
from bot.chat.refs import ChatRefs
from bot.chat.slack.actions import ButtonActions
from bot.chat.slack.app import build_bolt_app, events_route
from bot.chat.slack.commands import CommandRunner, SlashCommand
from bot.chat.slack.config import SlackConfig
from bot.chat.slack.deliverer import SlackDeliverer
from bot.chat.slack.once import CLAIM_TTL_SECONDS
from bot.chat.slack.replies import EphemeralReplies
from bot.chat.slack.startup import Identity, SlackSecrets, verify_app_token, verify_bot_token
from bot.chat.slack.tenant import Tenant
from bot.errors import ConfigError
from handlers.clock import utcnow
from handlers.jobs import ChatRef

log = logging.getLogger(__name__)

DEFAULT_API_URL = "https://slack.com/api/"
HTTP_TIMEOUT = 10  # seconds per Web API call; a hung call must not hold a job's messages for long

Claim = Callable[[str, int], Awaitable[bool]]  # (key, ttl seconds) -> first time? (JobStore.claim_once)


class SlackAdapter:
    def __init__(
        self,
        secrets: SlackSecrets,
        config: SlackConfig,
        api_url: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.secrets = secrets
        self.config = config
        self.clock = clock  # epoch seconds: what a request's timestamp is checked against
        base = api_url or DEFAULT_API_URL
        self.api_url = base if base.endswith("/") else base + "/"
        self.identity = Identity()
        self._session: aiohttp.ClientSession | None = None
        self._client: AsyncWebClient | None = None
        self._app: AsyncApp | None = None
        self._run: CommandRunner | None = None
        self._claim: Claim | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._socket_url: str | None = None
        self._socket_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._learning = asyncio.Lock()

    @property
    def socket_mode(self) -> bool:
        return self.secrets.socket_mode

    @property
    def client(self) -> AsyncWebClient:
        assert self._client is not None, "SlackAdapter is not connected"
        return self._client

    @property
    def app(self) -> AsyncApp:
        assert self._app is not None, "SlackAdapter is not connected"
        return self._app

    async def connect(self) -> None:
        """Check the tokens with Slack (raising ConfigError on a refusal) and build the app."""
        self._session = aiohttp.ClientSession()
        common: dict[str, Any] = {"base_url": self.api_url, "session": self._session, "timeout": HTTP_TIMEOUT}
        # No retry handlers: the outbox decides about retries, once, for every call.
        self._client = AsyncWebClient(token=self.secrets.bot_token, retry_handlers=[], **common)
        try:
            self.identity = await verify_bot_token(self._client)
            self._check_pin()
            if self.secrets.app_token is not None:
                self._socket_url = await verify_app_token(self._client, self.secrets.app_token)
        except BaseException:
            await self.close()
            raise
        replies = EphemeralReplies(self._client)
        self._app = build_bolt_app(
            AsyncWebClient(**common),
            self.secrets.bot_token,
            lambda: self.identity,
            self.config.command,
            SlashCommand(self._command, replies, self._spawn, self.config.language_for),
            ButtonActions(self._command, replies, self._spawn, self.config.language_for),
            self._first_delivery,
            self.tenant,
        )
        pinned = self.pinned()
        log.info("slack: serving workspace %s, app %s", pinned.team_id or "(not known yet)", pinned.app_id or "(any)")

    def pinned(self) -> Tenant:
        """The workspace and app requests must come from: configured, else as auth.test said."""
        return Tenant(self.config.team_id or self.identity.team_id, self.config.app_id or self.identity.app_id)

    async def tenant(self) -> Tenant:
        """:meth:`pinned`; while the workspace is unknown (Slack was unreachable at start), ask auth.test again."""
        if self.config.team_id is None and self.identity.team_id is None and self._client is not None:
            async with self._learning:
                if self.identity.team_id is None:
                    with contextlib.suppress(ConfigError):  # a refused token is said at start, not per request
                        self.identity = await verify_bot_token(self._client)
        return self.pinned()

    def _check_pin(self) -> None:
        """ConfigError when the bot token belongs to another workspace or app than the one configured."""
        for name, configured, learned in (
            ("slack.team_id", self.config.team_id, self.identity.team_id),
            ("slack.app_id", self.config.app_id, self.identity.app_id),
        ):
            if configured is not None and learned is not None and configured != learned:
                raise ConfigError(f"{name} is {configured} but SLACK_BOT_TOKEN belongs to {learned}")

    def mount(self, http: web.Application) -> None:
        """Serve ``/slack/events`` on the bot's HTTP server (HTTP mode only; Socket Mode needs no endpoint)."""
        if not self.socket_mode:
            assert self.secrets.signing_secret is not None  # check_secrets: HTTP mode has one
            http.add_routes([events_route(self.app, self.secrets.signing_secret, self.config.command, self.clock)])

    def deliverer(self, refs: ChatRefs, clock: Callable[[], datetime] = utcnow) -> SlackDeliverer:
        return SlackDeliverer(self.client, refs, self.config.alert_channel, clock, self.config.language_for)

    async def start(self, run: CommandRunner, claim: Claim) -> None:
        """Hand commands and button clicks to ``run`` (the bot's command entry), each request once as ``claim``
        (``JobStore.claim_once``) decides; open Socket Mode if configured."""
        self._run = run
        self._claim = claim
        if self.secrets.app_token is not None:
            self._socket = AsyncSocketModeHandler(self.app, self.secrets.app_token, web_client=self.client)
            if self._socket_url is not None:
                self._socket.client.wss_uri = self._socket_url  # checked at start: no second apps.connections.open
            self._socket_task = asyncio.create_task(self._socket.connect_async(), name="slack-socket-mode")  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        if self._socket is not None:
            await self._socket.close_async()  # type: ignore[no-untyped-call]
        if self._socket_task is not None:
            self._socket_task.cancel()
            with contextlib.suppress(BaseException):
                await self._socket_task
        if self._tasks:  # commands in flight finish (they are short), so their answers are not cut off
            await asyncio.wait(set(self._tasks), timeout=5)
        if self._session is not None:
            await self._session.close()

    async def _first_delivery(self, key: str) -> bool:
        """Claim ``key``: True for the first delivery of a request (before ``start`` nothing runs: no claim)."""
        if self._claim is None:
            return True
        return await self._claim(key, CLAIM_TTL_SECONDS)

    async def _command(self, user: str, chat: ChatRef, command: str, lang: Lang) -> str:
        if self._run is None:
            return text(lang, "chat.starting")
        return await self._run(user, chat, command, lang)

    def _spawn(self, work: Coroutine[Any, Any, str]) -> asyncio.Task[str]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
