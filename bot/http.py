"""The bot's one HTTP server: health, Prometheus metrics, and the signed runner report endpoint.

A report is taken only through :class:`bot.report_gate.ReportGate`: signed with the key of the attempt it names
(401 otherwise), within its caps (400 otherwise); a refused report changes nothing.

Slack's HTTP mode, the SNS endpoint and the CloudMonitor webhook mount on this same application, under one rule
for all of them: a request that cannot be handled because Redis is unavailable (down, restarting, loading) gets
503 and a short log line, on every route, so its sender tries again later (runners, SNS and Alibaba retry a
5xx; what Slack does is in :mod:`bot.chat.slack.app`), except ``/metrics``: it answers without the store's
part and says ``finetune_redis_up 0``. Refused requests are logged at a bounded rate (:mod:`bot.log_limit`):
nobody can make the bot write log lines without end.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from bot.bus_set import Bus
from bot.errors import InputRefused, StoreUnavailable
from bot.header_form import REPORT_SIGNATURE, REPORT_TIMESTAMP
from bot.log_limit import LimitedLog
from bot.report_gate import ReportGate
from bot.store import JobStore
from handlers.jobs import JobState

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

REPORTS_PATH = "/runner/reports"
MAX_BODY_BYTES = 1024 * 1024  # SNS notifications go up to 256 KiB before their envelope
RETRY_AFTER_SECONDS = 5


def build_app(
    store: JobStore,
    bus: Bus,
    reports: ReportGate,
    extra_metrics: Callable[[], dict[str, float]] | None = None,
) -> web.Application:
    refusals = LimitedLog(log)

    @web.middleware
    async def store_outage(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except StoreUnavailable as exc:
            refusals.warning(
                "redis-unavailable", "%s %s answered 503: Redis is unavailable (%s)", request.method, request.path, exc
            )
            return web.json_response(
                {"error": "store unavailable, retry"}, status=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
            )

    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[store_outage])

    async def healthz(request: web.Request) -> web.Response:
        await store.redis.ping()
        return web.json_response({"status": "ok"})

    async def metrics(request: web.Request) -> web.Response:
        # The one exception to "503 while Redis is unavailable": a scrape that failed would hide the bot's own
        # counters exactly when they matter, and could not say why. So the store's part is left out and
        # finetune_redis_up says 0 (deploy/prometheus/alerts.yaml pages on it).
        try:
            lines = await _store_metrics(store)
            redis_up = 1
        except StoreUnavailable as exc:
            refusals.warning(
                "redis-unavailable", "GET /metrics without the store's part: Redis is unavailable (%s)", exc
            )
            lines, redis_up = [], 0
        lines += _gauge("finetune_redis_up", "Whether this scrape could read Redis (1) or not (0).", redis_up)
        lines += _counter("finetune_events_handled_total", "Bus events handled.", bus.handled)
        lines += _counter("finetune_events_failed_total", "Bus event handler failures.", bus.failed)
        lines += _counter("finetune_events_parked_total", "Poison events parked.", bus.parked)
        lines += _histogram("finetune_handler_latency_seconds", "Bus handler latency.", bus)
        for name, value in {**reports.metrics(), **(extra_metrics() if extra_metrics else {})}.items():
            lines += _counter(name, name.replace("_", " "), value)
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")

    async def runner_report(request: web.Request) -> web.Response:
        body = await request.read()
        headers = request.headers
        try:
            timestamp, signature = REPORT_TIMESTAMP.read(headers), REPORT_SIGNATURE.read(headers)
            message = await reports.admit(body, timestamp, signature, route="http")
        except InputRefused as refused:
            if refused.status == 401:
                return web.json_response({"error": "bad or missing signature"}, status=401)
            return web.json_response({"error": "malformed report", "detail": refused.detail}, status=400)
        # A runner's retry of the same report has the same message id: it dedups downstream.
        await bus.publish(message)  # encoded once, from the model
        return web.json_response({"accepted": message.report.id}, status=202)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_post(REPORTS_PATH, runner_report)
    return app


class _MalformedRequests(logging.Filter):
    """aiohttp logs every request it cannot parse (a bad request line, header or chunk) at ERROR, with a
    traceback; anyone can send those. Such a record becomes one short, rate-limited warning line instead."""

    def __init__(self, quiet: LimitedLog) -> None:
        super().__init__()
        self.quiet = quiet

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError) or not 400 <= exc.code < 500:
            return True
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        self.quiet.warning("malformed-http", "refused a malformed HTTP request from %s: %s", peer, exc.message[:200])
        return False


def server_logger() -> logging.Logger:
    """The logger for the HTTP server's protocol errors: ``web.AppRunner(app, logger=server_logger())``."""
    server = logging.getLogger(__name__ + ".server")
    if not any(isinstance(known, _MalformedRequests) for known in server.filters):
        server.addFilter(_MalformedRequests(LimitedLog(server)))
    return server


async def _store_metrics(store: JobStore) -> list[str]:
    """What only Redis knows: jobs by state, each running job's step (no progress: its step stays put; the label is
    ``job_id``, since Prometheus owns ``job``), and each work stream's backlog per consumer group (lag: not yet
    delivered; pending: delivered, not acknowledged)."""
    counts = await store.counts_by_state()
    running = await store.list_jobs([JobState.RUNNING])
    backlog = await store.stream_backlog()
    lines = ["# HELP finetune_jobs Jobs by state.", "# TYPE finetune_jobs gauge"]
    lines += [f'finetune_jobs{{state="{state.value}"}} {counts.get(state, 0)}' for state in JobState]
    lines += ["# HELP finetune_job_step The step of each running job.", "# TYPE finetune_job_step gauge"]
    lines += [f'finetune_job_step{{job_id="{job.id}",recipe="{job.recipe}"}} {job.step or 0}' for job in running]
    lag = "finetune_stream_lag"
    lines += [f"# HELP {lag} Stream entries not yet delivered to a consumer group.", f"# TYPE {lag} gauge"]
    lines += [f'{lag}{{stream="{b.stream}",group="{b.group}"}} {b.lag}' for b in backlog if b.lag is not None]
    pending = "finetune_stream_pending"
    lines += [f"# HELP {pending} Stream entries delivered but not acknowledged.", f"# TYPE {pending} gauge"]
    lines += [f'{pending}{{stream="{b.stream}",group="{b.group}"}} {b.pending}' for b in backlog]
    return lines


def _gauge(name: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]


def _counter(name: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {value}"]


def _histogram(name: str, help_text: str, bus: Bus) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for bound, count in bus.latency.cumulative():
        label = "+Inf" if bound == float("inf") else repr(bound)
        lines.append(f'{name}_bucket{{le="{label}"}} {count}')
    return [*lines, f"{name}_sum {bus.latency.sum}", f"{name}_count {bus.latency.count}"]
