"""Acknowledgements made in PagerDuty or Opsgenie, taken into the job: the page is acknowledged in chat too, once.

- ``POST /pagerduty/webhook``: a PagerDuty v3 webhook subscription. Authentic when one of the ``v1=`` values of
  ``X-PagerDuty-Signature`` (comma-separated: several while PagerDuty rotates the secret) is the hex HMAC-SHA256
  of the raw body under the subscription's secret; 401 otherwise. ``incident.acknowledged`` of an incident whose
  ``incident_key`` is one of our pages acknowledges it; an event older than ``MAX_AGE`` (its ``occurred_at``) is
  refused as stale (400), so a captured request cannot be played back later.
- ``POST /opsgenie/webhook``: an Opsgenie outgoing Webhook integration, action ``Acknowledge`` of an alert whose
  ``alias`` is one of our pages. Opsgenie signs nothing: the integration is set to send a custom header,
  ``X-Finetune-Token: <OPSGENIE_WEBHOOK_TOKEN>`` (or its basic auth with that token as the password), checked in
  constant time; 401 otherwise. Put the route behind HTTPS (the token would cross the network in the clear).

Either way the acknowledgement is one job change (:func:`handlers.decide.ack_command` with ``via``), deduplicated
by the tool's event id, that does nothing when the page is acknowledged already or is not the job's open page; a
refused request changes nothing. Nothing here logs a secret, a signature or a body.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from aiohttp import web

from bot.header_form import BASIC, FINETUNE_TOKEN, PAGERDUTY_SIGNATURE, header_part
from bot.log_limit import LimitedLog
from handlers import safe_json
from handlers.outside_text import clean_line
from handlers.pagers import Tool

log = logging.getLogger(__name__)

PAGERDUTY_PATH = "/pagerduty/webhook"
OPSGENIE_PATH = "/opsgenie/webhook"
SIGNATURE_HEADER = PAGERDUTY_SIGNATURE.name
TOKEN_HEADER = FINETUNE_TOKEN.name
MAX_AGE = timedelta(minutes=30)  # PagerDuty retries a delivery for a few minutes; older is a replay
MAX_BODY = 256 * 1024

# key (the page's), the tool, who acknowledged, the tool's event id: what became of it ("acked", "already", …)
ToolAck = Callable[[str, Tool, str, str], Awaitable[str]]


def pagerduty_signed(body: bytes, header: str | None, secret: str) -> bool:
    """Whether one of the header's ``v1=<hex>`` signatures is the body's HMAC-SHA256 under ``secret``.

    ``header`` is the value :data:`bot.header_form.PAGERDUTY_SIGNATURE` let through (None: missing or malformed),
    so every value compared is ASCII hex."""
    if not header:
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest().encode()
    found = False
    for signature in header.split(","):
        version, _, value = signature.strip().partition("=")
        found |= version.lower() == "v1" and hmac.compare_digest(value.lower().encode("ascii"), expected)
    return found


def opsgenie_authentic(request: web.Request, token: str) -> bool:
    """The integration's custom header, or its basic auth's password, is ``token`` (compared in constant time)."""
    given = FINETUNE_TOKEN.read(request.headers)
    if given is not None:
        offered = given.encode("ascii")
    else:
        credentials = header_part(BASIC, request.headers, "credentials")
        try:
            offered = base64.b64decode(credentials or "", validate=True).partition(b":")[2]
        except binascii.Error:
            offered = b""
    return bool(offered) and hmac.compare_digest(offered, token.encode())


def pager_routes(
    ack: ToolAck,
    clock: Callable[[], datetime],
    pagerduty_secret: str | None,
    opsgenie_token: str | None,
) -> list[web.RouteDef]:
    """The webhook routes of the tools whose secret is set."""
    refusals = LimitedLog(log)

    async def pagerduty(request: web.Request) -> web.Response:
        assert pagerduty_secret is not None
        body = await request.read()
        signature = PAGERDUTY_SIGNATURE.read(request.headers)
        if len(body) > MAX_BODY or not pagerduty_signed(body, signature, pagerduty_secret):
            refusals.warning("pagerduty-unsigned", "refused a PagerDuty webhook: bad or missing signature")
            return web.json_response({"error": "bad or missing signature"}, status=401)
        document = _json(body)
        event = document.get("event") if document is not None else None
        if not isinstance(event, dict):
            return web.json_response({"error": "no event"}, status=400)
        occurred = _time(event.get("occurred_at"))
        if occurred is None or abs(clock() - occurred) > MAX_AGE:
            refusals.warning("pagerduty-stale", "refused a PagerDuty webhook: stale or undated event")
            return web.json_response({"error": "stale or undated event"}, status=400)
        if event.get("event_type") != "incident.acknowledged":
            return web.json_response({"ignored": str(event.get("event_type"))[:60]})
        data, agent = _object(event, "data"), _object(event, "agent")
        key = str(data.get("incident_key") or "")
        who = clean_line(str(agent.get("summary") or agent.get("id") or "someone")[:80])
        outcome = await ack(key, "pagerduty", who, f"pagerduty:{str(event.get('id'))[:80]}")
        return web.json_response({"outcome": outcome})

    async def opsgenie(request: web.Request) -> web.Response:
        assert opsgenie_token is not None
        if not opsgenie_authentic(request, opsgenie_token):
            refusals.warning("opsgenie-unauthenticated", "refused an Opsgenie webhook: bad or missing token")
            return web.json_response({"error": "bad or missing token"}, status=401)
        body = await request.read()
        payload = _json(body) if len(body) <= MAX_BODY else None
        if payload is None:
            return web.json_response({"error": "the body is not a JSON object"}, status=400)
        alert = _object(payload, "alert")
        if payload.get("action") != "Acknowledge":
            return web.json_response({"ignored": str(payload.get("action"))[:60]})
        key = str(alert.get("alias") or "")
        source = _object(payload, "source")
        who = clean_line(str(alert.get("username") or source.get("name") or "someone")[:80])
        event_id = f"opsgenie:{str(alert.get('alertId'))[:80]}:acknowledge"
        outcome = await ack(key, "opsgenie", who, event_id)
        return web.json_response({"outcome": outcome})

    routes: list[web.RouteDef] = []
    if pagerduty_secret:
        routes.append(web.post(PAGERDUTY_PATH, pagerduty))
    if opsgenie_token:
        routes.append(web.post(OPSGENIE_PATH, opsgenie))
    return routes


def _json(body: bytes) -> dict[str, Any] | None:
    """The body's JSON object (read within a size and a depth: :mod:`handlers.safe_json`), None if it is not one."""
    try:
        value = safe_json.loads(body, max_bytes=MAX_BODY)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _object(parent: dict[str, Any], name: str) -> dict[str, Any]:
    value = parent.get(name)
    return value if isinstance(value, dict) else {}


def _time(value: Any) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None
