"""Startup checks: a Slack setup that cannot work is one clear error when the bot starts, not a stack trace
per message later.

- a bot token with neither a signing secret (HTTP mode) nor an app token (Socket Mode), an app token that is not
  one (``xapp-…``), a signing secret or app token without a bot token: refused before anything starts;
- the bot token is tried with ``auth.test`` and the app token with ``apps.connections.open``: a refusal
  (``invalid_auth``, ``token_revoked``…) stops the start. Slack being unreachable does not: the bot has spot
  interruptions to handle, and its messages wait in the outbox until Slack is back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.delivery import PermanentDeliveryError, TransientDeliveryError
from bot.chat.slack.errors import call
from bot.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SlackSecrets:
    bot_token: str
    signing_secret: str | None
    app_token: str | None

    @property
    def socket_mode(self) -> bool:
        return self.app_token is not None


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the bot is in Slack, as ``auth.test`` says (unknown while Slack could not be reached)."""

    team_id: str | None = None
    user_id: str | None = None
    bot_id: str | None = None
    app_id: str | None = None  # auth.test names the app of a bot token (not of a legacy one)


def check_secrets(bot_token: str | None, signing_secret: str | None, app_token: str | None) -> SlackSecrets | None:
    """The Slack setup from the environment, or None when Slack is not configured at all."""
    if bot_token is None:
        given = [
            name for name, value in (("SLACK_SIGNING_SECRET", signing_secret), ("SLACK_APP_TOKEN", app_token)) if value
        ]
        if given:
            raise ConfigError(
                f"{' and '.join(given)} set but SLACK_BOT_TOKEN is not: Slack needs the bot token (xoxb-…)"
            )
        return None
    if app_token is not None and not app_token.startswith("xapp-"):
        raise ConfigError("SLACK_APP_TOKEN must be an app-level token (xapp-…) with the connections:write scope")
    if app_token is None and signing_secret is None:
        raise ConfigError(
            "SLACK_BOT_TOKEN is set but neither SLACK_SIGNING_SECRET (HTTP mode, POST /slack/events) "
            "nor SLACK_APP_TOKEN (Socket Mode) is"
        )
    return SlackSecrets(bot_token, signing_secret, app_token)


async def verify_bot_token(client: AsyncWebClient) -> Identity:
    try:
        reply = await call(client.auth_test())
    except PermanentDeliveryError as exc:
        raise ConfigError(f"SLACK_BOT_TOKEN was refused by Slack: {exc}") from None
    except TransientDeliveryError as exc:
        log.warning("cannot check SLACK_BOT_TOKEN now (%s): starting anyway; messages wait until Slack is back", exc)
        return Identity()
    fields = ("team_id", "user_id", "bot_id", "app_id")
    return Identity(**{name: reply.get(name) for name in fields})


async def verify_app_token(client: AsyncWebClient, app_token: str) -> str | None:
    """A Socket Mode URL for the app token, or None when Slack cannot be reached now (the client retries)."""
    try:
        reply = await call(client.apps_connections_open(app_token=app_token))
    except PermanentDeliveryError as exc:
        raise ConfigError(f"SLACK_APP_TOKEN was refused by Slack: {exc}") from None
    except TransientDeliveryError as exc:
        log.warning("cannot open a Socket Mode connection now (%s): retrying in the background", exc)
        return None
    return str(reply["url"])
