"""The slack-bolt app: request verification, authorisation, and which listener gets which request.

It is the same app in both transports: HTTP mode hands it the POSTs of ``/slack/events`` (bolt verifies the
signature and the timestamp), Socket Mode the envelopes of its websocket. Authorisation uses what ``auth.test``
said at start, so no request waits on a Web API call before its listener runs.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.slack.actions import ACTION_IDS, ButtonActions
from bot.chat.slack.commands import SlashCommand
from bot.chat.slack.startup import Identity

EVENTS_PATH = "/slack/events"


def build_bolt_app(
    client: AsyncWebClient,
    bot_token: str,
    signing_secret: str | None,
    identity: Callable[[], Identity],
    command_name: str,
    command: SlashCommand,
    actions: ButtonActions,
) -> AsyncApp:
    """``client`` carries no token (bolt copies it per request); ``signing_secret`` None means Socket Mode."""

    async def authorize(enterprise_id: str | None, team_id: str | None) -> AuthorizeResult:
        known = identity()
        return AuthorizeResult(
            enterprise_id=enterprise_id,
            team_id=team_id or known.team_id,
            bot_token=bot_token,
            bot_user_id=known.user_id,
            bot_id=known.bot_id,
        )

    app = AsyncApp(
        name="finetune-bot",
        client=client,
        signing_secret=signing_secret or "",
        request_verification_enabled=signing_secret is not None,
        authorize=authorize,
    )
    app.command(command_name)(command.on_command)
    app.action(ACTION_IDS)(actions.on_action)
    return app


def events_route(app: AsyncApp) -> web.RouteDef:
    """``POST /slack/events`` on the bot's own HTTP server: slash commands and interactivity (HTTP mode)."""

    async def slack_events(request: web.Request) -> web.Response:
        return await to_aiohttp_response(await app.async_dispatch(await to_bolt_request(request)))

    return web.post(EVENTS_PATH, slack_events)
