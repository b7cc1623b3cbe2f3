"""A local DingTalk over real HTTP and a real websocket, for the bot's DingTalk adapter to talk to.

One aiohttp server plays every DingTalk endpoint the bot uses, checking requests the way DingTalk does and
recording them:

- the Stream gateway: ``POST /v1.0/gateway/connections/open`` (client id and secret, subscriptions) answers an
  endpoint and a one-time ticket; the websocket at that endpoint sends frames exactly as the SDK expects them
  (``SYSTEM`` ping / disconnect, ``CALLBACK`` robot messages and card clicks) and records the SDK's acks;
- the OpenAPI: the access token, interactive card create-and-deliver and update, app robot group messages and
  one-to-one messages (``/v1.0/robot/oToMessages/batchSend``: 1 to 20 staff ids of the organisation; one it does
  not know comes back in ``invalidStaffIdList`` and gets nothing, as DingTalk answers);
  every call must carry a token this server issued (else HTTP 400 ``InvalidAuthentication``, as DingTalk answers);
- the oapi's ``/media/upload``: a multipart ``media`` file of ``type=image`` (a PNG or JPEG, 20 MB at most), the
  token in the query (else errcode 40014, as the oapi answers), kept by the ``media_id`` it answers;
- session webhooks (replies to a message) and a group's custom robot webhook, whose signature is checked with
  this module's own HMAC code and whose timestamp must be within an hour, so a wrong secret is caught.

``fail_next(path, status, …)`` makes the next calls of a path fail as DingTalk does when it is down or
throttling.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import json
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, WSMsgType, web

MESSAGE_TOPIC = "/v1.0/im/bot/messages/get"
CARD_TOPIC = "/v1.0/card/instances/callback"
SIGN_WINDOW_MS = 3600 * 1000  # DingTalk refuses a robot timestamp more than an hour away


@dataclass
class Failure:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class FakeDingTalk:
    def __init__(
        self,
        client_id: str = "dingapp-test",
        client_secret: str = "app-secret",
        robot_token: str = "robot-token",
        robot_secret: str = "SEC-robot-secret",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.robot_token = robot_token
        self.robot_secret = robot_secret
        self.clock = clock
        self.opens: list[dict[str, Any]] = []  # connection requests the gateway accepted
        self.acks: dict[str, dict[str, Any]] = {}  # frame messageId -> the client's ack frame
        self.calls: list[tuple[str, str, dict[str, Any]]] = []  # (method, path, body) of accepted OpenAPI calls
        self.cards: dict[str, dict[str, str]] = {}  # outTrackId -> the card's current public data
        self.card_spaces: dict[str, str] = {}  # outTrackId -> the openSpaceId it was delivered to
        self.group_messages: list[dict[str, Any]] = []  # {"conversation", "title", "text"}
        self.direct_messages: list[dict[str, Any]] = []  # {"user", "title", "text"}: one-to-one robot messages
        self.unknown_staff: set[str] = set()  # staff ids DingTalk does not know (answered in invalidStaffIdList)
        self.session_replies: list[dict[str, Any]] = []  # {"session", "body"}
        self.media: dict[str, bytes] = {}  # media_id -> the uploaded image
        self.robot_messages: list[dict[str, Any]] = []  # bodies of correctly signed robot webhook calls
        self.refused_robot_calls: list[str] = []  # why each refused robot call was refused
        self.token_requests = 0
        self._tokens: set[str] = set()
        self._tickets: set[str] = set()
        self._failures: dict[str, deque[Failure]] = {}
        self._ws: web.WebSocketResponse | None = None
        self._connected = asyncio.Event()
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- running ---------------------------------------------------------------------------------------------

    async def start(self) -> FakeDingTalk:
        app = web.Application()
        app.router.add_post("/v1.0/gateway/connections/open", self._open)
        app.router.add_get("/gateway", self._gateway)
        app.router.add_post("/v1.0/oauth2/accessToken", self._access_token)
        app.router.add_post("/v1.0/card/instances/createAndDeliver", self._create_card)
        app.router.add_put("/v1.0/card/instances", self._update_card)
        app.router.add_post("/v1.0/robot/groupMessages/send", self._group_message)
        app.router.add_post("/v1.0/robot/oToMessages/batchSend", self._one_to_one)
        app.router.add_post("/session/{session}", self._session_reply)
        app.router.add_post("/robot/send", self._robot)
        app.router.add_post("/media/upload", self._media_upload)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeDingTalk:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def robot_webhook(self) -> str:
        return f"{self.url}/robot/send?access_token={self.robot_token}"

    def session_webhook(self, name: str) -> str:
        return f"{self.url}/session/{name}"

    def fail_next(
        self,
        path: str,
        status: int = 200,
        times: int = 1,
        errcode: int | None = None,
        code: str | None = None,
        **headers: str,
    ) -> None:
        """The next ``times`` calls of ``path`` fail and change nothing: with ``status`` and the OpenAPI's error
        body (its ``code``; a 403 is by default the OpenAPI's QPS limit), or (webhooks) HTTP 200 with ``errcode``."""
        if errcode is not None:
            body: dict[str, Any] = {"errcode": errcode, "errmsg": "injected failure"}
        else:
            code = code or ("Forbidden.AccessDenied.QpsLimitForApi" if status == 403 else f"http{status}")
            body = {"code": code, "message": "injected failure", "requestid": "fake"}
        self._failures.setdefault(path, deque()).extend([Failure(status, body, headers)] * times)

    def revoke_tokens(self) -> None:
        """Every access token issued so far stops working (as when DingTalk rotates them)."""
        self._tokens.clear()

    # -- the Stream gateway ------------------------------------------------------------------------------------

    async def wait_connected(self, timeout: float = 20) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout)

    async def push(self, frame: dict[str, Any]) -> None:
        """Send one frame to the connected client."""
        await self.wait_connected()
        assert self._ws is not None
        await self._ws.send_str(json.dumps(frame))

    async def ack(self, message_id: str, timeout: float = 20) -> dict[str, Any]:
        """The client's ack of frame ``message_id``, once it arrives."""
        await self.wait_until(lambda: message_id in self.acks, timeout, f"an ack of {message_id}")
        return self.acks[message_id]

    async def disconnect(self) -> str:
        """Ask the client to reconnect, as the gateway does before it restarts."""
        frame = system_frame("disconnect", {"reason": "gateway restarting"})
        self._connected.clear()
        await self.push_connected(frame)
        return str(frame["headers"]["messageId"])

    async def push_connected(self, frame: dict[str, Any]) -> None:
        assert self._ws is not None
        await self._ws.send_str(json.dumps(frame))

    async def wait_until(self, done: Callable[[], bool], timeout: float = 60, what: str = "it") -> None:
        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(done)

        try:
            await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"DingTalk fake: no {what} within {timeout}s") from None

    async def _open(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("clientId") != self.client_id or body.get("clientSecret") != self.client_secret:
            return web.json_response({"code": "InvalidAuthentication", "message": "bad client"}, status=401)
        subscriptions = body.get("subscriptions")
        if not isinstance(subscriptions, list) or not subscriptions:
            return web.json_response({"code": "InvalidParameter", "message": "no subscriptions"}, status=400)
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        await self._record(lambda: self.opens.append(body))
        return web.json_response({"endpoint": f"ws://127.0.0.1:{request.url.port}/gateway", "ticket": ticket})

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            return web.json_response({"code": "InvalidTicket"}, status=401)
        self._tickets.discard(ticket)  # a ticket opens one connection
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._ws = ws
        self._connected.set()
        try:
            async for message in ws:
                if message.type is WSMsgType.TEXT:
                    ack = json.loads(message.data)
                    message_id = ack.get("headers", {}).get("messageId")

                    def acknowledge(ack: dict[str, Any] = ack, message_id: str = message_id) -> None:
                        self.acks[message_id] = ack

                    await self._record(acknowledge)
        finally:
            if self._ws is ws:
                self._ws = None
                self._connected.clear()
        return ws

    # -- the OpenAPI -------------------------------------------------------------------------------------------

    async def _access_token(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.token_requests += 1
        if body.get("appKey") != self.client_id or body.get("appSecret") != self.client_secret:
            return web.json_response({"code": "invalidClientSecret", "message": "appSecret is wrong"}, status=400)
        token = f"token-{uuid.uuid4().hex[:8]}"
        self._tokens.add(token)
        return web.json_response({"accessToken": token, "expireIn": 7200})

    async def _api(self, request: web.Request) -> tuple[dict[str, Any], web.Response | None]:
        """The JSON body of an OpenAPI call, or the error DingTalk would answer instead."""
        failure = self._failure(request.path)
        if failure is not None:
            return {}, failure
        if request.headers.get("x-acs-dingtalk-access-token") not in self._tokens:
            # What DingTalk answers for a token it does not accept: HTTP 400, not 401.
            refused = {"code": "InvalidAuthentication", "message": "不合法的access_token", "requestid": "fake"}
            return {}, web.json_response(refused, status=400)
        body = await request.json()
        return body, None

    async def _create_card(self, request: web.Request) -> web.Response:
        body, refused = await self._api(request)
        if refused is not None:
            return refused
        problem = _card_problem(body, self.client_id)
        track: str = body.get("outTrackId") or ""
        if problem is None and track in self.cards:
            problem = "outTrackId already used"
        if problem is not None:
            return web.json_response({"code": "param.invalid", "message": problem}, status=400)
        conversation = body["openSpaceId"].removeprefix("dtv1.card//IM_GROUP.")

        def create() -> None:
            self.calls.append(("POST", request.path, body))
            self.cards[track] = dict(body["cardData"]["cardParamMap"])
            self.card_spaces[track] = body["openSpaceId"]

        await self._record(create)
        deliver = {"spaceType": "IM_GROUP", "spaceId": conversation, "success": True, "carrierId": uuid.uuid4().hex}
        return web.json_response({"success": True, "result": {"outTrackId": track, "deliverResults": [deliver]}})

    async def _update_card(self, request: web.Request) -> web.Response:
        body, refused = await self._api(request)
        if refused is not None:
            return refused
        track = body.get("outTrackId")
        params = (body.get("cardData") or {}).get("cardParamMap")
        if track not in self.cards:
            return web.json_response({"code": "param.cardNotExist", "message": "no such card"}, status=400)
        if not isinstance(params, dict) or not all(isinstance(v, str) for v in params.values()):
            return web.json_response({"code": "param.invalid", "message": "cardParamMap of strings"}, status=400)

        def update() -> None:
            self.calls.append(("PUT", request.path, body))
            by_key = (body.get("cardUpdateOptions") or {}).get("updateCardDataByKey")
            self.cards[track] = {**self.cards[track], **params} if by_key else dict(params)

        await self._record(update)
        return web.json_response({"success": True, "result": True})

    async def _group_message(self, request: web.Request) -> web.Response:
        body, refused = await self._api(request)
        if refused is not None:
            return refused
        if body.get("robotCode") != self.client_id or body.get("msgKey") != "sampleMarkdown":
            return web.json_response({"code": "param.invalid", "message": "robotCode / msgKey"}, status=400)
        param = json.loads(body.get("msgParam") or "{}")
        if not param.get("title") or not param.get("text"):
            return web.json_response({"code": "param.invalid", "message": "msgParam title and text"}, status=400)
        message = {"conversation": body.get("openConversationId"), "title": param["title"], "text": param["text"]}

        def record() -> None:
            self.calls.append(("POST", request.path, body))
            self.group_messages.append(message)

        await self._record(record)
        return web.json_response({"processQueryKey": uuid.uuid4().hex})

    async def _one_to_one(self, request: web.Request) -> web.Response:
        body, refused = await self._api(request)
        if refused is not None:
            return refused
        users = body.get("userIds")
        if body.get("robotCode") != self.client_id or body.get("msgKey") != "sampleMarkdown":
            return web.json_response({"code": "param.invalid", "message": "robotCode / msgKey"}, status=400)
        if not isinstance(users, list) or not 1 <= len(users) <= 20 or not all(isinstance(u, str) for u in users):
            return web.json_response({"code": "param.invalid", "message": "userIds: 1 to 20 staff ids"}, status=400)
        param = json.loads(body.get("msgParam") or "{}")
        if not param.get("title") or not param.get("text"):
            return web.json_response({"code": "param.invalid", "message": "msgParam title and text"}, status=400)
        invalid = [user for user in users if user in self.unknown_staff]

        def record() -> None:
            self.calls.append(("POST", request.path, body))
            for user in users:
                if user not in invalid:
                    self.direct_messages.append({"user": user, "title": param["title"], "text": param["text"]})

        await self._record(record)
        answer = {"processQueryKey": uuid.uuid4().hex, "invalidStaffIdList": invalid, "flowControlledStaffIdList": []}
        return web.json_response(answer)

    async def _media_upload(self, request: web.Request) -> web.Response:
        failure = self._failure(request.path)
        if failure is not None:
            return failure
        if request.query.get("access_token") not in self._tokens:
            return web.json_response({"errcode": 40014, "errmsg": "不合法的access_token"})
        if request.query.get("type") != "image" or request.content_type != "multipart/form-data":
            return web.json_response({"errcode": 40004, "errmsg": "不合法的媒体文件类型"})
        reader = await request.multipart()
        content: bytes | None = None
        async for part in reader:
            if isinstance(part, BodyPartReader) and part.name == "media" and part.filename:
                content = bytes(await part.read())
        if not content or not content.startswith((b"\x89PNG\r\n\x1a\n", b"\xff\xd8")):
            return web.json_response({"errcode": 40005, "errmsg": "不合法的文件类型"})
        if len(content) > 20 * 1024 * 1024:
            return web.json_response({"errcode": 40006, "errmsg": "不合法的文件大小"})
        media_id = "@lAD" + uuid.uuid4().hex[:20]
        await self._record(lambda: self.media.__setitem__(media_id, content))
        return web.json_response({"errcode": 0, "errmsg": "ok", "type": "image", "media_id": media_id, "created_at": 0})

    # -- webhooks ----------------------------------------------------------------------------------------------

    async def _session_reply(self, request: web.Request) -> web.Response:
        failure = self._failure(request.path)
        if failure is not None:
            return failure
        body = await request.json()
        if body.get("msgtype") != "markdown" or not (body.get("markdown") or {}).get("text"):
            return web.json_response({"errcode": 40035, "errmsg": "markdown text missing"})
        reply = {"session": request.match_info["session"], "body": body}
        await self._record(lambda: self.session_replies.append(reply))
        return web.json_response({"errcode": 0, "errmsg": "ok"})

    async def _robot(self, request: web.Request) -> web.Response:
        failure = self._failure(request.path)
        if failure is not None:
            return failure
        why = self._robot_refusal(request)
        if why is not None:
            await self._record(lambda: self.refused_robot_calls.append(why))
            return web.json_response({"errcode": 310000, "errmsg": f"sign not match: {why}"})
        body = await request.json()
        if body.get("msgtype") != "markdown" or not (body.get("markdown") or {}).get("text"):
            return web.json_response({"errcode": 40035, "errmsg": "markdown text missing"})
        await self._record(lambda: self.robot_messages.append(body))
        return web.json_response({"errcode": 0, "errmsg": "ok"})

    def _robot_refusal(self, request: web.Request) -> str | None:
        if request.query.get("access_token") != self.robot_token:
            return "unknown access_token"
        try:
            timestamp = int(request.query.get("timestamp", ""))
        except ValueError:
            return "no timestamp"
        if abs(self.clock() * 1000 - timestamp) > SIGN_WINDOW_MS:
            return "timestamp more than an hour away"
        expected = hmac.new(
            self.robot_secret.encode("utf-8"), f"{timestamp}\n{self.robot_secret}".encode(), hashlib.sha256
        ).digest()
        if request.query.get("sign") != base64.b64encode(expected).decode():
            return "signature does not match"
        return None

    # -- helpers -----------------------------------------------------------------------------------------------

    def _failure(self, path: str) -> web.Response | None:
        queue = self._failures.get(path)
        if not queue:
            return None
        failure = queue.popleft()
        return web.json_response(failure.body, status=failure.status, headers=failure.headers)

    async def _record(self, change: Callable[[], None]) -> None:
        async with self._changed:
            change()
            self._changed.notify_all()


def _card_problem(body: dict[str, Any], robot_code: str) -> str | None:
    params = (body.get("cardData") or {}).get("cardParamMap")
    if not body.get("cardTemplateId") or not body.get("outTrackId"):
        return "cardTemplateId and outTrackId are required"
    if not isinstance(params, dict) or not all(isinstance(v, str) for v in params.values()):
        return "cardData.cardParamMap must map names to strings"
    if any(len(v.encode()) > 1024 for v in params.values()):
        return "a card value is over 1 KB"
    if not str(body.get("openSpaceId", "")).startswith("dtv1.card//IM_GROUP."):
        return "openSpaceId must be dtv1.card//IM_GROUP.<openConversationId>"
    if (body.get("imGroupOpenDeliverModel") or {}).get("robotCode") != robot_code:
        return "imGroupOpenDeliverModel.robotCode is required"
    if body.get("callbackType") != "STREAM":
        return "callbackType STREAM: the button callbacks come over the stream"
    return None


# -- frames, shaped as the Stream gateway sends them -----------------------------------------------------------

_ids = itertools.count(1)


def _frame(kind: str, topic: str, data: dict[str, Any], message_id: str | None = None) -> dict[str, Any]:
    return {
        "specVersion": "1.0",
        "type": kind,
        "headers": {
            "appId": "fake-app",
            "connectionId": "fake-connection",
            "contentType": "application/json",
            "messageId": message_id or f"frame-{next(_ids)}-{uuid.uuid4().hex[:6]}",
            "time": str(int(time.time() * 1000)),
            "topic": topic,
        },
        "data": json.dumps(data, ensure_ascii=False),
    }


def system_frame(topic: str, data: dict[str, Any]) -> dict[str, Any]:
    return _frame("SYSTEM", topic, data)


def message_frame(data: dict[str, Any], message_id: str | None = None) -> dict[str, Any]:
    return _frame("CALLBACK", MESSAGE_TOPIC, data, message_id)


def click_frame(data: dict[str, Any], message_id: str | None = None) -> dict[str, Any]:
    return _frame("CALLBACK", CARD_TOPIC, data, message_id)


def group_message(
    text: str,
    sender: str,
    conversation: str,
    session_webhook: str,
    msg_id: str | None = None,
    expires_in: float = 3600,
    msgtype: str = "text",
    staff: bool = True,
) -> dict[str, Any]:
    """A group member's ``@bot …`` as the robot receives it; ``staff=False``: someone outside the organisation
    (DingTalk sends no ``senderStaffId`` then)."""
    now_ms = int(time.time() * 1000)
    data: dict[str, Any] = {
        "conversationId": conversation,
        "atUsers": [{"dingtalkId": "$:LWCP_v1:$bot"}],
        "chatbotCorpId": "dingcorp",
        "chatbotUserId": "$:LWCP_v1:$bot",
        "msgId": msg_id or f"msg{uuid.uuid4().hex[:12]}",
        "senderNick": sender.title(),
        "isAdmin": False,
        "senderStaffId": sender,
        "sessionWebhookExpiredTime": now_ms + int(expires_in * 1000),
        "createAt": now_ms,
        "senderCorpId": "dingcorp",
        "conversationType": "2",
        "senderId": f"$:LWCP_v1:${sender}",
        "conversationTitle": "ML 团队",
        "isInAtList": True,
        "sessionWebhook": session_webhook,
        "robotCode": "dingapp-test",
        "msgtype": msgtype,
    }
    if not staff:
        del data["senderStaffId"]
    if msgtype == "text":
        data["text"] = {"content": text}
    else:
        data["content"] = {"downloadCode": "abc", "pictureDownloadCode": "abc"}
    return data


def card_click(out_track_id: str, user_id: str, action: str, conversation: str) -> dict[str, Any]:
    """A card button's callback request (``content`` is a JSON string, as DingTalk sends it)."""
    content = {"cardPrivateData": {"actionIds": [f"{action}_button"], "params": {"action": action}}}
    return {
        "type": "actionCallback",
        "outTrackId": out_track_id,
        "corpId": "dingcorp",
        "userId": user_id,
        "userIdType": 1,
        "spaceType": "IM_GROUP",
        "spaceId": conversation,
        "extension": "{}",
        "content": json.dumps(content),
    }
