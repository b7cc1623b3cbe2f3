"""The DingTalk Stream connection: a ticket from the gateway, a websocket, and every frame through the SDK.

dingtalk-stream parses the frames (``SYSTEM`` ping / disconnect, ``CALLBACK`` robot messages and card clicks),
routes them to handlers by topic and writes the acknowledgements; that part of it is async and used as is. Its
own ``start()`` is not: it opens the connection with a blocking ``requests`` call on the event loop, reads the
endpoint once at import, and swallows cancellation. So this module opens the connection itself (the same
request the SDK makes, with aiohttp, at ``DINGTALK_OPENAPI_ENDPOINT``), holds the websocket, reconnects with a
backoff, and stops when cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import quote_plus

import aiohttp
import websockets
from dingtalk_stream import (
    AckMessage,
    CallbackHandler,
    CardCallbackMessage,
    ChatbotMessage,
    Credential,
    DingTalkStreamClient,
)
from dingtalk_stream.version import VERSION_STRING

from bot.chat.delivery import PermanentDeliveryError
from bot.chat.dingtalk.inbound import Click, Inbound, Incoming
from bot.chat.dingtalk.transport import call
from bot.errors import ChatError, StoreUnavailable
from bot.log_limit import LimitedLog
from handlers import safe_json
from handlers.errors import UnrecognisedMessage

log = logging.getLogger(__name__)

OPEN_PATH = "/v1.0/gateway/connections/open"
MESSAGE_TOPIC: str = ChatbotMessage.TOPIC  # /v1.0/im/bot/messages/get
CARD_TOPIC: str = CallbackHandler.TOPIC_CARD_CALLBACK  # /v1.0/card/instances/callback
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)


class _QuietPings(logging.Filter):
    """The SDK warns "unknown message topic" on every keep-alive ping; a ping is not news."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "topic=ping" not in record.getMessage()


_sdk_log = logging.getLogger("bot.chat.dingtalk.sdk")
_sdk_log.addFilter(_QuietPings())


class _Messages(CallbackHandler):  # type: ignore[misc]  # the SDK has no type hints
    """``@bot …`` in a group (or a direct message): parsed by the SDK, handled by :class:`Inbound`."""

    def __init__(self, inbound: Inbound) -> None:
        super().__init__()
        self.logger = _sdk_log
        self.inbound = inbound

    async def process(self, callback: Any) -> tuple[int, str]:
        message = ChatbotMessage.from_dict(callback.data)
        texts = message.get_text_list() if message.message_type in ("text", "richText") else None
        incoming = Incoming(
            message_id=str(message.message_id or callback.headers.message_id),
            conversation_id=str(message.conversation_id or ""),
            conversation_type=str(message.conversation_type or ""),
            sender=str(message.sender_staff_id or message.sender_id or ""),
            sender_staff_id=str(message.sender_staff_id or ""),
            text=" ".join(part for part in texts if part) if texts else None,
            session_webhook=message.session_webhook,
            session_webhook_expires_ms=message.session_webhook_expired_time,
            sender_corp_id=str(message.sender_corp_id or ""),
            robot_corp_id=str(message.chatbot_corp_id or ""),
        )
        await self.inbound.message(incoming)
        return AckMessage.STATUS_OK, "OK"


class _Clicks(CallbackHandler):  # type: ignore[misc]  # the SDK has no type hints
    """A card button: the answer goes back in the acknowledgement, which updates the clicker's card."""

    def __init__(self, inbound: Inbound) -> None:
        super().__init__()
        self.logger = _sdk_log
        self.inbound = inbound

    async def process(self, callback: Any) -> tuple[int, dict[str, Any]]:
        parsed = CardCallbackMessage.from_dict(callback.data)
        click = Click(
            out_track_id=str(parsed.card_instance_id or ""),
            user_id=str(parsed.user_id or ""),
            space_id=str(callback.data.get("spaceId") or ""),
            content=parsed.content if isinstance(parsed.content, dict) else {},
            corp_id=str(parsed.corp_id or ""),
        )
        return AckMessage.STATUS_OK, await self.inbound.click(str(callback.headers.message_id), click)


class DingTalkStream:
    def __init__(
        self,
        client_id: str,
        client_secret: str,
        endpoint: str,
        session: aiohttp.ClientSession,
        inbound: Inbound,
        retry_seconds: tuple[float, ...] = RETRY_SECONDS,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.session = session
        self.retry_seconds = retry_seconds
        self.sdk = DingTalkStreamClient(Credential(client_id, client_secret), logger=_sdk_log)
        self.sdk.register_callback_handler(MESSAGE_TOPIC, _Messages(inbound))
        self.sdk.register_callback_handler(CARD_TOPIC, _Clicks(inbound))
        self.sdk.pre_start()
        self.connections = 0  # websockets opened so far (a reconnect adds one)
        self.quiet = LimitedLog(log)

    async def run(self) -> None:
        """Stay connected until cancelled: reconnect at once when the gateway says so, with a backoff on failures."""
        failures = 0
        while True:
            try:
                uri = await self._open()
                async with websockets.connect(uri, open_timeout=10, ping_interval=20, ping_timeout=20) as ws:
                    failures = 0
                    await self._serve(ws)
                await asyncio.sleep(0.2)
            except (ChatError, OSError, TimeoutError, ValueError, websockets.WebSocketException) as exc:
                delay = self.retry_seconds[min(failures, len(self.retry_seconds) - 1)]
                failures += 1
                log.warning("DingTalk stream: %s; reconnecting in %.0fs", exc or type(exc).__name__, delay)
                await asyncio.sleep(delay)

    async def _open(self) -> str:
        """Ask the gateway for a connection (the SDK's request body), return the websocket URI with its ticket."""
        body = {
            "clientId": self.sdk.credential.client_id,
            "clientSecret": self.sdk.credential.client_secret,
            "subscriptions": [{"type": "CALLBACK", "topic": topic} for topic in self.sdk.callback_handler_map],
            "ua": f"finetune-chatops dingtalk-sdk-python/v{VERSION_STRING}",
            "localIp": "",
        }
        answer = await call(self.session, "POST", self.endpoint + OPEN_PATH, "stream connection", body)
        endpoint, ticket = answer.get("endpoint"), answer.get("ticket")
        if not isinstance(endpoint, str) or not isinstance(ticket, str):
            raise PermanentDeliveryError(f"stream connection: no endpoint and ticket in {answer}")
        return f"{endpoint}?ticket={quote_plus(ticket)}"

    async def _serve(self, ws: Any) -> None:
        self.sdk.websocket = ws
        self.connections += 1
        log.info("DingTalk stream connected (%d)", self.connections)
        frames: set[asyncio.Task[None]] = set()
        try:
            async for raw in ws:
                task = asyncio.create_task(self._route(ws, raw))
                frames.add(task)
                task.add_done_callback(frames.discard)
            await asyncio.gather(*frames, return_exceptions=True)
        finally:
            for task in frames:
                task.cancel()

    async def _route(self, ws: Any, raw: str | bytes) -> None:
        """One frame through the SDK's router (which sends the ack); ``disconnect`` closes for a reconnect."""
        try:
            frame = safe_json.loads(raw)
        except UnrecognisedMessage as exc:  # said once, without a traceback: the frame is not one to retry
            self.quiet.warning("dingtalk-frame", "DingTalk stream frame refused: %s", exc)
            return
        try:
            result = await self.sdk.route_message(frame)
        except StoreUnavailable as exc:  # the claim that makes a message run once needs Redis: wait for it
            self.quiet.warning(
                "redis-unavailable",
                "DingTalk frame not handled, Redis is unavailable (%s): no ack, DingTalk delivers it again",
                exc,
            )
            return
        except Exception:
            log.exception("DingTalk stream frame not handled (no ack: DingTalk will deliver it again)")
            return
        if result == DingTalkStreamClient.TAG_DISCONNECT:
            await ws.close()
