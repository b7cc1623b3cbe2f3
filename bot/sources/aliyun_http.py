"""Alibaba Cloud event intake on the bot's HTTP server: ``POST /aliyun/cloudmonitor`` and ``POST /aliyun/eventbridge``.

CloudMonitor webhooks are not signed, so these routes trust a request only when it

1. comes from an allowed source address, when a list of networks is configured — else 403;
2. came over HTTPS — else 403, unless ``allow_insecure`` is set (a local test on loopback). The bot itself serves
   plain HTTP behind the load balancer, which terminates TLS and says so in ``X-Forwarded-Proto`` (an ALB sets it;
   deploy/aliyun/bot.ros.yaml turns it on). A client that reaches the bot directly and claims https only fools
   itself: the point is that the token never crosses a network in the clear, and such a client already sent it;
3. carries no token in its URL — else 400: URLs end up in access logs, proxies' logs and consoles, so a token seen
   there is refused (and should be rotated), never accepted;
4. carries the shared secret token in an ``X-Finetune-Token`` header or ``Authorization: Bearer …``, compared in
   constant time — else 401;
5. holds an event :mod:`handlers.aliyun_events` understands — else 400 (logged with the body);
6. is not older than the freshness window (:func:`handlers.aliyun_events.staleness`) — else 403.

Only then is anything published to the bus. A bus that cannot take the message gets 503, so the sender retries;
redeliveries are harmless since the bus messages carry ids derived from the event. The source address is the peer
of the TCP connection: behind a reverse proxy it is the proxy's, so list the proxy's address there.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Collection
from datetime import datetime

from aiohttp import web

from bot.header_form import BEARER, FINETUNE_TOKEN, header_part
from bot.log_limit import LimitedLog
from handlers.aliyun_events import parse_cloudmonitor, parse_eventbridge, staleness
from handlers.clock import utcnow
from handlers.errors import UnrecognisedMessage
from handlers.messages import BusMessage, CloudEvent

log = logging.getLogger(__name__)

CLOUDMONITOR_PATH = "/aliyun/cloudmonitor"
EVENTBRIDGE_PATH = "/aliyun/eventbridge"
TOKEN_HEADER = FINETUNE_TOKEN.name
MIN_TOKEN_LENGTH = 16

Publish = Callable[[BusMessage], Awaitable[str]]  # the bus encodes the message once, from the model
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Parser = Callable[[bytes, datetime], list[CloudEvent]]


def parse_networks(value: str) -> list[Network]:
    """``"100.100.0.0/16, 10.0.0.5"`` → networks; ValueError naming the bad entry."""
    networks: list[Network] = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ValueError(f"{item!r} is not an IP address or network (CIDR)") from exc
    return networks


def aliyun_routes(
    publish: Publish,
    token: str,
    sources: Collection[Network] = (),
    *,
    allow_insecure: bool = False,
    clock: Callable[[], datetime] = utcnow,
) -> list[web.RouteDef]:
    """The routes to mount on the bot's app (``app.add_routes(aliyun_routes(...))``).

    ``token`` must be at least 16 characters: it is all that stands between the internet and the bus. An empty
    ``sources`` accepts every address (the token still applies). ``allow_insecure`` accepts plain http (a test's
    loopback server; never in production).
    """
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"the Alibaba webhook token must be at least {MIN_TOKEN_LENGTH} characters")
    expected = token.encode()
    allowed = tuple(sources)
    quiet = LimitedLog(log)

    def refuse(request: web.Request, status: int, reason: str) -> web.Response:
        quiet.warning(
            "refused", "refused an Alibaba event push to %s from %s: %s", request.path, request.remote, reason
        )
        return web.json_response({"error": reason}, status=status)

    def handler(parse: Parser, what: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def receive(request: web.Request) -> web.Response:
            if allowed and not _address_allowed(request.remote, allowed):
                return refuse(request, 403, f"source address {request.remote} is not allowed")
            if not allow_insecure and not _over_https(request):
                return refuse(request, 403, "plain http refused: the token travels over https only")
            if "token" in request.query:
                return refuse(request, 400, "a token in the URL is refused: send it in the X-Finetune-Token header")
            if not hmac.compare_digest(_token_of(request).encode("ascii"), expected):
                return refuse(request, 401, "missing or wrong token")
            raw = await request.read()
            now = clock()
            try:
                messages = parse(raw, now)
            except UnrecognisedMessage as exc:
                quiet.warning(
                    "refused", "unrecognised %s from %s: %s; body: %s", what, request.remote, exc.reason, raw[:2000]
                )
                return web.json_response({"error": "unrecognised event", "reason": exc.reason}, status=400)
            stale = staleness(messages, now)
            if stale is not None:
                return refuse(request, 403, stale)
            try:
                for message in messages:
                    await publish(message)
            except Exception as exc:  # whatever stops the bus, the sender keeps the event and tries again
                quiet.warning(
                    "unpublished",
                    "could not publish an %s (%s: %s): asking the sender to retry",
                    what,
                    type(exc).__name__,
                    exc,
                )
                return web.json_response({"error": "bus unavailable, retry"}, status=503)
            return web.json_response({"accepted": [message.id for message in messages]})

        return receive

    return [
        web.post(CLOUDMONITOR_PATH, handler(parse_cloudmonitor, "CloudMonitor event")),
        web.post(EVENTBRIDGE_PATH, handler(parse_eventbridge, "EventBridge event")),
    ]


def _token_of(request: web.Request) -> str:
    """The token the request carries, as Bearer or in ``X-Finetune-Token``: ASCII, or "" (:mod:`bot.header_form`)."""
    return header_part(BEARER, request.headers, "token") or FINETUNE_TOKEN.read(request.headers) or ""


def _over_https(request: web.Request) -> bool:
    """TLS to the bot itself, or to the load balancer in front of it (its ``X-Forwarded-Proto``, first hop)."""
    if request.secure:  # aiohttp reads X-Forwarded-Proto only when told to trust proxies; this says https directly
        return True
    forwarded = request.headers.get("X-Forwarded-Proto", "")
    return forwarded.split(",")[0].strip().lower() == "https"


def _address_allowed(remote: str | None, allowed: tuple[Network, ...]) -> bool:
    try:
        address = ipaddress.ip_address(remote or "")
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in allowed)
