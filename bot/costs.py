"""The costs report as the bot reads and serves it: :func:`read_costs`, the one path ``/finetune costs`` (chat)
and ``GET /costs`` (a finance sheet) share, and that route.

``GET /costs?window=7d&team=…`` answers the report as JSON (:func:`handlers.cost_report.report_json`). ``/metrics``
is open to whoever reaches the port (counts, no money, no names); this route names people and what they spent, so it
asks more: it is mounted only when ``FINETUNE_COSTS_TOKEN`` is set (at least 16 characters), and a request must
carry that token as ``Authorization: Bearer …`` (compared in constant time) — else 401. A token in the URL is
refused (400): URLs end up in access logs. The token sees every team (the finance view); a person's view, limited
to their teams, is ``/finetune costs`` in chat. Redis unavailable: 503, as on every route.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Collection, Iterable
from datetime import datetime

from aiohttp import web

from bot.header_form import BEARER, header_part
from bot.log_limit import LimitedLog
from bot.store import JobStore
from handlers.cost_report import DEFAULT_WINDOW, WINDOWS, CostReport, cost_report, report_json, window_start

log = logging.getLogger(__name__)

COSTS_PATH = "/costs"
MIN_TOKEN_LENGTH = 16


async def read_costs(store: JobStore, window: str, end: datetime, teams: Iterable[str] | None) -> CostReport:
    """The report of ``window`` ending at ``end``, over the jobs the store finds active in it (not every job)."""
    jobs = await store.active_since(window_start(window, end))
    return cost_report(jobs, window, end, teams)


def costs_routes(
    store: JobStore, token: str, teams: Collection[str], clock: Callable[[], datetime]
) -> list[web.RouteDef]:
    """The route; ``teams`` are the configured ones (a ``team`` not among them is a 400, not an empty report)."""
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"FINETUNE_COSTS_TOKEN must be at least {MIN_TOKEN_LENGTH} characters")
    expected = token.encode()
    known = frozenset(teams)
    quiet = LimitedLog(log)

    def refuse(request: web.Request, status: int, reason: str) -> web.Response:
        quiet.warning("refused", "refused GET %s from %s: %s", request.path, request.remote, reason)
        return web.json_response({"error": reason}, status=status)

    async def costs(request: web.Request) -> web.Response:
        if "token" in request.query:
            return refuse(request, 400, "a token in the URL is refused: send it as Authorization: Bearer")
        bearer = header_part(BEARER, request.headers, "token") or ""  # ASCII, or nothing (bot.header_form)
        if not hmac.compare_digest(bearer.encode("ascii"), expected):
            return refuse(request, 401, "missing or wrong token")
        window = request.query.get("window", DEFAULT_WINDOW)
        if window not in WINDOWS:
            return web.json_response({"error": f"window must be one of {', '.join(WINDOWS)}"}, status=400)
        team = request.query.get("team")
        if team is not None and team not in known:
            return web.json_response({"error": "no such team"}, status=400)
        report = await read_costs(store, window, clock(), None if team is None else [team])
        return web.json_response(report_json(report))

    return [web.get(COSTS_PATH, costs)]
