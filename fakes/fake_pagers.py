"""Local PagerDuty and Opsgenie for tests: the calls the bot makes, over real HTTP, checked the way the tools do.

:class:`FakePagers` serves PagerDuty's Events API v2 (``POST /v2/enqueue``: the routing key in the body must be
the integration's, ``event_action`` one of trigger/acknowledge/resolve with a ``dedup_key``, a trigger's
``payload`` with summary, source and severity) and Opsgenie's Alert API (``POST /v2/alerts`` to create with an
``alias``; ``POST /v2/alerts/<alias>/acknowledge|close?identifierType=alias``), each behind the tool's own auth
(``Authorization: GenieKey <key>``); a wrong key is answered as the tools answer it (400 "invalid routing key",
401). Every call that passed is recorded; :meth:`FakePagers.calls_of` reads them, :meth:`wait_for` waits on them.

The helpers at the bottom build the webhooks the tools send: a PagerDuty v3 ``incident.acknowledged`` event
signed ``v1=<hex HMAC-SHA256 of the body>``, and an Opsgenie ``Acknowledge`` action.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiohttp import web

ROUTING_KEY = "R0UTINGKEY0000000000000000000000"
GENIE_KEY = "11111111-2222-3333-4444-555555555555"
PAGERDUTY_WEBHOOK_SECRET = "pd-webhook-secret-for-tests"
OPSGENIE_WEBHOOK_TOKEN = "og-webhook-token-for-tests-0123456789"


@dataclass(frozen=True)
class ToolCall:
    tool: str  # pagerduty / opsgenie
    action: str  # trigger / acknowledge / resolve (Opsgenie's create / close are told as trigger / resolve)
    key: str  # dedup_key / alias
    body: dict[str, Any]


class FakePagers:
    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self.refused: list[str] = []
        self.changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> FakePagers:
        app = web.Application()
        app.router.add_post("/v2/enqueue", self._pagerduty)
        app.router.add_post("/v2/alerts", self._opsgenie_create)
        app.router.add_post("/v2/alerts/{alias}/{verb}", self._opsgenie_action)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def calls_of(self, tool: str, action: str | None = None) -> list[ToolCall]:
        return [call for call in self.calls if call.tool == tool and action in (None, call.action)]

    async def wait_for(self, tool: str, action: str, count: int = 1, timeout: float = 60) -> None:
        """Until ``count`` calls of ``action`` reached ``tool`` (the timeout only turns a hang into a failure)."""
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: len(self.calls_of(tool, action)) >= count), timeout)

    async def _record(self, call: ToolCall) -> None:
        async with self.changed:
            self.calls.append(call)
            self.changed.notify_all()

    async def _pagerduty(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("routing_key") != ROUTING_KEY:
            self.refused.append("pagerduty: routing key")
            return web.json_response({"status": "invalid event", "message": "Event object is invalid"}, status=400)
        action, key = body.get("event_action"), body.get("dedup_key")
        payload = body.get("payload") or {}
        valid_trigger = action != "trigger" or all(payload.get(name) for name in ("summary", "source", "severity"))
        if action not in ("trigger", "acknowledge", "resolve") or not key or not valid_trigger:
            self.refused.append(f"pagerduty: {action} {key}")
            return web.json_response({"status": "invalid event"}, status=400)
        await self._record(ToolCall("pagerduty", action, key, body))
        return web.json_response({"status": "success", "message": "Event processed", "dedup_key": key}, status=202)

    def _genie(self, request: web.Request) -> bool:
        if request.headers.get("Authorization") == f"GenieKey {GENIE_KEY}":
            return True
        self.refused.append("opsgenie: key")
        return False

    async def _opsgenie_create(self, request: web.Request) -> web.Response:
        if not self._genie(request):
            return web.json_response({"message": "Could not authenticate"}, status=401)
        body = await request.json()
        if not body.get("message") or not body.get("alias") or len(body["message"]) > 130:
            self.refused.append("opsgenie: create")
            return web.json_response({"message": "Request body is not processable"}, status=422)
        await self._record(ToolCall("opsgenie", "trigger", body["alias"], body))
        return _opsgenie_accepted()

    async def _opsgenie_action(self, request: web.Request) -> web.Response:
        if not self._genie(request):
            return web.json_response({"message": "Could not authenticate"}, status=401)
        verb = request.match_info["verb"]
        if verb not in ("acknowledge", "close") or request.query.get("identifierType") != "alias":
            self.refused.append(f"opsgenie: {verb} {request.query_string}")
            return web.json_response({"message": "Invalid request"}, status=422)
        action = "acknowledge" if verb == "acknowledge" else "resolve"
        await self._record(ToolCall("opsgenie", action, request.match_info["alias"], await request.json()))
        return _opsgenie_accepted()


def _opsgenie_accepted() -> web.Response:
    return web.json_response(
        {"result": "Request will be processed", "took": 0.01, "requestId": str(uuid.uuid4())}, status=202
    )


def pagerduty_ack(key: str, who: str, at: datetime, event_id: str | None = None) -> dict[str, Any]:
    """A v3 webhook's ``incident.acknowledged`` event of the incident ``key`` opened (its ``incident_key``)."""
    return {
        "event": {
            "id": event_id or uuid.uuid4().hex,
            "event_type": "incident.acknowledged",
            "resource_type": "incident",
            "occurred_at": at.isoformat().replace("+00:00", "Z"),
            "agent": {"id": "PUSER01", "summary": who, "type": "user_reference"},
            "data": {"id": "PINC01", "type": "incident", "status": "acknowledged", "incident_key": key},
        }
    }


def pagerduty_signed(body: bytes, secret: str = PAGERDUTY_WEBHOOK_SECRET, *others: str) -> dict[str, str]:
    """The headers PagerDuty sends: ``X-PagerDuty-Signature`` with a ``v1=`` signature per secret given."""
    signatures = [hmac.new(s.encode(), body, hashlib.sha256).hexdigest() for s in (*others, secret)]
    return {"Content-Type": "application/json", "X-PagerDuty-Signature": ",".join(f"v1={s}" for s in signatures)}


def opsgenie_ack(key: str, who: str, alert_id: str = "og-alert-1") -> dict[str, Any]:
    """An Opsgenie Webhook integration's ``Acknowledge`` action on the alert with alias ``key``."""
    return {
        "action": "Acknowledge",
        "alert": {"alertId": alert_id, "alias": key, "message": "finetune", "username": who},
        "source": {"name": who, "type": "web"},
        "integrationName": "finetune-bot",
        "integrationType": "Webhook",
    }


def dumps(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode()
