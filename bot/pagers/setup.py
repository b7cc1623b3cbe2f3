"""Which paging tools the bot talks to, from its settings: each one whose key is set; a ladder that names a tool
without its key is refused at start (a page would otherwise go nowhere, unseen)."""

from __future__ import annotations

import aiohttp

from bot.errors import ConfigError
from bot.pagers.calls import OPSGENIE_URLS, Opsgenie, PagerDuty, PagerTool
from bot.settings import Settings
from handlers.oncall import OnCall

KEY_SETTINGS = {"pagerduty": "PAGERDUTY_ROUTING_KEY", "opsgenie": "OPSGENIE_API_KEY"}
MIN_WEBHOOK_SECRET = 24  # a guessable token would let anyone acknowledge a page


def webhook_secrets(settings: Settings) -> tuple[str | None, str | None]:
    """The PagerDuty webhook secret and the Opsgenie webhook token (None: that route is not mounted); ConfigError
    for one too short to keep a stranger from acknowledging pages."""
    found = (settings.secret("pagerduty_webhook_secret"), settings.secret("opsgenie_webhook_token"))
    for name, value in zip(("PAGERDUTY_WEBHOOK_SECRET", "OPSGENIE_WEBHOOK_TOKEN"), found, strict=True):
        if value is not None and len(value) < MIN_WEBHOOK_SECRET:
            raise ConfigError(f"{name} must be at least {MIN_WEBHOOK_SECRET} characters")
    return found


def pager_tools(settings: Settings, oncall: OnCall, session: aiohttp.ClientSession) -> dict[str, PagerTool]:
    """The configured tools; ConfigError naming the variable a ladder's tool needs and lacks."""
    tools: dict[str, PagerTool] = {}
    routing_key = settings.secret("pagerduty_routing_key")
    if routing_key:
        tools["pagerduty"] = PagerDuty(session, routing_key, settings.pagerduty_events_url)
    api_key = settings.secret("opsgenie_api_key")
    if api_key:
        base = settings.opsgenie_api_url or OPSGENIE_URLS[settings.opsgenie_region]
        tools["opsgenie"] = Opsgenie(session, api_key, base)
    missing = [KEY_SETTINGS[tool] for tool in oncall.tools if tool not in tools]
    if missing:
        raise ConfigError(f"the on-call ladder names a paging tool without its key: set {', '.join(missing)}")
    return tools
