"""The slack-bolt app: authorisation, one run per request, and which listener gets which request.

It is the same app in both transports: HTTP mode hands it the POSTs of ``/slack/events`` once
:mod:`bot.chat.slack.ingress` has checked their signature, timestamp and shape (so bolt's own verification is
off), Socket Mode the envelopes of its websocket. Before any listener, :mod:`bot.chat.slack.tenant` refuses a
request of another workspace or app, and :mod:`bot.chat.slack.once` makes sure a request delivered again does
nothing. Authorisation uses what ``auth.test`` said at start, so no request waits
on a Web API call before its listener runs.

What Slack does with an answer: a slash command or a click not answered 200 within three seconds shows the
person that it failed; what Slack delivers again (``X-Slack-Retry-Num``: at once, after a minute, after five; a
Socket Mode envelope not acked) is recognised and does nothing the second time. A refusal (4xx, with
``X-Slack-No-Retry``) or a Redis outage (503) starts nothing: the person knows to try again, and a retry that
reaches the bot once Redis is back runs the request, once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.slack.actions import ACTION_IDS, ButtonActions
from bot.chat.slack.commands import SlashCommand
from bot.chat.slack.ingress import Gate
from bot.chat.slack.once import FirstDelivery, once_per_request
from bot.chat.slack.startup import Identity
from bot.chat.slack.tenant import Tenant, pinned_tenant
from bot.errors import InputRefused
from bot.log_limit import LimitedLog

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
FORWARDED_HEADERS = ("X-Slack-Retry-Num", "X-Slack-Retry-Reason")


def build_bolt_app(
    client: AsyncWebClient,
    bot_token: str,
    identity: Callable[[], Identity],
    command_name: str,
    command: SlashCommand,
    actions: ButtonActions,
    first_delivery: FirstDelivery,
    tenant: Callable[[], Awaitable[Tenant]],
) -> AsyncApp:
    """``client`` carries no token (bolt copies it per request); ``tenant``: the workspace and app it serves."""

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
        request_verification_enabled=False,  # HTTP: the gate verified it; Socket Mode: the websocket is Slack's
        authorize=authorize,
    )
    app.use(pinned_tenant(tenant))  # first: a request of another workspace claims nothing, runs nothing
    app.use(once_per_request(first_delivery))
    app.command(command_name)(command.on_command)
    app.action(ACTION_IDS)(actions.on_action)
    return app


def events_route(
    app: AsyncApp, signing_secret: str, command_name: str, clock: Callable[[], float] = time.time
) -> web.RouteDef:
    """``POST /slack/events`` on the bot's own HTTP server: slash commands and interactivity (HTTP mode)."""
    gate = Gate(signing_secret, command_name, clock)
    refusals = LimitedLog(log)

    async def slack_events(request: web.Request) -> web.Response:
        try:
            accepted = gate.check(await request.read(), request.headers)
        except InputRefused as exc:
            refusals.warning(
                "slack-refused", "refused a request to %s from %s: %s", EVENTS_PATH, request.remote, exc.reason
            )
            # Events-style deliveries are retried on any error unless told not to; a refused request stays refused.
            return web.json_response({"error": exc.reason}, status=exc.status, headers={"X-Slack-No-Retry": "1"})
        if accepted.kind == "ssl_check":
            return web.Response(status=200)
        headers = {name: request.headers[name] for name in FORWARDED_HEADERS if name in request.headers}
        bolt_request = AsyncBoltRequest(
            body=json.dumps(accepted.body), headers={**headers, "Content-Type": "application/json"}
        )
        return await to_aiohttp_response(await app.async_dispatch(bolt_request))

    return web.post(EVENTS_PATH, slack_events)
