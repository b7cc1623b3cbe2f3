"""A local Slack for tests: the Web API methods the bot uses, a Socket Mode websocket, and Slack's request signing.

:class:`FakeSlack` answers ``auth.test``, ``apps.connections.open``, ``chat.postMessage``, ``chat.update``,
``chat.postEphemeral``, ``views.open``, ``conversations.replies`` and ``conversations.history`` (with message
metadata when asked for it; ``oldest`` is not applied) over real HTTP, checks the bearer token like Slack does
(and, as Slack does, names the bot token's ``scopes`` in the ``x-oauth-scopes`` header of each answer to it),
plays the file upload flow (``files.getUploadURLExternal``; the bytes POSTed once to the URL it gave, their length
the one announced; ``files.completeUploadExternal`` naming an uploaded file id, a channel and, when in a thread,
a message of that channel; the shared file becomes a message with its ``files``),
keeps every message as it stands after edits, and records every call (failed ones too) with its arguments. It
can be told to answer the next N calls with 429 (and a ``Retry-After``) or 500, or to be down until told otherwise. Its
``/socket`` endpoint speaks the Socket Mode protocol: ``hello`` on connect, envelopes from the test, acks back.

The helpers at the bottom build requests the way Slack sends them to an app in HTTP mode (form-encoded slash
commands, ``payload=`` for interactivity) and sign them as Slack does: ``v0=`` + HMAC-SHA256 of
``v0:{timestamp}:{body}`` with the signing secret.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from aiohttp import WSMsgType, web

BOT_TOKEN = "xoxb-test-bot-token"
APP_TOKEN = "xapp-1-test-app-token"
SIGNING_SECRET = "test-signing-secret"
TEAM = "T0TEST"
APP = "A0TEST"
BOT_USER = "U0BOT"
# What the manifest in docs/slack.md grants the bot token.
SCOPES = ("chat:write", "commands", "channels:history", "groups:history", "files:write")


@dataclass
class Call:
    method: str
    args: dict[str, Any]
    token: str | None
    status: int
    error: str | None = None
    at: float = field(default_factory=time.monotonic)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


@dataclass
class Message:
    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]]
    thread_ts: str | None = None
    edits: int = 0
    metadata: dict[str, Any] | None = None
    files: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Upload:
    """A file of the upload flow: announced (name, length), its bytes received, then shared where completed."""

    file_id: str
    filename: str
    length: int
    alt_text: str | None
    content: bytes | None = None
    title: str | None = None
    channel: str | None = None
    thread_ts: str | None = None
    refused: list[str] = field(default_factory=list)  # why each refused POST of its bytes was refused


class FakeSlack:
    def __init__(self, token: str = BOT_TOKEN, app_token: str = APP_TOKEN) -> None:
        self.token = token
        self.app_token = app_token
        self.scopes = list(SCOPES)  # what the bot token was granted (a test takes one away)
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, str], Message] = {}
        self.ephemeral: list[dict[str, Any]] = []
        self.unknown_channels: set[str] = set()
        self.uploads: dict[str, Upload] = {}  # file id -> the file, from its upload URL on
        self.socket_received: list[dict[str, Any]] = []
        self._failures: list[tuple[int, float | None]] = []
        self._down = False
        self._ts = itertools.count(1)
        self._sockets: list[web.WebSocketResponse] = []
        self._received = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> FakeSlack:
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/api/{method}", self._api)  # the conversations.* readers are GETs
        app.router.add_get("/socket", self._socket)
        app.router.add_post("/upload/{file_id}", self._upload)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def close(self) -> None:
        for socket in list(self._sockets):
            await socket.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeSlack:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    # -- what tests tell it --------------------------------------------------------------------------------

    def fail_next(self, count: int, status: int = 500, retry_after: float | None = None) -> None:
        """Answer the next ``count`` Web API calls with ``status`` (429 carries ``Retry-After``)."""
        self._failures.extend([(status, retry_after)] * count)

    def go_down(self) -> None:
        """Answer every Web API call with 500 until :meth:`come_back`."""
        self._down = True

    def come_back(self) -> None:
        self._down = False
        self._failures.clear()

    # -- what tests read -----------------------------------------------------------------------------------

    def called(self, method: str, ok: bool | None = True) -> list[Call]:
        return [call for call in self.calls if call.method == method and (ok is None or call.ok == ok)]

    def channel_messages(self, channel: str, top_level: bool = True) -> list[Message]:
        return [
            message
            for message in self.messages.values()
            if message.channel == channel and (message.thread_ts is None) == top_level
        ]

    def shared_files(self, channel: str, thread_ts: str | None = None) -> list[Upload]:
        """The files completed into ``channel`` (under ``thread_ts``, when given), in the order they were shared."""
        return [
            upload
            for upload in self.uploads.values()
            if upload.channel == channel and (thread_ts is None or upload.thread_ts == thread_ts)
        ]

    def replies(self, channel: str, thread_ts: str) -> list[Message]:
        return [m for m in self.messages.values() if m.channel == channel and m.thread_ts == thread_ts]

    async def wait_for(self, what: Callable[[], Any], timeout: float = 60.0) -> Any:
        """Poll ``what`` until it returns something truthy; fail with the recorded calls otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = what()
            if result:
                return result
            await asyncio.sleep(0.05)
        shown = [(c.method, c.status, c.error, {k: str(v)[:80] for k, v in c.args.items()}) for c in self.calls[-8:]]
        raise AssertionError(f"fake Slack never saw it; last calls: {shown}")

    # -- the Web API ---------------------------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        args: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            args.update(await request.json())
        elif request.can_read_body:
            args.update(dict(await request.post()))
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ") if header.startswith("Bearer ") else args.get("token")
        if self._down or self._failures:
            status, retry_after = self._failures.pop(0) if self._failures else (500, None)
            error: str | None = "ratelimited" if status == 429 else "internal_error"
            self.calls.append(Call(method, args, token, status, error=error))
            headers = {"Retry-After": str(int(retry_after))} if retry_after is not None else {}
            return web.json_response({"ok": False, "error": error}, status=status, headers=headers)
        answer = self._answer(method, args, token)
        error = None if answer.get("ok") else str(answer.get("error"))
        self.calls.append(Call(method, args, token, 200, error=error))
        scopes = {"x-oauth-scopes": ",".join(self.scopes)} if token == self.token else {}
        return web.json_response(answer, headers=scopes)

    def _answer(self, method: str, args: dict[str, Any], token: str | None) -> dict[str, Any]:
        if method == "apps.connections.open":
            if token != self.app_token:
                return {"ok": False, "error": "invalid_auth"}
            return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/socket"}
        if token != self.token:
            return {"ok": False, "error": "invalid_auth" if token else "not_authed"}
        if method == "auth.test":
            return {
                "ok": True,
                "url": "https://fake.slack.test/",
                "team_id": TEAM,
                "user_id": BOT_USER,
                "bot_id": "B0BOT",
                "app_id": APP,
            }
        if method == "views.open":
            return {"ok": True, "view": {"id": "V" + uuid.uuid4().hex[:8].upper()}}
        if method == "files.getUploadURLExternal":
            return self._upload_url(args)
        if method == "files.completeUploadExternal":
            return self._complete_upload(args)
        channel = str(args.get("channel", ""))
        if channel in self.unknown_channels or not channel:
            return {"ok": False, "error": "channel_not_found"}
        blocks = _json(args.get("blocks")) or []
        if method == "chat.postMessage":
            ts = f"{1_700_000_000 + next(self._ts)}.000100"
            thread = args.get("thread_ts")
            metadata = _json(args.get("metadata"))
            self.messages[(channel, ts)] = Message(channel, ts, str(args.get("text", "")), blocks, thread, 0, metadata)
            return {"ok": True, "channel": channel, "ts": ts, "message": {"text": args.get("text"), "ts": ts}}
        if method == "chat.update":
            message = self.messages.get((channel, str(args.get("ts"))))
            if message is None:
                return {"ok": False, "error": "message_not_found"}
            message.text, message.blocks = str(args.get("text", "")), blocks
            message.edits += 1
            return {"ok": True, "channel": channel, "ts": message.ts, "text": message.text}
        if method in ("conversations.replies", "conversations.history"):
            if method == "conversations.replies":
                parent = str(args.get("ts", ""))
                found = [m for m in self.messages.values() if m.channel == channel and parent in (m.ts, m.thread_ts)]
            else:
                found = self.channel_messages(channel)
            found.sort(key=lambda m: float(m.ts), reverse=method == "conversations.history")
            with_metadata = str(args.get("include_all_metadata", "")).lower() in ("1", "true")
            listed = [
                {
                    "ts": m.ts,
                    "text": m.text,
                    **({"metadata": m.metadata} if with_metadata and m.metadata else {}),
                    **({"files": m.files} if m.files else {}),
                }
                for m in found[: int(args.get("limit") or 100)]
            ]
            return {"ok": True, "messages": listed, "has_more": False}
        if method == "chat.postEphemeral":
            self.ephemeral.append({"channel": channel, "user": args.get("user"), "text": args.get("text")})
            return {"ok": True, "message_ts": f"{time.time():.6f}"}
        return {"ok": False, "error": "unknown_method"}

    # -- the file upload flow ------------------------------------------------------------------------------

    def _upload_url(self, args: dict[str, Any]) -> dict[str, Any]:
        filename = str(args.get("filename") or "")
        try:
            length = int(args.get("length") or 0)
        except ValueError:
            length = 0
        if not filename or length <= 0:
            return {"ok": False, "error": "invalid_arguments"}
        file_id = "F" + uuid.uuid4().hex[:10].upper()
        self.uploads[file_id] = Upload(file_id, filename, length, args.get("alt_txt"))
        return {"ok": True, "upload_url": f"http://127.0.0.1:{self.port}/upload/{file_id}", "file_id": file_id}

    async def _upload(self, request: web.Request) -> web.Response:
        """The upload URL: the bytes, once, exactly as many as announced (no token: the URL is the credential)."""
        upload = self.uploads.get(request.match_info["file_id"])
        body = await request.read()
        if upload is None:
            return web.Response(status=404, text="no such upload")
        why = "used already" if upload.content is not None else "wrong length" if len(body) != upload.length else ""
        if why:
            upload.refused.append(why)
            return web.Response(status=400, text=why)
        upload.content = body
        return web.Response(text=f"OK - {len(body)}")

    def _complete_upload(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            files = _json(args.get("files")) or []
        except ValueError:
            return {"ok": False, "error": "invalid_arguments"}
        channel = str(args.get("channel_id") or "")
        thread = args.get("thread_ts")
        if not files or not channel or channel in self.unknown_channels:
            return {"ok": False, "error": "invalid_arguments" if not files else "channel_not_found"}
        if thread and (channel, str(thread)) not in self.messages:
            return {"ok": False, "error": "invalid_thread_ts"}
        uploads = [self.uploads.get(str(item.get("id"))) for item in files]
        if any(upload is None or upload.content is None or upload.channel is not None for upload in uploads):
            return {"ok": False, "error": "file_not_found"}
        thread_ts = str(thread) if thread else None
        shared: list[dict[str, Any]] = []
        for upload, item in zip(uploads, files, strict=True):
            assert upload is not None
            upload.title = str(item.get("title") or upload.filename)
            upload.channel, upload.thread_ts = channel, thread_ts
            shared.append({"id": upload.file_id, "name": upload.filename, "title": upload.title})
        ts = f"{1_700_000_000 + next(self._ts)}.000100"
        comment = str(args.get("initial_comment") or "")
        self.messages[(channel, ts)] = Message(channel, ts, comment, [], thread_ts, files=shared)
        return {"ok": True, "files": shared}

    # -- Socket Mode ---------------------------------------------------------------------------------------

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        self._sockets.append(socket)
        hello = {"type": "hello", "num_connections": 1, "connection_info": {"app_id": "A0TEST"}}
        await socket.send_str(json.dumps(hello))
        try:
            async for frame in socket:
                if frame.type == WSMsgType.TEXT:
                    async with self._received:
                        self.socket_received.append(json.loads(frame.data))
                        self._received.notify_all()
        finally:
            self._sockets.remove(socket)
        return socket

    async def connected(self, timeout: float = 60.0) -> None:
        await self.wait_for(lambda: self._sockets, timeout)

    async def send_envelope(self, kind: str, payload: dict[str, Any]) -> str:
        """Send an envelope (``slash_commands``, ``interactive``…) to the connected app; returns its id."""
        envelope_id = uuid.uuid4().hex
        envelope = {"envelope_id": envelope_id, "type": kind, "accepts_response_payload": True, "payload": payload}
        await self._sockets[-1].send_str(json.dumps(envelope))
        return envelope_id

    async def ack_of(self, envelope_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """The app's acknowledgement of an envelope (what it sent back with that ``envelope_id``)."""

        def found() -> dict[str, Any] | None:
            return next((m for m in self.socket_received if m.get("envelope_id") == envelope_id), None)

        async with self._received:
            await asyncio.wait_for(self._received.wait_for(found), timeout)
        ack = found()
        assert ack is not None
        return ack


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


# -- requests as Slack sends them -------------------------------------------------------------------------


def slack_signature(secret: str, timestamp: int, body: bytes) -> str:
    base = b"v0:" + str(timestamp).encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def signed_headers(body: bytes, secret: str = SIGNING_SECRET, timestamp: int | None = None) -> dict[str, str]:
    moment = int(time.time()) if timestamp is None else timestamp
    return {
        "X-Slack-Request-Timestamp": str(moment),
        "X-Slack-Signature": slack_signature(secret, moment, body),
        "Content-Type": "application/x-www-form-urlencoded",
    }


def trigger_id() -> str:
    """A fresh ``trigger_id``, as Slack makes one for each command typed and each click."""
    return f"{next(_triggers)}.738474920.{uuid.uuid4().hex[:31]}"


_triggers = itertools.count(13345224609)


def slash_command(
    text: str,
    user: str = "U0ANA",
    channel: str = "C0JOBS",
    command: str = "/finetune",
    team: str = TEAM,
    app: str = APP,
) -> dict[str, str]:
    return {
        "token": "deprecated-verification-token",
        "team_id": team,
        "team_domain": "fake",
        "channel_id": channel,
        "channel_name": "ml-jobs",
        "user_id": user,
        "user_name": user.lower(),
        "command": command,
        "text": text,
        "api_app_id": app,
        "response_url": "https://hooks.slack.test/commands/T0TEST/1/abc",
        "trigger_id": trigger_id(),
    }


def block_action(
    action_id: str, value: str, user: str = "U0ANA", channel: str = "C0JOBS", team: str = TEAM, app: str = APP
) -> dict[str, Any]:
    return {
        "type": "block_actions",
        "team": {"id": team, "domain": "fake"},
        "user": {"id": user, "username": user.lower(), "team_id": team},
        "api_app_id": app,
        "token": "deprecated-verification-token",
        "container": {"type": "message", "message_ts": "1700000001.000100", "channel_id": channel},
        "trigger_id": trigger_id(),
        "channel": {"id": channel, "name": "ml-jobs"},
        "response_url": "https://hooks.slack.test/actions/T0TEST/1/abc",
        "actions": [
            {
                "action_id": action_id,
                "block_id": "finetune_card",
                "type": "button",
                "value": value,
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }


def form_body(fields: dict[str, str]) -> bytes:
    return urlencode(fields).encode()


def action_body(payload: dict[str, Any]) -> bytes:
    return urlencode({"payload": json.dumps(payload)}).encode()
