"""The SNS HTTPS endpoint (``POST /aws/sns``): verify, then confirm a subscription or publish a notification.

Checks run cheapest first, and everything that needs no network before anything that does, so a stranger's POST
never makes the bot fetch a URL:

1. a JSON object of a known SNS ``Type`` (agreeing with the ``x-amz-sns-message-type`` header when sent) — 400;
2. ``TopicArn`` in the allowlist — 403;
3. ``Timestamp`` at most an hour old (and not ahead of the clock beyond a small skew) — 403. A signature never
   expires, so without this a captured message could be replayed forever. An hour is safe for genuine traffic:
   SNS gives up retrying an HTTP/S delivery within 3,600 s (a hard limit of delivery policies), so SNS never
   delivers anything older; and a spot warning an hour old is about an instance long gone anyway;
4. the signature, with the certificate from an SNS host only (:mod:`bot.sources.sns_signature`) — 403.

Then a ``SubscriptionConfirmation`` is confirmed by GETting its ``SubscribeURL`` (only on an SNS host); an
``UnsubscribeConfirmation`` is logged and left alone (subscribing again is an operator's decision); a
``Notification`` is parsed by ``parse`` (the bot's :class:`bot.sources.aws_intake.AwsIntake`: what each topic may
carry, and every runner report's own signature; a refused one gets 403) and published to the bus.

Status codes follow SNS's retry rule (5xx and timeouts are retried, 4xx never): refusals and unrecognised
messages get 4xx (an unrecognised one is logged in full, and goes to the subscription's dead-letter queue when it
has one); a bus that cannot take the message, or a failed confirmation GET, gets 5xx so SNS tries again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from bot.errors import InputRefused
from bot.header_form import SNS_MESSAGE_TYPE
from bot.log_limit import LimitedLog
from bot.sources.aws_intake import parse_plain
from bot.sources.sns_signature import SnsVerifier, UrlFetcher, fetch_url
from handlers import safe_json
from handlers.aws_events import SNS_TYPES
from handlers.errors import UnrecognisedMessage
from handlers.messages import BusMessage

log = logging.getLogger(__name__)

SNS_PATH = "/aws/sns"
MESSAGE_TYPE_HEADER = SNS_MESSAGE_TYPE.name
MAX_AGE = timedelta(hours=1)
MAX_CLOCK_SKEW = timedelta(minutes=5)

Publish = Callable[[BusMessage], Awaitable[str]]  # the bus encodes the message once, from the model
Parse = Callable[[bytes], Awaitable[Sequence[BusMessage]]]


def sns_routes(
    publish: Publish,
    topic_allowlist: Collection[str],
    verifier: SnsVerifier,
    *,
    path: str = SNS_PATH,
    confirm: UrlFetcher = fetch_url,
    clock: Callable[[], float] = time.time,
    max_age: timedelta = MAX_AGE,
    parse: Parse = parse_plain,
) -> list[web.RouteDef]:
    """The route to mount on the bot's app (``app.add_routes(sns_routes(...))``).

    ``topic_allowlist`` must name at least one topic: an endpoint that trusts every topic would publish whatever
    anyone's topic sends. ``confirm`` GETs a SubscribeURL (injectable for tests, like the verifier's fetcher).
    """
    allowed = frozenset(topic_allowlist)
    if not allowed:
        raise ValueError("the SNS endpoint needs at least one allowed topic ARN")
    quiet = LimitedLog(log)  # refusals are logged, at a rate no stranger can raise

    async def receive(request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            message = _envelope(raw, _message_type(request))
        except ValueError as exc:
            return _refuse(quiet, request, 400, str(exc))
        topic = message["TopicArn"]
        if topic not in allowed:
            return _refuse(quiet, request, 403, f"topic {topic!r} is not allowed here")
        stale = _staleness(message.get("Timestamp"), datetime.fromtimestamp(clock(), UTC), max_age)
        if stale:
            return _refuse(quiet, request, 403, stale)
        try:
            await verifier.verify(message)
        except InputRefused as exc:  # 503: a certificate not fetched now, SNS delivers a retryable (5xx) one again
            said = "signature not checked now" if exc.status == 503 else "signature refused"
            return _refuse(quiet, request, exc.status, f"{said}: {exc}")
        kind = message["Type"]
        if kind == "SubscriptionConfirmation":
            return await _confirm(message, verifier, confirm)
        if kind == "UnsubscribeConfirmation":
            log.warning("SNS says %s was unsubscribed from %s; not subscribing again", request.path, topic)
            return web.json_response({"ignored": "UnsubscribeConfirmation"})
        return await _publish(raw, message, publish, parse, quiet)

    return [web.post(path, receive)]


def _message_type(request: web.Request) -> str | None:
    """The type SNS names beside the body; a header of another form is refused (ValueError), never compared."""
    if MESSAGE_TYPE_HEADER not in request.headers:
        return None
    kind = SNS_MESSAGE_TYPE.read(request.headers)
    if kind is None:
        raise ValueError(f"{MESSAGE_TYPE_HEADER} is not a message type")
    return kind


def _envelope(raw: bytes, header_type: str | None) -> dict[str, Any]:
    """The SNS JSON document, or ValueError saying why the body is not one."""
    try:
        message = safe_json.loads(raw)
    except ValueError as exc:
        raise ValueError("the body is not JSON") from exc
    if not isinstance(message, dict):
        raise ValueError("the body is not a JSON object")
    kind = message.get("Type")
    if kind not in SNS_TYPES:
        raise ValueError(f"unknown SNS message type {kind!r}")
    if header_type is not None and header_type != kind:
        raise ValueError(f"{MESSAGE_TYPE_HEADER} {header_type!r} disagrees with Type {kind!r}")
    if not isinstance(message.get("TopicArn"), str):
        raise ValueError("no TopicArn")
    return message


def _staleness(timestamp: object, now: datetime, max_age: timedelta) -> str | None:
    """Why ``timestamp`` is unacceptable (see the module docstring), or None when it is fresh."""
    if not isinstance(timestamp, str):
        return "no Timestamp"
    try:
        sent = datetime.fromisoformat(timestamp)
    except ValueError:
        return f"unreadable Timestamp {timestamp!r}"
    if sent.tzinfo is None:
        sent = sent.replace(tzinfo=UTC)
    if now - sent > max_age:
        return f"Timestamp {timestamp} is older than {max_age}: SNS stops retrying sooner, so this is a replay"
    if sent - now > MAX_CLOCK_SKEW:
        return f"Timestamp {timestamp} is in the future"
    return None


async def _confirm(message: dict[str, Any], verifier: SnsVerifier, confirm: UrlFetcher) -> web.Response:
    url = message.get("SubscribeURL")
    if not verifier.allows_url(url):
        log.warning("refused to confirm %s: SubscribeURL %r is not on SNS", message["TopicArn"], url)
        return web.json_response({"error": "SubscribeURL is not an SNS URL"}, status=403)
    try:
        await confirm(url)
    except Exception as exc:
        log.warning("could not confirm the subscription to %s: %s", message["TopicArn"], exc)
        return web.json_response({"error": "confirmation failed, retry"}, status=502)
    log.info("confirmed the SNS subscription to %s", message["TopicArn"])
    return web.json_response({"confirmed": message["TopicArn"]})


async def _publish(
    raw: bytes, message: dict[str, Any], publish: Publish, parse: Parse, quiet: LimitedLog
) -> web.Response:
    try:
        bus_messages = await parse(raw)
    except InputRefused as exc:  # counted and logged where refused
        return web.json_response({"error": "refused", "reason": exc.reason}, status=403)
    except UnrecognisedMessage as exc:
        log.warning("unrecognised SNS notification %s: %s; body: %s", message.get("MessageId"), exc, raw[:4000])
        return web.json_response({"error": "unrecognised message", "reason": exc.reason}, status=400)
    try:
        for bus_message in bus_messages:
            await publish(bus_message)
    except Exception as exc:  # whatever stops the bus, SNS keeps the message and tries again
        quiet.warning(
            "unpublished",
            "could not publish SNS notification %s (%s: %s): asking SNS to retry",
            message.get("MessageId"),
            type(exc).__name__,
            exc,
        )
        return web.json_response({"error": "bus unavailable, retry"}, status=503)
    return web.json_response({"accepted": [bus_message.id for bus_message in bus_messages]})


def _refuse(quiet: LimitedLog, request: web.Request, status: int, reason: str) -> web.Response:
    quiet.warning("refused", "refused an SNS message from %s: %s", request.remote, reason)
    return web.json_response({"error": reason}, status=status)
