"""Open, acknowledge and resolve a page in PagerDuty (Events API v2) and Opsgenie (Alert API), one HTTP call each.

The chat outbox hands every ``pager`` note to :class:`PagerDeliverer` (a :class:`~bot.chat.delivery.Deliverer`
like a chat platform's), so a call is retried until it goes, recorded once it went, and never repeated after
that; the page's key (``dedup_key``, ``alias``) makes a repeat after a crash harmless at the tool too.

The routing key and the API key are secrets: they travel in the request body (PagerDuty) or the
``Authorization`` header (Opsgenie), never in a URL, and no error or log line carries them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp

from bot.chat.catalog import plain
from bot.chat.delivery import PermanentDeliveryError, TransientDeliveryError
from bot.chat.render import message_text
from handlers.clock import utcnow
from handlers.jobs import Job
from handlers.messages import Notify
from handlers.notes import PagerCall

log = logging.getLogger(__name__)

TIMEOUT = aiohttp.ClientTimeout(total=15)
PAGERDUTY_URL = "https://events.pagerduty.com"
OPSGENIE_URLS = {"us": "https://api.opsgenie.com", "eu": "https://api.eu.opsgenie.com"}
SOURCE = "finetune-bot"
OPSGENIE_MESSAGE_MAX = 130  # Opsgenie cuts an alert's message there


class PagerTool(Protocol):
    """One paging tool: carry out ``call`` (``summary``: what its incident says), or raise a delivery error."""

    async def send(self, call: PagerCall, summary: str) -> None: ...


class PagerDuty:
    """PagerDuty's Events API v2: ``POST /v2/enqueue`` with the routing key, the action and the page's dedup_key."""

    def __init__(self, session: aiohttp.ClientSession, routing_key: str, base_url: str = PAGERDUTY_URL) -> None:
        self.session = session
        self.routing_key = routing_key
        self.url = base_url.rstrip("/") + "/v2/enqueue"

    async def send(self, call: PagerCall, summary: str) -> None:
        body: dict[str, Any] = {"routing_key": self.routing_key, "event_action": call.action, "dedup_key": call.key}
        if call.action == "trigger":
            body["payload"] = {"summary": summary[:1024], "source": SOURCE, "severity": "critical"}
        await _post(self.session, self.url, body, {}, "pagerduty", secret=self.routing_key)


class Opsgenie:
    """Opsgenie's Alert API: create an alert with the page's alias; acknowledge and close it by that alias."""

    def __init__(self, session: aiohttp.ClientSession, api_key: str, base_url: str = OPSGENIE_URLS["us"]) -> None:
        self.session = session
        self.api_key = api_key
        self.base = base_url.rstrip("/") + "/v2/alerts"

    async def send(self, call: PagerCall, summary: str) -> None:
        headers = {"Authorization": f"GenieKey {self.api_key}"}
        if call.action == "trigger":
            body: dict[str, Any] = {
                "message": summary[:OPSGENIE_MESSAGE_MAX],
                "alias": call.key,
                "description": summary,
                "source": SOURCE,
                "priority": "P1",
            }
            url = self.base
        else:
            verb = "acknowledge" if call.action == "acknowledge" else "close"
            url = f"{self.base}/{quote(call.key, safe='')}/{verb}?identifierType=alias"
            body = {"source": SOURCE, **({"note": summary} if call.by else {})}
        await _post(self.session, url, body, headers, "opsgenie", secret=self.api_key)


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    what: str,
    secret: str,
) -> None:
    """POST ``body`` as JSON: done on 2xx; TransientDeliveryError for the network, 429 and 5xx; Permanent else.
    The tool's answer is quoted with ``secret`` blanked out (a tool may echo what it was sent)."""
    try:
        async with session.post(url, json=body, headers=headers, timeout=TIMEOUT) as response:
            status, raw = response.status, await response.read()
            retry_after = response.headers.get("Retry-After")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise TransientDeliveryError(f"{what}: {type(exc).__name__}") from exc
    if 200 <= status < 300:
        return
    said = raw[:200].decode(errors="replace").replace(secret, "***")
    if status == 429 or status >= 500:
        raise TransientDeliveryError(f"{what}: HTTP {status} {said}", _seconds(retry_after))
    raise PermanentDeliveryError(f"{what}: HTTP {status} {said}")


def _seconds(header: str | None) -> float | None:
    try:
        return max(0.0, float(header)) if header else None
    except ValueError:
        return None


class PagerDeliverer:
    """The outbox's deliverer of ``pager`` notes: each to the tool it names (one not configured: dropped)."""

    def __init__(self, tools: Mapping[str, PagerTool], clock: Callable[[], datetime] = utcnow) -> None:
        self.tools = dict(tools)
        self.clock = clock

    async def deliver(self, job: Job, note: Notify) -> None:
        call = note.note
        if not isinstance(call, PagerCall):
            raise PermanentDeliveryError(f"a {note.note_type} note is not a pager call")
        tool = self.tools.get(call.tool)
        if tool is None:
            raise PermanentDeliveryError(f"{call.tool} is not configured")
        summary = plain(message_text(job, note, self.clock(), "en"))
        await tool.send(call, summary)
        log.info("%s %s of %s (%s)", call.tool, call.action, job.id, call.key)
