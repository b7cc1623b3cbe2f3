"""Tenant pinning: the bot answers its own Slack workspace and app, and refuses a request from any other.

A signature proves a request came from Slack for an app with our signing secret; it does not say which workspace
sent it (an app distributed to several workspaces shares one secret), and Socket Mode has no signature at all.
So every request, in both transports, passes a bolt middleware before anything else: its ``team_id`` (a slash
command's field, a click's ``team.id``) must be the pinned workspace and its ``api_app_id`` the pinned app.
The pin is ``slack.team_id`` / ``slack.app_id`` when configured, else what ``auth.test`` said of the bot token
(asked again while it has not answered); until the workspace is known, requests are refused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse

from bot.log_limit import LimitedLog

log = logging.getLogger(__name__)

Next = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Tenant:
    """The workspace (``T…``) and app (``A…``) the bot serves; None: not known (the app: not checked)."""

    team_id: str | None
    app_id: str | None


def tenant_of(body: Mapping[str, Any]) -> Tenant:
    """The workspace and app a request says it is from (a slash command's fields, or an interaction's)."""
    team = body.get("team_id")
    if not isinstance(team, str):
        nested = body.get("team")
        team = nested.get("id") if isinstance(nested, dict) else None
    app = body.get("api_app_id")
    return Tenant(team if isinstance(team, str) else None, app if isinstance(app, str) else None)


def foreign(pinned: Tenant, body: Mapping[str, Any]) -> str | None:
    """Why a request is not for the pinned tenant, or None when it is."""
    asked = tenant_of(body)
    if pinned.team_id is None:
        return "the bot's workspace is not known yet (auth.test has not answered)"
    if asked.team_id != pinned.team_id:
        return f"workspace {str(asked.team_id)[:20]!r} is not this bot's"
    if pinned.app_id is not None and asked.app_id != pinned.app_id:
        return f"app {str(asked.app_id)[:20]!r} is not this bot's"
    return None


def pinned_tenant(pinned: Callable[[], Awaitable[Tenant]]) -> Callable[..., Awaitable[BoltResponse | None]]:
    """The bolt middleware: a request of another workspace or app is answered 403 and reaches nothing."""
    quiet = LimitedLog(log)

    async def middleware(request: AsyncBoltRequest, body: dict[str, Any], next_: Next) -> BoltResponse | None:
        why = foreign(await pinned(), body)
        if why is not None:
            quiet.warning("slack-tenant", "refused a Slack request: %s", why)
            return BoltResponse(status=403, body=json.dumps({"error": why}), headers={"X-Slack-No-Retry": "1"})
        await next_()
        return None

    return middleware
