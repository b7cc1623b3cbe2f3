"""A fault-injecting HTTP proxy in front of moto: the network between the runner and S3, made unreliable.

It forwards every request unchanged, and on demand:

* answers 503 to writes (``fail_writes``: an S3 outage, or a bucket refusing writes until the instance is gone);
* answers 403 AccessDenied to requests matching a predicate (``refuse``: a role whose policy lacks a grant);
* holds requests matching a predicate (``hold``: an upload frozen mid-way, to SIGKILL the runner at that moment);
* throttles request bodies to ``upload_rate`` bytes/s shared by all connections (a slow link: uploads that
  take seconds with megabytes, so a notice can land in the middle of one);
* cuts GET responses short (``truncate``: a predicate on the path and how many to cut; the client is told the
  full Content-Length, gets half the body, and the connection is closed).

``arrived`` lists every request as it comes in, ``seen`` as it was answered, ``signed`` with the access key id that
signed it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}
_CHUNK = 64 * 1024


class S3FaultProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.fail_writes = False
        self.refuse: Callable[[str, str], bool] | None = None  # (method, path) -> answer 403 AccessDenied
        self.hold: Callable[[str, str], bool] | None = None
        self.held = asyncio.Event()  # set once a request has been held
        self.upload_rate: float | None = None  # bytes/s for request bodies, all connections together
        self.truncate: Callable[[str], bool] | None = None  # GET paths to cut short …
        self.truncate_times = 1  # … this many times in all
        self.truncated: list[str] = []
        self.arrived: list[tuple[str, str]] = []
        self.seen: list[tuple[str, str, int]] = []
        self.credentials: list[tuple[str, str]] = []  # (Authorization, X-Amz-Security-Token) of every request
        self.signed: list[tuple[str, str, str]] = []  # (method, path, the access key id in its Authorization)
        self._released = asyncio.Event()
        self._link_free_at = 0.0
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def signers(self, fragment: str) -> list[str]:
        """The access key ids that signed the requests whose path holds ``fragment``, in order."""
        return [key_id for _, path, key_id in self.signed if fragment in path]

    def arrivals(self, method: str, fragment: str) -> int:
        return sum(1 for seen_method, path in self.arrived if seen_method == method and fragment in path)

    async def start(self) -> S3FaultProxy:
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        self._client = aiohttp.ClientSession(auto_decompress=False)
        return self

    async def stop(self) -> None:
        self._released.set()
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _read_body(self, request: web.Request) -> bytes:
        if self.upload_rate is None:
            return await request.read()
        chunks = []
        async for chunk in request.content.iter_chunked(_CHUNK):
            chunks.append(chunk)
            # One link for everyone: each chunk takes its turn on it at the set rate.
            now = time.monotonic()
            self._link_free_at = max(self._link_free_at, now) + len(chunk) / self.upload_rate
            await asyncio.sleep(self._link_free_at - now)
        return b"".join(chunks)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        path = request.path_qs
        self.arrived.append((request.method, path))
        body = await self._read_body(request)
        authorization = request.headers.get("Authorization", "")
        self.credentials.append((authorization, request.headers.get("X-Amz-Security-Token", "")))
        signer = re.search(r"Credential=([^/,]+)/", authorization)
        self.signed.append((request.method, path, signer.group(1) if signer else ""))
        if self.hold is not None and self.hold(request.method, path):
            self.held.set()
            await self._released.wait()  # until the test is over
            return web.Response(status=503)
        if self.refuse is not None and self.refuse(request.method, path):
            self.seen.append((request.method, path, 403))
            return web.Response(status=403, text="<Error><Code>AccessDenied</Code><Message>denied</Message></Error>")
        if self.fail_writes and request.method in ("PUT", "POST", "DELETE"):
            self.seen.append((request.method, path, 503))
            return web.Response(status=503, text="<Error><Code>SlowDown</Code></Error>")
        assert self._client is not None
        headers = {key: value for key, value in request.headers.items() if key.lower() not in _HOP_HEADERS}
        headers["Host"] = request.host
        async with self._client.request(request.method, self.upstream + path, headers=headers, data=body) as reply:
            payload = await reply.read()
            self.seen.append((request.method, path, reply.status))
            out_headers = {key: value for key, value in reply.headers.items() if key.lower() not in _HOP_HEADERS}
            if request.method == "HEAD":  # no body, but the size the client asked about must survive
                out_headers["Content-Length"] = reply.headers.get("Content-Length", "0")
                return web.Response(status=reply.status, headers=out_headers)
            if self._should_truncate(request.method, path, reply.status, payload):
                return await self._cut_short(request, reply.status, out_headers, payload)
            return web.Response(status=reply.status, body=payload, headers=out_headers)

    def _should_truncate(self, method: str, path: str, status: int, payload: bytes) -> bool:
        if method != "GET" or status >= 300 or len(payload) < 2 or self.truncate is None:
            return False
        if len(self.truncated) >= self.truncate_times or not self.truncate(path):
            return False
        self.truncated.append(path)
        return True

    async def _cut_short(
        self, request: web.Request, status: int, headers: dict[str, str], payload: bytes
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = len(payload)
        await response.prepare(request)
        await response.write(payload[: len(payload) // 2])
        await asyncio.sleep(0.05)  # let the half reach the client before the connection drops
        assert request.transport is not None
        request.transport.close()
        return response
