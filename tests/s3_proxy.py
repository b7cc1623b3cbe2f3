"""A fault-injecting HTTP proxy in front of moto: the network between the runner and S3, made unreliable.

It forwards every request unchanged, and on demand answers 503 to writes (an S3 outage) or holds requests
matching a predicate (an upload frozen mid-way, so the test can SIGKILL the runner at that exact moment).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
from aiohttp import web

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}


class S3FaultProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.fail_writes = False
        self.hold: Callable[[str, str], bool] | None = None
        self.held = asyncio.Event()  # set once a request has been held
        self.seen: list[tuple[str, str, int]] = []
        self.credentials: list[tuple[str, str]] = []  # (Authorization, X-Amz-Security-Token) of every request
        self._released = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        path = request.path_qs
        self.credentials.append(
            (request.headers.get("Authorization", ""), request.headers.get("X-Amz-Security-Token", ""))
        )
        if self.hold is not None and self.hold(request.method, path):
            self.held.set()
            await self._released.wait()  # until the test is over
            return web.Response(status=503)
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
            return web.Response(status=reply.status, body=payload, headers=out_headers)
