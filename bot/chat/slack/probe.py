"""Is the Slack set-up usable? The probes of ``finetune-bot check``: the tokens' shapes (the same rules as at start,
:func:`bot.chat.slack.startup.check_secrets`), the bot token with ``auth.test`` (and the workspace and app it belongs
to, against ``slack.team_id`` / ``slack.app_id``), its scopes (:mod:`bot.chat.slack.scopes`), and in Socket Mode
the app token with ``apps.connections.open`` (which hands out a URL and opens nothing). Failures come through the
one mapping of slack_sdk's errors, :func:`bot.chat.slack.errors.call`."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.delivery import PermanentDeliveryError, TransientDeliveryError
from bot.chat.slack.adapter import DEFAULT_API_URL, HTTP_TIMEOUT
from bot.chat.slack.config import SlackConfig
from bot.chat.slack.errors import call
from bot.chat.slack.scopes import NEEDED, WANTED
from bot.chat.slack.startup import check_secrets
from bot.checks.result import Check, failed, passed
from bot.errors import ConfigError

BOT_TOKEN_FIX = "install the app to the workspace and set SLACK_BOT_TOKEN to its Bot User OAuth Token (xoxb-…)"
APP_TOKEN_FIX = "set SLACK_APP_TOKEN to an app-level token (xapp-…) with connections:write (Basic Information)"
SCOPES_HEADER = "x-oauth-scopes"


async def check_slack(
    bot_token: str | None,
    signing_secret: str | None,
    app_token: str | None,
    config: SlackConfig,
    api_url: str | None = None,
) -> list[Check]:
    """Nothing when Slack is not configured at all."""
    try:
        found = check_secrets(bot_token, signing_secret, app_token)
    except ConfigError as exc:
        return [failed("Slack tokens", str(exc), "set the variables the message names")]
    if found is None:
        return []
    async with aiohttp.ClientSession() as session:
        client = AsyncWebClient(
            token=found.bot_token,
            base_url=_with_slash(api_url or DEFAULT_API_URL),
            session=session,
            timeout=HTTP_TIMEOUT,
            retry_handlers=[],
        )
        checks = await _bot_token(client, config)
        if found.app_token is not None:
            checks.append(await _app_token(client, found.app_token))
    return checks


async def _bot_token(client: AsyncWebClient, config: SlackConfig) -> list[Check]:
    name = "Slack bot token"
    try:
        reply = await call(client.auth_test())
    except PermanentDeliveryError as exc:
        return [failed(name, f"refused by Slack: {exc}", BOT_TOKEN_FIX)]
    except TransientDeliveryError as exc:
        return [failed(name, f"not checked, Slack did not answer: {exc}", "check the network path to Slack")]
    team, app, user = reply.get("team_id"), reply.get("app_id"), reply.get("user_id")
    for setting, configured, actual in (("slack.team_id", config.team_id, team), ("slack.app_id", config.app_id, app)):
        if configured is not None and actual is not None and configured != actual:
            fix = f"use that workspace's / app's token, or set {setting} to {actual}"
            return [failed(name, f"belongs to {actual}, but {setting} is {configured}", fix)]
    token = passed(name, f"bot {user} of app {app or '?'} in workspace {reply.get('team', '')} {team}".strip())
    return [token, _scopes(reply.headers or {})]


def _scopes(headers: Mapping[str, str]) -> Check:
    name = "Slack scopes"
    said = next((value for key, value in headers.items() if key.lower() == SCOPES_HEADER), None)
    if said is None:
        return failed(name, "Slack did not say them (no x-oauth-scopes header)", "check SLACK_API_URL reaches Slack")
    granted = {scope.strip() for scope in said.split(",") if scope.strip()}
    missing = [scope for scope in NEEDED if scope not in granted]
    if missing:
        uses = "; ".join(f"{scope}: {NEEDED[scope]}" for scope in missing)
        fix = f"add {', '.join(missing)} to the app's bot token scopes (OAuth & Permissions) and reinstall it"
        return failed(name, f"missing {uses}", fix)
    has = ", ".join(scope for scope in [*NEEDED, *WANTED] if scope in granted)
    without = "".join(f"; without {scope}, {loss}" for scope, loss in WANTED.items() if scope not in granted)
    return passed(name, f"{has}{without}")


async def _app_token(client: AsyncWebClient, app_token: str) -> Check:
    name = "Slack app token"
    try:
        await call(client.apps_connections_open(app_token=app_token))
    except PermanentDeliveryError as exc:
        return failed(name, f"refused by Slack: {exc}", APP_TOKEN_FIX)
    except TransientDeliveryError as exc:
        return failed(name, f"not checked, Slack did not answer: {exc}", "check the network path to Slack")
    return passed(name, "Socket Mode connections may open")


def _with_slash(url: str) -> str:
    return url if url.endswith("/") else url + "/"
